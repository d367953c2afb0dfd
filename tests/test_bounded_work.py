"""Work in proportion to what happens, not to simulated time: the cluster sampler widens its interval in a
long stretch where nothing but itself runs (harness/timeseries.py), so a day-long tool call sampled every
10 ms is a few thousand samples, not millions; values beyond what a day or the hardware allows are
refused by the schema with the key named (tests/test_bad_input.py runs them through run.py)."""
from __future__ import annotations

import json

import pandas as pd

from harness.experiment import run_experiment
from harness.timeseries import IDLE_TICKS
from tests.conftest import load_config


def trace(path, tool_latency_s: float) -> None:
    turns = [{"new_tokens": 100, "output_tokens": 20, "tool_latency_s": tool_latency_s, "tool_output_tokens": 30},
             {"new_tokens": 30, "output_tokens": 10, "tool_latency_s": 0.0, "tool_output_tokens": 0}]
    path.write_text("".join(json.dumps({"group": g, "family": "swe", "turns": turns}) + "\n" for g in range(2)))


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
