"""Every workload config x every policy config x sync and async runs end to end on the simulator
(harness.experiment.run_experiment, as `python run.py` does), at small sizes, and its results keep
the simulator's invariants (tests/test_sim_invariants.py) and write every output file.

The lists are read from configs/, so a new workload or policy YAML joins the matrix. The trace
workload replays a small file exported here from the mix, so it holds two families.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from harness.experiment import run_experiment, run_info
from harness.rollout import ModeConfig
from tests.conftest import CONFIGS, load_config
from tests.test_sim_invariants import check_invariants
from workloads.card import build
from workloads.trace import export_trace

WORKLOADS = sorted(p.stem for p in (Path(CONFIGS) / "workload").glob("*.yaml"))
POLICIES = sorted(p.stem for p in (Path(CONFIGS) / "policy").glob("*.yaml"))
MODES = {"sync": ["mode=sync"], "async": ["mode=async", "mode.max_in_flight=3"]}
SIZES = ["workload.batch_size=2", "workload.group_size=2"]
FORECASTING = {"prorsa"}   # the policies that write forecast.parquet
FILES = ["summary.json", "lifecycle.parquet", "engines.parquet", "timeseries.parquet"]


def small(workload: str, trace: Path | None = None) -> list[str]:
    """Overrides that shrink `workload` to 2 prompts x 2 samples of at most 3 turns (a mix: per component)."""
    if workload == "trace":
        return ["workload=trace", f"workload.path={trace}"]
    if workload == "requests":   # the serving benchmark's requests, here as a batch of one-turn trajectories
        return ["workload=requests", "workload.num_requests=4", "workload.prompt_tokens=500", "workload.output_tokens=40"]
    cfg = load_config([f"workload={workload}"]).workload
    turns = [f"workload.components.{c}.max_turns=3" for c in cfg.components] if "components" in cfg \
        else ["workload.max_turns=3"]
    return [f"workload={workload}", *SIZES, *turns]


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "mix.jsonl"
    export_trace(build(small("mix") + ["workload.batch_size=4"]), 1, path)   # 3 search and 1 swe groups
    return path


def test_the_matrix_covers_the_families():
    assert {"search", "search_long", "swe", "tooluse", "synthetic", "mix", "trace"} <= set(WORKLOADS)
    assert {"colocate", "fixed_pd", "ppd", "reactive_pd", "prorsa", "oracle_pd"} <= set(POLICIES)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_priors_cover_every_family_drawn(workload, trace):
    cfg = load_config(small(workload, trace))
    run = run_info(ModeConfig(**OmegaConf.to_container(cfg.mode)), instantiate(cfg.workload, seed=cfg.seed))
    assert set(run.weights) <= set(run.priors) and sum(run.weights.values()) == pytest.approx(1.0)
    for family in run.priors.values():
        for prior in vars(family).values():
            if isinstance(prior, int):   # the caps
                assert prior >= 1
                continue
            if isinstance(prior, float):   # the share of output length a trajectory's turns share
                assert 0 <= prior <= 1
                continue
            if isinstance(prior, tuple):   # recorded trajectories in their groups (a trace's)
                assert all(len(x.tool_outputs) == len(x.tool_latencies) == len(x.outputs) - 1
                           for group in prior for x in group)
                assert bool(prior) == (workload == "trace")
                continue
            assert prior.median >= 0 and prior.sigma >= 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("workload", WORKLOADS)
def test_runs_and_keeps_the_invariants(workload, policy, mode, trace, tmp_path):
    cfg = load_config([*small(workload, trace), f"policy={policy}", *MODES[mode], "mode.num_steps=2",
                       "cluster.num_engines=4"])
    summary = run_experiment(cfg, tmp_path)
    for name in FILES + (["forecast.parquet"] if policy in FORECASTING else []):
        assert (tmp_path / name).is_file(), name
    assert json.loads((tmp_path / "summary.json").read_text())["config_hash"] == summary["config_hash"]
    # The scripts the run replayed (a workload is deterministic per seed and step).
    replayed = instantiate(cfg.workload, seed=cfg.seed)
    scripts = [s for step in range(cfg.mode.num_steps) for s in replayed.batch(step)]
    assert summary["completed_trajectories"] == summary["num_trajectories"] == len(scripts)
    df = pd.read_parquet(tmp_path / "lifecycle.parquet")
    check_invariants(scripts, df, summary["rollout_time_s"])
