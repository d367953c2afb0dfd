"""Reports from result files: a short table of one run."""
from __future__ import annotations

ROWS = [("policy", "{}"), ("workload", "{}"), ("mode", "{}"), ("cluster", "{}"),
        ("completed_trajectories", "{}"), ("rollout_time_s", "{:.2f}"), ("lower_bound_s", "{:.2f}"),
        ("efficiency_vs_lower_bound", "{:.2f}"), ("throughput_traj_per_s", "{:.3f}"),
        ("turn_latency_p50_s", "{:.2f}"), ("turn_latency_p99_s", "{:.2f}"), ("num_role_switches", "{}"),
        ("preemptions", "{}"), ("wall_time_s", "{:.2f}")]


def print_summary(summary: dict) -> None:
    width = max(len(k) for k, _ in ROWS)
    for key, fmt in ROWS:
        print(f"{key:<{width}}  {fmt.format(summary[key])}")
