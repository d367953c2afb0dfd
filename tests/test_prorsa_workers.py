"""A plan's independent what-if runs on forked workers (harness/prorsa/workers.py): the same results as
one process, in the same order, with the work done in other processes."""
from __future__ import annotations

import os

import pandas as pd
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from harness.experiment import run_info
from harness.prorsa.workers import FORK, PlanWorkers, available_cpus
from harness.rollout import ModeConfig
from tests.conftest import cluster_of, load_config, simulate

pytestmark = pytest.mark.skipif(not FORK, reason="forked workers need the fork start method (Linux)")


def square_and_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def test_map_keeps_the_order_and_runs_on_other_processes():
    out = PlanWorkers(3).map(square_and_pid, list(range(10)))
    assert [v for v, _ in out] == [x * x for x in range(10)]
    pids = {pid for _, pid in out}
    assert len(pids) == 3 and os.getpid() in pids
    # item i on worker i mod 3: items 1, 4 and 7 share a process, which is not this one
    assert out[1][1] == out[4][1] == out[7][1] != os.getpid()


def test_a_failing_worker_names_what_failed():
    def fails_on_five(x: int) -> int:
        if x == 5:
            raise ValueError("five is out")
        return x
    with pytest.raises(RuntimeError, match="a plan worker failed:(.|\n)*ValueError: five is out"):
        PlanWorkers(2).map(fails_on_five, list(range(8)))


def test_auto_takes_the_cpus_this_process_may_use():
    assert PlanWorkers.of("auto").count == len(os.sched_getaffinity(0))
    assert PlanWorkers.of(3).count == 3


def start(overrides: list[str], workers: int):
    """The start plan's choice, scores and what-if events with `workers` processes."""
    overrides = [*overrides, "policy=prorsa", f"policy.plan_workers={workers}"]
    cfg = load_config(overrides)
    mode = ModeConfig(**OmegaConf.to_container(cfg.mode, resolve=True))
    policy = instantiate(cfg.policy)
    roles = policy.initial_roles(cluster_of(overrides), run_info(mode, instantiate(cfg.workload, seed=cfg.seed)))
    return roles, policy.planner._last, policy.planner.whatif.events


@pytest.mark.parametrize("overrides", [
    ["+experiment=heavy_prefill", "workload.batch_size=16"],
    # async, two task families: the start is hedged over each family alone (more runs on the workers)
    ["+experiment=capture_flip_async", "workload.batch_size=8", "mode.max_in_flight=32"],
], ids=["sync", "async_hedged"])
def test_the_start_plan_is_the_same_on_any_number_of_workers(overrides):
    one = start(overrides, 1)
    assert one[2] > 0
    assert start(overrides, 3) == one


def test_a_run_with_checks_is_the_same_on_two_workers(monkeypatch):
    """A sync curriculum whose phases want other splits: Prorsa's start, its step-start plans and its
    fresh-sample checks run on the workers; the lifecycle is the same to the byte as with one
    process."""
    from harness.prorsa.planner import Planner
    checks = []
    check = Planner.check
    monkeypatch.setattr(Planner, "check", lambda self, *a, **k: checks.append(1) or check(self, *a, **k))
    base = ["+experiment=shift_reason_browse_sync", "workload.batch_size=4", "mode.num_steps=4", "policy=prorsa"]
    result, one, _ = simulate([*base, "policy.plan_workers=1"])
    assert checks and result.num_role_switches > 0
    _, two, _ = simulate([*base, "policy.plan_workers=2"])
    pd.testing.assert_frame_equal(one, two)


def test_auto_under_ray_takes_the_cpus_ray_assigned_the_task():
    """A sweep under `hydra/launcher=ray` runs each job as a Ray task of one CPU: its plans stay in one
    process rather than each job forking one worker per core."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert ray.get(ray.remote(num_cpus=1)(available_cpus).remote()) == 1
        assert ray.get(ray.remote(num_cpus=2)(available_cpus).remote()) == 2
    finally:
        ray.shutdown()
