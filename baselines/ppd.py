"""ppd: only first turns (and turns whose KV holder is gone) go to prefill engines; every later turn
appends its new tokens on the decode engine that holds the trajectory's KV, so no KV moves
(after "Not All Prefills Are Equal", arXiv 2603.13358). A fixed P:D split, `num_prefill`."""
from __future__ import annotations

from baselines.fixed_pd import FixedPD
from harness.api import ClusterView, Role, Route, TurnRequest


class PPD(FixedPD):
    name = "ppd"

    def route(self, request: TurnRequest, view: ClusterView) -> Route | None:
        holder = self.prefix.decode_engine.get(request.trajectory_id)
        for e in view.with_role(Role.DECODE):
            if e.engine_id == holder:
                return Route(holder, holder)
        return super().route(request, view)
