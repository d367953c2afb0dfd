"""Engine servers: one subprocess per engine, owned by a Ray actor (or directly, without Ray).

`ServerProcess` starts a server command in its own process group (so a kill reaches the engine-core
and worker processes too: killing only vLLM's API-server PID leaves them orphaned, docs/engines.md, "Server settings that matter on this CPU"),
waits for GET /health, and restarts, kills (fault injection) or stops it. `EnginePool` holds one per
engine: as Ray actors placed by Ray resources (`ray.init(address=...)` reaches an existing cluster),
or in-process when Ray is disabled. Start-up runs for all engines in parallel.

Closed by default: a server binds 127.0.0.1 when every engine is on the driver's node (no Ray, or a Ray
cluster of one node), else the node's cluster address, never every interface; and it requires the API
key the pool draws per run (`--api-key`), which the clients send (`Authorization: Bearer`). A command
names these with the placeholders "{host}" and "{api_key}" (the key is never written to the log).
"""
from __future__ import annotations

import asyncio
import ctypes
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

LOOPBACK = "127.0.0.1"


@dataclass
class ServerSpec:
    """How to launch one engine's server. `port=0` picks a free port on the node at start (again if the
    server finds it taken: the probe and the server's bind cannot be one step)."""

    engine_id: int
    argv: list[str]                     # command; "{port}", "{host}", "{api_key}" are replaced at start
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    host: str = LOOPBACK                # "": the node's cluster address (engines on several nodes)
    api_key: str = ""
    log_path: str = ""
    startup_timeout_s: float = 600.0
    num_cpus: float = 1.0               # Ray resources of the actor
    num_gpus: float = 0.0


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def new_api_key() -> str:
    """A key for one run's servers: a client without it is refused."""
    return secrets.token_urlsafe(32)


def _port_taken(log_text: str) -> bool:
    """The server's start-up log says its port was taken (between our probe and its bind)."""
    return "Address already in use" in log_text or "[Errno 98]" in log_text


def _parent_death_signal() -> None:
    """In the child: SIGTERM when the owner dies (vLLM's API server then stops its engine processes)."""
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except OSError:
        pass


