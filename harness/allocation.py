"""Allocations as splits (how many prefill engines; COLOCATED: none), and which engines change role to
reach one. Here, not in a policy, because every policy that switches roles uses it (Prorsa, PEARL,
oracle_pd).

The cheapest to drain switch: a decode engine with the least decode work bound to it (then the fewest
running sequences and least KV in use) becomes a prefill engine; a prefill engine still carrying the
most decode work (decodes it was running when it became a prefill engine), then the least queued
prefill, becomes a decode engine. Going to or from colocation moves every engine; the least
decode-loaded become the prefill pool. `decode_left` (engine id -> output tokens its turns under way
still have to decode, the policy's forecast) ranks the engines by that work; without it every engine
counts zero. Why: with kv_both a decode engine that becomes a prefill engine finishes its running
decodes at one token per prefill step (docs/decisions/2026-12-07-prorsa-rules.md, R31).
The backend carries each switch out (drain, hand back queued legs, switch time); nothing is lost.
"""
from __future__ import annotations

from harness.api import ClusterView, Role

COLOCATED = 0   # the split "no prefill engines": every engine colocated


def roles_for(split: int, n: int) -> list[Role]:
    """The roles of `n` engines in `split` (before any engine exists: the initial allocation)."""
    if split == COLOCATED:
        return [Role.COLOCATED] * n
    return [Role.PREFILL] * split + [Role.DECODE] * (n - split)


def current_split(view: ClusterView) -> int | None:
    """The split the engines are in (counting switches under way); None while mixed or switching."""
    roles = [e.target_role or e.role for e in view.engines]
    if view.switching():
        return None
    if all(r == Role.COLOCATED for r in roles):
        return COLOCATED
    if Role.COLOCATED in roles:
        return None
    return sum(r == Role.PREFILL for r in roles)


def target_roles(view: ClusterView, target: int, decode_left: dict[int, float] | None = None) -> dict[int, Role]:
    engines = view.engines
    if target == COLOCATED:
        return {e.engine_id: Role.COLOCATED for e in engines}
    left = decode_left or {}
    prefill = [e for e in engines if e.role == Role.PREFILL]
    decode = [e for e in engines if e.role == Role.DECODE]
    roles = {e.engine_id: e.role for e in engines}
    if not prefill and not decode:  # from colocation
        order = sorted(engines, key=lambda e: (left.get(e.engine_id, 0.0), e.decoding_requests, e.kv_used_tokens,
                                               e.engine_id))
        return {e.engine_id: (Role.PREFILL if i < target else Role.DECODE) for i, e in enumerate(order)}
    if target > len(prefill):
        order = sorted(decode, key=lambda e: (left.get(e.engine_id, 0.0), e.running_requests, e.kv_used_tokens,
                                              e.engine_id))
        for e in order[: target - len(prefill)]:
            roles[e.engine_id] = Role.PREFILL
    elif target < len(prefill):
        order = sorted(prefill, key=lambda e: (-left.get(e.engine_id, 0.0), e.waiting_prefill_tokens, e.engine_id))
        for e in order[: len(prefill) - target]:
            roles[e.engine_id] = Role.DECODE
    return roles
