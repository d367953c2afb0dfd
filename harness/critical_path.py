"""Why a setting lands where it does: where its critical path's time goes, and how much any allocation
could gain there.

The critical path is what the rollout waits for. In sync RL a step ends with its last trajectory, so it
is that trajectory in each step; in async RL (and serving), where no one trajectory ends the run, it is
the mean trajectory. Each turn is cut at its lifecycle times (lifecycle.parquet) into
  queue     ready -> prefill start, and KV arrived -> decode start,
  prefill   prefill start -> end,
  transfer  prefill end -> KV arrived (0 when colocated),
  decode    decode start -> last token,
  tool      last token -> tool result (the next turn is ready then; 0 on the last turn),
which add up to the turn's time exactly, so the shares of a path sum to 1. Colocated, a decode's time
includes the steps that other requests' prefill chunks share with it (on DP-attention ranks, one rank's
prefill stalls every rank's decode): the interference a P/D split removes shows as decode.

An allocation of engines to roles changes only the GPU side (queue, prefill, transfer, decode); the tool
calls are the workload's. How much it could gain is read from lower_bound_s (harness/metrics.py), a time
no policy beats: no allocation can be faster than a run by more than a factor rollout_time_s /
lower_bound_s. That bound holds the tool floor (a step cannot end before its longest chain of tool
calls, so a critical path whose tool share is s shrinks by at most 1 - s) and adds each turn's prefill
and batch-1 decode and the total work spread over every engine, so it is never looser than the tool
share's.
"""
from __future__ import annotations

from dataclasses import asdict, astuple, dataclass, fields
from pathlib import Path

import pandas as pd

PART_NAMES = ("tool", "queue", "prefill", "transfer", "decode")
# Each part as the why sentence names it.
PART_WORDS = {"tool": "tool calls", "queue": "queueing", "prefill": "prefill", "transfer": "KV transfer",
              "decode": "decode"}
LIFECYCLE_COLUMNS = ["trajectory_id", "step", "t_ready", "t_prefill_start", "t_prefill_end",
                     "t_transfer_end", "t_decode_start", "t_decode_end", "t_tool_end"]


@dataclass(frozen=True)
class PathShares:
    """Shares of a critical path's time; they sum to 1."""

    tool: float
    queue: float
    prefill: float
    transfer: float
    decode: float

    @property
    def largest(self) -> str:
        return max(fields(self), key=lambda f: getattr(self, f.name)).name


def turn_parts(lifecycle: pd.DataFrame) -> pd.DataFrame:
    """Each turn's seconds in each part (PART_NAMES), beside its trajectory_id and step."""
    lc = lifecycle
    return pd.DataFrame({
        "trajectory_id": lc["trajectory_id"], "step": lc["step"],
        "tool": lc["t_tool_end"] - lc["t_decode_end"],
        "queue": (lc["t_prefill_start"] - lc["t_ready"]) + (lc["t_decode_start"] - lc["t_transfer_end"]),
        "prefill": lc["t_prefill_end"] - lc["t_prefill_start"],
        "transfer": lc["t_transfer_end"] - lc["t_prefill_end"],
        "decode": lc["t_decode_end"] - lc["t_decode_start"]})


def critical_path_shares(lifecycle: pd.DataFrame, mode: str) -> PathShares:
    """The shares of the critical path (the module's docstring) of a complete run's lifecycle."""
    per_trajectory = turn_parts(lifecycle).groupby("trajectory_id").agg(
        step=("step", "first"), **{p: (p, "sum") for p in PART_NAMES})
    if mode == "sync":
        ends = lifecycle.groupby("trajectory_id")["t_tool_end"].max()
        last = ends.groupby(per_trajectory["step"]).idxmax()
        per_trajectory = per_trajectory.loc[last]
    seconds = per_trajectory[list(PART_NAMES)].sum()
    return PathShares(*(float(seconds[p] / seconds.sum()) for p in PART_NAMES))


def run_shares(path: str | Path, mode: str) -> PathShares:
    return critical_path_shares(pd.read_parquet(Path(path) / "lifecycle.parquet", columns=LIFECYCLE_COLUMNS), mode)


def max_gain(rollout_time_s: float, lower_bound_s: float) -> float:
    """The most any allocation could gain over a run, as a fraction of speed: the bound allows a run
    rollout_time_s / lower_bound_s times as fast."""
    return rollout_time_s / lower_bound_s - 1


def why_text(shares: PathShares, policy: str, efficiency: float, gain: float) -> str:
    """One sentence: what bounds the setting, each part's share, and the gain the lower bound leaves."""
    top = shares.largest
    rest = ", ".join(f"{p} {s:.0%}" for p, s in zip(PART_NAMES, astuple(shares)) if p != top)
    return (f"{top}-bound: {getattr(shares, top):.0%} of {policy}'s critical path in {PART_WORDS[top]} ({rest}); "
            f"{policy} is at {efficiency:.2f} of the lower bound: no allocation can beat it by more than {gain:.1%}")


def why_table(runs: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per setting (`keys`) and policy, the means over its seeds of the critical path's shares, the
    efficiency and the most any allocation could gain, and the sentence that says them (`runs`: one row per
    complete run with `keys`, path, mode, policy, seed, rollout_time_s, lower_bound_s, efficiency)."""
    rows = []
    for r in runs.to_dict("records"):
        rows.append({**{k: r[k] for k in keys}, "policy": r["policy"], "seed": r["seed"],
                     **asdict(run_shares(r["path"], r["mode"])), "efficiency": r["efficiency"],
                     "max_gain": max_gain(r["rollout_time_s"], r["lower_bound_s"])})
    values = [*PART_NAMES, "efficiency", "max_gain"]
    per_run = pd.DataFrame(rows, columns=[*keys, "policy", "seed", *values])
    table = per_run.groupby([*keys, "policy"], as_index=False).agg(
        seeds=("seed", "nunique"), **{v: (v, "mean") for v in values})
    table["why"] = [why_text(PathShares(*(r[p] for p in PART_NAMES)), r["policy"], r["efficiency"], r["max_gain"])
                    for r in table.to_dict("records")]
    return table
