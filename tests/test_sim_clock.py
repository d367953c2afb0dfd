"""The event loop runs events in (time, sequence) order, whichever queue holds them: the engines'
heap, the bucket being run or a later bucket (checked against one plain heap of every event)."""
from __future__ import annotations

import heapq
import math
import random

import pytest

from harness.sim.clock import BUCKET_S, EventLoop


@pytest.mark.parametrize("seed", range(5))
def test_events_run_in_time_then_sequence_order(seed):
    rng = random.Random(seed)
    loop = EventLoop()
    ran: list[tuple[float, int]] = []
    expected: list[tuple[float, int]] = []   # one heap of (t, seq), popped as the loop should
    seq = 0

    def schedule(t: float, engine: bool) -> None:
        nonlocal seq
        seq += 1
        me = (t, seq)
        heapq.heappush(expected, me)

        def callback():
            ran.append(me)
            for _ in range(rng.choice((0, 1, 1, 2))):
                if len(expected) + len(ran) < 3000:   # children: same time, same bucket, later buckets
                    delay = rng.choice((0.0, 0.0, rng.random() * 0.01, rng.random() * BUCKET_S * 3,
                                        rng.expovariate(0.2)))
                    schedule(loop.now + delay, rng.random() < 0.5)
        (loop.at_engine if engine else loop.at)(t, callback)

    for _ in range(200):
        schedule(rng.choice((0.0, rng.random() * 30)), rng.random() < 0.3)
    for t in (math.inf, math.inf, 2.0 ** 62, 1e300):   # the last bucket's times, inf after any finite one
        schedule(t, False)
    assert loop.run() is True
    order = [heapq.heappop(expected) for _ in range(len(expected))]
    assert len(ran) == len(order) == loop.events_processed > 1000
    assert ran == sorted(ran) and ran == order


def test_observers_left_behind_and_restored():
    loop = EventLoop()
    ran: list[str] = []
    loop.at(0.5, lambda: ran.append("work 0.5"))
    loop.at(0.6, lambda: ran.append("sample 0.6"), observer=True)
    loop.at(7.0, lambda: ran.append("sample 7"), observer=True)
    loop.at(9.0, lambda: ran.append("work 9"))
    assert loop.run(stop=lambda: bool(ran)) is False    # ran the first event, then stopped
    kept = loop.without_observers()
    assert loop.run() is True and ran == ["work 0.5", "work 9"]
    loop.restore(kept)
    ran.clear()
    loop.now = 0.5
    assert loop.run() is True and ran == ["sample 0.6", "sample 7", "work 9"]


@pytest.mark.parametrize("t", [1.0, math.nan])
def test_an_event_in_the_past_is_refused(t):
    loop = EventLoop()
    loop.at(2.0, lambda: loop.at(t, lambda: None))
    with pytest.raises(RuntimeError, match="in the past"):
        loop.run()
