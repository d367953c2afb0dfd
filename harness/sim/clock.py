"""The discrete-event loop: a heap of (time, sequence number, callback, observer)."""
from __future__ import annotations

import heapq
from typing import Callable


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None], bool]] = []
        self._seq = 0
        self.events_processed = 0

    def at(self, t: float, callback: Callable[[], None], observer: bool = False) -> None:
        """Run `callback` at time `t`. An observer's callback only reads state (sampling, progress);
        a fork of the simulation leaves it behind (`without_observers`)."""
        if t < self.now:
            raise RuntimeError(f"event scheduled in the past: {t} < {self.now}")
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, callback, observer))

    def run(self, stop: Callable[[], bool] | None = None) -> None:
        heap, pop = self._heap, heapq.heappop
        while heap and (stop is None or not stop()):
            t, _, callback, _ = pop(heap)
            self.now = t
            self.events_processed += 1
            callback()

    def without_observers(self) -> list:
        """Drop the observers' callbacks; returns the full heap, to put back with `restore`."""
        full = self._heap
        self._heap = [e for e in full if not e[3]]
        heapq.heapify(self._heap)
        return full

    def restore(self, heap: list) -> None:
        self._heap = heap
