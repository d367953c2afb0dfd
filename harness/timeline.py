"""Each engine's role and state over time, with the busy seconds of every interval (engines.parquet).

Both backends keep one; they differ only in how they count an engine's busy time, passed in as
`busy(engine_id)` (total busy seconds so far).
"""
from __future__ import annotations

from typing import Callable

from harness.api import Role

COLUMNS = ["engine_id", "t_start", "t_end", "role", "state", "busy_s", "utilisation"]


class RoleTimeline:
    def __init__(self, roles: list[Role], busy: Callable[[int], float]):
        self._busy = busy
        self._closed: list[dict] = []
        self._open = [(0.0, r.value, "serving", 0.0) for r in roles]   # (t0, role, state, busy at t0)

    def enter(self, engine_id: int, now: float, role: Role, state: str) -> None:
        """Close the engine's current interval at `now` and open one in `role` / `state`."""
        t0, old_role, old_state, busy0 = self._open[engine_id]
        busy = self._busy(engine_id)
        if now > t0:
            self._closed.append(_row(engine_id, t0, now, old_role, old_state, busy - busy0))
        self._open[engine_id] = (now, role.value, state, busy)

    def rows(self, now: float) -> list[dict]:
        open_rows = [_row(i, t0, now, role, state, self._busy(i) - busy0)
                     for i, (t0, role, state, busy0) in enumerate(self._open)]
        return sorted(self._closed + open_rows, key=lambda r: (r["engine_id"], r["t_start"]))


def _row(engine_id: int, t0: float, t1: float, role: str, state: str, busy: float) -> dict:
    return {"engine_id": engine_id, "t_start": t0, "t_end": t1, "role": role, "state": state,
            "busy_s": busy, "utilisation": busy / (t1 - t0) if t1 > t0 else 0.0}
