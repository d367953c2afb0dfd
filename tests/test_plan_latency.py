"""Plans off the critical path in the simulator: a plan's decision applies after the latency the policy
charges (`policy.plan_latency`), a decision whose state moved too far is dropped, and summary.json
reports the plans' cost. Hand-made cases with known answers."""
from __future__ import annotations

import json

import pytest

from harness.api import ClusterView, EngineState, EventKind, Role
from harness.experiment import plan_metrics
from harness.rollout import PlanRecord
from tests.conftest import SwitchAt, simulate

SMALL = ["workload=synthetic", "workload.batch_size=6", "workload.group_size=4", "mode.num_steps=1",
         "cluster.num_engines=3", "cluster.switch_mechanism=kv_both"]


def switch_starts(latency_s: float) -> tuple[list[float], object]:
    policy = SwitchAt([Role.COLOCATED] * 3, {0: Role.PREFILL, 1: Role.DECODE}, at_s=3.0, control_interval_s=1.0,
                      latency_s=latency_s)
    result, _, _ = simulate(SMALL, policy=policy, keep_events=True)
    return sorted(e.t for e in result.events if e.kind == EventKind.ROLE_SWITCH_START), result


@pytest.mark.parametrize("latency", [0.0, 5.0, 2.5])
def test_a_decision_applies_after_the_plans_latency(latency):
    """The plan at the 3-s tick switches engines 0 and 1: at 3 s with no latency, at 3 s + latency
    otherwise, and the record says when it was asked, what it cost and how long it took."""
    starts, result = switch_starts(latency)
    assert starts == pytest.approx([3.0 + latency] * 2)
    (record,) = result.plans
    assert record.t == pytest.approx(3.0) and record.latency_s == pytest.approx(latency)
    assert record.cpu_s >= 0 and not record.dropped_stale


def test_no_tick_plans_while_a_plan_is_in_flight():
    """A plan in flight holds the ticks back: the driver asks no plan of the policy until the last
    one's decision applies (a 5-s plan at 3 s; ticks at 4-7 s skipped)."""
    asked = []

    class Counting(SwitchAt):
        def plan(self, view):
            asked.append(round(view.now, 6))
            return super().plan(view)
    policy = Counting([Role.COLOCATED] * 3, {0: Role.PREFILL}, at_s=3.0, control_interval_s=1.0, latency_s=5.0)
    simulate(SMALL, policy=policy)
    # the step start's plan and the first tick's at 0 s, then a tick each second until the plan at 3 s
    assert asked[:5] == [0.0, 0.0, 1.0, 2.0, 3.0] and 4.0 not in asked and 7.0 not in asked and 8.0 in asked


def view_of(roles: list[Role], now: float = 0.0, target: Role | None = None) -> ClusterView:
    engines = [EngineState(i, r, target is None or i != 0, 1, 0, 0, 0, 0, 0, 1000,
                           target_role=target if i == 0 else None) for i, r in enumerate(roles)]
    return ClusterView(now=now, engines=engines)


def test_a_decision_is_dropped_when_an_engine_changed_since_its_plan():
    """A switch that begins on another engine between the plan and its application (a failure's
    recovery, another policy action) makes the decision stale: it is dropped, and counted."""
    from harness.rollout import RolloutDriver, _Asked
    driver = RolloutDriver.__new__(RolloutDriver)
    driver.step_windows, driver.started, driver.completed = [], 10, 0
    asked = _Asked(view_of([Role.COLOCATED] * 2), 0, 10, 0, None)
    assert not driver._stale(asked, view_of([Role.COLOCATED] * 2, now=5.0))
    assert driver._stale(asked, view_of([Role.COLOCATED] * 2, now=5.0, target=Role.PREFILL))
    driver.completed = 5    # half of the 10 in flight ended: not yet
    assert not driver._stale(asked, view_of([Role.COLOCATED] * 2, now=5.0))
    driver.completed = 6    # more than half
    assert driver._stale(asked, view_of([Role.COLOCATED] * 2, now=5.0))
    driver.completed, driver.step_windows = 0, [(5.0, float("nan"))]   # a sync step began
    assert driver._stale(asked, view_of([Role.COLOCATED] * 2, now=5.0))


def test_plan_metrics_known_answer():
    plans = [PlanRecord(0.0, 0.2, 1.0), PlanRecord(10.0, 0.4, 3.0, dropped_stale=True), PlanRecord(20.0, 1.0, 2.0)]
    assert plan_metrics(plans) == {"plans": 3, "plans_dropped_stale": 1, "plan_cpu_s_p50": 0.4, "plan_cpu_s_max": 1.0,
                                   "plan_latency_s_p50": 2.0, "plan_latency_s_max": 3.0}
    assert plan_metrics([])["plans"] == 0


def test_prorsa_charges_its_plan_latency_and_reports_it(tmp_path):
    """Prorsa with `policy.plan_latency=5`: every plan's decision applies 5 s after its tick, and
    summary.json has the plan fields; with `model`, the latency is its what-if events at the rate."""
    from harness.experiment import run_experiment
    from tests.conftest import load_config
    base = ["policy=prorsa", "workload=synthetic", "workload.batch_size=4", "workload.group_size=4",
            "mode.num_steps=2", "logger=none", "progress_interval_s=0"]
    summary = run_experiment(load_config(base + ["policy.plan_latency=5"]), tmp_path / "five")
    assert summary["plans"] >= 2 and summary["plan_latency_s_p50"] == pytest.approx(5.0)
    assert summary["plan_latency_s_max"] == pytest.approx(5.0) and summary["plan_cpu_s_max"] > 0
    assert summary["start_plan_cpu_s"] > 0   # the start plan ran what-ifs: its CPU is reported apart
    on_disk = json.loads((tmp_path / "five" / "summary.json").read_text())
    assert {k: on_disk[k] for k in summary if k.startswith("plan")} == {k: summary[k] for k in summary if k.startswith("plan")}
    from harness.experiment import run_rollout
    result, _ = run_rollout(load_config(base + ["policy.plan_latency=model", "policy.plan_events_per_s=1000"]))
    events = [p.latency_s * 1000 for p in result.plans]   # each plan's what-if events, at 1,000 per second
    assert len(events) >= 2 and all(e >= 1 and e == pytest.approx(round(e), abs=1e-6) for e in events)