class ServerProcess:
    def __init__(self, spec: ServerSpec):
        self.spec = spec
        self.proc: subprocess.Popen | None = None
        self.port = spec.port
        self.host = spec.host
        self.starts = 0

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self, port_retries: int = 3) -> str:
        """Launch and wait for /health; returns the base URL. Raises with the log tail on failure. A port
        picked here and taken by another process before the server bound it is picked again."""
        if self.proc is not None and self.proc.poll() is None:
            return self.url
        if not self.host:
            import ray
            self.host = ray.util.get_node_ip_address()
        for attempt in range(port_retries + 1):
            picked = not self.spec.port
            if picked:
                self.port = _free_port(self.host)
            log_start = self._launch()
            try:
                return self._wait_healthy()
            except RuntimeError:
                if not (picked and attempt < port_retries and _port_taken(self._log_since(log_start))):
                    raise
        raise AssertionError("unreachable: the last attempt raises")

    def _launch(self) -> int:
        """Start the server process; returns the log's size before this start's lines."""
        argv = [self._fill(a, self.spec.api_key) for a in self.spec.argv]
        shown = [self._fill(a, "***") for a in self.spec.argv]
        log = open(self.spec.log_path or os.devnull, "ab")
        log_start = log.tell()
        log.write(f"\n==== start {self.starts} {time.ctime()}: {' '.join(shown)}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(argv, env={**os.environ, **self.spec.env}, stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     preexec_fn=_parent_death_signal)
        log.close()
        self.starts += 1
        return log_start

    def _fill(self, arg: str, api_key: str) -> str:
        return arg.replace("{port}", str(self.port)).replace("{host}", self.host).replace("{api_key}", api_key)

    def _wait_healthy(self) -> str:
        deadline = time.monotonic() + self.spec.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine {self.spec.engine_id}: server exited with {self.proc.returncode} "
                                   f"during start-up; log {self.spec.log_path}:\n{self.log_tail()}")
            if self.healthy():
                return self.url
            time.sleep(0.5)
        self.kill()
        raise TimeoutError(f"engine {self.spec.engine_id}: no /health after {self.spec.startup_timeout_s} s; "
                           f"log {self.spec.log_path}:\n{self.log_tail()}")

    def restart(self, argv: list[str] | None = None) -> str:
        """Kill and start again (with a new command, e.g. another SGLang disaggregation mode)."""
        self.kill()
        if argv is not None:
            self.spec.argv = list(argv)
        return self.start()

    def kill(self) -> None:
        """SIGKILL the whole process group (fault injection, and the end of a failed server)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def hang(self) -> None:
        """SIGSTOP the whole process group (fault injection: a server that stops answering but keeps
        its port and connections open, as a wedged GPU or a deadlocked scheduler does)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the group, SIGKILL what is left after `grace_s`."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=grace_s)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            pass
        self.kill()
        self.proc = None

    # --- queries --------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else -1

    def healthy(self, timeout_s: float = 2.0) -> bool:
        request = urllib.request.Request(f"{self.url}/health", headers=auth_headers(self.spec.api_key))
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as r:
                return r.status == 200
        except OSError:
            return False

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(Path(self.spec.log_path).read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.spec.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""


def auth_headers(api_key: str) -> dict[str, str]:
    """The header a client of the run's servers sends (none when they were started without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class EnginePool:
    """One server per engine; `use_ray` places each in a Ray actor (one CPU core or GPUs each).

    With Ray, the engines' resources are reserved together first, in one placement group with a bundle
    per engine (an engine's GPUs on one node): a cluster that cannot hold them all fails before any
    server starts, naming what was asked, instead of leaving some engines up and the rest waiting."""

    def __init__(self, specs: list[ServerSpec], use_ray: bool = True, ray_address: str | None = None,
                 placement_timeout_s: float = 60.0):
        self.specs = specs
        self.use_ray = use_ray
        self.urls: list[str] = []
        self.placement = None
        if use_ray:
            import ray
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
            if not ray.is_initialized():
                ray.init(address=ray_address, include_dashboard=False, log_to_driver=False,
                         num_cpus=None if ray_address else max(len(specs), os.cpu_count() or 1),
                         configure_logging=False)
            if sum(n["Alive"] for n in ray.nodes()) > 1:   # engines may run on other nodes than the driver
                specs = [replace(s, host="") if s.host == LOOPBACK else s for s in specs]
                self.specs = specs
            bundles = [{"CPU": s.num_cpus, **({"GPU": s.num_gpus} if s.num_gpus else {})} for s in specs]
            self.placement = placement_group(bundles, strategy="PACK")
            ready, _ = ray.wait([self.placement.ready()], timeout=placement_timeout_s)
            if not ready:
                ray.util.remove_placement_group(self.placement)
                self.placement = None
                raise ValueError(f"Ray cannot place {len(specs)} engines (one bundle each: {bundles[0]}) within "
                                 f"{placement_timeout_s:.0f} s; the cluster has {ray.cluster_resources()}")
            actor = ray.remote(ServerProcess)
            self.servers = [actor.options(num_cpus=s.num_cpus, num_gpus=s.num_gpus, max_concurrency=4, name=None,
                                          scheduling_strategy=PlacementGroupSchedulingStrategy(
                                              self.placement, placement_group_bundle_index=i)).remote(s)
                            for i, s in enumerate(specs)]
        else:
            self.servers = [ServerProcess(s) for s in specs]

    @property
    def api_key(self) -> str:
        """The key the servers require (one per run, the same for every engine)."""
        return self.specs[0].api_key if self.specs else ""

    def _call(self, i: int, method: str, *args):
        """A blocking call of a server method, through its actor when Ray is on."""
        s = self.servers[i]
        if self.use_ray:
            import ray
            return ray.get(getattr(s, method).remote(*args))
        return getattr(s, method)(*args)

    async def _acall(self, i: int, method: str, *args):
        s = self.servers[i]
        if self.use_ray:
            return await getattr(s, method).remote(*args)
        return await asyncio.to_thread(getattr(s, method), *args)

    def start(self) -> list[str]:
        """Start every server at once and wait for all of them."""
        if self.use_ray:
            import ray
            self.urls = ray.get([s.start.remote() for s in self.servers])
        else:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(len(self.servers)) as ex:
                self.urls = list(ex.map(lambda s: s.start(), self.servers))
        return self.urls

    async def restart(self, i: int, argv: list[str] | None = None) -> str:
        self.urls[i] = await self._acall(i, "restart", argv)
        return self.urls[i]

    async def kill(self, i: int) -> None:
        await self._acall(i, "kill")

    async def hang(self, i: int) -> None:
        await self._acall(i, "hang")

    def pid(self, i: int) -> int:
        return self._call(i, "pid")

    def healthy(self, i: int) -> bool:
        return self._call(i, "healthy")

    def stop(self) -> None:
        for i in range(len(self.servers)):
            try:
                self._call(i, "stop")
            except Exception:   # noqa: BLE001 - best effort: stop the others too
                pass
        if self.use_ray:
            import ray
            for s in self.servers:
                ray.kill(s)
            if self.placement is not None:
                ray.util.remove_placement_group(self.placement)
                self.placement = None
        self.servers = []
