"""Workload generators: statistics against their YAML targets, invariants, groups, drift, mixes.

Samples are drawn at a large batch size (thousands of trajectories) so sampling noise is small
next to the tolerances of workloads/stats.py, which measure how well the fits match the papers.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from harness.experiment import instantiate_checked
from harness.trajectory import validate_script
from workloads.stats import compare, metric_values, statistic

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
FAMILIES = ("search", "search_long", "swe", "tooluse", "reasoning", "browse")


@functools.lru_cache(maxsize=None)
def workload_config(name: str, *overrides: str):
    """Composed once per distinct override list (composing is the slow part); instantiate copies it."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose(config_name="config", overrides=[f"workload={name}", *overrides]).workload


def build(name: str, *overrides: str, seed: int = 0):
    """The workload as a run builds it: its keys checked against its schema, then instantiated."""
    return instantiate_checked(workload_config(name, *overrides), "workload", seed=seed)


def large_sample(name: str, trajectories: int = 2500):
    w = build(name)
    w.batch_size = math.ceil(trajectories / w.group_size)
    return w, w.sample(0)


@pytest.fixture(scope="module", params=FAMILIES)
def family_sample(request):
    return large_sample(request.param)


def test_statistics_match_published_targets(family_sample):
    w, labelled = family_sample
    assert w.targets, f"{w.name}.yaml lists no published targets"
    rows = compare(labelled, w.targets)
    bad = [r for r in rows if not r["ok"]]
    assert not bad, "\n".join(f"{r['population']} {r['metric']} {r['stat']}: generated {r['generated']:.4g}, "
                              f"published {r['published']:.4g} ({r['tolerance']})" for r in bad)


def test_scripts_are_valid_and_respect_the_caps(family_sample):
    w, labelled = family_sample
    for script, _ in labelled:
        validate_script(script)
        assert len(script.turns) <= w.max_turns
        assert script.turns[0].new_tokens >= 1 and script.turns[0].new_tokens <= w.prompt.high
        assert script.turns[-1].tool_latency_s == 0.0
        for k, t in enumerate(script.turns):
            assert 1 <= t.output_tokens <= w.max_output_tokens
            assert script.prompt_tokens(k) + t.output_tokens <= w.context_cap
            if k:
                assert t.new_tokens <= w.tool_output.high


def test_yaml_config_values_are_what_is_generated():
    """Uncapped quantities have the configured medians (the YAML, not code, sets the numbers)."""
    w, labelled = large_sample("search")
    scripts = [s for s, _ in labelled]
    assert statistic(metric_values(scripts, "prompt_tokens"), "p50") == pytest.approx(w.prompt.median, rel=0.05)
    assert statistic(metric_values(scripts, "output_tokens"), "p50") == pytest.approx(w.output.median, rel=0.05)
    tight = build("search", "workload.output.median=40", "workload.output.sigma=0.0")
    assert {t.output_tokens for s in tight.batch(0) for t in s.turns} == {40}


@pytest.mark.parametrize("name", FAMILIES)
def test_batches_are_deterministic_sized_and_ids_unique(name):
    w = build(name)
    a, b = w.batch(1), build(name).batch(1)
    assert a == b
    assert build(name, seed=1).batch(1) != a
    batches = [w.batch(s) for s in range(3)]
    assert all(len(x) == w.batch_size * w.group_size for x in batches)
    scripts = [s for x in batches for s in x]
    assert len({s.trajectory_id for s in scripts}) == len(scripts)
    assert len({s.group_id for s in scripts}) == 3 * w.batch_size
    assert [s.step for s in batches[2]] == [2] * len(batches[2])
    assert {s.family for s in scripts} == {w.family}


def test_default_sizes_fit_a_laptop_run():
    for name in FAMILIES + ("mix",):
        w = build(name)
        assert 2 * w.batch_size * w.group_size <= 300, name


def test_group_members_share_the_prompt_and_are_correlated():
    w = build("swe", "workload.group_corr=0.6", "workload.batch_size=250",
              "workload.turns=[{name: one, weight: 1, median: 16, sigma: 0.48}]")
    scripts = w.batch(0)
    by_group: dict[int, list] = {}
    for s in scripts:
        by_group.setdefault(s.group_id, []).append(s)
    assert all(len({s.turns[0].new_tokens for s in g}) == 1 for g in by_group.values())
    # Within-group correlation of log turns: between-group share of the variance (ANOVA estimate).
    logs = np.array([[math.log(len(s.turns)) for s in g] for g in by_group.values()])
    between = logs.mean(axis=1).var(ddof=1) - logs.var(axis=1, ddof=1).mean() / logs.shape[1]
    icc = between / logs.var(ddof=1)
    assert icc == pytest.approx(0.6, abs=0.12)
    independent = build("swe", "workload.group_corr=0.0", "workload.batch_size=250",
                        "workload.turns=[{name: one, weight: 1, median: 16, sigma: 0.48}]").batch(0)
    logs0 = np.array([math.log(len(s.turns)) for s in independent]).reshape(250, -1)
    icc0 = (logs0.mean(axis=1).var(ddof=1) - logs0.var(axis=1, ddof=1).mean() / logs0.shape[1]) / logs0.var(ddof=1)
    assert abs(icc0) < 0.08


