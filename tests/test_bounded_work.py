"""Work in proportion to what happens, not to simulated time: the cluster sampler and the policy's control
tick widen their intervals in a long stretch where nothing but ticks run (harness/ticks.py), so a day-long
tool call sampled every 10 ms is a few thousand samples, not millions, and a policy ticked every 100 ms
plans about a thousand times, not 800,000; values beyond what a day or the hardware allows are refused by
the schema with the key named (tests/test_bad_input.py runs them through run.py)."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from baselines.reactive_pd import ReactivePD
from harness.experiment import lifecycle_frame, run_experiment, run_rollout
from harness.ticks import IDLE_TICKS
from tests.conftest import load_config, policy_of


def trace(path, tool_latency_s: float, groups: int = 2, last_output_tokens: int = 10) -> None:
    turns = [{"new_tokens": 100, "output_tokens": 20, "tool_latency_s": tool_latency_s, "tool_output_tokens": 30},
             {"new_tokens": 30, "output_tokens": last_output_tokens, "tool_latency_s": 0.0, "tool_output_tokens": 0}]
    path.write_text("".join(json.dumps({"group": g, "family": "swe", "turns": turns}) + "\n" for g in range(groups)))


def test_a_long_idle_tool_call_costs_samples_in_proportion_to_the_events(tmp_path):
    trace(tmp_path / "t.jsonl", 80000.0)   # 8,000,000 intervals of 10 ms in which nothing happens
    cfg = load_config(["workload=trace", f"workload.path={tmp_path / 't.jsonl'}", "mode.num_steps=1",
                       "sample_interval_s=0.01", "progress_interval_s=0"])
    summary = run_experiment(cfg, tmp_path / "run")
    samples = pd.read_parquet(tmp_path / "run" / "timeseries.parquet")
    assert summary["rollout_time_s"] > 80000
    assert len(samples) < 3 * IDLE_TICKS + 100
    assert samples["t_s"].is_monotonic_increasing
    busy = samples[samples["t_s"] < 1.0]   # the first turns, before the tool call: every 10 ms
    assert len(busy) > 10 and busy["t_s"].diff().dropna().round(9).eq(0.01).all()


def test_a_busy_run_is_sampled_on_the_grid(tmp_path):
    cfg = load_config(["workload.batch_size=4", "workload.group_size=2", "mode.num_steps=1", "sample_interval_s=0.5",
                       "progress_interval_s=0"])
    summary = run_experiment(cfg, tmp_path)
    samples = pd.read_parquet(tmp_path / "timeseries.parquet")
    assert abs(len(samples) - summary["rollout_time_s"] / 0.5) <= 2
    assert samples["t_s"].diff().dropna().round(9).eq(0.5).all()


class CountingPD(ReactivePD):
    """reactive_pd (which never switches on this load) recording when it is asked to plan; with
    `latency_s`, each plan is applied that long after it (an event of the control tick's own)."""

    def __init__(self, latency_s: float | None = None, **settings):
        super().__init__(**settings)
        self.latency_s, self.asked = latency_s, []

    def plan(self, view):
        self.asked.append(view.now)
        return super().plan(view)

    def plan_latency_s(self, cpu_s: float) -> float | None:
        return self.latency_s


TOOL_S, CONTROL_S = 80000.0, 0.1   # 800,000 control intervals in which nothing happens


def idle_ticks_bound(idle_s: float, interval_s: float) -> float:
    """Ticks over an idle stretch of `idle_s` by the rule: IDLE_TICKS (and one) on the grid, then one per
    doubling of the interval until the doubled intervals cover the stretch, and the two at its edges."""
    return IDLE_TICKS + 1 + math.ceil(math.log2(idle_s / interval_s)) + 2


@pytest.mark.parametrize("latency_s", [None, 0.05])
def test_a_long_idle_tool_call_costs_plans_in_proportion_to_the_events(tmp_path, latency_s):
    trace(tmp_path / "t.jsonl", TOOL_S, groups=1, last_output_tokens=200)   # one trajectory, its last turn ~2 s
    cfg = load_config(["workload=trace", f"workload.path={tmp_path / 't.jsonl'}", "mode.num_steps=1",
                       "policy=reactive_pd"])
    policy = policy_of("reactive_pd", _target_=f"{__name__}.CountingPD", control_interval_s=CONTROL_S,
                       latency_s=latency_s)
    result, _ = run_rollout(cfg, policy)
    turns = lifecycle_frame(result).sort_values("turn")
    first, last = turns.iloc[0], turns.iloc[1]

    # The result is the run's by hand: turn 0, the tool call, turn 1; the same as with no control tick
    # but for the latency of the plan the sync step starts with.
    assert last["t_ready"] - first["t_decode_end"] == pytest.approx(TOOL_S, abs=1e-6)
    assert result.rollout_time_s == last["t_decode_end"]
    static, _ = run_rollout(cfg, policy_of("fixed_pd", num_prefill=2))
    assert result.rollout_time_s == pytest.approx(static.rollout_time_s + (latency_s or 0.0), abs=1e-6)

    # Plans: on the grid while the turns run, IDLE_TICKS of them into the tool call, then a few doubling ones.
    busy_s = result.rollout_time_s - TOOL_S
    bound = busy_s / CONTROL_S + 2 + idle_ticks_bound(TOOL_S, CONTROL_S)
    assert IDLE_TICKS < len(policy.asked) <= bound < 1100
    if latency_s:
        assert len(result.plans) == len(policy.asked)   # each applied, its application a tick event
    # The tool's end wakes the tick: the policy plans within an interval of it and on the grid after.
    after = [t for t in policy.asked if t >= last["t_ready"]]
    assert after[0] - last["t_ready"] <= CONTROL_S + 1e-9
    assert len(after) >= (result.rollout_time_s - last["t_ready"]) / CONTROL_S - 1 > 10
    assert pd.Series(after).diff().dropna().round(9).eq(CONTROL_S).all()


def test_the_sampler_and_the_control_tick_do_not_keep_each_other_busy(tmp_path, monkeypatch):
    """Both tick through the tool call at intervals that never meet; each one's idle test discounts the
    other's ticks, so both widen (counting the other's tick as activity, neither ever would)."""
    asked = []
    plan = ReactivePD.plan
    monkeypatch.setattr(ReactivePD, "plan", lambda self, view: asked.append(view.now) or plan(self, view))
    trace(tmp_path / "t.jsonl", TOOL_S, groups=1)
    cfg = load_config(["workload=trace", f"workload.path={tmp_path / 't.jsonl'}", "mode.num_steps=1",
                       "policy=reactive_pd", f"policy.control_interval_s={CONTROL_S}", "sample_interval_s=0.03",
                       "progress_interval_s=0"])
    summary = run_experiment(cfg, tmp_path / "run")
    samples = pd.read_parquet(tmp_path / "run" / "timeseries.parquet")
    busy_s = summary["rollout_time_s"] - TOOL_S
    assert summary["rollout_time_s"] > TOOL_S
    assert IDLE_TICKS < len(asked) <= busy_s / CONTROL_S + 2 + idle_ticks_bound(TOOL_S, CONTROL_S)
    assert IDLE_TICKS < len(samples) <= busy_s / 0.03 + 2 + idle_ticks_bound(TOOL_S, 0.03)
