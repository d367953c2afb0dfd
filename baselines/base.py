"""What the static baselines share: prefix tracking from events, no re-planning, a validated split."""
from __future__ import annotations

from harness.api import ClusterView, LifecycleEvent, Role
from harness.policy import Policy
from harness.routing import PrefixTracker


def split_roles(num_prefill: int, num_engines: int) -> list[Role]:
    """`num_prefill` prefill engines, the rest decode; rejects a split that leaves a pool empty."""
    if num_engines < 2:
        raise ValueError(f"a P/D split needs cluster.num_engines >= 2 (one prefill and one decode engine); "
                         f"cluster.num_engines={num_engines}: use policy=colocate")
    if not (isinstance(num_prefill, int) and 1 <= num_prefill <= num_engines - 1):
        raise ValueError(f"policy.num_prefill={num_prefill!r} is invalid; allowed: an integer in "
                         f"[1, {num_engines - 1}] (cluster.num_engines={num_engines})")
    return [Role.PREFILL] * num_prefill + [Role.DECODE] * (num_engines - num_prefill)


class StaticPolicy(Policy):
    """Roles fixed at the start; routing follows where each trajectory's KV lives."""

    control_interval_s = None

    def __init__(self) -> None:
        self.prefix = PrefixTracker()

    def observe(self, event: LifecycleEvent) -> None:
        self.prefix.observe(event)

    def plan(self, view: ClusterView) -> None:
        return None

    def plan_latency_s(self, cpu_s: float) -> None:
        return None   # never plans

    def metrics(self) -> dict:
        return {}
