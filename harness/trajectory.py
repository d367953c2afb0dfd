"""Trajectory scripts (what the workload says will happen) and lifecycle records (what did happen)."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from operator import attrgetter

import numpy as np


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


@dataclass(slots=True)   # one per turn of a trajectory in flight (TurnTable keeps the ended ones)
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


# A TurnTable row: each field of TurnRecord as its type, the family as an index into the names seen.
_KINDS = {"int": np.int64, "float": np.float64, "str": np.int32}
TURN_ROW = np.dtype([(f.name, _KINDS[f.type]) for f in fields(TurnRecord)])
_FAMILY = TURN_COLUMNS.index("family")
_VALUES = attrgetter(*TURN_COLUMNS)


class TurnTable:
    """The turn records of the ended trajectories, as columns: a record object costs several times its
    values, and a run keeps every turn to its end (lifecycle.parquet). A trajectory's records are
    appended when it ends, into fixed-size chunks of TURN_ROW rows; `columns()` gives them in
    trajectory-id order, turns in order, as lifecycle.parquet stores them."""

    CHUNK = 1024   # rows per chunk

    def __init__(self) -> None:
        self._full: list[np.ndarray] = []
        self._last = np.empty(self.CHUNK, TURN_ROW)
        self._rows = 0                    # rows used in `_last`
        self._families: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._full) * self.CHUNK + self._rows

    def append(self, records: list[TurnRecord]) -> None:
        """One trajectory's records, in turn order."""
        for r in records:
            if self._rows == self.CHUNK:
                self._full.append(self._last)
                self._last, self._rows = np.empty(self.CHUNK, TURN_ROW), 0
            row = list(_VALUES(r))
            row[_FAMILY] = self._families.setdefault(r.family, len(self._families))
            self._last[self._rows] = tuple(row)
            self._rows += 1

    def columns(self) -> dict[str, np.ndarray]:
        """Column name -> values (int64, float64; the family as str objects), sorted by trajectory id."""
        rows = np.concatenate([*self._full, self._last[:self._rows]])
        rows = rows[np.argsort(rows["trajectory_id"], kind="stable")]
        names = np.array(list(self._families), dtype=object)
        return {name: names[rows[name]] if name == "family" else rows[name] for name in TURN_COLUMNS}

