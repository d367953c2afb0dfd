"""One simulated engine: its role, its parallelism, a scheduler (scheduler.py) over its data-parallel
attention ranks and the cost model that times its steps, as vLLM v1's EngineCore pairs a scheduler
with a model executor.

The backend (backend.py) drives it: `start_step(now)` asks the scheduler for a plan and times it,
`end_step()` applies the step and yields what it produces. The engine never calls its owner.
A span of decode-only steps (scheduler.py) ends early, at the end of the step under way, when
something arrives that could change the batch (`cut_span`).
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Iterator

from mypy_extensions import mypyc_attr

from harness.api import Role
from harness.perf.cost_model import CostModel
from harness.perf.roofline import Parallelism
from harness.sim.scheduler import (SCHEDULERS, HandOff, Leg, Report, RequestStatus, Scheduler, SchedulerConfig,
                                   SimRequest, StepPlan)


@mypyc_attr(native_class=False)
@dataclass(frozen=True)
class EngineConfig:
    memory_fraction: float
    activation_reserve_bytes: float
    scheduler: SchedulerConfig
    gpu_name: str = ""              # for messages
    engine: str = "vllm"            # its step semantics (scheduler.py SCHEDULERS)


@mypyc_attr(serializable=True, allow_interpreted_subclasses=True)
class SimEngine:
    def __init__(self, engine_id: int, role: Role, par: Parallelism, cost: CostModel, cfg: EngineConfig,
                 launched_as: Role | None = None, contended_cost: CostModel | None = None):
        self.id = engine_id
        self.cfg = cfg
        self.role = role
        self.target_role: Role | None = None
        self.available = True
        self.switching = False
        self.ships_decodes = False   # a prefill engine sending its decodes away (migrate_decodes_on_switch)
        self.version = 0             # invalidates a scheduled step end when a span is cut short
        self.busy = False
        self.pending_wake = False    # a step start is scheduled
        self.busy_s = 0.0
        self.stale = False           # the backend's view must re-read this engine
        self._plan: StepPlan | None = None
        self._span: list[float] | None = None   # end time of each step of a decode span
        self._span_steps = 0                    # the steps of it that run (a prefix of _span)
        self._span_start = 0.0
        self.configure(launched_as or role, par, cost, contended_cost)

    def configure(self, role: Role, par: Parallelism, cost: CostModel,
                  contended_cost: CostModel | None = None) -> None:
        """(Re)load the engine with parallelism `par` (launched for `role`): an empty KV cache.
        `contended_cost`: its steps' times while another engine on the host runs one (None: the same)."""
        self.par, self.launched_as, self.cost = par, role, cost
        self.contended_cost = contended_cost
        cap = cost.kv_capacity_tokens(self.cfg.memory_fraction, self.cfg.activation_reserve_bytes)
        if cap <= 0:
            raise ValueError(f"cluster.parallelism.{role.value}: model weights leave no KV memory "
                             f"on a {self.cfg.gpu_name} rank (tp={par.tp}, dp={par.dp}, "
                             f"ep={par.ep}); use more GPUs per engine or a larger GPU")
        self.scheduler = SCHEDULERS[self.cfg.engine](self.id, self.cfg.scheduler, cap, par.dp)
        self.kv_capacity_tokens = cap * par.dp

    @property
    def idle(self) -> bool:
        return not self.busy and self.scheduler.idle

    def enqueue(self, s: SimRequest, now: float) -> None:
        """A leg arrives at `now`. During a decode span, the KV of the span's steps started by then is
        reserved first: the rank the leg goes to depends on each rank's memory and prefix cache."""
        if self._span is not None:
            self.scheduler.reserve_span(self._step_under_way(now) + 1)
        need = Scheduler.kv_need(s)
        cap = self.scheduler.rank_capacity
        if need > cap:
            raise ValueError(
                f"trajectory {s.trajectory_id} turn {s.request.turn} needs {need} KV tokens but a rank of "
                f"engine {self.id} ({self.role.value}) holds {cap}; lower the workload's context cap or "
                "give the engines more memory")
        self.scheduler.add_request(s)

    # --- steps --------------------------------------------------------------------------------
    def start_step(self, now: float, contended: bool = False) -> tuple[StepPlan, float | None]:
        """Plan the next step and time it: (plan, its end time), or (plan, None) when nothing can run.
        The plan's outputs (preemptions, decode starts, KV pulls) are the backend's to act on.
        `contended`: another engine on the host runs a step now (timed by `contended_cost`, if any)."""
        plan = self.scheduler.schedule()
        if plan.idle:
            return plan, None
        cost = self.cost
        if contended and self.contended_cost is not None:
            cost = self.contended_cost
        if plan.span_steps:
            self._span = cost.decode_span_ends(plan.seqs, plan.ctx, plan.span_steps, plan.graph, now)
            self._span_steps = plan.span_steps
            self._span_start = now
            end = self._span[-1]
        else:
            if plan.prefill:
                dt = cost.mixed_step_time(plan.seqs, plan.ctx, plan.prefill, plan.graph)
            else:
                dt = cost.decode_step_time(plan.seqs, plan.ctx, plan.graph)
            self.busy_s += dt
            end = now + dt
        self._plan = plan
        self.busy = True
        self.version += 1
        return plan, end

    def cut_span(self, now: float) -> float | None:
        """Something arrived during a span: it ends with the step under way. The new end time, or None
        if the span ends then anyway (or there is none)."""
        span = self._span
        if span is None:
            return None
        i = self._step_under_way(now)
        if i >= self._span_steps - 1:
            return None
        self._span_steps = i + 1
        self.version += 1
        return span[i]

    def _step_under_way(self, now: float) -> int:
        """The index of the span's step running at `now` (one ending at `now` counts as running)."""
        assert self._span is not None
        return bisect_left(self._span, now, 0, self._span_steps)

    @property
    def in_span(self) -> bool:
        return self._span is not None

    def decoding(self, now: float) -> Iterator[tuple[int, int]]:
        """(trajectory id, output tokens generated by `now`) of each request decoding: the scheduler's
        count plus the steps of a decode span under way that have ended (the scheduler applies a span
        when it ends)."""
        done = bisect_right(self._span, now, 0, self._span_steps) if self._span is not None else 0
        for tid, n in self.scheduler.decoding():
            yield tid, n + done

    def token_steps(self, now: float) -> tuple[list[float], list[SimRequest]]:
        """The step (or the decode span's steps) ending at `now`, before it is applied: the end time of
        each step, and the requests that sample a token at each of them (the decoding ones, and those
        whose prefill ends in a single step, a prefill leg's excepted). Read by the serving benchmark for
        inter-token latencies (harness/serve.py); it changes nothing."""
        plan = self._plan
        assert plan is not None   # a step was started
        ends = self._span[:self._span_steps] if self._span is not None else [now]
        out: list[SimRequest] = []
        for r, decoded in zip(self.scheduler.ranks, plan.decoding):
            if decoded and r.decode_n:
                out.extend(s for s in r.running.values() if s.status is RequestStatus.DECODING)
        if not plan.span_steps:
            for chunks in plan.chunks:
                for s, c in chunks:
                    if (s.status is RequestStatus.PREFILLING and s.computed + c == s.target
                            and s.leg is not Leg.PREFILL):
                        out.append(s)
        return ends, out

    def end_step(self) -> Iterator[Report | HandOff]:
        """Apply the step (or the steps of the span) that just ended; what it produces, in order, as it
        goes (Scheduler.update_from_output)."""
        plan, self._plan = self._plan, None
        assert plan is not None   # a step was started
        steps = 1
        if self._span is not None:
            steps = self._span_steps
            self.busy_s += self._span[steps - 1] - self._span_start
            self._span = None
        return self.scheduler.update_from_output(plan, steps)

    # --- role switches --------------------------------------------------------------------------
    def take_waiting(self, decode_legs: bool = False) -> list[SimRequest]:
        return self.scheduler.take_waiting(decode_legs)

    def clear_prefix_cache(self) -> None:
        self.scheduler.clear_prefix_cache()

