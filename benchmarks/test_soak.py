"""Soak: an async simulator run of 10,000 trajectories with Prorsa. Memory must stay flat after warm-up
and Prorsa's plans must not slow down as the run goes on (its history is bounded: the tracker keeps
the newest values per family, harness/prorsa/tracker.py HISTORY).

Reported by pytest-benchmark, never asserted against wall time. `extra_info`: resident memory when a
quarter of the trajectories have ended and at the end (growth ratio), and the mean plan time in the
first and last quarter of the plans (ratio). Marked `large` (about two minutes): `-m large` runs it.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
from hydra.utils import instantiate

from harness.api import EventKind
from harness.experiment import run_rollout
from tests.conftest import load_config

# search (short trajectories, fast tools) at 10,000 trajectories: 20 batches of 100 prompts x 5
SOAK = ["policy=prorsa", "workload=search", "mode=async", "mode.num_steps=20", "mode.max_in_flight=256",
        "workload.batch_size=100", "cluster=dense8_h100", "logger=none"]
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class Probe:
    """Wraps the policy: times each plan and samples resident memory as trajectories end."""

    def __init__(self, policy, total: int):
        self.policy, self.total = policy, total
        self.plan_s: list[float] = []
        self.rss: dict[str, int] = {}
        self.ended = 0

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def observe(self, event):
        self.policy.observe(event)
        if event.kind == EventKind.TRAJECTORY_END:
            self.ended += 1
            if self.ended == self.total // 4:
                self.rss["quarter"] = rss_bytes()

    def plan(self, view):
        due = self.policy._plans
        t = time.perf_counter()
        out = self.policy.plan(view)
        if self.policy._plans > due:
            self.plan_s.append(time.perf_counter() - t)
        return out


@pytest.mark.large
def test_soak_10000_trajectories_async_prorsa(benchmark):
    cfg = load_config(SOAK)
    total = cfg.mode.num_steps * cfg.workload.batch_size * cfg.workload.group_size
    assert total == 10_000
    probes = []

    def plan_latency_s(self, cpu_s: float) -> None:
        return None   # never plans

    def run():
        probe = Probe(instantiate(cfg.policy), total)
        result, _ = run_rollout(cfg, policy=probe)
        probe.rss["end"] = rss_bytes()
        probes.append(probe)
        return result

    result = benchmark.pedantic(run, rounds=1, iterations=1)
    assert len({r.trajectory_id for r in result.records}) == total
    probe = probes[-1]
    quarter = max(len(probe.plan_s) // 4, 1)
    first, last = np.mean(probe.plan_s[:quarter]), np.mean(probe.plan_s[-quarter:])
    benchmark.extra_info.update({
        "trajectories": total, "plans": len(probe.plan_s),
        "rss_quarter_mb": probe.rss["quarter"] / 2**20, "rss_end_mb": probe.rss["end"] / 2**20,
        "rss_growth_after_warmup": probe.rss["end"] / probe.rss["quarter"],
        "plan_s_first_quarter": first, "plan_s_last_quarter": last, "plan_time_ratio_last_first": last / first,
        "history_per_family": probe.policy.tracker.history})
    assert len(probe.policy.tracker.outputs["search"]) <= probe.policy.tracker.history
