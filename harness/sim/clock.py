"""The discrete-event loop: a heap of (time, sequence number, callback)."""
from __future__ import annotations

import heapq
from typing import Callable


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self.events_processed = 0

    def at(self, t: float, callback: Callable[[], None]) -> None:
        if t < self.now:
            raise RuntimeError(f"event scheduled in the past: {t} < {self.now}")
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, callback))

    def run(self, stop: Callable[[], bool] = lambda: False) -> None:
        heap = self._heap
        while heap and not stop():
            t, _, callback = heapq.heappop(heap)
            self.now = t
            self.events_processed += 1
            callback()
