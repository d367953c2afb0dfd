"""The engine pool on real Ray, with a stand-in server process (a few lines of Python answering GET
/health; no vLLM needed): the engines' resources are reserved together in one placement group, a
cluster that cannot hold them fails before any server starts, and stopping frees the reservation."""
from __future__ import annotations

import sys
import urllib.request

import pytest

ray = pytest.importorskip("ray")

from harness.engines.server import EnginePool, ServerSpec  # noqa: E402

HEALTH = ("import http.server as h\n"
          "class H(h.BaseHTTPRequestHandler):\n"
          "    def do_GET(self):\n"
          "        self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n"
          "    def log_message(self, *a): pass\n"
          "h.HTTPServer(('', {port}), H).serve_forever()\n")


def spec(i: int, tmp_path, num_cpus: float = 1.0) -> ServerSpec:
    return ServerSpec(i, [sys.executable, "-c", HEALTH], log_path=str(tmp_path / f"server{i}.log"),
                      startup_timeout_s=60, num_cpus=num_cpus)


@pytest.fixture
def ray_two_cpus():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def test_pool_reserves_a_bundle_per_engine_and_frees_it(tmp_path, ray_two_cpus):
    pool = EnginePool([spec(0, tmp_path), spec(1, tmp_path)], use_ray=True)
    try:
        table = ray.util.placement_group_table(pool.placement)
        assert table["state"] == "CREATED" and len(table["bundles"]) == 2
        assert all(b == {"CPU": 1.0} for b in table["bundles"].values())
        urls = pool.start()
        assert len(urls) == 2
        for url in urls:
            assert urllib.request.urlopen(url + "/health", timeout=10).status == 200
        placement = pool.placement
    finally:
        pool.stop()
    assert ray.util.placement_group_table(placement)["state"] == "REMOVED"


def test_pool_that_cannot_be_placed_fails_before_any_server_starts(tmp_path, ray_two_cpus):
    with pytest.raises(ValueError, match=r"Ray cannot place 3 engines"):
        EnginePool([spec(i, tmp_path) for i in range(3)], use_ray=True, placement_timeout_s=3)
    assert not list(tmp_path.glob("server*.log"))
    # the failed reservation was given back: two engines fit now
    pool = EnginePool([spec(0, tmp_path), spec(1, tmp_path)], use_ray=True, placement_timeout_s=10)
    pool.stop()
