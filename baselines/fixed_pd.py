"""fixed_pd: a fixed split of `num_prefill` prefill engines and the rest decode, never changed.

Prefix-aware inside each pool: a turn's prefill goes to the prefill engine that prefilled the
trajectory's previous turn (its prompt is cached there), its decode to the decode engine that holds
the trajectory's context (only the new tokens' KV then moves).
"""
from __future__ import annotations

from harness.api import ClusterView, LifecycleEvent, Role, Route, TurnRequest
from harness.cluster import ClusterConfig
from harness.routing import PrefixTracker, decode_load, pick, prefill_load


class FixedPD:
    name = "fixed_pd"
    control_interval_s = None

    def __init__(self, num_prefill: int = 1) -> None:
        self.num_prefill = num_prefill
        self.prefix = PrefixTracker()

    def initial_roles(self, cluster: ClusterConfig) -> list[Role]:
        num_engines = cluster.num_engines
        if not (isinstance(self.num_prefill, int) and 1 <= self.num_prefill <= num_engines - 1):
            raise ValueError(f"policy.num_prefill={self.num_prefill!r} is invalid; allowed: an integer in "
                             f"[1, {num_engines - 1}] (cluster.num_engines={num_engines})")
        return [Role.PREFILL] * self.num_prefill + [Role.DECODE] * (num_engines - self.num_prefill)

    def observe(self, event: LifecycleEvent) -> None:
        self.prefix.observe(event)

    def plan(self, view: ClusterView) -> None:
        return None

    def metrics(self) -> dict:
        return {}

    def route(self, request: TurnRequest, view: ClusterView) -> Route | None:
        tid = request.trajectory_id
        p = pick(view.with_role(Role.PREFILL), self.prefix.prefill_engine.get(tid), prefill_load)
        d = pick(view.with_role(Role.DECODE), self.prefix.decode_engine.get(tid), decode_load)
        return None if p is None or d is None else Route(p.engine_id, d.engine_id)
