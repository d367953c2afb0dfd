"""Trajectory scripts (what the workload says will happen) and lifecycle records (what did happen)."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class TurnScript:
    """One turn as the workload scripts it.

    `new_tokens` are the tokens the environment appends before this turn's prefill: the initial
    prompt for turn 0, the previous tool call's output after that. The turn's prompt is the
    previous prompt plus the previous output plus `new_tokens`.
    """

    new_tokens: int
    output_tokens: int
    tool_latency_s: float = 0.0        # the tool call after this turn; ignored on the last turn


@dataclass(frozen=True)
class TrajectoryScript:
    trajectory_id: int
    group_id: int
    family: str
    turns: tuple[TurnScript, ...]
    max_output_tokens: int = 32768     # per-turn cap a real request would carry
    step: int = 0                      # the RL step (sync) or batch index (async) it belongs to

    def prompt_tokens(self, turn: int) -> int:
        """Full prompt length of `turn` (context before its decode)."""
        total = 0
        for k in range(turn + 1):
            total += self.turns[k].new_tokens
            if k < turn:
                total += self.turns[k].output_tokens
        return total

    def tool_output_tokens(self, turn: int) -> int:
        return self.turns[turn + 1].new_tokens if turn + 1 < len(self.turns) else 0

    @property
    def total_tokens(self) -> int:
        return sum(t.new_tokens + t.output_tokens for t in self.turns)


def validate_script(s: TrajectoryScript) -> None:
    if not s.turns:
        raise ValueError(f"trajectory {s.trajectory_id}: no turns")
    for k, t in enumerate(s.turns):
        if t.new_tokens < (1 if k == 0 else 0) or t.output_tokens < 1:
            raise ValueError(f"trajectory {s.trajectory_id} turn {k}: new_tokens={t.new_tokens}, "
                             f"output_tokens={t.output_tokens}; need new_tokens>=1 on turn 0, "
                             "new_tokens>=0 after, output_tokens>=1")
        if not (t.tool_latency_s >= 0 and math.isfinite(t.tool_latency_s)):
            raise ValueError(f"trajectory {s.trajectory_id} turn {k}: tool_latency_s="
                             f"{t.tool_latency_s} must be finite and >= 0")


@dataclass(slots=True)   # one per turn of the run, kept to its end: no per-record __dict__
class TurnRecord:
    """One row of lifecycle.parquet: one turn of one trajectory. Times in seconds; NaN = never."""

    trajectory_id: int
    group_id: int
    step: int
    family: str
    turn: int
    engine_prefill: int = -1
    engine_decode: int = -1
    t_ready: float = math.nan
    t_prefill_start: float = math.nan
    t_prefill_end: float = math.nan
    t_transfer_end: float = math.nan   # equals t_prefill_end when colocated
    t_decode_start: float = math.nan
    t_first_token: float = math.nan
    t_decode_end: float = math.nan
    t_tool_end: float = math.nan       # equals t_decode_end on the last turn
    new_tokens: int = 0                # prefilled tokens, recomputed ones included
    cached_tokens: int = 0             # prompt tokens served from a prefix cache or moved KV
    output_tokens: int = 0
    transferred_tokens: int = 0
    recomputed_tokens: int = 0
    preemptions: int = 0
    prompt_tokens: int = 0


TURN_COLUMNS = [f.name for f in fields(TurnRecord)]
