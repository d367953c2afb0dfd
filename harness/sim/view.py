"""What the router sees of the simulated engines (ClusterView), kept rather than rebuilt.

A routing call reads every engine's state; rebuilding them all would cost O(engines * ranks) per call.
So an engine whose observable state changed is marked stale and only those are re-read, into a list
that views share instead of copying (256 references per routing call on a 1,024-GPU cluster); a re-read
copies it first if a view handed out since still holds it. The available engines of each role are
indexed, with a heap per load function, so the least loaded engine is found in O(log engines).
It also counts what the engines' own state does not show: the decode legs routed to each engine whose
prefill is not done (`routed`, `arrived`).
"""
from __future__ import annotations

import heapq
import sys
from dataclasses import fields

from mypy_extensions import mypyc_attr

from harness.api import ClusterView, EngineState, Role
from harness.routing import EngineList, decode_load, prefill_load, request_load
from harness.sim.clock import EventLoop
from harness.sim.engine import SimEngine

# EngineState's fields in this order: built positionally (a third of the keyword call's cost).
_STATE_BY_POSITION = tuple(f.name for f in fields(EngineState)) == (
    "engine_id", "role", "available", "gpus", "waiting_requests", "waiting_prefill_tokens", "running_requests",
    "decoding_requests", "kv_used_tokens", "kv_capacity_tokens", "queued_kv_tokens", "inbound_requests",
    "target_role", "launched_as")


@mypyc_attr(serializable=True, allow_interpreted_subclasses=True)
class EngineViews:
    def __init__(self, engines: list[SimEngine], count: int, gpus: int, loop: EventLoop):
        """`engines`: the backend's list (filled after this is made), `count` of them."""
        self.engines, self.loop = engines, loop
        self._gpus = gpus
        self._stale: list[SimEngine] = []
        self._states: list = [None] * count   # every engine's, filled as each is marked stale
        self._states_alone = self._states_refs()    # its reference count while only this holds it
        self._gen = 0                                   # bumped whenever a state is re-read
        self._roles: dict[Role, _RoleIndex] | None = None   # available engines per role, by id
        self._inbound = [0] * count       # decode legs routed here, prefill not done
        self._inbound_tokens = [0] * count

    def mark_stale(self, e: SimEngine) -> None:
        """Something `view()` reports of engine `e` changed."""
        if not e.stale:
            e.stale = True
            self._stale.append(e)

    def routed(self, e: SimEngine, tokens: int) -> None:
        """A decode leg of `tokens` prompt tokens is bound for `e`, its prefill not done."""
        self._inbound[e.id] += 1
        self._inbound_tokens[e.id] += tokens
        self.mark_stale(e)

    def arrived(self, engine_id: int, tokens: int) -> None:
        """A decode leg counted by `routed` is no longer on its way (prefilled, or handed back)."""
        self._inbound[engine_id] -= 1
        self._inbound_tokens[engine_id] -= tokens

    def inbound(self, engine_id: int) -> int:
        """Decode legs bound for the engine whose prefill is not done."""
        return self._inbound[engine_id]

    def view(self) -> ClusterView:
        if self._stale:
            self._refresh()
        view = _SimView(self.loop.now, self._states)
        view._views, view._gen = self, self._gen
        return view

    def _states_refs(self) -> int:
        return sys.getrefcount(self._states)

    def state(self, e: SimEngine) -> EngineState:
        """Engine `e` as the router sees it now."""
        waiting, pending, running, decoding, used, queued = e.scheduler.totals()
        if _STATE_BY_POSITION:
            return EngineState(e.id, e.role, e.available, self._gpus, waiting, pending, running, decoding, used,
                               e.kv_capacity_tokens, queued + self._inbound_tokens[e.id], self._inbound[e.id],
                               e.target_role, e.launched_as)
        return EngineState(
            engine_id=e.id, role=e.role, available=e.available, gpus=self._gpus,
            waiting_requests=waiting, waiting_prefill_tokens=pending, running_requests=running,
            decoding_requests=decoding, kv_used_tokens=used, kv_capacity_tokens=e.kv_capacity_tokens,
            target_role=e.target_role, queued_kv_tokens=queued + self._inbound_tokens[e.id],
            inbound_requests=self._inbound[e.id], launched_as=e.launched_as)

    def _refresh(self) -> None:
        if self._states_refs() > self._states_alone:
            self._states = list(self._states)   # copy on write: a view still holding it keeps what it was given
        states, roles = self._states, self._roles
        for e in self._stale:
            e.stale = False
            old = states[e.id]
            s = states[e.id] = self.state(e)
            if roles is None:
                continue
            if old.role is not s.role or old.available != s.available:
                roles = None   # membership changed (a role switch): rebuilt when next asked
            elif s.available:
                roles[s.role].replace(s)
        self._stale.clear()
        self._roles = roles
        self._gen += 1

    def _role_index(self, role: Role) -> _RoleIndex:
        if self._roles is None:
            self._roles = {r: _RoleIndex(self, r, [s for s in self._states if s.available and s.role == r])
                           for r in Role}
        return self._roles[role]