def test_turn_modes_per_group_keep_a_group_in_one_mode():
    w = build("tooluse", "workload.batch_size=50")
    labelled = w.sample(0)
    groups = [{mode for _, mode in labelled[g * w.group_size:(g + 1) * w.group_size]} for g in range(50)]
    assert all(len(modes) == 1 for modes in groups)
    assert len(set.union(*groups)) == 3


def test_drift_grows_outputs_and_turns_per_step():
    w = build("search_long", "workload.batch_size=60", "workload.group_corr=0",
              "workload.drift.output_per_step=0.1", "workload.drift.turns_per_step=0.05", "workload.context_cap=1000000", "workload.max_turns=1000",
              "workload.max_output_tokens=100000")
    out0 = statistic(metric_values(w.batch(0), "output_tokens"), "p50")
    out5 = statistic(metric_values(w.batch(5), "output_tokens"), "p50")
    assert out5 / out0 == pytest.approx(1.1 ** 5, rel=0.1)
    turns0 = metric_values(w.batch(0), "turns").mean()
    turns10 = metric_values(w.batch(10), "turns").mean()
    assert turns10 / turns0 == pytest.approx(1.05 ** 10, rel=0.12)
    assert build("search_long").batch(0) == build("search_long", "workload.drift.output_per_step=0.5").batch(0)


def test_context_cap_cuts_the_last_turn_and_ends_the_trajectory():
    w = build("swe", "workload.context_cap=6000", "workload.batch_size=50")
    for s in w.batch(0):
        end = s.prompt_tokens(len(s.turns) - 1) + s.turns[-1].output_tokens
        assert end <= 6000


@pytest.mark.parametrize("override, field", [
    ("workload.batch_size=0", "workload.batch_size"),
    ("workload.group_corr=1.5", "workload.group_corr"),
    ("+workload.output.mean=3", "workload.output"),
    ("workload.prompt.high=200000", "workload.prompt.high"),
    ("workload.turn_modes_per=prompt", "workload.turn_modes_per"),
])
def test_bad_config_names_the_key(override, field):
    with pytest.raises((ValueError, InstantiationException), match=field.replace(".", r"\.")):
        build("swe", override)


# --- mix ---------------------------------------------------------------------------------------

def test_mix_follows_its_weight_schedule_with_unique_ids():
    w = build("mix", "workload.batch_size=40",
              "workload.schedule=[{step: 0, weights: {search: 3, swe: 1}}, {step: 2, weights: {swe: 1}}]")
    expected = {0: {"search": 30, "swe": 10}, 1: {"search": 30, "swe": 10}, 2: {"search": 0, "swe": 40},
                3: {"search": 0, "swe": 40}}
    scripts = []
    for step, counts in expected.items():
        batch = w.batch(step)
        assert len(batch) == w.batch_size * w.group_size
        for family, n in counts.items():
            assert sum(s.family == family for s in batch) == n * w.group_size
        for g in range(w.batch_size):  # a group never mixes families
            assert len({s.family for s in batch[g * w.group_size:(g + 1) * w.group_size]}) == 1
        scripts += batch
    assert len({s.trajectory_id for s in scripts}) == len(scripts)
    assert len({s.group_id for s in scripts}) == 4 * w.batch_size
    assert w.batch(1) == build("mix", "workload.batch_size=40",
                               "workload.schedule=[{step: 0, weights: {search: 3, swe: 1}}, "
                               "{step: 2, weights: {swe: 1}}]").batch(1)


def test_mix_rounds_weights_by_largest_remainder():
    w = build("mix", "workload.batch_size=7",
              "workload.schedule=[{step: 0, weights: {search: 0.5, swe: 0.5}}]")
    assert sum(w.prompts(0).values()) == 7 and abs(w.prompts(0)["search"] - 3.5) == 0.5


def test_mix_rejects_unknown_components():
    with pytest.raises(InstantiationException, match=r"workload\.schedule\[0\]\.weights.*tooluse"):
        build("mix", "workload.schedule=[{step: 0, weights: {tooluse: 1}}]")


def test_config_files_cite_sources():
    """Each family YAML names its recipe and cites reference rows; no value without a comment nearby."""
    for name in FAMILIES:
        text = (CONFIGS / "workload" / f"{name}.yaml").read_text()
        assert "Recipe:" in text and "assumption" in text
        assert OmegaConf.load(CONFIGS / "workload" / f"{name}.yaml").targets
