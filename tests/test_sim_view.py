"""The simulator keeps its cluster view up to date incrementally (only engines that changed are
re-read) and indexes engines per role for routing. Checked here against a view rebuilt from every
engine on every call, and against routing by plain scans, over runs with role switches, PD, SGLang
semantics and preemptions."""
from __future__ import annotations

import pytest

from harness.api import ClusterView, EngineState, Role
from harness.routing import EngineList, decode_load, pick, prefill_load, request_load
from harness.sim.backend import SimBackend
from tests.conftest import SwitchAt, simulate
from tests.test_sim_invariants import TIGHT


def full_view(b: SimBackend) -> ClusterView:
    """The cluster view read from every rank of every engine."""
    states = []
    for e in b.engines:
        rs = e.scheduler.ranks
        states.append(EngineState(
            engine_id=e.id, role=e.role, available=e.available, gpus=b.cluster.gpus_per_engine,
            waiting_requests=sum(len(r.waiting) for r in rs), waiting_prefill_tokens=sum(r.pending_prefill for r in rs),
            running_requests=sum(len(r.running) for r in rs), decoding_requests=sum(r.decode_n for r in rs),
            kv_used_tokens=sum(r.kv.used for r in rs), kv_capacity_tokens=e.kv_capacity_tokens,
            target_role=e.target_role, queued_kv_tokens=sum(r.waiting_kv for r in rs) + b.views._inbound_tokens[e.id],
            inbound_requests=b.views._inbound[e.id], launched_as=e.launched_as))
    return ClusterView(now=b.loop.now, engines=states)


def switching() -> SwitchAt:
    """Colocated engines, then one prefill and one decode engine from t=3 s (with PD routing)."""
    return SwitchAt([Role.COLOCATED] * 3, {0: Role.PREFILL, 1: Role.DECODE}, at_s=3.0, control_interval_s=1.0)


CASES = {
    "colocate-moe": (["policy=colocate", "cluster=moe_h200"], None),
    "fixed_pd-moe": (["policy=fixed_pd", "cluster=moe_h200", "policy.num_prefill=3"], None),
    "ppd-swe": (["policy=ppd", "workload=swe"], None),
    "colocate-tight": (["policy=colocate", *TIGHT], None),
    "fixed_pd-tight": (["policy=fixed_pd", "policy.num_prefill=1", *TIGHT], None),
    "switch-reshard": (["cluster.num_engines=3", "cluster.switch_mechanism=reshard"], switching),
    "switch-drain-sglang": (["cluster.num_engines=3", "cluster.switch_mechanism=drain", "cluster.engine=sglang"],
                            switching),
    "switch-kv_both-async": (["cluster.num_engines=3", "cluster.switch_mechanism=kv_both", "mode=async",
                              "mode.max_in_flight=12"], switching),
}


@pytest.mark.parametrize("case", CASES)
def test_kept_view_and_role_index_match_a_full_rebuild(small, case, monkeypatch):
    extra, policy = CASES[case]
    kept = SimBackend.view
    checked = {"views": 0, "picks": 0}

    def view(self):
        v = kept(self)
        assert v.engines == full_view(self).engines
        for role in Role:
            indexed = v.with_role(role)
            plain = ClusterView.with_role(v, role)
            assert type(indexed) is EngineList and indexed == plain
            for preferred in (None, plain[0].engine_id if plain else None, plain[-1].engine_id if plain else None):
                for load in (decode_load, prefill_load, request_load):
                    assert pick(v.with_role(role), preferred, load) is pick(plain, preferred, load)
                    checked["picks"] += 1
        checked["views"] += 1
        return v

    monkeypatch.setattr(SimBackend, "view", view)
    result, df, _ = simulate(small + extra, policy=policy() if policy else None)
    assert checked["views"] > 20 and checked["picks"] > 0
    assert result.num_role_switches == (2 if policy else 0)
    assert "tight" not in case or df.preemptions.sum() > 0


def test_an_engine_list_changed_by_its_caller_is_scanned(small):
    _, _, backend = simulate(small + ["policy=colocate", "mode.num_steps=1", "workload.batch_size=2"])
    v = backend.view()
    engines = v.with_role(Role.COLOCATED)
    assert engines.lookup is not None
    last = engines[-1]
    engines.sort(key=lambda e: -e.engine_id)
    assert engines.lookup is None
    assert pick(engines, last.engine_id, decode_load) is last
    stale = v.with_role(Role.COLOCATED)
    backend.views.mark_stale(backend.engines[0])
    backend.view()                 # a newer view: the older one answers from its own engines
    assert pick(stale, None, decode_load) is min(stale, key=decode_load)


def test_the_simulator_builds_the_same_lifecycle_events():
    from harness.api import EventKind, LifecycleEvent
    from harness.sim.backend import _event
    a = LifecycleEvent(EventKind.PREEMPTED, 1.5, 3, 4, 5, 6, 7)
    b = _event(EventKind.PREEMPTED, 1.5, 3, 4, 5, 6, 7)
    assert type(b) is LifecycleEvent and a == b and hash(a) == hash(b) and repr(a) == repr(b)
    assert a.__dict__ == b.__dict__ and list(a.__dict__) == list(b.__dict__)


