"""SGLangBackend against a STUB: fake SGLang servers and a fake sglang-router that record every call.

SGLang itself has NOT been run here (it needs CUDA, or a source build on AMX Xeons). The STUB checks
the backend's side of the protocol only: mini_lb-style PD requests (the same /generate body with the
prefill engine's bootstrap host/port and one bootstrap_room on both engines), router membership, and
the role switch order (leave the router -> drain -> /pd_role_switch on an idle engine -> re-register).
"""
from __future__ import annotations

import asyncio
import threading
from collections import Counter

import pytest

from harness.api import EventKind, Role
from tests.conftest import SwitchAt, load_config

aiohttp = pytest.importorskip("aiohttp")
from aiohttp import web  # noqa: E402

from harness.engines.sglang import SGLangBackend, sglang_argv  # noqa: E402


class StubSGLang:
    """STUB of SGLang servers (one per engine) and of sglang-router, on one background event loop."""

    def __init__(self, roles: list[str]):
        self.roles = list(roles)
        self.calls: list[tuple] = []          # (server, method, path, body), in arrival order
        self.in_flight = [0] * len(roles)
        self.workers: dict[str, dict] = {}
        self.loop = asyncio.new_event_loop()
        self.urls: list[str] = []
        self.router_url = ""
        self._runners = []
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    def _engine_app(self, i: int) -> web.Application:
        async def generate(req):
            body = await req.json()
            self.calls.append((i, "POST", "/generate", body))
            self.in_flight[i] += 1
            try:
                n = len(body["input_ids"])
                if self.roles[i] == "prefill":
                    await asyncio.sleep(0.01)
                    return web.json_response({"meta_info": {"prompt_tokens": n, "cached_tokens": 0,
                                                            "completion_tokens": 1}})
                out = body["sampling_params"]["max_new_tokens"]
                await asyncio.sleep(0.02)
                return web.json_response({"output_ids": [7] * out, "meta_info": {
                    "prompt_tokens": n, "cached_tokens": 0, "completion_tokens": out, "e2e_latency": 0.02}})
            finally:
                self.in_flight[i] -= 1

        async def switch(req):
            body = await req.json()
            self.calls.append((i, "POST", "/pd_role_switch", {**body, "in_flight": self.in_flight[i]}))
            if self.in_flight[i]:
                return web.json_response({"error": "not idle"}, status=400)
            self.roles[i] = body["new_role"]
            return web.json_response({"success": True})

        async def health(req):
            return web.Response(text="ok")
        app = web.Application()
        app.add_routes([web.post("/generate", generate), web.post("/pd_role_switch", switch),
                        web.get("/health", health)])
        return app

    def _router_app(self) -> web.Application:
        async def add(req):
            body = await req.json()
            self.calls.append(("router", "POST", "/workers", body))
            wid = f"w{len(self.workers)}-{body['url'].rsplit(':', 1)[1]}"
            self.workers[wid] = body
            return web.json_response({"worker_id": wid})

        async def remove(req):
            wid = req.match_info["wid"]
            self.calls.append(("router", "DELETE", f"/workers/{wid}", None))
            self.workers.pop(wid)
            return web.json_response({"success": True})

        async def listing(req):
            return web.json_response({"workers": list(self.workers.values())})
        app = web.Application()
        app.add_routes([web.post("/workers", add), web.delete("/workers/{wid}", remove), web.get("/workers", listing)])
        return app

    async def _serve(self, app) -> str:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runners.append(runner)
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def _start(self):
        self.urls = [await self._serve(self._engine_app(i)) for i in range(len(self.roles))]
        self.router_url = await self._serve(self._router_app())

    def close(self):
        async def stop():
            for r in self._runners:
                await r.cleanup()
        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


@pytest.fixture
def stub():
    s = StubSGLang(["prefill", "decode", "decode"])
    yield s
    s.close()


