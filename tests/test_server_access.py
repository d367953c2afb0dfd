"""Engines closed by default (harness/engines/server.py), checked without vLLM or SGLang: the command lines
bind the address the pool chooses (127.0.0.1 on one node) and carry the run's API key, which is drawn per
run and never written to the server log; the clients send it; backend.extra_args cannot reopen them; a
port taken between the probe and the server's bind is picked again; SGLang's log is not a fixed /tmp path.
A stand-in server (a few lines of Python) answers /health only with the key. The test that a real vLLM
server refuses a request without the key is in tests/test_engines_vllm.py (marker `engine`).
"""
from __future__ import annotations

import asyncio
import json
import sys

import pytest
from omegaconf import OmegaConf

from harness.api import Role
from harness.engines import sglang as sglang_module
from harness.engines.base import http_session
from harness.engines.server import ServerProcess, ServerSpec
from harness.engines.sglang import SGLangBackend, sglang_argv
from harness.engines.vllm import vllm_argv, vllm_server_specs
from tests.conftest import cluster_of, load_config

STAND_IN = """
import http.server as h, json, os, sys
host, port, key, record = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
if os.environ.get("TAKEN_ONCE") and not os.path.exists(record + ".taken"):
    open(record + ".taken", "w").close()
    print("OSError: [Errno 98] Address already in use", flush=True)
    sys.exit(1)
json.dump(sys.argv[1:4], open(record, "w"))
class H(h.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.headers.get("Authorization") == "Bearer " + key else 401)
        self.end_headers()
    def log_message(self, *a): pass
h.HTTPServer((host, port), H).serve_forever()
"""


def vllm_cfg(*overrides: str) -> dict:
    return OmegaConf.to_container(load_config(["backend=vllm", "backend.model=/models/m", *overrides]).backend,
                                  resolve=True)


def sglang_cfg(*overrides: str) -> dict:
    return OmegaConf.to_container(load_config(["backend=sglang", "backend.model=/models/m", *overrides]).backend,
                                  resolve=True)


def value(argv: list[str], flag: str) -> str | None:
    assert argv.count(flag) <= 1, f"{flag} appears {argv.count(flag)} times"
    return argv[argv.index(flag) + 1] if flag in argv else None


@pytest.mark.parametrize("role", list(Role), ids=lambda r: r.value)
def test_vllm_command_line_binds_the_chosen_address_and_requires_the_key(role):
    argv = vllm_argv(vllm_cfg(), cluster_of([]), role)
    assert value(argv, "--host") == "{host}" and value(argv, "--api-key") == "{api_key}"
    assert "0.0.0.0" not in argv


@pytest.mark.parametrize("role", list(Role), ids=lambda r: r.value)
def test_sglang_command_line_binds_the_chosen_address_and_requires_the_key(role):
    argv = sglang_argv(sglang_cfg("cluster=moe_h200_sglang"), cluster_of(["cluster=moe_h200_sglang"]), role, 9000)
    assert value(argv, "--host") == "{host}" and value(argv, "--api-key") == "{api_key}"
    assert "0.0.0.0" not in argv


def test_vllm_specs_draw_one_key_per_run_and_bind_loopback(tmp_path):
    cfg = vllm_cfg(f"backend.log_dir={tmp_path}", f"backend.kv_shared_dir={tmp_path / 'kv'}")
    first, _ = vllm_server_specs(cfg, cluster_of([]))
    second, _ = vllm_server_specs(cfg, cluster_of([]))
    keys = {s.api_key for s in first}
    assert len(keys) == 1 and len(first[0].api_key) >= 32
    assert first[0].api_key != second[0].api_key
    assert {s.host for s in first} == {"127.0.0.1"}


@pytest.mark.parametrize("flag", ["--host", "--host=0.0.0.0", "--api-key", "--api-key=x"])
def test_extra_args_cannot_reopen_a_server(flag):
    with pytest.raises(ValueError, match=f"backend.extra_args sets {flag.split('=')[0]}, which the harness sets"):
        vllm_argv(vllm_cfg(f"backend.extra_args=['{flag}']"), cluster_of([]), Role.COLOCATED)
    with pytest.raises(ValueError, match=f"backend.extra_args sets {flag.split('=')[0]}, which the harness sets"):
        sglang_argv(sglang_cfg("cluster=moe_h200_sglang", f"backend.extra_args=['{flag}']"),
                    cluster_of(["cluster=moe_h200_sglang"]), Role.COLOCATED, 9000)


def stand_in(tmp_path, key: str = "k" * 40) -> ServerSpec:
    return ServerSpec(0, [sys.executable, "-c", STAND_IN, "{host}", "{port}", "{api_key}", str(tmp_path / "argv.json")],
                      log_path=str(tmp_path / "server.log"), startup_timeout_s=30, api_key=key)


def test_a_server_gets_loopback_and_the_key_which_the_log_never_shows(tmp_path):
    server = ServerProcess(stand_in(tmp_path))
    try:
        url = server.start()
        assert url.startswith("http://127.0.0.1:")
        host, port, key = json.loads((tmp_path / "argv.json").read_text())
        assert (host, int(port), key) == ("127.0.0.1", server.port, "k" * 40)
        log = (tmp_path / "server.log").read_text()
        assert "k" * 40 not in log and "***" in log
    finally:
        server.stop()


def test_a_port_taken_before_the_server_binds_it_is_picked_again(tmp_path):
    spec = stand_in(tmp_path)
    spec.env = {"TAKEN_ONCE": "1"}
    server = ServerProcess(spec)
    try:
        server.start()
        assert server.starts == 2 and server.healthy()
    finally:
        server.stop()


def test_a_fixed_port_that_is_taken_is_an_error_not_a_retry(tmp_path):
    spec = stand_in(tmp_path)
    spec.env, spec.port = {"TAKEN_ONCE": "1"}, 1   # a fixed port: the user asked for it, it is not changed
    server = ServerProcess(spec)
    with pytest.raises(RuntimeError, match="exited with 1 during start-up"):
        server.start()
    assert server.starts == 1


def test_the_clients_send_the_key():
    async def headers():
        async with http_session(api_key="secret") as with_key, http_session() as without:
            return dict(with_key.headers), dict(without.headers)

    with_key, without = asyncio.run(headers())
    assert with_key["Authorization"] == "Bearer secret" and "Authorization" not in without


class FakePool:
    """Stands for EnginePool in SGLangBackend.from_config: keeps the specs, starts nothing."""
    made: list = []

    def __init__(self, specs, use_ray=True, ray_address=None):
        self.specs = specs
        self.urls = [f"http://127.0.0.1:{30000 + s.engine_id}" for s in specs]
        FakePool.made.append(self)

    def start(self):
        return self.urls


def test_sglang_logs_to_a_directory_of_its_own_and_its_clients_get_the_key(monkeypatch):
    monkeypatch.setattr(sglang_module, "EnginePool", FakePool)
    cfg = sglang_cfg("cluster=moe_h200_sglang")
    cluster = cluster_of(["cluster=moe_h200_sglang"])
    roles = [Role.COLOCATED] * cluster.num_engines
    backends = [SGLangBackend.from_config(cluster, roles, **cfg) for _ in range(2)]
    first, second = (p.specs for p in FakePool.made[-2:])
    assert all(not s.log_path.startswith("/tmp/sglang_engine") for s in first)
    assert first[0].log_path != second[0].log_path                 # two runs never share a log file
    assert backends[0].api_key == first[0].api_key != second[0].api_key == backends[1].api_key
