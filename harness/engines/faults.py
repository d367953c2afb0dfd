"""Fault injection for the real backends: servers killed (SIGKILL) or hung (SIGSTOP) at seeded random
instants of one rollout, and the recovery of each read back from the lifecycle events.

The injector runs on the backend's own clock (`call_later`), so it sees the run as the driver does:
at each instant it picks one engine that is serving (not failed, not already restarting) and faults
it; the backend's failure path (harness/engines/base.py: hand the engine's turns back, restart the
server, rejoin) does the rest. Used by tests/test_engine_faults.py; usable on a GPU cluster the same
way (`FaultInjector(backend, ..., done=lambda: driver.completed >= driver.total).arm()` before
`driver.run()`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np

from harness.api import EventKind, LifecycleEvent

log = logging.getLogger(__name__)


@dataclass
class Fault:
    """One injected fault and what followed it."""

    t: float                     # backend clock (s) at the signal
    engine_id: int
    legs_in_flight: int          # legs the engine was serving when it was faulted
    t_failed: float | None = None      # when the backend declared the engine failed
    t_recovered: float | None = None   # when it served again (ENGINE_RECOVERED)

    @property
    def recovery_s(self) -> float | None:
        return None if self.t_recovered is None else self.t_recovered - self.t


class FaultInjector:
    """`count` faults of one kind ('kill': SIGKILL, 'hang': SIGSTOP) at gaps drawn uniformly from
    `gap_s` (seconds of backend time), each on a random engine that is serving at that instant (of
    `engines`, default all; with `busy_only`, one with legs in flight: killing an idle server costs no
    work and tests little). When none is, it tries again after the next gap. It stops at `count`, or
    once `done()` says the rollout has finished (its pending timer would otherwise keep the run open)."""

    def __init__(self, backend, count: int, seed: int, done: Callable[[], bool],
                 gap_s: tuple[float, float] = (2.0, 8.0), kind: str = "kill", engines: list[int] | None = None,
                 busy_only: bool = False):
        if kind not in ("kill", "hang"):
            raise ValueError(f"fault kind {kind!r} is invalid; allowed: kill, hang")
        if count < 0 or not 0 <= gap_s[0] <= gap_s[1]:
            raise ValueError(f"faults: count {count} must be >= 0 and gap_s {gap_s} an increasing pair >= 0")
        self.backend, self.count, self.kind, self.gap_s = backend, count, kind, gap_s
        self.engines, self.done, self.busy_only = engines, done, busy_only
        self.rng = np.random.default_rng(seed)
        self.faults: list[Fault] = []
        self._restarts_due: dict[int, int] = {}   # engine -> the restart count it serves at again

    def arm(self) -> None:
        """Schedule the first fault; call before the run starts."""
        if self.count:
            self._next()

    def _next(self) -> None:
        self.backend.call_later(float(self.rng.uniform(*self.gap_s)), self._inject)

    def _inject(self) -> None:
        if len(self.faults) >= self.count or self.done():
            return
        # serving: not failed, and restarted since our last fault on it (a killed server with no legs
        # in flight looks healthy until the health monitor's third failed poll)
        serving = [e for e in self.backend.engines if e.available and not e.failed
                   and e.restarts >= self._restarts_due.get(e.engine_id, 0)
                   and (self.engines is None or e.engine_id in self.engines)]
        if self.busy_only:
            serving = [e for e in serving if e.legs]
        if serving:
            e = serving[int(self.rng.integers(len(serving)))]
            self._restarts_due[e.engine_id] = e.restarts + 1
            self.faults.append(Fault(self.backend.now(), e.engine_id, len(e.legs)))
            log.info("fault %d: %s engine %d at %.1f s (%d legs in flight)", len(self.faults), self.kind,
                     e.engine_id, self.backend.now(), len(e.legs))
            (self.backend.kill_engine if self.kind == "kill" else self.backend.hang_engine)(e.engine_id)
        if len(self.faults) < self.count and not self.done():
            self._next()

    def read_back(self, events: list[LifecycleEvent]) -> list[Fault]:
        """Match each fault to the engine's next ENGINE_FAILED and ENGINE_RECOVERED events."""
        for f in self.faults:
            failed = [e.t for e in events if e.kind == EventKind.ENGINE_FAILED and e.engine_id == f.engine_id
                      and e.t >= f.t]
            f.t_failed = min(failed) if failed else None
            back = [e.t for e in events if e.kind == EventKind.ENGINE_RECOVERED and e.engine_id == f.engine_id
                    and e.t >= f.t]
            f.t_recovered = min(back) if back else None
        return self.faults


def recovery_summary(faults: list[Fault]) -> dict:
    """Faults, how many were detected and recovered, and recovery time (signal -> serving) p50 / max."""
    rec = [f.recovery_s for f in faults if f.recovery_s is not None]
    detect = [f.t_failed - f.t for f in faults if f.t_failed is not None]
    return {"faults": len(faults), "detected": len(detect), "recovered": len(rec),
            "detect_p50_s": float(np.median(detect)) if detect else None,
            "recovery_p50_s": float(np.median(rec)) if rec else None,
            "recovery_max_s": float(max(rec)) if rec else None}