class _SimView(ClusterView):
    """A view whose `with_role` answers from the role index while the view is the newest
    (nothing re-read since); an older view answers from its own engines, as any ClusterView."""

    _views: EngineViews | None = None
    _gen = -1

    def generated_tokens(self) -> dict[int, int]:
        """Read from the engines when asked (building it for every routing call would cost a pass over
        every running request)."""
        b = self._views
        return {} if b is None else {tid: n for e in b.engines for tid, n in e.decoding(b.loop.now)}

    def with_role(self, role: Role) -> list[EngineState]:
        b = self._views
        if b is None or b._gen != self._gen:
            return super().with_role(role)
        index = b._role_index(role)
        return EngineList.indexed(index.engines, index, self._gen)


@mypyc_attr(serializable=True, allow_interpreted_subclasses=True)
class _RoleIndex:
    """The available engines of one role, in id order: where each one is, and (built on first use)
    a heap per load function, so the least loaded engine is found in O(log engines)."""

    LOADS = (decode_load, prefill_load, request_load)   # keys that end with the engine id: no two engines tie

    def __init__(self, views: EngineViews, role: Role, engines: list[EngineState]):
        self.views, self.role = views, role
        self.engines = engines
        self.positions: dict = {s.engine_id: i for i, s in enumerate(engines)}
        self.heaps: dict = {}            # load -> [heap of (key, n, state), ids re-read since]
        self.pushed = 0

    def position(self, engine_id: int | None) -> int | None:
        return self.positions.get(engine_id)

    def replace(self, s: EngineState) -> None:
        self.engines[self.positions[s.engine_id]] = s
        for h in self.heaps.values():
            h[1].add(s.engine_id)

    def least(self, load, gen: int) -> EngineState | None:
        """The engine `min(engines, key=load)` gives, or None when this index cannot tell."""
        b = self.views
        if gen != b._gen or b._roles is None or b._roles.get(self.role) is not self \
                or not any(load is f for f in self.LOADS):
            return None
        states = b._states
        h = self.heaps.get(load)
        if h is None or len(h[1]) > len(self.engines) // 2 or len(h[0]) > 4 * len(self.engines):
            heap = [(load(s), 0, s) for s in self.engines]
            heapq.heapify(heap)
            h = self.heaps[load] = [heap, set()]
        heap, pending = h
        for i in pending:   # n orders one engine's entries; the keys of two engines never tie
            self.pushed += 1
            heapq.heappush(heap, (load(states[i]), self.pushed, states[i]))
        pending.clear()
        while states[heap[0][2].engine_id] is not heap[0][2]:
            heapq.heappop(heap)     # an entry for a state since re-read
        return heap[0][2]
