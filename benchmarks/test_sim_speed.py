"""Simulator speed: one synchronous RL step of 1024 trajectories x ~20 turns on a 64-GPU cluster.

Reported, never asserted against wall time: pytest-benchmark prints the wall time, and
`extra_info` carries simulated events per second and simulated tokens per wall second.
Run: `.venv/bin/python -m pytest benchmarks -q --benchmark-enable`.
"""
import time

import pytest

from tests.conftest import simulate

BIG = ["cluster=moe_h200", "cluster.num_engines=16", "mode=sync", "mode.num_steps=1",
       "workload.batch_size=128", "workload.group_size=8", "workload.turns_median=20", "workload.turns_sigma=0.2",
       "workload.group_sigma=0.1", "workload.max_turns=30", "workload.tool_output_median=400",
       "workload.output_median=200", "workload.prompt_median=1000"]


@pytest.mark.parametrize("policy", ["policy=colocate", "policy=fixed_pd"])
def test_one_rl_step_1024_trajectories_64_gpus(benchmark, policy):
    def once():
        t0 = time.perf_counter()
        result, df, backend = simulate(BIG + [policy, "policy.num_prefill=6"] if "fixed" in policy else BIG + [policy])
        return result, df, backend, time.perf_counter() - t0

    result, df, backend, wall = benchmark.pedantic(once, rounds=1, iterations=1)
    tokens = int(df.new_tokens.sum() + df.output_tokens.sum())
    benchmark.extra_info.update({
        "trajectories": len(result.scripts), "turns": len(df), "events": backend.loop.events_processed,
        "events_per_s": backend.loop.events_processed / wall, "sim_tokens_per_wall_s": tokens / wall,
        "simulated_s": result.rollout_time_s})
    assert len(result.scripts) == 1024
    assert df.turn.groupby(df.trajectory_id).size().mean() > 15
