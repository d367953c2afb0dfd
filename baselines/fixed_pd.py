"""fixed_pd: a fixed split of `num_prefill` prefill engines and the rest decode, never changed.

Prefix-aware inside each pool: a turn's prefill goes to the prefill engine that prefilled the
trajectory's previous turn (its prompt is cached there), its decode to the decode engine that holds
the trajectory's context (only the new tokens' KV then moves).
"""
from __future__ import annotations

from baselines.base import StaticPolicy, split_roles
from harness.api import ClusterView, Role, Route, RunInfo, TurnRequest
from harness.cluster import ClusterConfig
from harness.routing import Balance, decode_load, pick, prefill_load


class FixedPD(StaticPolicy):
    name = "fixed_pd"

    def __init__(self, *, num_prefill: int) -> None:
        super().__init__()
        self.num_prefill = num_prefill

    def initial_roles(self, cluster: ClusterConfig, run: RunInfo) -> list[Role]:
        self.balance = Balance.of(cluster)
        return split_roles(self.num_prefill, cluster.num_engines)

    def route(self, request: TurnRequest, view: ClusterView) -> Route | None:
        tid = request.trajectory_id
        p = pick(view.with_role(Role.PREFILL), self.prefix.prefill_engine.get(tid), prefill_load, self.balance)
        d = pick(view.with_role(Role.DECODE), self.prefix.decode_engine.get(tid), decode_load, self.balance)
        return None if p is None or d is None else Route(p.engine_id, d.engine_id)