@pytest.mark.sources
@pytest.mark.parametrize("case", ["fixed_pd-tight", "colocate-tight", "switch-drain-sglang", "switch-reshard"])
def test_engine_bookkeeping_matches_the_queues_and_caches(small, case, monkeypatch):
    """What the engines keep to avoid looking into their queues and caches (each trajectory's prefix
    holders, each rank's earliest finish) always matches them."""
    from harness.sim.scheduler import _NO_FINISH, RequestStatus, Scheduler
    schedule = Scheduler.schedule
    checked = []

    def checked_schedule(scheduler):
        holders = {}
        ranks = scheduler.ranks
        for i, r in enumerate(ranks):
            for tid in r.kv.cache:
                holders[tid] = holders.get(tid, 0) | (1 << i)
            live = [f for f, seq, s in r.finish_heap
                    if s.status is RequestStatus.DECODING and r.running.get(seq) is s]
            assert r.next_finish is None or r.next_finish == min(live, default=_NO_FINISH)
            assert r.kv.holders is ranks[0].kv.holders
            assert r.kv.cache_tokens == sum(r.kv.cache.values()) and 0 <= r.kv.used <= r.kv.capacity
        assert ranks[0].kv.holders == holders
        checked.append(scheduler.engine_id)
        return schedule(scheduler)

    monkeypatch.setattr(Scheduler, "schedule", checked_schedule)
    extra, policy = CASES[case]
    result, df, _ = simulate(small + extra, policy=policy() if policy else None)
    assert len(checked) > 50
    assert "tight" not in case or df.preemptions.sum() > 0


def state(engine_id: int, running: int, waiting: int = 0) -> EngineState:
    return EngineState(engine_id=engine_id, role=Role.DECODE, available=True, gpus=1, waiting_requests=waiting,
                       waiting_prefill_tokens=0, running_requests=running, decoding_requests=running,
                       kv_used_tokens=running, kv_capacity_tokens=10_000)


@pytest.mark.parametrize("held,least,moves", [
    (64, 0, False),     # not over 64 requests: stays with its prefix
    (70, 5, True),      # 65 more and 14x: the least busy takes it
    (69, 5, False),     # 64 more: not over the absolute threshold
    (200, 140, False),  # 60 more
    (300, 190, True),   # 110 more and 1.58x
    (300, 210, False),  # 90 more but 1.43x: not over the relative threshold
])
def test_a_turn_leaves_an_overloaded_prefix_engine_known_answers(held, least, moves):
    """sgl-router's balance rule (64 requests and 1.5x): the engine holding the prefix keeps the turn
    unless it holds more than 64 requests over the least busy and more than 1.5x its requests. Requests
    count queued ones too (here 10 of `held` wait)."""
    engines = [state(0, held - 10, 10), state(1, least), state(2, least + 1)]
    chosen = pick(engines, 0, decode_load)
    assert chosen.engine_id == (1 if moves else 0)


def test_the_balance_rule_comes_from_the_cluster_config():
    """`cluster.router_balance_abs_requests` / `router_balance_rel` reach the router: with 8 and 1.5, an
    engine holding 20 requests against 5 gives the turn away; with the default 64 it keeps it."""
    from harness.routing import Balance
    from tests.conftest import cluster_of
    tight = Balance.of(cluster_of(["cluster=dense8_h100", "cluster.router_balance_abs_requests=8"]))
    assert tight == Balance(8, 1.5) and Balance.of(cluster_of(["cluster=dense8_h100"])) == Balance(64, 1.5)
    engines = [state(0, 20), state(1, 5)]
    assert pick(engines, 0, decode_load, tight).engine_id == 1
    assert pick(engines, 0, decode_load).engine_id == 0


def test_a_view_keeps_the_states_it_was_given(small, monkeypatch):
    """Views share the backend's list of states until it is re-read: one still held is copied first,
    so every view handed out during a run still shows, at the end, what it showed when made."""
    kept = SimBackend.view
    views = []

    def view(self):
        v = kept(self)
        views.append((v, list(v.engines), [EngineState(**vars(s)) for s in v.engines]))
        return v

    monkeypatch.setattr(SimBackend, "view", view)
    simulate(small + ["cluster.num_engines=3"], policy=switching())
    assert len(views) > 20 and len({id(v.engines) for v, _, _ in views}) > 20
    for v, given, values in views:
        assert v.engines == given and all(a is b for a, b in zip(v.engines, given))
        assert v.engines == values   # the states themselves are never changed in place


def test_a_dropped_view_lets_the_next_read_reuse_the_list(small):
    _, _, backend = simulate(small + ["policy=colocate", "mode.num_steps=1", "workload.batch_size=2"])
    states = backend.view().engines       # only the backend (and this name) hold it now
    del states
    before = id(backend.views._states)
    backend.views.mark_stale(backend.engines[0])
    backend.view()
    assert id(backend.views._states) == before
    held = backend.view()
    backend.views.mark_stale(backend.engines[0])
    assert backend.view().engines is not held.engines
