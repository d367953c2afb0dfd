"""Cluster state over simulated (or wall) time, sampled from the backend while a rollout runs.

Why: the lifecycle log says what each turn did, but not how much prefill and decode work was waiting
at each moment or how many engines each role had; the demand-vs-allocation figures and the W&B time
series need exactly that. The sampler reads only `backend.view()` (what a real system can observe)
on the backend's own clock, so it runs unchanged on real engines.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

import pandas as pd

from harness.api import Backend, Role
from harness.ticks import IdleBackoff, TickCount, event_count


@dataclass(frozen=True)
class Sample:
    t_s: float
    prefill_demand_tokens: int      # prompt tokens waiting to be prefilled, all engines
    decode_requests: int            # requests in their decode phase, all engines
    kv_used_tokens: int
    kv_capacity_tokens: int
    waiting_requests: int           # queue length: legs admitted to no batch yet
    running_requests: int
    engines_prefill: int            # available engines per role; switching ones counted apart
    engines_decode: int
    engines_colocated: int
    engines_switching: int          # unavailable: switching roles (or failed)
    completed_trajectories: int
    total_trajectories: int


COLUMNS = list(Sample.__dataclass_fields__)


@dataclass
class ClusterSampler:
    """Samples the cluster every `interval_s` of backend time until the rollout has finished; after
    IDLE_TICKS intervals in a row in which nothing but ticks ran (this sampler's and, given the driver's
    `ticks`, the policy's control ticks: harness/ticks.py), each next interval is twice the last (at most
    a day) until something happens again, so that timeseries.parquet has fewer rows in a long idle
    stretch, where the state does not change. Sampling then costs work in proportion to the events, not
    to simulated time (a tool call of a day, with nothing else running, is a few thousand samples).

    Listeners get every sample as it is taken (W&B logging, progress on the terminal). `progress` says
    (trajectories completed, trajectories in the run): the sampler does not know the driver.
    """

    backend: Backend
    progress: Callable[[], tuple[int, int]]
    interval_s: float
    listeners: list[Callable[[Sample], None]] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    ticks: TickCount = field(default_factory=TickCount)   # shared with the run's other tickers
    _backoff: IdleBackoff = field(init=False)

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"sample_interval_s={self.interval_s} is invalid; allowed: > 0")
        self._backoff = IdleBackoff(self.ticks)

    def start(self) -> None:
        self.backend.call_later(0.0, self._tick, observer=True)

    def _tick(self) -> None:
        self._backoff.tick()
        sample = self._sample()
        self.samples.append(sample)
        for listener in self.listeners:
            listener(sample)
        done, total = self.progress()
        if done < total:
            gap = self._backoff.next_gap_s(event_count(self.backend), self.interval_s)
            self.backend.call_later(gap, self._tick, observer=True)

    def _sample(self) -> Sample:
        view = self.backend.view()
        done, total = self.progress()
        serving = [e for e in view.engines if e.available]
        return Sample(
            t_s=view.now,
            prefill_demand_tokens=sum(e.waiting_prefill_tokens for e in view.engines),
            decode_requests=sum(e.decoding_requests for e in view.engines),
            kv_used_tokens=sum(e.kv_used_tokens for e in view.engines),
            kv_capacity_tokens=sum(e.kv_capacity_tokens for e in view.engines),
            waiting_requests=sum(e.waiting_requests for e in view.engines),
            running_requests=sum(e.running_requests for e in view.engines),
            engines_prefill=sum(e.role == Role.PREFILL for e in serving),
            engines_decode=sum(e.role == Role.DECODE for e in serving),
            engines_colocated=sum(e.role == Role.COLOCATED for e in serving),
            engines_switching=len(view.engines) - len(serving),
            completed_trajectories=done,
            total_trajectories=total)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(s) for s in self.samples], columns=COLUMNS)
