"""What every real-engine backend shares: the wall clock, timers, the router's bookkeeping, role
switches as drain + switch, engine failures, and the per-leg log (legs.py).

A subclass supplies the wire protocol (`_serve_turn`: the legs of one turn on the engines of its route)
and, optionally, what a switch does on the server (`_apply_switch`). Everything runs on one asyncio
loop in the caller's thread: `run()` returns when no turn, timer, switch or restart is pending, so the
RolloutDriver and the Policy run unchanged (their callbacks are plain synchronous calls).

Time: `now()` is wall seconds since the backend was built. Delays scheduled while a DECODE_END is
being delivered are the driver's tool calls; they are multiplied by `time_scale` (other timers, e.g.
the policy's control ticks and the sampler's, are not).

Events per turn (LifecycleEvent.tokens as harness/api.py defines them). A client sees a leg only
through its HTTP response, so some events are emitted when the information arrives, with the time it
describes (possibly in the past):
  colocated leg (stream):  first chunk -> DECODE_START, FIRST_TOKEN;
                           end -> PREFILL_START (t: server's schedule time, tokens: cached),
                                  PREFILL_END (t: first chunk, tokens: computed), DECODE_END.
  prefill leg (max_tokens=1): end -> PREFILL_START, PREFILL_END.
  decode leg (stream):     first chunk -> DECODE_START, FIRST_TOKEN;
                           end -> TRANSFER_END (t: first chunk, tokens: KV tokens the decode engine did
                                  not compute), DECODE_END.
Engine failure: a leg whose server is gone (connection refused or dropped, or /health failing) marks
the engine failed (ENGINE_FAILED), every turn with a leg on it is handed back to the driver (the policy
routes it again; its finished legs count as work done, nothing is counted twice: DECODE_END is emitted
only by the attempt that completes), and the server is restarted; when it is healthy again the engine
rejoins the pool with its role and an ENGINE_RECOVERED event tells the driver to retry turns it parked
meanwhile.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from harness.api import ClusterView, EngineState, EventKind, LifecycleEvent, Role, Route, TurnRequest
from harness.engines.legs import LegLog
from harness.engines.server import auth_headers
from harness.timeline import RoleTimeline

K = EventKind
log = logging.getLogger(__name__)


# The engines' HTTP servers close a connection that has been idle for 5 s: vLLM's API server runs uvicorn
# with timeout_keep_alive=VLLM_HTTP_TIMEOUT_KEEP_ALIVE, default 5 (vllm/envs.py), and SGLang's with
# timeout_keep_alive=5 (python/sglang/srt/entrypoints/http_server.py). aiohttp keeps an idle connection
# for 15 s (aiohttp/connector.py) and does not retry a POST on one the server has closed, so a leg sent
# on it while the loop was too busy to see the close failed (ServerDisconnectedError, "Can not write
# request body") and its healthy engine was declared gone. Idle connections are dropped before any
# server drops them.
SERVER_KEEPALIVE_S = 5.0
# Server flags the harness owns, whatever backend.extra_args say (harness/engines/server.py).
ACCESS_FLAGS = ("--host", "--api-key")
CLIENT_KEEPALIVE_S = 4.0


def http_session(timeout: float | None = None, api_key: str = ""):
    """The aiohttp session every client of the engines uses: no connection limit, a 10 s connect
    timeout, `timeout` seconds for a whole request (None: none), idle connections kept 4 s, and the run's
    API key on every request (the servers refuse a request without it)."""
    import aiohttp
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=CLIENT_KEEPALIVE_S),
                                 timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=10),
                                 headers=auth_headers(api_key))


class EngineGone(Exception):
    """The engine's server is unreachable or dead."""

    def __init__(self, engine_id: int, reason: str):
        super().__init__(f"engine {engine_id}: {reason}")
        self.engine_id = engine_id
        self.reason = reason


class LegError(Exception):
    """The server answered, but not with a usable result (HTTP error, short output)."""


