"""colocate: every engine serves both phases; a trajectory stays on the engine holding its prefix."""
from __future__ import annotations

from baselines.base import StaticPolicy
from harness.api import ClusterView, Role, Route, RunInfo, TurnRequest
from harness.cluster import ClusterConfig
from harness.routing import Balance, decode_load, pick


class Colocate(StaticPolicy):
    name = "colocate"

    def initial_roles(self, cluster: ClusterConfig, run: RunInfo) -> list[Role]:
        self.balance = Balance.of(cluster)
        return [Role.COLOCATED] * cluster.num_engines

    def route(self, request: TurnRequest, view: ClusterView) -> Route | None:
        e = pick(view.with_role(Role.COLOCATED), self.prefix.decode_engine.get(request.trajectory_id), decode_load,
                 self.balance)
        return None if e is None else Route(e.engine_id, e.engine_id)
