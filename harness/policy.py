"""The contract between the rollout driver and an allocation policy (baselines/, harness/prorsa).

Its own module because it names both the engine-facing types (harness.api) and the cluster config
(harness.cluster), which itself builds on harness.api.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING

from harness.api import ClusterView, LifecycleEvent, Role, Route, RunInfo, TurnRequest
from harness.cluster import ClusterConfig

if TYPE_CHECKING:
    import pandas as pd


class Policy(ABC):
    """Decides engine roles (plan) and where each turn runs (route).

    `initial_roles`: the roles the engines are launched in (with each role's parallelism, which kv_both
    and drain switches keep). `plan` is called every `control_interval_s` of (simulated or wall) time
    (in the simulator, further apart in a long stretch where nothing happens: harness/ticks.py), and
    in sync RL before each step's batch (the first included; every trajectory of the last step ended,
    none of the next started: the batch starts once the switches asked for are done), and returns
    the roles it wants, or None to keep the current ones. `route` must pick available engines:
    engines whose role serves the leg (colocated or prefill for the prefill leg; colocated or
    decode for the decode leg). On real engines `plan` runs in a worker thread while the driver's loop
    goes on routing (`route` is called meanwhile; events reach `observe` once the plan returns).

    A policy subclasses it; the hooks after `route` do nothing unless overridden, so the experiment
    calls them on every policy and names none.
    """

    name: str
    control_interval_s: float | None

    @abstractmethod
    def initial_roles(self, cluster: ClusterConfig, run: RunInfo) -> list[Role]: ...

    @abstractmethod
    def metrics(self) -> dict: ...      # policy-specific entries for summary.json

    @abstractmethod
    def observe(self, event: LifecycleEvent) -> None: ...

    @abstractmethod
    def plan(self, view: ClusterView) -> dict[int, Role] | None: ...

    @abstractmethod
    def plan_latency_s(self, cpu_s: float) -> float | None:
        """The simulated time from the last `plan` call to its decision's application, given the CPU
        seconds it took (the driver measures them); None when that call made no plan worth recording (a
        rule evaluated, or none due). Real engines ignore the value: a plan there takes what it takes."""

    @abstractmethod
    def route(self, request: TurnRequest, view: ClusterView) -> Route | None: ...   # None: park the turn

    # --- optional hooks ---------------------------------------------------------------------------
    def attach_simulator(self, simulate: Callable[..., float | None]) -> None:
        """On the simulator, before `initial_roles`: `simulate(roles, policy)` is the whole rollout's time
        from the start, its engines launched in `roles` and `policy` driving (an oracle sees the future
        through it); `simulate(roles, policy, limit_s)` is None once that time is sure to exceed `limit_s`."""

    def attach_driver(self, driver) -> None:
        """The run's RolloutDriver, once built: on the simulator its `fork()` runs the rollout ahead."""

    def forecast_frame(self) -> pd.DataFrame | None:
        """The policy's forecasts against what happened (forecast.parquet); None: no such file."""
        return None
