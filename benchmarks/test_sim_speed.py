"""Simulator speed: one synchronous RL step of ~20-turn trajectories, 1,024 of them on 64 H200 (16
engines of 4 GPUs) and 16,384 on 1,024 H200 (256 engines, the same shape 16 times wider).

Reported, never asserted against wall time. Each round times `driver.run()` on a fresh rollout (what
summary.json's `wall_time_s` measures); `extra_info` has turns and simulated events per wall second,
microseconds per turn (the cost per turn should not grow with the cluster) and the peak RSS.
Run: `.venv/bin/python -m pytest benchmarks -q --benchmark-enable --benchmark-autosave`; the 1,024-GPU
case (about a minute, one round) is marked `large` and left out unless asked for: add `-m large`.
"""
from __future__ import annotations

import gc
import resource

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from harness.cluster import cluster_from_config
from harness.experiment import build_backend, run_info
from harness.rollout import ModeConfig, RolloutDriver
from tests.conftest import load_config

BIG = ["cluster=moe_h200", "cluster.num_engines=16", "mode=sync", "mode.num_steps=1",
       "workload.batch_size=128", "workload.group_size=8", "workload.turns.0.median=20", "workload.turns.0.sigma=0.2",
       "workload.group_corr=0.2", "workload.max_turns=30", "workload.tool_output.median=400",
       "workload.output.median=200", "workload.prompt.median=1000"]
WIDE = ["cluster.num_engines=256", "workload.batch_size=2048"]   # 1,024 GPUs, 16,384 trajectories
POLICIES = {"colocate": ["policy=colocate"], "fixed_pd": ["policy=fixed_pd", "policy.num_prefill=6"]}


def rollout(overrides: list[str]) -> tuple[RolloutDriver, object]:
    """A fresh driver and simulator for `overrides`, built outside the timed part."""
    cfg = load_config(overrides)
    cluster = cluster_from_config(OmegaConf.to_container(cfg.cluster, resolve=True))
    mode = ModeConfig(**OmegaConf.to_container(cfg.mode, resolve=True))
    workload = instantiate(cfg.workload, seed=cfg.seed)
    policy = instantiate(cfg.policy)
    backend = build_backend(cfg, cluster, policy.initial_roles(cluster, run_info(mode, workload)))
    return RolloutDriver(workload, policy, backend, mode), backend


def run_benchmark(benchmark, overrides: list[str], rounds: int):
    last: list = []   # the newest round's backend, for its counters

    def setup():
        # Earlier rounds' drivers and backends (reference cycles) are collected before the next one is
        # built, outside the timed part; the timed call takes its driver out of `held`, so pytest-benchmark
        # keeps no reference to it.
        last.clear()
        gc.collect()
        driver, backend = rollout(overrides)
        last.append(backend)
        return ([driver],), {}

    result = benchmark.pedantic(lambda held: held.pop().run(), setup=setup, rounds=rounds, iterations=1)
    turns, events = len(result.turns), last[0].loop.events_processed
    info = {"trajectories": result.trajectories, "turns": turns, "events": events,
            "simulated_s": result.rollout_time_s, "gpus": last[0].cluster.num_gpus,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if benchmark.stats:   # none under --benchmark-disable
        wall = benchmark.stats.stats.min
        info.update(wall_s=wall, turns_per_s=turns / wall, events_per_s=events / wall, us_per_turn=wall / turns * 1e6)
    benchmark.extra_info.update(info)
    return result


@pytest.mark.parametrize("policy", POLICIES)
def test_one_rl_step_1024_trajectories_64_gpus(benchmark, policy):
    result = run_benchmark(benchmark, BIG + POLICIES[policy], rounds=3)
    assert result.trajectories == 1024
    assert len(result.turns) / result.trajectories > 15


@pytest.mark.large
def test_one_rl_step_16384_trajectories_1024_gpus(benchmark):
    result = run_benchmark(benchmark, BIG + WIDE + POLICIES["colocate"], rounds=1)
    assert result.trajectories == 16384
    assert len(result.turns) / result.trajectories > 15
