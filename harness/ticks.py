"""Periodic ticks whose work follows what happens, not simulated time: the cluster sampler
(harness/timeseries.py) and the policy's control tick (harness/rollout.py).

The rule: a ticker runs every `interval_s` of backend time; after IDLE_TICKS intervals in a row in which
nothing but ticks ran, each next interval is twice the last (at most MAX_IDLE_INTERVAL_S) until something
happens again. A tool call of a day with nothing else running then costs a few thousand ticks, not
86,400 / interval_s; a run with anything going on within IDLE_TICKS intervals ticks on the grid.

"Nothing but ticks": the simulator counts every event it runs (`EventLoop.events_processed`), and every
ticker of a run adds its own tick events to one TickCount that they share. An interval was idle when
the events run since the ticker's last tick were all tick events: its own and the other tickers'. So
the sampler's tick is no activity to the control tick, nor the control tick's to the sampler; a ticker
that counted only itself would see the other's ticks and, with both scheduled, never widen. Real
engines have no event count: their tickers keep the interval.

Its own module, importing nothing of the harness, so that any layer's ticker can use it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

IDLE_TICKS = 1000
MAX_IDLE_INTERVAL_S = 86400.0


def event_count(backend) -> int | None:
    """The events the backend has run (the simulator's loop counts them); None where none are counted."""
    return getattr(getattr(backend, "loop", None), "events_processed", None)


@dataclass
class TickCount:
    """Tick events run, by every ticker that shares this count (one per run: RolloutDriver.ticks)."""
    n: int = 0


@dataclass
class IdleBackoff:
    """One ticker's interval under the rule above. The ticker calls `tick()` for each event that is its
    tick (first thing in the callback) and `next_gap_s` for the delay to its next one."""

    ticks: TickCount = field(default_factory=TickCount)
    widened: bool = False      # the last interval given was past the grid (more than IDLE_TICKS idle ones)
    _events: int | None = None   # the event count at the last tick (None: no tick yet)
    _ticks: int = 0            # the shared tick count then
    _idle: int = 0             # idle intervals in a row
    _gap_s: float = 0.0        # the last interval given

    def tick(self) -> None:
        self.ticks.n += 1

    def next_gap_s(self, events: int | None, interval_s: float) -> float:
        """The delay to the next tick, `events` being the backend's event count now (event_count)."""
        if events is None:
            return interval_s
        quiet = self._events is not None and events - self._events == self.ticks.n - self._ticks
        self._idle = self._idle + 1 if quiet else 0
        self._events, self._ticks = events, self.ticks.n
        self.widened = self._idle > IDLE_TICKS
        self._gap_s = min(2 * self._gap_s, MAX_IDLE_INTERVAL_S) if self.widened else interval_s
        return self._gap_s

    def wake(self) -> None:
        """Something happened: back on the grid (the ticker schedules its next tick one interval on)."""
        self._idle, self.widened = 0, False
