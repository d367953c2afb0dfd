"""oracle_pd: AN ORACLE, not a deployable policy. It knows the future by simulating it: it forks the
running simulation (which holds every trajectory's script) and runs each candidate allocation to the
end of the rollout, then takes the best; it needs the simulator (backend=sim). It is never behind
the best static allocation, but it is not an upper bound on switching: each decision compares holding
one allocation to the end, so a split that serves only the phase at hand loses to one that serves
every phase left (REPRODUCE.md, section 5's curricula).

- At the start it runs the whole rollout under colocation and every P:D split (nothing is loaded yet,
  so no switch is paid) and starts in the best: never worse than the best static allocation
  (the report's `hindsight_best` row).
- Every `decision_interval_s` it forks the rollout and runs "stay" and every other candidate (switch
  prices included, as the cluster's switch mechanism charges them) to the end; it switches only to a
  candidate that ends sooner. A candidate's run (here and at the start) stops as soon as its rollout
  time is sure to exceed the best so far: it could not be chosen, and the choice is the same. Between
  decisions the rollout runs exactly as the fork of the chosen candidate did, so each decision can
  only shorten the predicted end: the oracle never ends later than its start allocation, hence never
  behind `hindsight_best`. So staying's time at a decision is the time the last decision predicted for the
  allocation it chose, and is not simulated again.
"""
from __future__ import annotations

import math
from collections.abc import Callable

from harness.allocation import COLOCATED, current_split, roles_for, target_roles
from harness.api import ClusterView, LifecycleEvent, Role, Route, RunInfo, TurnRequest
from harness.cluster import ClusterConfig
from harness.policy import Policy
from harness.routing import SGL_ROUTER, Balance, PrefixTracker, route_by_role
from harness.sim.backend import nested_runs


class HoldRoles(Policy):
    """The roles stay as they are; routing as Prorsa's (route_by_role). What a fork runs."""

    name = "hold_roles"
    control_interval_s = None

    def __init__(self, prefix: PrefixTracker, balance: Balance = SGL_ROUTER):
        self.prefix, self.balance = prefix, balance

    def initial_roles(self, cluster: ClusterConfig, run: RunInfo) -> list[Role]:
        raise ValueError("hold_roles only continues a forked rollout")

    def observe(self, event: LifecycleEvent) -> None:
        self.prefix.observe(event)

    def plan(self, view: ClusterView) -> None:
        return None

    def plan_latency_s(self, cpu_s: float) -> None:
        return None   # never plans

    def route(self, request: TurnRequest, view: ClusterView) -> Route | None:
        return route_by_role(request, view, self.prefix, self.balance)

    def metrics(self) -> dict:
        return {}


class OraclePD(Policy):
    name = "oracle_pd"

    def __init__(self, *, control_interval_s: float, decision_interval_s: float, allow_colocated: bool,
                 name: str = "oracle_pd"):
        self.name = name
        self.control_interval_s = control_interval_s
        self.decision_interval_s = decision_interval_s
        self.allow_colocated = allow_colocated
        self.prefix = PrefixTracker()
        self.decisions: list[tuple[float, int]] = []
        self.predicted: list[tuple[float, dict[int, float | None]]] = []
        self._next = decision_interval_s
        self._chosen_s: float | None = None   # the predicted rollout time of the allocation held now
        self._simulate: Callable[..., float | None] | None = None
        self._driver = None

    # --- Policy contract ----------------------------------------------------------------------
    def attach_simulator(self, simulate: Callable[..., float | None]) -> None:
        self._simulate = simulate

    def attach_driver(self, driver) -> None:
        self._driver = driver

    def initial_roles(self, cluster: ClusterConfig, run: RunInfo) -> list[Role]:
        if self._simulate is None:
            raise ValueError("policy=oracle_pd needs the simulator (backend=sim): it simulates the future")
        self.n = cluster.num_engines
        self.balance = Balance.of(cluster)
        candidates = ([COLOCATED] if self.allow_colocated else []) + list(range(1, self.n))
        scores = race(candidates, lambda k, limit_s: self._simulate(roles_for(k, self.n),
                                                                  HoldRoles(PrefixTracker(), self.balance), limit_s))
        finished = {k: v for k, v in scores.items() if v is not None}
        best = min(finished, key=lambda k: (finished[k], k))
        self._chosen_s = finished[best]
        self.decisions.append((0.0, best))
        self.predicted.append((0.0, scores))
        return roles_for(best, self.n)

    def observe(self, event: LifecycleEvent) -> None:
        self.prefix.observe(event)

    def plan(self, view: ClusterView) -> dict[int, Role] | None:
        if view.now < self._next:
            return None
        self._next = view.now + self.decision_interval_s
        current = current_split(view)
        if current is None:
            return None
        roles_of = {}

        def forked(k: int, limit_s: float) -> float | None:
            roles_of[k] = target_roles(view, k)
            with nested_runs():
                fork = self._driver.fork(HoldRoles(_copy_prefix(self.prefix), self.balance))
                fork.apply_roles(fork.backend.view(), roles_of[k])
                rollout_s = fork.resume_within(limit_s)
                del fork   # before nested_runs collects: the fork's graph is freed with it
            return rollout_s
        others = [k for k in ([COLOCATED] if self.allow_colocated else []) + list(range(1, self.n)) if k != current]
        # staying first: every other candidate must beat it; its time is the one the last decision predicted
        scores = race([current, *others], forked, known={current: self._chosen_s})
        self.predicted.append((view.now, scores))
        finished = {k: v for k, v in scores.items() if v is not None}
        best = min(finished, key=lambda k: (finished[k], k != current, k))
        if best == current or not finished[best] < finished[current]:
            return None
        self._chosen_s = finished[best]
        self.decisions.append((view.now, best))
        return roles_of[best]

    def plan_latency_s(self, cpu_s: float) -> None:
        return None   # an oracle: its decisions are free

    def route(self, request: TurnRequest, view: ClusterView) -> Route | None:
        return route_by_role(request, view, self.prefix, self.balance)

    def metrics(self) -> dict:
        # a candidate's predicted time is null where its run stopped once sure to end after the best
        return {"oracle_decisions": [[round(t, 3), k] for t, k in self.decisions],
                "oracle_predicted_s": [[round(t, 3), {str(k): None if v is None else round(v, 3) for k, v in s.items()}]
                                       for t, s in self.predicted]}


def race(candidates: list[int], run: Callable[[int, float], float | None],
         known: dict[int, float | None] | None = None) -> dict[int, float | None]:
    """Each candidate's rollout time, in order: `run(k, limit_s)` stops once sure to exceed the best so far
    (None: it could not be chosen). A time in `known` is taken as it is, not run."""
    scores: dict[int, float | None] = {}
    best_s = math.inf
    for k in candidates:
        scores[k] = known[k] if known and known.get(k) is not None else run(k, best_s)
        if scores[k] is not None:
            best_s = min(best_s, scores[k])
    return scores


def _copy_prefix(p: PrefixTracker) -> PrefixTracker:
    q = PrefixTracker()
    q.prefill_engine, q.decode_engine = dict(p.prefill_engine), dict(p.decode_engine)
    return q