def test_sglang_backend_against_stub(stub):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from harness.cluster import cluster_from_config
    from harness.experiment import build_backend, lifecycle_frame, run_info
    from harness.rollout import ModeConfig, RolloutDriver

    cfg = load_config(["backend=sglang", "cluster=cpu_small", "cluster.num_engines=3", "cluster.engine=sglang",
                       "cluster.switch_mechanism=drain", "workload=synthetic",
                       "workload.batch_size=4", "workload.group_size=2", "workload.prompt.median=300",
                       "workload.output.median=20", "workload.tool_output.median=100",
                       "workload.tool_latency.0.median=0.05", "workload.max_turns=4", "mode.num_steps=1",
                       f"backend.urls=[{','.join(stub.urls)}]", f"backend.router_url={stub.router_url}"])
    cluster = cluster_from_config(OmegaConf.to_container(cfg.cluster, resolve=True))
    mode = ModeConfig(**OmegaConf.to_container(cfg.mode, resolve=True))
    workload = instantiate(cfg.workload, seed=0)
    policy = SwitchAt([Role.PREFILL, Role.DECODE, Role.DECODE], {1: Role.PREFILL}, at_s=0.3,
                      control_interval_s=0.05)
    backend = build_backend(cfg, cluster, policy.initial_roles(cluster, run_info(mode, workload)))
    driver = RolloutDriver(workload, policy, backend, mode, keep_events=True)
    result = driver.run()
    df = lifecycle_frame(result)

    # every turn completed once
    assert df.t_decode_end.notna().all()
    ends = Counter((e.trajectory_id, e.turn) for e in result.events if e.kind == EventKind.DECODE_END)
    assert set(ends.values()) == {1} and len(ends) == len(df)
    # PD requests: the same body on both engines, bootstrap = the prefill engine's
    gens = [c for c in stub.calls if c[2] == "/generate"]
    by_room: dict[int, list] = {}
    for server, _, _, body in gens:
        by_room.setdefault(body["bootstrap_room"], []).append((server, body))
    assert len(by_room) == len(df)
    for room, pair in by_room.items():
        (s1, b1), (s2, b2) = pair
        assert b1 == b2 and s1 != s2
        assert b1["bootstrap_host"] == "127.0.0.1"
        assert b1["bootstrap_port"] in (backend.bootstrap_ports[s1], backend.bootstrap_ports[s2])
        assert b1["sampling_params"]["ignore_eos"] is True
    for r in df.itertuples():
        assert r.engine_prefill != r.engine_decode
    # the switch: deregister -> /pd_role_switch on an idle engine -> register as prefill
    seq = [(c[0], c[1], c[2]) for c in stub.calls if c[2] != "/generate"]
    initial = [("router", "POST", "/workers")] * 3
    assert seq[:3] == initial
    rest = seq[3:]
    assert rest[0][0:2] == ("router", "DELETE") and rest[1] == (1, "POST", "/pd_role_switch")
    assert rest[2] == ("router", "POST", "/workers")
    switch_call = next(c for c in stub.calls if c[2] == "/pd_role_switch")
    assert switch_call[3]["new_role"] == "prefill" and switch_call[3]["in_flight"] == 0
    assert stub.roles == ["prefill", "prefill", "decode"]
    registered = {w["url"]: w for w in stub.workers.values()}
    assert registered[stub.urls[1]]["worker_type"] == "prefill"
    assert registered[stub.urls[1]]["bootstrap_port"] == backend.bootstrap_ports[1]
    assert result.num_role_switches == 1
    # after the switch engine 1 is a prefill engine: no decode leg is routed to it
    t_end = next(e.t for e in result.events if e.kind == EventKind.ROLE_SWITCH_END)
    after = df[df.t_ready > t_end]
    assert len(after) and (after.engine_decode != 1).all()


def test_sglang_refuses_colocated_switch(stub):
    backend = SGLangBackend(stub.urls, [Role.PREFILL, Role.DECODE, Role.DECODE], router_url=None,
                            bootstrap_ports=[1, 2, 3])
    with pytest.raises(ValueError, match="only between prefill and decode"):
        backend.switch_role(0, Role.COLOCATED)


def test_sglang_launch_command():
    from tests.conftest import cluster_of
    cluster = cluster_of(["cluster=dense_h100"])
    cfg = {"model": "/models/qwen3-8b", "transfer_backend": "nixl"}
    argv = sglang_argv(cfg, cluster, Role.DECODE, 9001)
    s = " ".join(argv)
    assert "--disaggregation-mode decode" in s and "--enable-pd-role-switch" in s
    assert "--disaggregation-bootstrap-port 9001" in s and "--tp-size 4" in s
    assert "--disaggregation-transfer-backend nixl" in s
    assert "--disaggregation-mode null" in " ".join(sglang_argv(cfg, cluster, Role.COLOCATED, 9001))


def test_a_completed_turn_is_not_handed_back_by_a_later_failure():
    """Real-engine backends (the base every backend shares): a failure of an engine hands back the turns
    with a leg on it, not one handed back already, and not one whose DECODE_END is out (its job stays
    among the backend's jobs until its task's done-callback runs)."""
    from harness.api import Route, TurnRequest
    from harness.engines.base import Job
    job = Job(TurnRequest(trajectory_id=1, group_id=0, turn=0, family="f", prompt_tokens=10, appended_tokens=10,
                          max_output_tokens=5, output_tokens=5, t_ready=0.0), Route(0, 1), attempt=0)
    assert job.lost_with(0) and job.lost_with(1) and not job.lost_with(2)
    job.completed = True
    assert not job.lost_with(0) and not job.lost_with(1)
