"""The discrete-event loop: events of (time, sequence number, callback, observer), run in that order.

Two heaps hold them, merged at every pop (the order is the same as one heap's): the engines' own
steps (`at_engine`: one or two per engine, near in time) and everything else (`at`: tool calls,
samplers, control ticks; thousands at once on a large cluster). Engine steps are most events; a heap of
their own stays small and in cache instead of sifting through every waiting tool call.
"""
from __future__ import annotations

import heapq
from typing import Callable

from mypy_extensions import mypyc_attr


@mypyc_attr(serializable=True, allow_interpreted_subclasses=True)
class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None], bool]] = []
        self._engine: list[tuple[float, int, Callable[[], None], bool]] = []
        self._seq = 0
        self.events_processed = 0

    def at(self, t: float, callback: Callable[[], None], observer: bool = False) -> None:
        """Run `callback` at time `t`. An observer's callback only reads state (sampling, progress);
        a fork of the simulation leaves it behind (`without_observers`)."""
        if t < self.now:
            raise RuntimeError(f"event scheduled in the past: {t} < {self.now}")
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, callback, observer))

    def at_engine(self, t: float, callback: Callable[[], None]) -> None:
        """`at` for an engine's own step (ordered with every other event)."""
        if t < self.now:
            raise RuntimeError(f"event scheduled in the past: {t} < {self.now}")
        self._seq += 1
        heapq.heappush(self._engine, (t, self._seq, callback, False))

    def run(self, stop: Callable[[], bool] | None = None) -> bool:
        """Run events in order until none is left (returns True) or `stop()` says so before one (False)."""
        heap, engine, pop = self._heap, self._engine, heapq.heappop
        while stop is None or not stop():
            if engine and (not heap or engine[0] < heap[0]):   # (t, seq): never equal
                t, _, callback, _ = pop(engine)
            elif heap:
                t, _, callback, _ = pop(heap)
            else:
                return True
            self.now = t
            self.events_processed += 1
            callback()
        return False

    def without_observers(self) -> list:
        """Drop the observers' callbacks; returns the full heap, to put back with `restore`."""
        full = self._heap
        self._heap = [e for e in full if not e[3]]
        heapq.heapify(self._heap)
        return full

    def restore(self, heap: list) -> None:
        self._heap = heap
