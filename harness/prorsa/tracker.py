"""Lifecycle tracker: what Prorsa knows of every trajectory, built from lifecycle events only.

For each trajectory: its phase (waiting for prefill, prefilling, transferring, decoding, in a tool
call, done), its turn, its context, when its current phase began, and its history (output tokens,
tool latencies and tool output tokens per turn). The same events arrive from the simulator and
from real engines, so the tracker needs nothing else.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from harness.api import EventKind, LifecycleEvent


class Phase(str, enum.Enum):
    QUEUED = "queued"          # prompt ready, prefill not started
    PREFILLING = "prefilling"
    TRANSFERRING = "transferring"
    DECODING = "decoding"
    TOOL = "tool"
    DONE = "done"


@dataclass
class TrajectoryState:
    trajectory_id: int
    family: str
    started_at: float
    phase: Phase = Phase.QUEUED
    phase_since: float = 0.0
    turn: int = 0
    context: int = 0                   # prompt tokens of the current turn
    appended: int = 0                  # tokens this turn added to the context
    outputs: list[int] = field(default_factory=list)
    tool_latencies: list[float] = field(default_factory=list)
    tool_outputs: list[int] = field(default_factory=list)


class LifecycleTracker:
    def __init__(self) -> None:
        self.live: dict[int, TrajectoryState] = {}
        self.finished_turns: dict[str, list[int]] = {}     # family -> turn counts of ended trajectories
        self.outputs: dict[str, list[int]] = {}            # family -> output tokens of finished turns
        self.tool_latencies: dict[str, list[float]] = {}
        self.tool_outputs: dict[str, list[int]] = {}
        self.first_prompts: dict[str, list[int]] = {}
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.tpot: dict[int, float] = {}                   # engine -> last observed time per output token
        self._decode_first_token: dict[int, float] = {}

    def observe(self, e: LifecycleEvent) -> None:
        K = EventKind
        if e.kind == K.TRAJECTORY_START:
            self.live[e.trajectory_id] = TrajectoryState(e.trajectory_id, e.detail or "default", e.t, phase_since=e.t)
            self.starts.append(e.t)
            return
        s = self.live.get(e.trajectory_id)
        if s is None:
            return
        if e.kind == K.TURN_READY:
            s.turn, s.appended = e.turn, e.tokens
            s.context += e.tokens
            if e.turn == 0:
                self.first_prompts.setdefault(s.family, []).append(e.tokens)
            self._enter(s, Phase.QUEUED, e.t)
        elif e.kind == K.PREFILL_START:
            self._enter(s, Phase.PREFILLING, e.t)
        elif e.kind == K.PREFILL_END and s.phase == Phase.PREFILLING:
            self._enter(s, Phase.TRANSFERRING, e.t)
        elif e.kind == K.DECODE_START:
            self._enter(s, Phase.DECODING, e.t)
        elif e.kind == K.FIRST_TOKEN:
            self._decode_first_token[e.trajectory_id] = e.t
        elif e.kind == K.DECODE_END:
            s.outputs.append(e.tokens)
            self.outputs.setdefault(s.family, []).append(e.tokens)
            first = self._decode_first_token.pop(e.trajectory_id, None)
            if first is not None and e.tokens > 1 and e.t > first:
                self.tpot[e.engine_id] = (e.t - first) / (e.tokens - 1)
            self._enter(s, Phase.TOOL, e.t)
        elif e.kind == K.TOOL_END:
            s.tool_latencies.append(e.t - s.phase_since)
            s.tool_outputs.append(e.tokens)
            self.tool_latencies.setdefault(s.family, []).append(e.t - s.phase_since)
            self.tool_outputs.setdefault(s.family, []).append(e.tokens)
        elif e.kind == K.TRAJECTORY_END:
            self.finished_turns.setdefault(s.family, []).append(s.turn + 1)
            self.ends.append(e.t)
            s.phase = Phase.DONE
            del self.live[e.trajectory_id]

    @staticmethod
    def _enter(s: TrajectoryState, phase: Phase, t: float) -> None:
        s.phase, s.phase_since = phase, t
