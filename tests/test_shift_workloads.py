"""The reasoning and browse families and the shifting-mix experiments (configs/experiment/shift_*.yaml).

- each new family's YAML states targets for the quantities that set the P/D balance (that the
  generator meets them, and the recipe caps, is checked with every family in tests/test_workloads.py);
- the two families sit on opposite sides of the P/D balance (reasoning decodes, browse prefills);
- a shifting experiment's per-step family shares follow its schedule, with whole GRPO groups.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate


CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def compose_config(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose(config_name="config", overrides=["logger=none", *overrides])


@pytest.mark.parametrize("name", ["reasoning", "browse"])
def test_family_yaml_states_its_main_targets(name):
    """Both families' statistics and caps are checked with the others (tests/test_workloads.py);
    here, that their YAMLs state targets for the quantities that set the P/D balance."""
    metrics = {m for population in instantiate(compose_config([f"workload={name}"]).workload, seed=0).targets.values()
               for m in population}
    assert metrics >= {"output_tokens", "tool_output_tokens", "tool_latency_s"}


def test_reasoning_decodes_and_browse_prefills():
    """Output tokens per new context token: reasoning is decode-heavy, browse prefill-heavy."""
    ratio = {}
    for name in ("reasoning", "browse"):
        scripts = instantiate(compose_config([f"workload={name}"]).workload, seed=0).batch(0)
        new = sum(t.new_tokens for s in scripts for t in s.turns)
        out = sum(t.output_tokens for s in scripts for t in s.turns)
        ratio[name] = out / new
    assert ratio["reasoning"] > 3 and ratio["browse"] < 0.1, ratio


@pytest.mark.parametrize("experiment, families", [("shift_reason_browse", ("reasoning", "browse")),
                                                  ("shift_reason_browse_kvboth_64gpu", ("reasoning", "browse")),
                                                  ("shift_swe_search", ("swe", "search"))])
def test_shifting_mix_follows_its_schedule(experiment, families):
    cfg = compose_config([f"+experiment={experiment}"])
    assert cfg.mode.name == "async" and cfg.cluster.name == "moe_h200"
    w = instantiate(cfg.workload, seed=0)
    schedule = {int(e.step): dict(e.weights) for e in cfg.workload.schedule}
    assert len(schedule) >= 3, "the weights must move more than once"
    weights = {}
    for step in range(cfg.mode.num_steps):
        weights = schedule.get(step, weights)   # an entry holds until the next one
        scripts = w.batch(step)
        assert len(scripts) == w.batch_size * w.group_size
        assert {s.step for s in scripts} == {step}
        count = Counter(s.family for s in scripts)
        assert set(count) <= set(families)
        total = sum(weights.values())
        for name in families:
            groups = count[name] / w.group_size
            assert groups == int(groups), f"step {step}: {name} is not made of whole GRPO groups"
            assert abs(groups - weights.get(name, 0.0) / total * w.batch_size) < 1, (step, name, count)
    # the heavy family flips: the first entry's majority is the minority one entry later
    first, second = schedule[0], schedule[sorted(schedule)[1]]
    heavy = max(first, key=first.get)
    assert second[heavy] < 0.5 * sum(second.values())


def test_a_phase_alone_keeps_one_mix():
    """The documented way to run one phase: a one-entry schedule gives the same shares every step."""
    cfg = compose_config(["+experiment=shift_reason_browse", "mode.num_steps=4",
                          "workload.schedule=[{step:0,weights:{reasoning:0.9,browse:0.1}}]"])
    w = instantiate(cfg.workload, seed=0)
    shares = {step: Counter(s.family for s in w.batch(step)) for step in range(cfg.mode.num_steps)}
    assert len({tuple(sorted(c.items())) for c in shares.values()}) == 1
    assert shares[0]["reasoning"] == round(0.9 * w.batch_size) * w.group_size


def test_policies_are_told_each_steps_shares_not_the_scripts():
    """RunInfo.step_weights: the family shares of every step's batch, as the schedule declares them
    (shift_reason_browse: reasoning-heavy steps 0-1 and 4-5, browse-heavy 2-3 and 6-7)."""
    from harness.experiment import run_info
    from harness.rollout import ModeConfig
    from omegaconf import OmegaConf
    cfg = compose_config(["+experiment=shift_reason_browse"])
    info = run_info(ModeConfig(**OmegaConf.to_container(cfg.mode, resolve=True)),
                    instantiate(cfg.workload, seed=0))
    assert len(info.step_weights) == cfg.mode.num_steps and info.weights == info.step_weights[0]
    heavy = [max(w, key=w.get) for w in info.step_weights]
    assert heavy == ["reasoning", "reasoning", "browse", "browse"] * 2
    assert all(abs(sum(w.values()) - 1) < 1e-9 and max(w.values()) > 0.7 for w in info.step_weights)
