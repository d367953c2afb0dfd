"""Routing helpers shared by policies: where each trajectory's KV lives, and which engine is least loaded.

A real router knows where it sent each trajectory's last legs (sticky sessions), so prefix-aware
routing needs nothing beyond the lifecycle events. Like SGLang's router (sgl-router `cache_aware`), it
keeps a trajectory on the engine holding its prefix unless that engine is overloaded against the
least busy one, and then sends it to the least busy (its prefix recomputed there).
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.api import ClusterView, EngineState, EventKind, LifecycleEvent, Role, Route, TurnRequest


_PREFILL_END, _DECODE_END, _TRAJECTORY_END = EventKind.PREFILL_END, EventKind.DECODE_END, EventKind.TRAJECTORY_END
_CLEARED = EventKind.PREFIX_CACHE_CLEARED


class PrefixTracker:
    """The engine that last prefilled and the engine that last decoded each trajectory, while its KV is
    there: an engine whose prefix cache was cleared (a role switch that reloads or resets it) holds
    nobody's. Why: a trajectory pinned to an engine that no longer has its KV gains nothing from the
    pin; after a switch to colocation the former decode engines, which had decoded every live
    trajectory's turn while draining, kept them all and the engines that had been prefill engines
    got no work (browse on dense8_h100, 6P2D -> colocated at a sync step's start: 1,090 s to the
    step's end, against 258 s for colocation throughout)."""

    def __init__(self) -> None:
        self.prefill_engine: dict[int, int] = {}
        self.decode_engine: dict[int, int] = {}

    def observe(self, e: LifecycleEvent) -> None:
        kind = e.kind   # (module constants: this runs for every lifecycle event)
        if kind == _PREFILL_END:
            self.prefill_engine[e.trajectory_id] = e.engine_id
        elif kind == _DECODE_END:
            self.decode_engine[e.trajectory_id] = e.engine_id
        elif kind == _TRAJECTORY_END:
            self.prefill_engine.pop(e.trajectory_id, None)
            self.decode_engine.pop(e.trajectory_id, None)
        elif kind == _CLEARED:
            for held in (self.prefill_engine, self.decode_engine):
                for tid in [t for t, engine in held.items() if engine == e.engine_id]:
                    del held[tid]


def prefill_load(e: EngineState) -> tuple:
    """Prefill work queued or running (tokens), then requests."""
    return (e.waiting_prefill_tokens, e.running_requests + e.waiting_requests, e.engine_id)


def requests_in_flight(e: EngineState) -> int:
    """Requests queued, running, or routed here and still prefilling elsewhere."""
    return e.running_requests + e.waiting_requests + e.inbound_requests


def decode_load(e: EngineState) -> tuple:
    """KV memory in use or promised to assigned legs, as a fraction of capacity, then requests."""
    return ((e.kv_used_tokens + e.queued_kv_tokens) / max(e.kv_capacity_tokens, 1), requests_in_flight(e),
            e.engine_id)


@dataclass(frozen=True)
class Balance:
    """When a turn leaves the engine holding its prefix: that engine holds more than `abs_requests`
    requests in flight over the least busy candidate and more than `rel` times its requests. Defaults:
    sgl-router's cache_aware ones (sgl-project/sglang, sgl-router/py_src/sglang_router/router_args.py:
    balance_abs_threshold 64, balance_rel_threshold 1.5; a worker's load is its requests in flight).
    There the router balances when the busiest worker exceeds the least busy by both; here a turn
    leaves its prefix's engine when that engine does. Set per cluster (`cluster.router_balance_abs_requests`,
    `cluster.router_balance_rel`)."""

    abs_requests: int = 64
    rel: float = 1.5

    @classmethod
    def of(cls, cluster) -> Balance:
        """The cluster config's rule (harness/cluster.py ClusterConfig)."""
        return cls(cluster.router_balance_abs_requests, cluster.router_balance_rel)


SGL_ROUTER = Balance()


def request_load(e: EngineState) -> tuple:
    """Requests in flight, then the engine id (no two engines tie)."""
    return (requests_in_flight(e), e.engine_id)


class EngineList(list):
    """A `with_role` answer from a backend that indexes its engines (the simulator): a list of
    EngineState that can also say where an engine is in it and which is least loaded without a scan,
    so routing on a large cluster does not cost O(engines). Any change to the list drops the index.
    `lookup`: position(engine_id) -> int | None and least(load, gen) -> EngineState | None."""

    __slots__ = ("lookup", "gen")

    @classmethod
    def indexed(cls, engines, lookup, gen: int) -> EngineList:
        out = cls(engines)
        out.lookup, out.gen = lookup, gen
        return out


def _dropping_index(name: str):
    method = getattr(list, name)

    def changed(self, *args, **kwargs):
        self.lookup = None
        return method(self, *args, **kwargs)
    changed.__name__ = name
    return changed


for _name in ("__setitem__", "__delitem__", "__iadd__", "__imul__", "append", "extend", "insert", "pop",
              "remove", "clear", "sort", "reverse"):
    setattr(EngineList, _name, _dropping_index(_name))


def _least(candidates: list[EngineState], load) -> EngineState:
    lookup = getattr(candidates, "lookup", None) if type(candidates) is EngineList else None
    best = lookup.least(load, candidates.gen) if lookup is not None else None
    return best if best is not None else min(candidates, key=load)


def _preferred(candidates: list[EngineState], preferred: int | None) -> EngineState | None:
    lookup = getattr(candidates, "lookup", None) if type(candidates) is EngineList else None
    if lookup is not None:   # the same answer as the scan below, from the backend's index
        i = lookup.position(preferred)
        return candidates[i] if i is not None else None
    return next((e for e in candidates if e.engine_id == preferred), None)


def pick(candidates: list[EngineState], preferred: int | None, load, balance: Balance = SGL_ROUTER) -> EngineState | None:
    """The preferred engine if it is a candidate (it holds the prefix) and not overloaded by `balance`'s
    rule against the least busy candidate, which then takes the turn; else the least loaded by `load`
    (docs/decisions/2026-12-07-prorsa-rules.md, R25)."""
    if not candidates:
        return None
    e = _preferred(candidates, preferred)
    if e is None:
        return _least(candidates, load)
    n = requests_in_flight(e)
    if n <= balance.abs_requests:    # cannot be imbalanced: no scan
        return e
    lo = _least(candidates, request_load)
    m = requests_in_flight(lo)
    return lo if n - m > balance.abs_requests and n > balance.rel * m else e


def route_by_role(request: TurnRequest, view: ClusterView, prefix: PrefixTracker,
                  balance: Balance = SGL_ROUTER, placement=decode_load) -> Route | None:
    """Route to whatever roles exist now: PD when prefill and decode engines are available, else a
    colocated engine, else append-prefill on a decode engine; None (wait) when nothing can serve.
    `placement`: the load that picks the engine to decode a turn no candidate holds the prefix of."""
    tid = request.trajectory_id
    p = pick(view.with_role(Role.PREFILL), prefix.prefill_engine.get(tid), prefill_load, balance)
    d = pick(view.with_role(Role.DECODE), prefix.decode_engine.get(tid), placement, balance)
    if p is not None and d is not None:
        return Route(p.engine_id, d.engine_id)
    c = pick(view.with_role(Role.COLOCATED), prefix.decode_engine.get(tid), placement, balance)
    if c is not None:
        return Route(c.engine_id, c.engine_id)
    if d is not None:
        return Route(d.engine_id, d.engine_id)
    return None
