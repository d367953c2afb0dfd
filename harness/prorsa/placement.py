"""Where a trajectory's decodes go when no decode engine holds its prefix: by forecast decode work.

The shared router (harness/routing.py) places such a turn, most often a trajectory's first, on the
decode engine with the least KV in use or promised. A first turn's prompt (a few hundred tokens) barely
moves that fraction, so the turns of a batch that arrive together herd onto one engine, and sticky KV
keeps them there for every later turn (docs/decisions/2026-12-07-prorsa-rules.md, R23).

`policy.placement: forecast_work` places them by the decode work each engine is forecast to hold
instead: every trajectory routed to a decode engine counts there with its forecast output tokens from
its present turn to its end (family mean output x (1 + expected turns after this one, given the turns
so far), from the distributions Prorsa learns online), so each placement moves the next one. This is a
forecast only Prorsa has; the baselines keep the shared router's rule. Later turns stay sticky (the
router's balance rule as before).
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from harness.api import ClusterView, EngineState, EventKind, LifecycleEvent, Route, TurnRequest
from harness.routing import Balance, PrefixTracker, decode_load, route_by_role


def turns_left_factor(turns: np.ndarray, cap: int) -> np.ndarray:
    """Per 0-based turn index k: 1 + E[turns - (k+1) | turns > k], the turns a trajectory that has reached
    turn k still runs, this one included (1 past the largest observed count)."""
    turns = np.asarray(turns, dtype=float)
    return np.asarray([1 + float(np.mean(turns[turns > k])) - (k + 1) if (turns > k).any() else 1.0
                       for k in range(max(cap, 1))])


class DecodeWork:
    """Forecast decode work (output tokens) held by each decode engine: one entry per trajectory, where
    its present turn was sent. `left[family][k]`: forecast output tokens from turn k to the end."""

    def __init__(self, left: dict[str, np.ndarray] | None = None):
        self.left = left or {}
        self.of: dict[int, tuple[int, float]] = {}          # trajectory -> (decode engine, work)
        self.on: dict[int, float] = defaultdict(float)       # decode engine -> work

    def copy(self) -> DecodeWork:
        out = DecodeWork(self.left)
        out.of, out.on = dict(self.of), defaultdict(float, self.on)
        return out

    def work(self, family: str, turn: int) -> float:
        left = self.left.get(family)
        return float(left[min(turn, len(left) - 1)]) if left is not None and len(left) else 0.0

    def assign(self, trajectory_id: int, engine_id: int, family: str, turn: int) -> None:
        self.drop(trajectory_id)
        w = self.work(family, turn)
        self.of[trajectory_id] = (engine_id, w)
        self.on[engine_id] += w

    def drop(self, trajectory_id: int) -> None:
        held = self.of.pop(trajectory_id, None)
        if held is not None:
            self.on[held[0]] -= held[1]

    def move(self, trajectory_id: int, engine_id: int) -> None:
        held = self.of.get(trajectory_id)
        if held is not None:
            self.on[held[0]] -= held[1]
            self.of[trajectory_id] = (engine_id, held[1])
            self.on[engine_id] += held[1]

    def observe(self, e: LifecycleEvent) -> None:
        if e.kind == EventKind.TRAJECTORY_END:
            self.drop(e.trajectory_id)
        elif e.kind == EventKind.DECODE_MIGRATED:
            self.move(e.trajectory_id, e.engine_id)

    def load(self, e: EngineState) -> tuple:
        """The placement key: forecast decode work held, then the router's decode load."""
        return (self.on.get(e.engine_id, 0.0), *decode_load(e))


def route_placing(request: TurnRequest, view: ClusterView, prefix: PrefixTracker, balance: Balance,
                  work: DecodeWork | None, turn: int) -> Route | None:
    """The shared router's route, placing by `work` when the policy has one and counting the turn (the
    trajectory's `turn`) on its decode engine; the run and its what-if both route through here, so a
    plan prices the placement the run uses."""
    if work is None:
        return route_by_role(request, view, prefix, balance)
    route = route_by_role(request, view, prefix, balance, work.load)
    if route is not None:
        work.assign(request.trajectory_id, route.decode_engine, request.family, turn)
    return route
