"""Soak: an async simulator run of 40,000 trajectories with Prorsa. Memory must stay flat after warm-up
and Prorsa's plans must not slow down as the run goes on (its history is bounded: the tracker keeps
the newest values per family, harness/prorsa/tracker.py HISTORY; the driver keeps an ended trajectory's
turns as columns and of its script only its lower-bound inputs, harness/rollout.py).

Resident memory is sampled every 4,000 ended trajectories and printed (`-s`); the run fails if it grows
by more than RSS_GROWTH from a quarter of the trajectories (warm-up done) to the last. Plan times are
reported by pytest-benchmark, never asserted against wall time. Marked `large` (minutes): `-m large`
runs it.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
from hydra.utils import instantiate

from harness.api import EventKind
from harness.experiment import lifecycle_frame, run_rollout
from tests.conftest import load_config

# search (short trajectories, fast tools) at 40,000 trajectories: 80 batches of 100 prompts x 5
SOAK = ["policy=prorsa", "workload=search", "mode=async", "mode.num_steps=80", "mode.max_in_flight=256",
        "workload.batch_size=100", "cluster=dense8_h100", "logger=none"]
EVERY = 4_000           # trajectories ended between two memory samples
RSS_GROWTH = 1.10       # resident memory at the end over that at a quarter of the trajectories, at most
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class Probe:
    """Wraps the policy: times each plan and samples resident memory as trajectories end."""

    def __init__(self, policy, marks: set[int]):
        self.policy, self.marks = policy, marks
        self.plan_s: list[float] = []
        self.rss: dict[int, int] = {}   # trajectories ended -> resident bytes then
        self.ended = 0

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def observe(self, event):
        self.policy.observe(event)
        if event.kind == EventKind.TRAJECTORY_END:
            self.ended += 1
            if self.ended in self.marks:
                self.rss[self.ended] = rss_bytes()
                print(f"soak: {self.ended:6d} trajectories ended, RSS {self.rss[self.ended] / 2**20:7.1f} MiB",
                      flush=True)

    def plan(self, view):
        due = self.policy._plans
        t = time.perf_counter()
        out = self.policy.plan(view)
        if self.policy._plans > due:
            self.plan_s.append(time.perf_counter() - t)
        return out


@pytest.mark.large
def test_soak_40000_trajectories_async_prorsa(benchmark):
    cfg = load_config(SOAK)
    total = cfg.mode.num_steps * cfg.workload.batch_size * cfg.workload.group_size
    assert total == 40_000
    warm = total // 4
    probes = []

    def run():
        probe = Probe(instantiate(cfg.policy), {*range(EVERY, total + 1, EVERY), warm})
        result, _ = run_rollout(cfg, policy=probe)
        probes.append(probe)
        return result

    result = benchmark.pedantic(run, rounds=1, iterations=1)
    assert lifecycle_frame(result)["trajectory_id"].nunique() == total
    probe = probes[-1]
    quarter = max(len(probe.plan_s) // 4, 1)
    first, last = np.mean(probe.plan_s[:quarter]), np.mean(probe.plan_s[-quarter:])
    growth = probe.rss[total] / probe.rss[warm]
    benchmark.extra_info.update({
        "trajectories": total, "plans": len(probe.plan_s),
        "rss_mb": {n: b / 2**20 for n, b in sorted(probe.rss.items())},
        "rss_growth_after_warmup": growth,
        "plan_s_first_quarter": first, "plan_s_last_quarter": last, "plan_time_ratio_last_first": last / first,
        "history_per_family": probe.policy.tracker.history})
    print(f"soak: RSS at {total} / at {warm} trajectories = {growth:.3f}")
    assert len(probe.policy.tracker.outputs["search"]) <= probe.policy.tracker.history
    assert growth <= RSS_GROWTH, (f"resident memory grew {growth:.3f}x from {warm} to {total} trajectories "
                                  f"(at most {RSS_GROWTH}x)")
