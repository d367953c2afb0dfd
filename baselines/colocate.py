"""colocate: every engine serves both phases; a trajectory stays on the engine holding its prefix."""
from __future__ import annotations

from harness.api import ClusterView, LifecycleEvent, Role, Route, TurnRequest
from harness.cluster import ClusterConfig
from harness.routing import PrefixTracker, decode_load, pick


class Colocate:
    name = "colocate"
    control_interval_s = None

    def __init__(self) -> None:
        self.prefix = PrefixTracker()

    def initial_roles(self, cluster: ClusterConfig) -> list[Role]:
        return [Role.COLOCATED] * cluster.num_engines

    def observe(self, event: LifecycleEvent) -> None:
        self.prefix.observe(event)

    def plan(self, view: ClusterView) -> None:
        return None

    def metrics(self) -> dict:
        return {}

    def route(self, request: TurnRequest, view: ClusterView) -> Route | None:
        e = pick(view.with_role(Role.COLOCATED), self.prefix.decode_engine.get(request.trajectory_id), decode_load)
        return None if e is None else Route(e.engine_id, e.engine_id)
