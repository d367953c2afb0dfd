"""The discrete-event loop: events of (time, sequence number, callback, observer), run in that order.

Two queues hold them, merged at every pop (the order is the same as one heap's): the engines' own
steps (`at_engine`: one or two per engine, near in time, in a heap of their own) and everything else
(`at`: tool calls, samplers, control ticks; thousands at once on a large cluster). Engine steps are most
events; a heap of their own stays small and in cache instead of sifting through every waiting tool
call. The others wait in buckets of `BUCKET_S` of simulated time (a calendar queue): only the bucket
being run is a heap, the later ones are unsorted lists, heapified when their time comes.
"""
from __future__ import annotations

import heapq
import math
from typing import Callable, Final

from mypy_extensions import mypyc_attr

# Simulated seconds per bucket. Tool calls last milliseconds to minutes (configs/workload), so the
# bucket being run holds about a second's share of them. Any width gives the same order of events; it
# only sets how small the heap that is sifted stays.
BUCKET_S: Final = 1.0
_LAST_BUCKET: Final = 2 ** 62   # times from 2**62 buckets on (and inf) share the last one

Event = tuple[float, int, Callable[[], None], bool]


@mypyc_attr(serializable=True, allow_interpreted_subclasses=True)
class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._near: list[Event] = []            # a heap: every event of bucket <= self._bucket
        self._far: dict[int, list[Event]] = {}  # bucket -> its events, unsorted (every bucket > self._bucket)
        self._far_buckets: list[int] = []       # a heap of the keys of `_far`
        self._bucket = 0
        self._engine: list[Event] = []
        self._seq = 0
        self.events_processed = 0

    def at(self, t: float, callback: Callable[[], None], observer: bool = False) -> None:
        """Run `callback` at time `t`. An observer's callback only reads state (sampling, progress);
        a fork of the simulation leaves it behind (`without_observers`)."""
        if not t >= self.now:   # (NaN too)
            raise RuntimeError(f"event scheduled in the past: {t} < {self.now}")
        self._seq += 1
        self._push((t, self._seq, callback, observer))

    def _push(self, event: Event) -> None:
        b = _bucket(event[0])
        if b <= self._bucket:
            heapq.heappush(self._near, event)
            return
        later = self._far.get(b)
        if later is None:
            self._far[b] = [event]
            heapq.heappush(self._far_buckets, b)
        else:
            later.append(event)

    def at_engine(self, t: float, callback: Callable[[], None]) -> None:
        """`at` for an engine's own step (ordered with every other event)."""
        if not t >= self.now:
            raise RuntimeError(f"event scheduled in the past: {t} < {self.now}")
        self._seq += 1
        heapq.heappush(self._engine, (t, self._seq, callback, False))

    def run(self, stop: Callable[[], bool] | None = None) -> bool:
        """Run events in order until none is left (returns True) or `stop()` says so before one (False)."""
        engine, pop = self._engine, heapq.heappop
        while stop is None or not stop():
            near = self._near
            if not near and self._far_buckets:   # the next bucket's events become the heap
                self._bucket = pop(self._far_buckets)
                near = self._near = self._far.pop(self._bucket)
                heapq.heapify(near)
            if engine and (not near or engine[0] < near[0]):   # (t, seq): never equal
                t, _, callback, _ = pop(engine)
            elif near:
                t, _, callback, _ = pop(near)
            else:
                return True
            self.now = t
            self.events_processed += 1
            callback()
        return False

    def without_observers(self) -> tuple[list[Event], dict[int, list[Event]], list[int], int]:
        """Drop the observers' callbacks; returns what held them, to put back with `restore`."""
        kept = (self._near, self._far, self._far_buckets, self._bucket)
        everything = self._near + [e for later in self._far.values() for e in later]
        self._near, self._far, self._far_buckets, self._bucket = [], {}, [], _bucket(self.now)
        for e in everything:
            if not e[3]:
                self._push(e)
        return kept

    def restore(self, kept: tuple[list[Event], dict[int, list[Event]], list[int], int]) -> None:
        self._near, self._far, self._far_buckets, self._bucket = kept


def _bucket(t: float) -> int:
    return math.floor(t / BUCKET_S) if t < _LAST_BUCKET * BUCKET_S else _LAST_BUCKET
