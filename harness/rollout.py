"""RolloutDriver: the agent loop of every trajectory, in synchronous or asynchronous RL.

Per trajectory: prefill leg -> [KV transfer] -> decode leg -> tool call -> next turn, whose prompt is
the previous prompt + the model's output + the tool's output. The driver asks the policy where each
turn runs and, every control interval, which role each engine should have; the backend executes.

- sync: an RL step releases B prompts x G samples at once and ends when its last trajectory ends;
  steps run back to back (lengths may drift from step to step, as the workload says).
- async: up to `max_in_flight` trajectories run at once; a new one starts when another ends, as long
  as its batch is at most `staleness` steps ahead of the batches already completed (a trainer that
  consumes each completed batch at once); the run ends when num_steps batches have completed.
- serve (the serving benchmark, harness/serve.py): the workload's single-turn requests are sent at the
  arrival times it draws for `request_rate`, at most `max_concurrency` in flight (later ones wait for a
  slot, first come first served, as `vllm bench serve`'s semaphore); no RL step, no weight update.
"""
from __future__ import annotations

import math
import resource
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial

from harness.api import Backend, ClusterView, EngineState, EventKind, LifecycleEvent, Role, Route, TurnRequest
from harness.policy import Policy
from harness.ticks import IdleBackoff, TickCount, event_count
from harness.trajectory import TrajectoryScript, TurnRecord, TurnTable, validate_script
from workloads.base import Workload


@dataclass(frozen=True)
class ModeConfig:
    """The `mode` group (its keys checked by harness/schema.py ModeSchema)."""
    name: str                       # sync | async | serve
    num_steps: int
    max_in_flight: int = 0          # async only
    staleness: int = 1              # async only
    request_rate: float = math.inf  # serve only: requests per second (inf: all at once)
    max_concurrency: int | None = None   # serve only: requests in flight at most (None: no cap)


# A decision is dropped as stale when, between its plan and its application, more than this share of the
# trajectories in flight at the plan have ended: the plan ranked its candidates on their futures, and
# the work it would apply to is now mostly another.
STALE_ENDED_SHARE = 0.5


@dataclass
class PlanRecord:
    """One plan of the policy: when it was asked for, its cost and whether its decision was applied."""
    t: float                        # the instant the plan started from
    cpu_s: float                    # CPU seconds the plan took, its forked workers included (measured)
    latency_s: float = math.nan     # from `t` to its decision's application (simulated: charged; real: waited)
    dropped_stale: bool = False     # the state moved too far before it could apply (RolloutDriver._stale)


def plan_cpu_s() -> float:
    """CPU seconds of this thread and of the child processes waited for so far: a plan's cost, where
    it may run its independent what-ifs on forked workers (harness/prorsa/workers.py)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.thread_time() + children.ru_utime + children.ru_stime


@dataclass(frozen=True)
class _Asked:
    """The state a plan was asked on, to tell at its application whether it still holds."""
    view: ClusterView
    steps: int                      # sync steps begun
    started: int
    completed: int
    then: Callable[[], None] | None    # what waits for the decision (a sync step's batch)


@dataclass
class RolloutResult:
    turns: TurnTable                # every turn of every trajectory (harness.experiment.lifecycle_frame)
    trajectories: int
    step_windows: list[tuple[float, float]]   # sync: each step's (start, end); async: one window
    rollout_time_s: float
    num_role_switches: int
    events: list[LifecycleEvent] = field(default_factory=list)
    plans: list[PlanRecord] = field(default_factory=list)


def run_batches(workload: Workload, mode: ModeConfig) -> Iterator[list[TrajectoryScript]]:
    """The trajectories a run of `mode` runs, a step's batch at a time (serve: its one batch): the
    workload gives the same batch for a step every time it is asked, so what needs a run's scripts after
    it (the lower bound, tests) reads them here rather than the driver keeping every one to the end."""
    for step in range(mode.num_steps):
        yield workload.batch(step)


def check_route(route: Route, view: ClusterView, request: TurnRequest) -> None:
    """A route must name available engines whose roles serve its legs."""
    p, d = _engine(view, route.prefill_engine), _engine(view, route.decode_engine)
    if p is None or d is None:
        raise ValueError(f"{_where(route, request)}: no such engine")
    if not (p.available and d.available):
        raise ValueError(f"{_where(route, request)}: engine not available (switching roles or failed)")
    if route.disaggregated:
        if p.role == Role.DECODE or d.role == Role.PREFILL:
            raise ValueError(f"{_where(route, request)}: prefill on a {p.role.value} engine, "
                             f"decode on a {d.role.value} engine")
    elif p.role == Role.PREFILL:
        raise ValueError(f"{_where(route, request)}: a prefill engine cannot decode")


def _where(route: Route, request: TurnRequest) -> str:
    return f"route {route} for trajectory {request.trajectory_id} turn {request.turn}"


def _engine(view: ClusterView, engine_id: int) -> EngineState | None:
    """The engine's state; views list engines by id, so this is one lookup, not a scan of the cluster."""
    engines = view.engines
    if 0 <= engine_id < len(engines) and engines[engine_id].engine_id == engine_id:
        return engines[engine_id]
    return next((e for e in engines if e.engine_id == engine_id), None)