@dataclass(eq=False)
class Leg:
    """One HTTP request of one turn on one engine, as the router tracks it."""

    kind: str                      # colocated | prefill | decode
    engine_id: int
    prompt_tokens: int
    output_tokens: int
    trajectory_id: int = -1
    t_submit: float = math.nan
    t_first: float = math.nan
    t_done: float = math.nan
    generated: int = 0
    status: str = "pending"        # pending | running | ok | failed | returned
    cached_tokens: int = -1
    server: dict = field(default_factory=dict)   # server-reported per-request metrics
    t_ready: float = math.nan      # when the leg could be sent (harness overhead: t_submit - t_ready)
    handler_s: float = 0.0         # harness time spent on the response (parsing, events)

    @property
    def decoding(self) -> bool:
        return not math.isnan(self.t_first) and self.kind != "prefill"


@dataclass(eq=False)
class Job:
    """One attempt at one turn on one route."""

    request: TurnRequest
    route: Route
    attempt: int
    legs: list[Leg] = field(default_factory=list)
    task: asyncio.Task | None = None
    inbound: bool = False          # counted as inbound on the decode engine (prefill not done)
    handed_back: bool = False
    completed: bool = False        # its DECODE_END is out: a failure found later does not hand it back
    pre_leg: Leg | None = None     # the first leg, registered on its engine at submit()

    def engines(self) -> set[int]:
        return {self.route.prefill_engine, self.route.decode_engine}

    def lost_with(self, engine_id: int) -> bool:
        """Whether a failure of `engine_id` hands this turn back: it has a leg there and has neither been
        handed back nor completed. A completed job stays in the backend's jobs until its task's
        done-callback runs; handing it back then ran the turn twice (measured under load: 974 of 960
        trajectories completed in a fault-injection rollout)."""
        return engine_id in self.engines() and not self.handed_back and not self.completed


@dataclass
class EngineRuntime:
    engine_id: int
    url: str
    role: Role
    available: bool = True
    failed: bool = False
    target_role: Role | None = None
    switching: bool = False
    kv_capacity_tokens: int = 0
    legs: set = field(default_factory=set)          # Leg objects in flight here
    inbound: int = 0
    inbound_tokens: int = 0
    busy_s: float = 0.0
    busy_since: float | None = None
    restarts: int = 0
    unhealthy_checks: int = 0
    drained: asyncio.Event | None = None      # set when a draining engine becomes idle

    def idle(self) -> bool:
        return not self.legs and not self.inbound


