"""reactive_pd: switch one engine at a time from the present prefill queue and decode load, by thresholds.

No forecast and no cost model (in the spirit of DOPD / TokenScale's reactive scaling): when the
queued prefill per prefill engine exceeds `prefill_queue_high` tokens while the decode pool has KV to
spare, a decode engine becomes a prefill engine; when the prefill queue is short and the decode pool's
KV use exceeds `decode_kv_high`, a prefill engine becomes a decode engine. It isolates the value of
forecasting against Prorsa.
"""
from __future__ import annotations

from baselines.base import split_roles
from harness.api import ClusterView, LifecycleEvent, Role, Route, RunInfo, TurnRequest
from harness.cluster import ClusterConfig
from harness.policy import Policy
from harness.routing import Balance, PrefixTracker, route_by_role


class ReactivePD(Policy):
    name = "reactive_pd"

    def __init__(self, *, num_prefill: int, control_interval_s: float, prefill_queue_high: int,
                 prefill_queue_low: int, decode_kv_high: float, decode_kv_low: float, min_dwell_s: float):
        if not 0 < decode_kv_low <= decode_kv_high <= 1:
            raise ValueError(f"policy.decode_kv_low={decode_kv_low}, policy.decode_kv_high={decode_kv_high} "
                             "are invalid; allowed: 0 < decode_kv_low <= decode_kv_high <= 1")
        if prefill_queue_low > prefill_queue_high:
            raise ValueError(f"policy.prefill_queue_low={prefill_queue_low} is invalid; allowed: <= "
                             f"policy.prefill_queue_high ({prefill_queue_high})")
        self.num_prefill = num_prefill
        self.control_interval_s = control_interval_s
        self.q_high, self.q_low = prefill_queue_high, prefill_queue_low
        self.kv_high, self.kv_low = decode_kv_high, decode_kv_low
        self.min_dwell_s = min_dwell_s
        self.prefix = PrefixTracker()
        self._last_switch = float("-inf")

    def initial_roles(self, cluster: ClusterConfig, run: RunInfo) -> list[Role]:
        self.balance = Balance.of(cluster)
        return split_roles(self.num_prefill, cluster.num_engines)

    def observe(self, event: LifecycleEvent) -> None:
        self.prefix.observe(event)

    def plan(self, view: ClusterView) -> dict[int, Role] | None:
        if view.switching() or view.now - self._last_switch < self.min_dwell_s:
            return None
        prefill = [e for e in view.engines if e.role == Role.PREFILL]
        decode = [e for e in view.engines if e.role == Role.DECODE]
        queue = sum(e.waiting_prefill_tokens for e in prefill) / max(len(prefill), 1)
        kv = sum(e.kv_used_tokens + e.queued_kv_tokens for e in decode) / max(sum(e.kv_capacity_tokens for e in decode), 1)
        roles = None
        if queue > self.q_high and kv < self.kv_low and len(decode) > 1:
            e = min(decode, key=lambda e: (e.running_requests, e.kv_used_tokens, e.engine_id))
            roles = {e.engine_id: Role.PREFILL}
        elif queue < self.q_low and kv > self.kv_high and len(prefill) > 1:
            e = min(prefill, key=lambda e: (e.waiting_prefill_tokens, e.engine_id))
            roles = {e.engine_id: Role.DECODE}
        if roles:
            self._last_switch = view.now
        return roles

    def plan_latency_s(self, cpu_s: float) -> None:
        return None   # a threshold rule: free

    def route(self, request: TurnRequest, view: ClusterView) -> Route | None:
        return route_by_role(request, view, self.prefix, self.balance)

    def metrics(self) -> dict:
        return {}