class RolloutDriver:
    def __init__(self, workload: Workload, policy: Policy, backend: Backend, mode: ModeConfig,
                 keep_events: bool = False):
        self.workload, self.policy, self.backend, self.mode = workload, policy, backend, mode
        self.keep_events = keep_events
        self.events: list[LifecycleEvent] = []
        # Trajectories in flight: their scripts and turn records (in turn order); at its end a trajectory's
        # records move to `turns` and its script is dropped, so memory stays flat over a long run.
        self.records: dict[int, list[TurnRecord]] = {}
        self.scripts: dict[int, TrajectoryScript] = {}
        self.turns = TurnTable()
        self.context: dict[int, int] = {}          # trajectory -> prompt tokens of its current turn
        self.batch_traj = workload.batch_size * workload.group_size
        self.total = mode.num_steps * self.batch_traj
        self.started = self.completed = 0
        self.step_done: dict[int, int] = {}
        self.step_windows: list[tuple[float, float]] = []
        self.parked: list[TurnRequest] = []
        self._arrived: deque[TrajectoryScript] = deque()   # serve: requests arrived, waiting for a slot
        self.role_switches = 0
        self.finished_at = math.nan
        self._pending_batches: dict[int, list[TrajectoryScript]] = {}
        self._step_after_switch: int | None = None   # a sync step waiting for its start's role switches
        self.plans: list[PlanRecord] = []
        self._planning = False          # a plan is in flight: asked for, its decision not applied yet
        self._after_plan: Callable[[], None] | None = None   # a sync step start waiting for that plan
        self._held: list[LifecycleEvent] | None = None   # the policy's events while its plan runs off the loop
        # The control tick's interval widens in a long idle stretch (harness/ticks.py); `ticks` is the
        # run's count of tick events, shared with the cluster sampler (harness/experiment.py).
        self.ticks = TickCount()
        self._control = IdleBackoff(self.ticks)
        self._control_gen = 0           # the control tick due; an earlier one still queued was superseded
        backend.set_listener(self._on_event, self._route_and_submit)

    # --- public -------------------------------------------------------------------------------
    def run(self) -> RolloutResult:
        self._begin()
        return self.resume()

    def run_within(self, limit_s: float) -> float | None:
        """`run()`'s rollout time, or None once it is sure to exceed `limit_s` (`resume_within`)."""
        self._begin()
        return self.resume_within(limit_s)

    def _begin(self) -> None:
        if self.mode.name == "sync":
            self._start_sync_step(0)
        elif self.mode.name == "serve":
            self._schedule_arrivals()
        else:
            self._fill_async()
        if self.policy.control_interval_s:
            self.backend.call_later(0.0, partial(self._control_tick, self._control_gen))

    def resume_within(self, limit_s: float) -> float | None:
        """The rollout time `resume()` would give, or None once it is sure to exceed `limit_s`: the time
        counted so far has passed it at an event with work left (the driver is then left mid-run). A run
        whose last events cross the limit between two events ends and gives its time, above the limit."""
        self.backend.run(None if math.isinf(limit_s) else lambda: self.elapsed_rollout_s() > limit_s)
        if self.completed != self.total:
            return None
        return self.resume().rollout_time_s

    def elapsed_rollout_s(self) -> float:
        """The rollout time counted so far: `resume()`'s sum of step windows, the one under way to now."""
        now = self.backend.now()
        if self.mode.name != "sync":
            return now
        return sum((now if math.isnan(end) else end) - start for start, end in self.step_windows)

    def resume(self) -> RolloutResult:
        """Run the backend to the end and collect the result (a fork continues from its instant)."""
        self.backend.run()
        if self.completed != self.total:
            raise RuntimeError(f"rollout stalled: {self.completed} of {self.total} trajectories completed "
                               f"(parked requests: {len(self.parked)})")
        if self.mode.name != "sync":
            self.step_windows = [(0.0, self.finished_at)]
        rollout = sum(b - a for a, b in self.step_windows)
        return RolloutResult(self.turns, self.started, self.step_windows, rollout, self.role_switches, self.events,
                             self.plans)

    # --- trajectory lifecycle ------------------------------------------------------------------
    def _batch(self, step: int) -> list[TrajectoryScript]:
        if step not in self._pending_batches:
            scripts = self.workload.batch(step)
            if len(scripts) != self.batch_traj:
                raise ValueError(f"workload {self.workload.name} gave {len(scripts)} trajectories for step "
                                 f"{step}; expected batch_size*group_size={self.batch_traj}")
            self._pending_batches[step] = list(reversed(scripts))
        return self._pending_batches[step]

    def _start_trajectory(self, script: TrajectoryScript) -> None:
        validate_script(script)
        self.scripts[script.trajectory_id] = script
        self.started += 1
        self._emit(LifecycleEvent(EventKind.TRAJECTORY_START, self.backend.now(), script.trajectory_id, 0,
                                  detail=script.family))
        self.context[script.trajectory_id] = 0
        self._turn_ready(script, 0)

    def _turn_ready(self, script: TrajectoryScript, turn: int) -> None:
        tid = script.trajectory_id
        t = script.turns[turn]
        appended = t.new_tokens + (script.turns[turn - 1].output_tokens if turn else 0)
        self.context[tid] += appended
        now = self.backend.now()
        req = TurnRequest(trajectory_id=tid, group_id=script.group_id, turn=turn, family=script.family,
                          prompt_tokens=self.context[tid], appended_tokens=appended,
                          max_output_tokens=script.max_output_tokens, output_tokens=t.output_tokens, t_ready=now)
        self.records.setdefault(tid, []).append(TurnRecord(
            trajectory_id=tid, group_id=script.group_id, step=script.step, family=script.family, turn=turn,
            t_ready=now, prompt_tokens=req.prompt_tokens))
        self._emit(LifecycleEvent(EventKind.TURN_READY, now, tid, turn, tokens=appended))
        self._route_and_submit(req)

    def _route_and_submit(self, req: TurnRequest) -> None:
        view = self.backend.view()
        route = self.policy.route(req, view)
        if route is None:
            self.parked.append(req)
            return
        check_route(route, view, req)
        rec = self.records[req.trajectory_id][req.turn]
        rec.engine_prefill, rec.engine_decode = route.prefill_engine, route.decode_engine
        self.backend.submit(req, route)

    def _retry_parked(self) -> None:
        parked, self.parked = self.parked, []
        for req in parked:
            self._route_and_submit(req)

    def _trajectory_end(self, tid: int) -> None:
        script = self.scripts.pop(tid)
        del self.context[tid]
        self.turns.append(self.records.pop(tid))
        self._emit(LifecycleEvent(EventKind.TRAJECTORY_END, self.backend.now(), tid, len(script.turns) - 1))
        self.completed += 1
        if self.completed == self.total:
            self.finished_at = self.backend.now()
        if self.mode.name == "sync":
            self.step_done[script.step] = self.step_done.get(script.step, 0) + 1
            if self.step_done[script.step] == self.batch_traj:
                start = self.step_windows[-1][0]
                self.step_windows[-1] = (start, self.backend.now())
                if script.step + 1 < self.mode.num_steps:
                    self._start_sync_step(script.step + 1)
        elif self.mode.name == "serve":
            self._send_arrived()
        else:
            if self.completed % self.batch_traj == 0 and self.completed < self.total:
                self.backend.update_weights()   # the trainer consumed a batch and updated the weights
            self._fill_async()

    def _start_sync_step(self, step: int) -> None:
        if step:
            self.backend.update_weights()   # the trainer's update between two steps
        # Nothing runs (the last step's trajectories have all ended): the policy may set the roles the
        # step starts in, and the batch starts once that plan is applied and its switches are done (the
        # step's time counts both). A plan still in flight from the last step is applied (or dropped as
        # stale) first.
        self.step_windows.append((self.backend.now(), math.nan))
        ask = partial(self._ask_policy, partial(self._step_planned, step))
        if self._planning:
            self._after_plan = ask
        else:
            ask()

    def _step_planned(self, step: int) -> None:
        if self.backend.view().switching():
            self._step_after_switch = step
            return
        self._start_batch(step)

    def _start_batch(self, step: int) -> None:
        """Start every trajectory of sync step `step`. Not while roles are changing: its first turns
        would all go to the engines already in their roles and stay there (sticky KV;
        docs/decisions/2026-12-07-prorsa-rules.md, R24)."""
        self._step_after_switch = None
        batch = self._batch(step)
        while batch:
            self._start_trajectory(batch.pop())

    def _fill_async(self) -> None:
        while (self.started < self.total and self.started - self.completed < self.mode.max_in_flight
               and self.started // self.batch_traj <= self.completed // self.batch_traj + self.mode.staleness):
            self._start_trajectory(self._batch(self.started // self.batch_traj).pop())

    # --- serve mode ----------------------------------------------------------------------------
    def _schedule_arrivals(self) -> None:
        """Each request of the workload's one batch arrives at its time (workload.arrivals)."""
        batch = self._batch(0)
        times = self.workload.arrivals(self.mode.request_rate)
        for t in times:
            self.backend.call_later(t, partial(self._arrive, batch.pop()))

    def _arrive(self, script: TrajectoryScript) -> None:
        self._arrived.append(script)
        self._send_arrived()

    def _send_arrived(self) -> None:
        """Send the arrived requests in arrival order while the concurrency cap allows."""
        cap = self.mode.max_concurrency
        while self._arrived and (cap is None or self.started - self.completed < cap):
            self._start_trajectory(self._arrived.popleft())

    # --- events ---------------------------------------------------------------------------------
    def _emit(self, e: LifecycleEvent) -> None:
        if self._control.widened:
            self._wake_control_tick()
        if self.keep_events:
            self.events.append(e)
        if self._held is not None:
            self._held.append(e)
        else:
            self.policy.observe(e)

    def _on_event(self, e: LifecycleEvent) -> None:
        K = EventKind
        turns = self.records.get(e.trajectory_id)
        rec = turns[e.turn] if turns is not None else None
        if e.kind == K.PREFILL_START:
            if math.isnan(rec.t_prefill_start):
                rec.t_prefill_start = e.t
                rec.cached_tokens = e.tokens
        elif e.kind == K.PREFILL_END:
            rec.new_tokens += e.tokens
            if math.isnan(rec.t_prefill_end):
                rec.t_prefill_end = e.t
        elif e.kind == K.TRANSFER_END:
            rec.t_transfer_end = e.t
            rec.transferred_tokens += e.tokens
        elif e.kind == K.DECODE_MIGRATED:
            rec.engine_decode = e.engine_id
        elif e.kind == K.DECODE_START:
            if math.isnan(rec.t_decode_start):
                rec.t_decode_start = e.t
        elif e.kind == K.FIRST_TOKEN:
            if math.isnan(rec.t_first_token):
                rec.t_first_token = e.t
        elif e.kind == K.PREEMPTED:
            rec.preemptions += 1
            rec.recomputed_tokens += e.tokens
            rec.new_tokens += e.extra_tokens
        elif e.kind == K.DECODE_END:
            rec.t_decode_end = e.t
            rec.output_tokens = e.tokens
            if math.isnan(rec.t_transfer_end):
                rec.t_transfer_end = rec.t_prefill_end
        elif e.kind == K.ROLE_SWITCH_END:
            self.role_switches += 1
        self._emit(e)
        if e.kind == K.DECODE_END:
            self._after_decode(e.trajectory_id, e.turn)
        elif (e.kind in (K.ROLE_SWITCH_END, K.ENGINE_RECOVERED) and (self.parked or self._step_after_switch is not None)
              and not self.backend.view().switching()):
            # Parked turns, and a sync step's batch, wait for the whole transition, so they spread over
            # every new engine instead of piling onto the first one back.
            if self._step_after_switch is not None:
                self._start_batch(self._step_after_switch)
            if self.parked:
                self._retry_parked()

    def _after_decode(self, tid: int, turn: int) -> None:
        script = self.scripts[tid]
        rec = self.records[tid][turn]
        if turn + 1 == len(script.turns):
            rec.t_tool_end = rec.t_decode_end
            self._trajectory_end(tid)
            return

        self.backend.call_later(script.turns[turn].tool_latency_s, partial(self._tool_done, script, turn))

    def _tool_done(self, script: TrajectoryScript, turn: int) -> None:
        rec = self.records[script.trajectory_id][turn]
        rec.t_tool_end = self.backend.now()
        self._emit(LifecycleEvent(EventKind.TOOL_END, rec.t_tool_end, script.trajectory_id, turn,
                                  tokens=script.tool_output_tokens(turn)))
        self._turn_ready(script, turn + 1)

    def _control_tick(self, gen: int) -> None:
        """Ask the policy for a plan (unless one is in flight) every `control_interval_s`, or further
        apart in a long idle stretch: after IDLE_TICKS intervals in a row in which nothing but ticks ran,
        each interval doubles, up to a day (harness/ticks.py; the simulator only). The events of such an
        interval are this tick, the sampler's ticks and the delayed application of this tick's plan (a
        decision that switches a role makes events of its own). Unlike the sampler's, this tick wakes:
        the first lifecycle event after the interval widened schedules the next tick one interval on
        (`_wake_control_tick`), so the policy re-plans as soon after the idle stretch as it would have
        without it; the tick then queued further on is superseded (`gen`) and returns when it runs."""
        self._control.tick()
        if gen != self._control_gen:
            return   # superseded by a wake-up
        interval = self.policy.control_interval_s
        if self.completed == self.total or not interval:
            return   # done, or (in a fork) a policy that never re-plans
        if not self._planning:
            self._ask_policy(tick=True)
        gap = self._control.next_gap_s(event_count(self.backend), interval)
        self.backend.call_later(gap, partial(self._control_tick, gen))

    def _wake_control_tick(self) -> None:
        self._control.wake()
        interval = self.policy.control_interval_s
        self._control_gen += 1
        if interval and self.completed < self.total:
            self.backend.call_later(interval, partial(self._control_tick, self._control_gen))

    def _ask_policy(self, then: Callable[[], None] | None = None, tick: bool = False) -> None:
        """The policy's plan on the present view. The simulator runs it at once (its clock stands still)
        and its decision applies after the latency the policy charges for it; real engines run it in a
        worker while this loop goes on routing and streaming under the present roles (the policy's events
        held until the plan returns, so it plans on one state), and it applies when it returns. `then`
        runs once the decision is applied or dropped. `tick`: asked by the control tick, whose delayed
        application is part of the tick (a tick event: harness/ticks.py)."""
        asked = _Asked(self.backend.view(), len(self.step_windows), self.started, self.completed, then)
        self._planning = True
        inline = self.backend.plans_inline
        if not inline:
            self._held = []

        def work() -> tuple[dict[int, Role] | None, float]:
            t0 = plan_cpu_s()
            return self.policy.plan(asked.view), plan_cpu_s() - t0

        def returned(result: tuple[dict[int, Role] | None, float]) -> None:
            wanted, cpu = result
            held, self._held = self._held, None
            for e in held or ():
                self.policy.observe(e)
            latency = self.policy.plan_latency_s(cpu)
            if latency is None:   # no plan was due: nothing to record
                self._apply_plan(asked, wanted, None)
                return
            record = PlanRecord(asked.view.now, cpu)
            self.plans.append(record)
            if inline and latency > 0:
                apply = self._apply_tick_plan if tick else self._apply_plan
                self.backend.call_later(latency, partial(apply, asked, wanted, record))
            else:
                self._apply_plan(asked, wanted, record)
        self.backend.run_plan(work, returned)

    def _apply_tick_plan(self, asked: _Asked, wanted: dict[int, Role] | None, record: PlanRecord | None) -> None:
        self._control.tick()
        self._apply_plan(asked, wanted, record)

    def _apply_plan(self, asked: _Asked, wanted: dict[int, Role] | None, record: PlanRecord | None) -> None:
        self._planning = False
        view = self.backend.view()
        if record is not None:
            record.latency_s = view.now - asked.view.now
            if wanted and self._stale(asked, view):
                record.dropped_stale, wanted = True, None
        self.apply_roles(view, wanted)
        if asked.then is not None:
            asked.then()
        after, self._after_plan = self._after_plan, None
        if after is not None:
            after()

    def _stale(self, asked: _Asked, view: ClusterView) -> bool:
        """Whether the state has moved too far since the plan for its decision to apply: an engine's role,
        switch or health changed (a failure, a recovery, another switch), a sync step began, or more than
        STALE_ENDED_SHARE of the trajectories then in flight have ended."""
        def roles(v: ClusterView) -> list[tuple]:
            return [(e.engine_id, e.role, e.target_role, e.available) for e in v.engines]
        in_flight = max(asked.started - asked.completed, 1)
        return (roles(asked.view) != roles(view) or asked.steps != len(self.step_windows)
                or self.completed - asked.completed > STALE_ENDED_SHARE * in_flight)

    def apply_roles(self, view: ClusterView, wanted: dict[int, Role] | None) -> None:
        """Start the role switches `wanted` asks for (engines not already in or moving to that role)."""
        for e in view.engines:
            role = (wanted or {}).get(e.engine_id)
            if role is not None and role != (e.target_role or e.role) and e.target_role is None:
                self.backend.switch_role(e.engine_id, role)

    def fork(self, policy: Policy | None = None) -> RolloutDriver:
        """An independent copy of this rollout at this instant (its backend, workload, progress and
        policy), to be continued with `resume()`; driven from now on by `policy` if one is given.
        Only the simulator can fork. A plan under way (the one that forks, as oracle_pd's) stays this
        driver's: the fork starts with none."""
        fork = self.backend.fork(self, replace={id(self.policy): policy} if policy is not None else None)
        fork._planning, fork._after_plan, fork._held = False, None, None
        return fork
