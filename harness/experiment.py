"""One run: build workload, policy, backend and driver from a resolved config; write the result files.

Every run writes, next to Hydra's `.hydra/config.yaml`: lifecycle.parquet (one row per turn),
engines.parquet (each engine's role over time and its utilisation) and summary.json. Files are
written to a temporary name and renamed, so a crash never leaves a half-written result; summary.json
is written last and marks the run complete.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pandas as pd
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from harness.cluster import ClusterConfig, cluster_from_config
from harness.metrics import lower_bound_s, turn_latency_percentiles
from harness.rollout import ModeConfig, RolloutDriver, RolloutResult
from harness.trajectory import TURN_COLUMNS

SUMMARY = "summary.json"


def build_backend(cfg: DictConfig, cluster: ClusterConfig, roles):
    name = cfg.backend.name
    if name == "sim":
        from harness.sim.backend import SimBackend
        return SimBackend(cluster, roles, fast_forward=bool(cfg.backend.fast_forward))
    raise ValueError(f"backend.name={name!r} is not available; allowed: sim")


def run_experiment(cfg: DictConfig, out_dir: str | os.PathLike) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Everything is validated before anything is simulated.
    cluster = cluster_from_config(OmegaConf.to_container(cfg.cluster, resolve=True))
    mode = ModeConfig(**OmegaConf.to_container(cfg.mode, resolve=True))
    workload = instantiate(cfg.workload, seed=cfg.seed)
    policy = instantiate(cfg.policy)
    roles = policy.initial_roles(cluster.num_engines)
    backend = build_backend(cfg, cluster, roles)
    wall0 = time.perf_counter()
    result = RolloutDriver(workload, policy, backend, mode).run()
    wall = time.perf_counter() - wall0
    summary = summarize(cfg, cluster, mode, result, backend, wall, policy.name, workload.name)
    write_results(out, result, backend.engine_timeline(), summary)
    return summary


def lifecycle_frame(result: RolloutResult) -> pd.DataFrame:
    return pd.DataFrame([r.__dict__ for r in result.records], columns=TURN_COLUMNS)


def summarize(cfg, cluster: ClusterConfig, mode: ModeConfig, result: RolloutResult, backend, wall_s: float,
              policy_name: str, workload_name: str) -> dict:
    df = lifecycle_frame(result)
    done = int(df.groupby("trajectory_id")["t_decode_end"].apply(lambda s: s.notna().all()).sum()) if len(df) else 0
    lb = lower_bound_s(cluster, result.scripts, mode.name)
    summary = {
        "policy": policy_name, "workload": workload_name, "mode": mode.name,
        "backend": str(cfg.backend.name), "cluster": cluster.name, "seed": int(cfg.seed),
        "num_trajectories": len(result.scripts), "completed_trajectories": done,
        "rollout_time_s": result.rollout_time_s,
        "throughput_traj_per_s": done / result.rollout_time_s if result.rollout_time_s > 0 else 0.0,
        "lower_bound_s": lb,
        "efficiency_vs_lower_bound": lb / result.rollout_time_s if result.rollout_time_s > 0 else 0.0,
        "num_role_switches": result.num_role_switches,
        "num_turns": len(df), "prefill_tokens": int(df["new_tokens"].sum()),
        "cached_tokens": int(df["cached_tokens"].sum()), "output_tokens": int(df["output_tokens"].sum()),
        "preemptions": int(df["preemptions"].sum()),
        "step_times_s": [b - a for a, b in result.step_windows],
        "wall_time_s": wall_s,
    }
    if hasattr(backend, "loop"):
        summary["sim_events"] = backend.loop.events_processed
    summary.update(turn_latency_percentiles(df))
    return summary


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def write_results(out: Path, result: RolloutResult, timeline: list[dict], summary: dict) -> None:
    _atomic(out / "lifecycle.parquet", lambda p: lifecycle_frame(result).to_parquet(p, index=False))
    _atomic(out / "engines.parquet", lambda p: pd.DataFrame(
        timeline, columns=["engine_id", "t_start", "t_end", "role", "state", "busy_s", "utilisation"]
    ).to_parquet(p, index=False))
    _atomic(out / SUMMARY, lambda p: p.write_text(json.dumps(summary, indent=2) + "\n"))
