"""Lifecycle tracker: what Prorsa knows of every trajectory, built from lifecycle events only.

For each trajectory: its phase (waiting for prefill, prefilling, transferring, decoding, in a tool
call, done), its turn, its context, when its current phase began, and its history (output tokens,
tool latencies and tool output tokens per turn). The same events arrive from the simulator and
from real engines, so the tracker needs nothing else.
"""
from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

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
    engine: int = -1                   # the engine decoding its current turn (while DECODING)
    appended: int = 0                  # tokens this turn added to the context
    outputs: list[int] = field(default_factory=list)
    tool_latencies: list[float] = field(default_factory=list)
    tool_outputs: list[int] = field(default_factory=list)


HISTORY = 2000   # the newest observations kept per family and quantity (memory and cost stay flat)
TPOT_HISTORY = 64   # per engine, the newest turns' times per output token


class LifecycleTracker:
    def __init__(self, history: int = HISTORY) -> None:
        self.live: dict[int, TrajectoryState] = {}
        self.history = history
        self.finished_turns: dict[str, deque[int]] = {}    # family -> turn counts of ended trajectories
        self.outputs: dict[str, deque[int]] = {}           # family -> output tokens of finished turns
        self.tool_latencies: dict[str, deque[float]] = {}
        self.tool_outputs: dict[str, deque[int]] = {}
        self.first_prompts: dict[str, deque[int]] = {}
        self.trajectory_outputs: dict[str, deque[list[int]]] = {}   # family -> ended trajectories' outputs
        self.start_families: deque[str] = deque(maxlen=history)   # the families of the newest starts
        self.started = 0
        self.tpot: dict[int, deque[tuple[float, float]]] = {}   # engine -> (turn end, its time per output token)
        self._decode_first_token: dict[int, float] = {}
        self._counted: dict[int, int] = {}     # trajectory id -> tokens generated, counted by the backend
        self._counted_at = math.nan

    def observe(self, e: LifecycleEvent) -> None:
        K = EventKind
        if e.kind == K.TRAJECTORY_START:
            family = e.detail or "default"
            self.live[e.trajectory_id] = TrajectoryState(e.trajectory_id, family, e.t, phase_since=e.t)
            self.start_families.append(family)
            self.started += 1
            return
        s = self.live.get(e.trajectory_id)
        if s is None:
            return
        if e.kind == K.TURN_READY:
            s.turn, s.appended = e.turn, e.tokens
            s.context += e.tokens
            if e.turn == 0:
                self._keep(self.first_prompts, s.family, e.tokens)
            self._enter(s, Phase.QUEUED, e.t)
        elif e.kind == K.PREFILL_START:
            self._enter(s, Phase.PREFILLING, e.t)
        elif e.kind == K.PREFILL_END and s.phase == Phase.PREFILLING:
            self._enter(s, Phase.TRANSFERRING, e.t)
        elif e.kind == K.DECODE_START:
            self._enter(s, Phase.DECODING, e.t)
            s.engine = e.engine_id
        elif e.kind == K.DECODE_MIGRATED:
            s.engine = e.engine_id
        elif e.kind == K.FIRST_TOKEN:
            self._decode_first_token[e.trajectory_id] = e.t
        elif e.kind == K.DECODE_END:
            s.outputs.append(e.tokens)
            self._keep(self.outputs, s.family, e.tokens)
            first = self._decode_first_token.pop(e.trajectory_id, None)
            if first is not None and e.tokens > 1 and e.t > first:
                self.tpot.setdefault(e.engine_id, deque(maxlen=TPOT_HISTORY)).append(
                    (e.t, (e.t - first) / (e.tokens - 1)))
            self._enter(s, Phase.TOOL, e.t)
        elif e.kind == K.TOOL_END:
            s.tool_latencies.append(e.t - s.phase_since)
            s.tool_outputs.append(e.tokens)
            self._keep(self.tool_latencies, s.family, e.t - s.phase_since)
            self._keep(self.tool_outputs, s.family, e.tokens)
        elif e.kind == K.TRAJECTORY_END:
            self._keep(self.finished_turns, s.family, s.turn + 1)
            if s.outputs:
                self._keep(self.trajectory_outputs, s.family, s.outputs)
            s.phase = Phase.DONE
            del self.live[e.trajectory_id]

    def last_tpot(self) -> list[float]:
        """Each engine's newest observed time per output token."""
        return [seen[-1][1] for seen in self.tpot.values()]

    def count_generated(self, now: float, counts: dict[int, int]) -> None:
        """The output tokens each decoding turn has generated, as the backend counted them at `now`
        (ClusterView.generated_tokens: a client streaming the responses sees every token)."""
        self._counted, self._counted_at = counts, now

    def generated(self, s: TrajectoryState, now: float, default_tpot: float) -> float:
        """Tokens a decoding turn has generated so far: counted by the backend at `now` when it says
        (`count_generated`); else estimated, its time decoding over the mean time per token of the turns
        that ended on its engine since it began (they decoded beside it), the engine's newest value, or
        `default_tpot`, before any did. Why counted: with 8,000-token answers the estimate ran 23% high
        (16k-token tool outputs, 8 DP4 engines at 1P7D, 250 s into the step: 1.19 M tokens estimated,
        0.96 M generated; the turns that ended beside a long decode ran at the shorter contexts of
        earlier), so the what-if's decodes under way ended early and it put a switch to colocation at
        783.9 s to the step's end where the forked run took 995.4 s. Why the estimate uses the turns
        beside it: taking the newest value for the whole span undercounted (mix_reason_browse,
        dense8_h100, async, at 50 s: 981 tokens estimated, 1,861 true)."""
        if s.phase != Phase.DECODING:
            return 0.0
        if now == self._counted_at and s.trajectory_id in self._counted:
            return float(self._counted[s.trajectory_id])
        seen = self.tpot.get(s.engine, ())
        beside = [v for t, v in seen if t > s.phase_since]
        tpot = float(np.mean(beside)) if beside else (seen[-1][1] if seen else default_tpot)
        return (now - s.phase_since) / tpot

    def censored(self, now: float, tpot: float) -> dict[str, dict[str, list[float]]]:
        """What the live trajectories tell of each quantity so far, per family: values known to be at
        least this much (turns reached; tokens generated by a decoding turn, `generated`; time spent
        in a running tool call). `tpot`: the time per token before any engine reported one."""
        out: dict[str, dict[str, list[float]]] = {"turns": {}, "output_tokens": {}, "tool_latency_s": {}}
        for s in self.live.values():
            out["turns"].setdefault(s.family, []).append(s.turn + 1)
            if s.phase == Phase.DECODING:
                out["output_tokens"].setdefault(s.family, []).append(self.generated(s, now, tpot))
            elif s.phase == Phase.TOOL:
                out["tool_latency_s"].setdefault(s.family, []).append(now - s.phase_since)
        return out

    def output_groups(self) -> dict[str, list[list[int]]]:
        """Per family, the output tokens of each trajectory's finished turns (ended trajectories and
        live ones): how much of the spread of output lengths is the trajectory's own."""
        out = {f: list(v) for f, v in self.trajectory_outputs.items()}
        for s in self.live.values():
            if s.outputs:
                out.setdefault(s.family, []).append(s.outputs)
        return out

    def _keep(self, store: dict[str, deque], family: str, value) -> None:
        store.setdefault(family, deque(maxlen=self.history)).append(value)

    @staticmethod
    def _enter(s: TrajectoryState, phase: Phase, t: float) -> None:
        s.phase, s.phase_since = phase, t
