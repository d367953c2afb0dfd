"""Engine servers: one subprocess per engine, owned by a Ray actor (or directly, without Ray).

`ServerProcess` starts a server command in its own process group (so a kill reaches the engine-core
and worker processes too: killing only vLLM's API-server PID leaves them orphaned, docs/engines.md, "Server settings that matter on this CPU"),
waits for GET /health, and restarts, kills (fault injection) or stops it. `EnginePool` holds one per
engine: as Ray actors placed by Ray resources (`ray.init(address=...)` reaches an existing cluster),
or in-process when Ray is disabled. Start-up runs for all engines in parallel.
"""
from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ServerSpec:
    """How to launch one engine's server. `port=0` picks a free port on the node at start."""

    engine_id: int
    argv: list[str]                     # command; "{port}" is replaced by the chosen port
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    log_path: str = ""
    startup_timeout_s: float = 600.0
    num_cpus: float = 1.0               # Ray resources of the actor
    num_gpus: float = 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


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
        self.host = "127.0.0.1"
        self.starts = 0

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> str:
        """Launch and wait for /health; returns the base URL. Raises with the log tail on failure."""
        if self.proc is not None and self.proc.poll() is None:
            return self.url
        if not self.port:
            self.port = _free_port()
        try:
            import ray
            if ray.is_initialized():
                self.host = ray.util.get_node_ip_address()
        except ImportError:
            pass
        argv = [a.replace("{port}", str(self.port)) for a in self.spec.argv]
        log = open(self.spec.log_path or os.devnull, "ab")
        log.write(f"\n==== start {self.starts} {time.ctime()}: {' '.join(argv)}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(argv, env={**os.environ, **self.spec.env}, stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     preexec_fn=_parent_death_signal)
        log.close()
        self.starts += 1
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
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=timeout_s) as r:
                return r.status == 200
        except OSError:
            return False

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(Path(self.spec.log_path).read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


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
