"""The reasoning and browse families and the shifting-mix experiments (configs/experiment/shift_*.yaml).

- each new family generates the statistics its YAML states (the `targets`, e.g. the mean output per
  turn of reasoning and the mean page size of browse), within workloads/stats.py's tolerances;
- the two families sit on opposite sides of the P/D balance (reasoning decodes, browse prefills);
- a shifting experiment's per-step family shares follow its schedule, with whole GRPO groups.
"""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from harness.trajectory import validate_script
from workloads.stats import compare

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def compose_config(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose(config_name="config", overrides=["logger=none", *overrides])


@pytest.fixture(scope="module", params=["reasoning", "browse"])
def family(request):
    """A large sample (~2500 trajectories) of one family, so sampling noise is small."""
    w = instantiate(compose_config([f"workload={request.param}"]).workload, seed=0)
    w.batch_size = math.ceil(2500 / w.group_size)
    return w, w.sample(0)


def test_family_statistics_match_their_yaml(family):
    w, labelled = family
    rows = compare(labelled, w.targets)
    assert {r["metric"] for r in rows} >= {"output_tokens", "tool_output_tokens", "tool_latency_s"}
    bad = [r for r in rows if not r["ok"]]
    assert not bad, "\n".join(f"{w.name}: {r['metric']} {r['stat']} generated {r['generated']:.4g}, "
                              f"yaml {r['published']:.4g} ({r['tolerance']})" for r in bad)


def test_family_scripts_respect_the_recipe_caps(family):
    w, labelled = family
    for script, _ in labelled:
        validate_script(script)
        assert len(script.turns) <= w.max_turns
        for k, t in enumerate(script.turns):
            assert 1 <= t.output_tokens <= w.max_output_tokens
            assert script.prompt_tokens(k) + t.output_tokens <= w.context_cap


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