class HttpBackendBase:
    """The Backend contract over HTTP engines. Subclasses implement `_serve_turn`."""

    name = "http"
    # A switch drains the engine first (SGLang's role switch: leave the router, finish, switch); a
    # backend whose engines are all KV producers and consumers (vLLM kv_both) sets False: nothing
    # drains, the engine finishes what it runs while it takes legs of its new role, as the simulator's
    # kv_both does (harness/sim/backend.py).
    drains_on_switch = True
    plans_inline = False   # a plan runs in a worker thread while the loop routes and streams

    def __init__(self, urls: list[str], roles: list[Role], *, time_scale: float = 1.0, switch_wait_s: float = 0.0,
                 kv_capacity_tokens: int = 0, max_retries: int = 3, health_interval_s: float = 2.0,
                 api_key: str = ""):
        if len(roles) != len(urls):
            raise ValueError(f"policy gave {len(roles)} roles for {len(urls)} engines")
        if not time_scale > 0:
            raise ValueError(f"backend.time_scale={time_scale} is invalid; allowed: a number > 0")
        if not switch_wait_s >= 0:
            raise ValueError(f"switch_wait_s={switch_wait_s} is invalid; allowed: a number >= 0")
        self.time_scale = time_scale
        self.api_key = api_key                 # the servers' key (harness/engines/server.py), sent on every request
        self.switch_wait_s = switch_wait_s     # after the server's switch: from the cluster config (subclasses)
        self.max_retries = max_retries
        self.health_interval_s = health_interval_s
        self.loop = asyncio.new_event_loop()
        self.engines = [EngineRuntime(i, u, r, kv_capacity_tokens=kv_capacity_tokens)
                        for i, (u, r) in enumerate(zip(urls, roles))]
        # engine -> the role its server's flags (parallelism) are for: a relaunch for another role
        # changes it (SGLang's reshard), a switch in place or a restart does not
        self.launched: dict[int, Role] = dict(enumerate(roles))
        self.timeline = RoleTimeline(roles, self._busy)
        self._on_event: Callable[[LifecycleEvent], None] = lambda e: None
        self._on_returned: Callable[[TurnRequest], None] = lambda r: None
        self._pending = 0
        self._idle: asyncio.Event | None = None
        self._ready = asyncio.Event()
        self._error: BaseException | None = None
        self._in_decode_end = False
        self._attempts: dict[tuple[int, int], int] = {}
        self._jobs: set[Job] = set()
        self.legs = LegLog()
        self.failures: list[dict] = []
        self.session = None
        self._planner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plan")
        self.run_wall_s = 0.0
        self.run_cpu_s = 0.0
        self._t0 = time.monotonic()

    # --- Backend contract ---------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self._t0

    def call_later(self, delay_s: float, callback: Callable[[], None], observer: bool = False) -> None:
        if self._in_decode_end:
            delay_s *= self.time_scale
        self._pending += 1
        self.loop.call_later(max(delay_s, 0.0), self._fire, callback)

    def set_listener(self, on_event, on_returned) -> None:
        self._on_event, self._on_returned = on_event, on_returned

    def run_plan(self, work: Callable[[], object], done: Callable[[object], None]) -> None:
        """`work` in the planner's thread; `done` on this loop when it returns (the run waits for it)."""
        self._pending += 1
        future = self.loop.run_in_executor(self._planner, work)
        future.add_done_callback(lambda f: self._fire(lambda: done(f.result())))

    def update_weights(self) -> None:
        """Real-engine runs here serve fixed random weights: no weight update reaches the servers, so
        their prefix caches are kept (the simulator's `flush_prefix_cache_on_weight_update` models it)."""

    def fork(self, root, replace=None):
        raise ValueError("backend.fork: only the simulator (backend=sim) can fork a run")

    def submit(self, request: TurnRequest, route: Route) -> None:
        key = (request.trajectory_id, request.turn)
        attempt = self._attempts.get(key, -1) + 1
        if attempt > self.max_retries:
            raise RuntimeError(f"trajectory {request.trajectory_id} turn {request.turn}: failed "
                               f"{attempt} times; giving up (backend.max_retries={self.max_retries})")
        self._attempts[key] = attempt
        job = Job(request, route, attempt)
        # the first leg counts on its engine from now on, so the next route() sees it (a sync step
        # routes its whole batch before any request is sent)
        job.pre_leg = self._open_leg(job, "prefill" if route.disaggregated else "colocated",
                                     route.prefill_engine, self.now())
        if route.disaggregated:
            job.inbound = True
            d = self.engines[route.decode_engine]
            d.inbound += 1
            d.inbound_tokens += request.prompt_tokens
        self._pending += 1
        self._jobs.add(job)
        job.task = self.loop.create_task(self._job(job))
        # accounting in a done-callback: it runs even for a task cancelled before it started
        job.task.add_done_callback(lambda _t, job=job: self._job_done(job))

    def switch_role(self, engine_id: int, role: Role) -> None:
        e = self.engines[engine_id]
        if e.target_role is not None or e.role == role:
            return
        self._check_switch(e, role)
        e.target_role = role
        e.available = False
        self.timeline.enter(e.engine_id, self.now(), e.role, "draining" if self.drains_on_switch else "switching")
        self._emit(LifecycleEvent(K.ROLE_SWITCH_START, self.now(), engine_id=engine_id,
                                  detail=f"{e.role.value}->{role.value}"))
        self._pending += 1
        self.loop.create_task(self._guard(self._switch(e)))

    def view(self) -> ClusterView:
        states = []
        for e in self.engines:
            waiting = [g for g in e.legs if not g.decoding]
            decoding = [g for g in e.legs if g.decoding]
            states.append(EngineState(
                engine_id=e.engine_id, role=e.role, available=e.available, gpus=1,
                waiting_requests=len(waiting),
                waiting_prefill_tokens=sum(g.prompt_tokens for g in waiting if g.kind != "decode"),
                running_requests=len(decoding), decoding_requests=len(decoding),
                kv_used_tokens=sum(g.prompt_tokens + g.generated for g in decoding),
                kv_capacity_tokens=e.kv_capacity_tokens,
                queued_kv_tokens=sum(g.prompt_tokens for g in waiting) + e.inbound_tokens,
                inbound_requests=e.inbound, target_role=e.target_role, launched_as=self.launched[e.engine_id]))
        view = ClusterView(now=self.now(), engines=states)
        view._generated = {g.trajectory_id: g.generated for e in self.engines for g in e.legs if g.decoding}
        return view

    def run(self) -> None:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        try:
            self.loop.run_until_complete(self._main())
        finally:
            self._planner.shutdown(wait=False)
            self.run_wall_s += time.perf_counter() - wall0
            self.run_cpu_s += time.process_time() - cpu0
        if self._error is not None:
            raise self._error

    def engine_timeline(self) -> list[dict]:
        return self.timeline.rows(self.now())

    def _busy(self, engine_id: int) -> float:
        e = self.engines[engine_id]
        return e.busy_s + (self.now() - e.busy_since if e.busy_since is not None else 0.0)

    def leg_frame(self):
        """One row per leg: client times, tokens, server metrics, harness overhead (legs.parquet)."""
        return self.legs.frame()

    def overhead(self) -> dict:
        """The harness's own time per leg against the server's time (see docs/engines.md)."""
        return self.legs.overhead(self.run_cpu_s, self.run_wall_s)

    # --- extras (not in the contract) -----------------------------------------------------------
    def kill_engine(self, engine_id: int) -> None:
        """Fault injection: SIGKILL the engine's server (its whole process group)."""
        self._pending += 1
        self.loop.create_task(self._guard(self._kill_server(engine_id)))

    def hang_engine(self, engine_id: int) -> None:
        """Fault injection: SIGSTOP the engine's server; the health monitor must find it (harness/engines/
        faults.py)."""
        self._pending += 1
        self.loop.create_task(self._guard(self._hang_server(engine_id)))

    # --- subclass hooks -------------------------------------------------------------------------
    async def _serve_turn(self, job: Job) -> None:
        raise NotImplementedError

    async def _on_drain_start(self, e: EngineRuntime, role: Role) -> None:
        """When a switch begins, before the drain (SGLang: leave the router)."""

    async def _apply_switch(self, e: EngineRuntime, role: Role) -> None:
        """What a switch does on the server; vLLM with kv_both: nothing (routing only)."""

    def _check_switch(self, e: EngineRuntime, role: Role) -> None:
        """Raise if this backend cannot give `e` the role."""

    async def _restart_server(self, engine_id: int) -> str:
        raise NotImplementedError

    async def _kill_server(self, engine_id: int) -> None:
        raise NotImplementedError

    async def _hang_server(self, engine_id: int) -> None:
        raise NotImplementedError

    async def _healthy(self, engine_id: int, timeout_s: float = 5.0) -> bool:
        try:
            async with self.session.get(self.engines[engine_id].url + "/health", timeout=_timeout(timeout_s)) as r:
                return r.status == 200
        except Exception:   # noqa: BLE001 - any failure to answer is "not healthy"
            return False

    async def _on_start(self) -> None:
        """Per run, after the HTTP session exists (e.g. scrape counters)."""

    async def _on_finish(self) -> None:
        """Per run, before the HTTP session closes."""

    # --- leg helpers for subclasses -------------------------------------------------------------
    def _open_leg(self, job: Job, kind: str, engine_id: int, t_ready: float) -> Leg:
        pre = job.pre_leg
        if pre is not None and pre.kind == kind and pre.engine_id == engine_id:
            job.pre_leg = None            # registered at submit(); sent now
            pre.t_submit = self.now()
            return pre
        r = job.request
        leg = Leg(kind, engine_id, r.prompt_tokens, 1 if kind == "prefill" else r.output_tokens, r.trajectory_id,
                  t_ready=t_ready)
        e = self.engines[engine_id]
        if kind == "decode" and job.inbound:
            job.inbound = False
            e.inbound -= 1
            e.inbound_tokens -= r.prompt_tokens
        if not e.legs and e.busy_since is None:
            e.busy_since = self.now()
        e.legs.add(leg)
        job.legs.append(leg)
        leg.t_submit = self.now()
        leg.status = "running"
        return leg

    def _close_leg(self, job: Job, leg: Leg, status: str) -> None:
        e = self.engines[leg.engine_id]
        if leg in e.legs:
            e.legs.discard(leg)
            leg.status = status
            if not e.legs and e.busy_since is not None:
                e.busy_s += self.now() - e.busy_since
                e.busy_since = None
            self.legs.record(job.request.trajectory_id, job.request.turn, job.attempt, leg)
            if e.idle():
                self._maybe_switch_ready(e)

    def _emit(self, e: LifecycleEvent) -> None:
        if e.kind == K.DECODE_END:
            self._in_decode_end = True
            try:
                self._on_event(e)
            finally:
                self._in_decode_end = False
        else:
            self._on_event(e)

    def _event(self, kind: EventKind, job: Job, engine_id: int, t: float | None = None, tokens: int = 0,
               detail: str = "") -> None:
        r = job.request
        self._emit(LifecycleEvent(kind, self.now() if t is None else t, r.trajectory_id, r.turn, engine_id,
                                  tokens, detail=detail))

    # --- internals ------------------------------------------------------------------------------
    async def _main(self) -> None:
        self._idle = asyncio.Event()
        self.session = http_session(api_key=self.api_key)
        monitor = self.loop.create_task(self._monitor())
        try:
            await self._on_start()
            self._ready.set()
            self._check_idle()
            await self._idle.wait()
            await self._on_finish()
        finally:
            monitor.cancel()
            for job in list(self._jobs):
                if job.task is not None:
                    job.task.cancel()
            await asyncio.sleep(0)
            await self.session.close()
            self.session = None
            self._ready.clear()

    def _fire(self, callback) -> None:
        try:
            if self._error is None:
                callback()
        except BaseException as exc:  # noqa: BLE001 - surfaced by run()
            self._fail(exc)
        finally:
            self._pending -= 1
            self._check_idle()

    async def _guard(self, coro) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001
            self._fail(exc)
        finally:
            self._pending -= 1
            self._check_idle()

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        if self._idle is not None:
            self._idle.set()

    def _check_idle(self) -> None:
        if self._idle is not None and self._pending == 0:
            self._idle.set()

    async def _job(self, job: Job) -> None:
        await self._ready.wait()          # turns submitted before run() wait for the HTTP session
        try:
            await self._serve_turn(job)
            job.completed = True
        except EngineGone as gone:
            job.handed_back = True
            log.warning("engine %d gone (%s); trajectory %d turn %d handed back", gone.engine_id, gone.reason,
                        job.request.trajectory_id, job.request.turn)
            self._engine_failed(gone.engine_id, gone.reason, exclude=job)
        except LegError as err:          # e.g. a failed KV load under kv_load_failure_policy=fail: retry
            job.handed_back = True
            log.warning("leg failed: %s; trajectory %d turn %d handed back", err, job.request.trajectory_id,
                        job.request.turn)
            self.failures.append({"engine_id": -1, "t": self.now(), "reason": str(err)[:300]})

    def _job_done(self, job: Job) -> None:
        task = job.task
        if not task.cancelled() and task.exception() is not None:
            self._fail(task.exception())
        self._jobs.discard(job)
        if job.handed_back:
            self._hand_back(job)
        self._pending -= 1
        self._check_idle()

    def _hand_back(self, job: Job) -> None:
        for leg in list(job.legs):
            if leg.status == "running":
                if math.isnan(leg.t_done):
                    leg.t_done = self.now()
                self._close_leg(job, leg, "returned")
        if job.inbound:
            d = self.engines[job.route.decode_engine]
            d.inbound -= 1
            d.inbound_tokens -= job.request.prompt_tokens
            job.inbound = False
            if d.idle():
                self._maybe_switch_ready(d)
        if self._error is None:
            try:
                self._on_returned(job.request)
            except BaseException as exc:  # noqa: BLE001
                self._fail(exc)

    def _engine_failed(self, engine_id: int, reason: str, exclude: Job | None = None) -> None:
        e = self.engines[engine_id]
        if e.failed:
            return
        e.failed = True
        e.available = False
        log.warning("engine %d failed: %s; restarting it", engine_id, reason)
        self.failures.append({"engine_id": engine_id, "t": self.now(), "reason": reason})
        self.timeline.enter(e.engine_id, self.now(), e.role, "failed")
        self._emit(LifecycleEvent(K.ENGINE_FAILED, self.now(), engine_id=engine_id, detail=reason[:200]))
        for job in list(self._jobs):
            if job is not exclude and job.lost_with(engine_id):
                job.handed_back = True
                job.task.cancel()
        self._pending += 1
        self.loop.create_task(self._guard(self._recover(e)))

    async def _recover(self, e: EngineRuntime) -> None:
        e.url = await self._restart_server(e.engine_id)
        e.restarts += 1
        e.failed = False
        e.unhealthy_checks = 0
        if e.target_role is not None:      # a switch asked for meanwhile: the restart applied it
            await self._apply_switch(e, e.target_role)
            e.role, e.target_role = e.target_role, None
        e.available = True
        self.timeline.enter(e.engine_id, self.now(), e.role, "serving")
        self._emit(LifecycleEvent(K.ENGINE_RECOVERED, self.now(), engine_id=e.engine_id, detail=e.role.value))

    async def _monitor(self) -> None:
        """Detects a dead server between legs (a hung one too): /health every health_interval_s."""
        while True:
            await asyncio.sleep(self.health_interval_s)
            live = [e for e in self.engines if not e.failed]
            for e, ok in zip(live, await asyncio.gather(*[self._healthy(e.engine_id, 5.0) for e in live])):
                e.unhealthy_checks = 0 if ok else e.unhealthy_checks + 1
                if e.unhealthy_checks >= 3 and not e.failed:   # 3 in a row: a slow answer is not a death
                    self._engine_failed(e.engine_id, "health check failed")

    def _maybe_switch_ready(self, e: EngineRuntime) -> None:
        if e.drained is not None:
            e.drained.set()

    async def _switch(self, e: EngineRuntime) -> None:
        """Drain (the engine takes no new legs; its running and inbound legs finish), switch, rejoin;
        without a drain (`drains_on_switch` False) the engine takes no new legs only while the switch
        waits, and its running legs go on."""
        if self.drains_on_switch:
            await self._on_drain_start(e, e.target_role)
            while not e.idle() and not e.failed:
                e.drained = asyncio.Event()
                await e.drained.wait()
            e.drained = None
        if e.failed:                      # _recover gives it the target role after the restart
            return
        e.switching = True
        if self.drains_on_switch:
            self.timeline.enter(e.engine_id, self.now(), e.role, "switching")
        await self._apply_switch(e, e.target_role)
        if self.switch_wait_s:
            await asyncio.sleep(self.switch_wait_s)
        old, e.role = e.role, e.target_role
        e.target_role, e.switching, e.available = None, False, not e.failed
        self.timeline.enter(e.engine_id, self.now(), e.role, "serving")
        self._emit(LifecycleEvent(K.ROLE_SWITCH_END, self.now(), engine_id=e.engine_id,
                                  detail=f"{old.value}->{e.role.value}"))


def _timeout(total: float):
    import aiohttp
    return aiohttp.ClientTimeout(total=total)


def check_extra_args(extra: list[str], owned: dict[str, str]) -> None:
    """backend.extra_args may not set a flag the cluster config owns (two sources that could disagree), nor
    the address a server binds or its API key (harness/engines/server.py: closed by default)."""
    for a in extra:
        flag = a.split("=", 1)[0]
        if flag in ACCESS_FLAGS:
            raise ValueError(f"backend.extra_args sets {flag}, which the harness sets (a server binds 127.0.0.1 "
                             f"on one node, the node's address across nodes, and requires a key drawn per run); "
                             f"remove {flag} from backend.extra_args")
        if flag in owned:
            raise ValueError(f"backend.extra_args sets {flag}, which comes from cluster.{owned[flag]}; "
                             f"set cluster.{owned[flag]} instead and remove {flag} from backend.extra_args")
