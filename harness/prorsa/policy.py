"""Prorsa (arXiv 2610.16592): prediction-guided P/D allocation with engine role switching.

Only the abstract is public; the algorithm here is ours. Every `control_interval_s`:
  track (tracker.py: every trajectory's lifecycle, from events only)
  -> when a plan is due (every `replan_interval_s`, and at once when a sync step starts):
     sample every live trajectory's future from the per-family distributions learned online (the
     workload's priors until `min_observations`) -- its turns left, the rest of its output or tool
     call, every later turn -- and, in async RL, the trajectories that will start (forecast.py);
  -> run the simulator forward from the present under colocation and every P:D split, each reached
     from the present roles by moving the fewest engines, switch costs included (planner.py);
  -> switch when the best candidate ends the phase (sync: the step's last trajectory; async: the mean
     end of the live trajectories and the next `max_in_flight`) more than `hysteresis` sooner than staying,
     in `confirm_plans` consecutive plans (each plan is one sample of the future, and a flip on one
     sample resets every engine's prefix cache: docs/decisions/2026-12-07-prorsa-rules.md, R1), in sync
     RL (and async when a switch drains or reloads engines) also by the mean over `check_samples`
     fresh samples of the futures (one sample's gain is noisy and, as the best of several candidates
     on it, biased up), and not sooner than `min_dwell_s` after the last switch.
A plan on a cluster of more than `plan_engines` engines simulates a slice of it (slice.py), and a plan
whose phase is bound by its longest chain of tool calls runs the present allocation only (planner.py,
`Planner.settled`), and the next plan waits while that bound keeps the choice closed: its cost does not
grow with the cluster. With `plan_per_engine`, a plan also simulates one trajectory in as many as leave
that many per engine, each standing for them all (slice.py): nor with the trajectories in flight.
The run under the present allocation is the forecast (forecast.parquet: prefill tokens and decoding
sequences per bin against what happened). The initial allocation is the planner's choice for a
phase of trajectories sampled from the priors (`initial: plan`), or colocation (`initial: colocated`).
With several task families the plan also weighs each family alone and starts where the worst case
over these mixes is best (planner.py, `initial`): a start that suits only the first batches' mix can
take minutes to leave when switches reload engines, and costs little to leave when they do not.
Ablations: `forecast: false` plans on the present only (each live trajectory finishes its current
turn, nothing after it, no new trajectories); `switching: false` keeps the initial allocation.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from harness.api import ClusterView, EventKind, LifecycleEvent, Role, Route, RunInfo, TurnRequest
from harness.cluster import ClusterConfig, cost_model, is_number
from harness.policy import Policy
from harness.prorsa.forecast import FutureModel, FutureTrajectory, FutureTurn, future_sampler
from harness.prorsa.forecast_log import Forecast, ForecastLog
from harness.prorsa.mode_rules import ModeRules, rules_for
from harness.prorsa.model import PlanningModel, with_priors
from harness.prorsa.placement import DecodeWork, route_placing, turns_left_factor
from harness.prorsa.planner import Decision, Planner, decode_left
from harness.prorsa.slice import ClusterSlice, cluster_split, home, scaled, thinned
from harness.allocation import COLOCATED, current_split, roles_for, target_roles
from harness.prorsa.tracker import LifecycleTracker, Phase
from harness.prorsa.workers import PlanWorkers
from harness.prorsa.whatif import WhatIf
from harness.routing import Balance, PrefixTracker
from harness.sim.backend import nested_runs

log = logging.getLogger(__name__)


# A plan settled by the critical-path floor says how long the choice stays closed if the world goes as
# its one sample of the futures says (Planner.settled); the next plan is due then, but after at most this
# many replan intervals, since the sample may be wrong (a tail that turns out decode-bound).
SETTLED_PLANS_SKIPPED = 6


@dataclass(frozen=True)
class Sample:
    """One sample of the futures a plan scores its candidates on (Prorsa._sample)."""
    live: list[FutureTrajectory]        # the live trajectories' futures (a slice's, thinned if the plan is)
    new: list[FutureTrajectory]         # async: the trajectories to start
    hedges: list[list[FutureTrajectory]]   # async, several families: the starts if the mix turned to one
    then: Callable[[], list[FutureTrajectory]] | None   # sync: the next step's batch, for the forecast
    rng: np.random.Generator            # the plan's stream, which the fresh-sample check goes on drawing from


def split_name(split: int, n: int) -> str:
    return "colocated" if split == COLOCATED else f"{split}P{n - split}D"


def same_mix(a: list[float], b: list[float]) -> bool:
    """Two task mixes (one share per family) are the same: shares are counts over a batch, so any real
    difference is far above this tolerance (and a family's 1e-9 stand-in for 0 is below it)."""
    return all(abs(x - y) < 1e-6 for x, y in zip(a, b))


class Prorsa(Policy):
    name = "prorsa"

    def __init__(self, *, control_interval_s: float, replan_interval_s: float, horizon_s: float, bins: int,
                 hysteresis: float, min_dwell_s: float, min_observations: int, allow_colocated: bool, forecast: bool,
                 switching: bool, initial: str, initial_samples: int, initial_max_samples: int, max_candidates: int,
                 mix_window: int, confirm_plans: int, switch_rule: str, check_samples: int, priority: str,
                 mix_forecast: str, placement: str, plan_latency: float | str, plan_events_per_s: float,
                 plan_engines: int, plan_workers: int | str, plan_per_engine: int | None, model: Mapping | None,
                 priors: str, seed: int, name: str = "prorsa"):
        """Every setting's default lives in configs/policy/prorsa.yaml, so none is written here."""
        self.name = name
        self.control_interval_s = control_interval_s
        self.replan_interval_s = replan_interval_s
        self.horizon_s, self.bins = horizon_s, bins
        self.hysteresis, self.min_dwell_s, self.min_obs = hysteresis, min_dwell_s, min_observations
        self.allow_colocated, self.use_forecast, self.switching = allow_colocated, forecast, switching
        self.initial, self.initial_samples, self.initial_max_samples = initial, initial_samples, initial_max_samples
        self.max_candidates, self.mix_window, self.seed = max_candidates, mix_window, seed
        self.confirm_plans, self.switch_rule, self.check_samples = confirm_plans, switch_rule, check_samples
        self.priority, self.mix_forecast = priority, mix_forecast
        if not (plan_latency == "model" or (is_number(plan_latency) and plan_latency >= 0)):
            raise ValueError(f"policy.plan_latency={plan_latency!r} is invalid; allowed: model, or a number of "
                             "seconds >= 0")
        self.plan_latency, self.plan_events_per_s = plan_latency, plan_events_per_s
        self.plan_engines = plan_engines
        if plan_per_engine is not None and not (isinstance(plan_per_engine, int) and plan_per_engine >= 1):
            raise ValueError(f"policy.plan_per_engine={plan_per_engine!r} is invalid; allowed: null (every "
                             "trajectory), or an integer >= 1")
        if plan_per_engine is not None and placement == "forecast_work":
            raise ValueError(f"policy.plan_per_engine={plan_per_engine!r} is invalid with policy.placement="
                             "forecast_work; allowed: null (a thinned plan holds no decode work to place by for the "
                             "trajectories it leaves out)")
        self.plan_per_engine = plan_per_engine
        self.workers = PlanWorkers.of(plan_workers)
        self.slice_share = 1.0   # the share of the cluster a plan simulates (slice.py); 1: the whole cluster
        self.model, self.priors = PlanningModel.of(model), priors
        self._planned_events: int | None = None   # what-if events of the last `plan` call's plan (None: none made)
        self.work = DecodeWork() if placement == "forecast_work" else None   # placement.py
        self._work_left: dict[str, np.ndarray] = {}   # family -> forecast work left (s) by turns so far
        self.tracker = LifecycleTracker()
        self.prefix = PrefixTracker()
        self.routes: dict[int, Route] = {}     # trajectory -> the engines its turn under way was sent to
        # ... and that turn: on real engines events reach `observe` after a plan returns, so a turn's end
        # may arrive after the next turn was routed, and must not take that route away
        self._routed_turn: dict[int, int] = {}
        self._wanted: list[int] = []          # switch_rule=consecutive: the targets of the latest plans in a row
        self.decisions: list[tuple[float, int]] = []
        self.plan_scores: list[tuple[float, dict[int, float]]] = []
        self._last_switch = -np.inf
        self._next_plan = 0.0
        self._starts_seen = 0
        self._plans = 0

    # --- Policy contract ----------------------------------------------------------------------
    def initial_roles(self, cluster: ClusterConfig, run: RunInfo) -> list[Role]:
        run = with_priors(run, self.priors)
        self.run, self.cluster = run, cluster
        self.rules: ModeRules = rules_for(run)   # what the run's mode sets (mode_rules.py)
        self.balance = Balance.of(cluster)
        planned = self.model.cluster(cluster)   # what the what-if simulates (model.py)
        if cluster.num_engines > self.plan_engines:   # a slice of it (slice.py)
            planned = replace(planned, num_engines=self.plan_engines)
            self.slice_share = self.plan_engines / cluster.num_engines
        whatif = WhatIf(planned, self.bins, self.horizon_s / self.bins, staleness=run.staleness)
        self.planner = Planner(planned, whatif, self.hysteresis, self.allow_colocated, self.max_candidates,
                               self.rules, self.confirm_plans, self.switch_rule, self.workers)
        self.forecast_log = ForecastLog(self.horizon_s, self.bins)
        # a thinned rank holds 1/weight of its KV, and one trajectory of the longest context the run allows
        rank_kv = min(cost_model(planned, r).kv_capacity_tokens(planned.memory_fraction, planned.activation_reserve_bytes)
                      for r in Role)
        # ... and a thinned step keeps a GRPO group at least
        self.max_weight = max(1, min(rank_kv // max(p.context_cap for p in run.priors.values()),
                                     run.trajectories_per_step // max(run.group_size, 1)))
        self._simulate_at(run.max_in_flight)   # the start's phase holds this many at once
        self.families = sorted(run.priors)
        decode = cost_model(planned, Role.DECODE)   # time per token before any is observed: a batch of 32
        dp = decode.par.dp
        self.default_tpot_s = float(decode.decode_step_times(np.full(dp, 32 // dp or 1), np.zeros(dp), 1)[0])
        self.weights = [run.weights.get(f, 0.0) or 1e-9 for f in self.families]
        self._forecast_work_left(self.future_model(0.0))
        self.planner.whatif.placement = self.work
        with nested_runs():
            split = COLOCATED if self.initial == "colocated" else self._cluster_split(self._initial_split())
        self.decisions.append((0.0, split))
        self._step_split = split              # the allocation planned for the start of the present step
        # and the task mix it was planned for; none for a start hedged over the mixes the run declares:
        # that start is the launch (under kv_both and drain an engine keeps the parallelism it was
        # launched with), and in sync RL the first step is then planned for its own mix before its
        # batch starts, as every later step is (`_plan_step`; docs/decisions/2026-12-07-prorsa-rules.md, R3)
        self._step_split_mix = None if self.initial != "colocated" and self._hedged_start() else self.weights
        # a start planned on the neutral prior is a guess: the next step start is planned again from what
        # the first step showed (sync; async plans learn as they roll)
        self._start_guessed = self.priors == "none"
        return roles_for(split, cluster.num_engines)

    def _simulate_at(self, count: int | None) -> None:
        """Thin the plans that follow for `count` trajectories on the cluster at once (None: simulate
        every one): one in `weight` is simulated, the most that leaves every engine `plan_per_engine`
        of them or more (1: all, as without `plan_per_engine`), lets a rank hold a trajectory of the
        longest context at that weight and keeps a GRPO group of a step; the what-if's engines count
        each as `weight` (slice.py).
        Thinned: the start plan and the plans scored by the mean end (async, before its last phase).
        Not: the plans within a run scored by a last end (a sync step's start and its tail, an async
        run's last phase). That end is a few trajectories' and a switch hangs on it; thinned, each of
        them weighs as the `weight` it stands for (docs/decisions/2026-12-06-plan-thinning.md)."""
        per_engine = (count or 0) / self.cluster.num_engines
        weight = min(max(1, int(per_engine // self.plan_per_engine)), self.max_weight) if self.plan_per_engine else 1
        self._weigh(weight)

    def _weigh(self, weight: int) -> None:
        """The what-if simulates each trajectory as `weight` of them, its run's counts at that share."""
        whatif = self.planner.whatif
        whatif.weight = weight
        whatif.update_every = self._scaled(self.run.trajectories_per_step) if self.rules.updates_in_flight else 0
        whatif.total = self._scaled(self.run.total_trajectories)

    @property
    def weight(self) -> int:
        """Each trajectory the plans simulate stands for this many (`_simulate_at`; the what-if's)."""
        return self.planner.whatif.weight

    def _scaled(self, count: int, weight: int | None = None) -> int:
        """A count of trajectories as a plan samples it: at the slice's share, one in `weight` (the
        plan's) of them."""
        return scaled(count, self.slice_share / (self.weight if weight is None else weight))

    def _thinned(self, futures: list[FutureTrajectory], stratum=lambda ft: None,
                 unit=lambda ft: ft.trajectory_id) -> list[FutureTrajectory]:
        """One in the plan's `weight` of `futures`, by their chains (slice.py `thinned`)."""
        if self.weight == 1:
            return futures
        return thinned(futures, self.weight, self.planner.decode_floor_s, stratum, unit)

    def _slice(self, view: ClusterView) -> ClusterSlice | None:
        """The engines a plan simulates on a cluster bigger than `plan_engines` (None: all of them)."""
        return ClusterSlice.of(view, self.plan_engines) if self.slice_share < 1.0 else None

    def _cluster_split(self, split: int) -> int:
        """A split the planner chose (on the slice, if any) as a split of the cluster."""
        return cluster_split(split, self.slice_share, self.cluster.num_engines)

    def observe(self, event: LifecycleEvent) -> None:
        self.tracker.observe(event)
        self.prefix.observe(event)
        if self.work is not None:
            self.work.observe(event)
        tid = event.trajectory_id
        under_way = self._routed_turn.get(tid) == event.turn
        if event.kind == EventKind.TRAJECTORY_END or (event.kind == EventKind.DECODE_END and under_way):
            self.routes.pop(tid, None)
            self._routed_turn.pop(tid, None)
        elif event.kind == EventKind.DECODE_MIGRATED and tid in self.routes and under_way:
            old = self.routes[event.trajectory_id]   # the KV leaves from where it is (the prefill side)
            self.routes[event.trajectory_id] = Route(old.prefill_engine, event.engine_id, old.priority)
        if event.kind == EventKind.TURN_READY:
            self.forecast_log.observe_arrival(event.t, event.tokens)

    def plan(self, view: ClusterView) -> dict[int, Role] | None:
        events = self.planner.whatif.events
        self._planned_events = None
        roles = self._plan(view)
        if self.planner.whatif.events > events:
            self._planned_events = self.planner.whatif.events - events
        return roles

    def plan_latency_s(self, cpu_s: float) -> float | None:
        """The simulated time from the last `plan` call to its decision: `plan_latency` seconds, or
        (`model`) its what-if events at `plan_events_per_s`, the rate measured for the compiled simulator
        (benchmarks/test_prorsa_overhead.py), deterministic so that runs stay reproducible. None when
        the call ran no what-if (no plan due)."""
        if self._planned_events is None:
            return None
        if self.plan_latency == "model":
            return self._planned_events / self.plan_events_per_s
        return float(self.plan_latency)

    def _plan(self, view: ClusterView) -> dict[int, Role] | None:
        if self.rules.steps and not self.tracker.live and self.tracker.started < self.run.total_trajectories:
            return self._plan_step(view)
        self.forecast_log.observe_decoding(view.now, sum(s.phase == Phase.DECODING for s in self.tracker.live.values()))
        new_step = self.rules.steps and self.tracker.started > self._starts_seen
        if not (new_step or view.now >= self._next_plan) or not self.tracker.live:
            return None
        current = current_split(view)
        if current is None:
            return None   # a switch is under way
        self._next_plan = view.now + self.replan_interval_s
        self._starts_seen = self.tracker.started
        self._plans += 1
        with nested_runs():   # the what-if simulations are freed when the plan is made
            return self._plan_now(view, current)

    def _plan_now(self, view: ClusterView, current: int) -> dict[int, Role] | None:
        """One plan: sample the futures, score the candidates, switch if it pays (the class docstring).
        A thinned plan (an async rolling phase, `plan_per_engine`) decides to stay alone; a switch it
        wants is decided again by the plan in full, on the same sample of the live trajectories
        (docs/decisions/2026-12-07-confirmed-switch.md)."""
        # an async rolling phase holds `max_in_flight` on the engines at once, as the start's does
        thin = self.rules.on_mean_end(self._to_end())
        self.tracker.count_generated(view.now, view.generated_tokens())
        sampler = self.future_model(view.now)
        self._forecast_work_left(sampler)
        part = self._slice(view)
        planned = view if part is None else part.view(view)   # the engines the what-if simulates
        if part is not None:
            self.planner.whatif.placement = part.work(self.work) if self.work is not None else None
        sample = self._sample(view.now, sampler, part, thin)
        if not self.switching or view.now - self._last_switch < self.min_dwell_s:
            outcome = self.planner.whatif.run(sample.live, [e.role for e in planned.engines],
                                              [e.role for e in planned.engines], sample.new,
                                              self._scaled(self.run.max_in_flight),
                                              launched_as=planned.launched_roles(), then=sample.then)
            self._record(view.now, outcome)
            return None
        at = current_split(planned)
        if at is None:
            return None   # the slice is between roles (a switch under way elsewhere)
        d = self._decide(planned, at, sample)
        if self.weight > 1 and d.switch and self._cluster_split(d.split) != current:
            self.planner.unweigh()   # the thinned plan's scores are not evidence
            sample = self._sample(view.now, sampler, part, thin=False)
            d = self._decide(planned, at, sample)
        if d.closed_for_s is not None:   # the floor keeps the choice closed for a while (Planner.settled)
            self._next_plan = view.now + max(self.replan_interval_s,
                                             min(d.closed_for_s, SETTLED_PLANS_SKIPPED * self.replan_interval_s))
        self._record(view.now, d.current)
        self.plan_scores.append((view.now, d.scores))
        n = len(planned.engines)
        log.debug("t=%.1f plan: %s", view.now, ", ".join(f"{split_name(k, n)} {v:.1f}" for k, v in sorted(d.scores.items())))
        target = self._cluster_split(d.split)
        wants = d.switch and target != current
        switch = wants and self._checked(planned, d, at, sampler, sample.rng, part)
        if wants and not switch:
            self.planner.reject(d.split)
        # `consecutive`: this many plans in a row want the target; `evidence`: the planner's sum of them
        needed = self.confirm_plans if self.switch_rule == "consecutive" else 1
        self._wanted = (self._wanted + [target])[-needed:] if switch else []
        if not switch or self._wanted.count(target) < needed:
            return None
        self._wanted = []
        self.planner.reset()
        self._last_switch = view.now
        self.decisions.append((view.now, target))
        log.info("t=%.1f switch %s -> %s (predicted %.1f s -> %.1f s)", view.now, split_name(current, len(view.engines)),
                 split_name(target, len(view.engines)), d.scores[at], d.scores[d.split])
        if part is None:
            return d.roles
        left = {part.ids[i]: v for i, v in decode_left(sample.live).items()}
        return target_roles(view, target, left)

    def _sample(self, now: float, sampler: FutureModel, part: ClusterSlice | None, thin: bool) -> Sample:
        """One sample of the futures a plan scores the candidates on, thinned (`thin`, `_simulate_at`) or
        not: the live trajectories', the trajectories to start (async), their hedges (async, several
        families) and the next step's batch (sync, for the forecast); and the plan's stream, which
        `_checked` goes on drawing from. A thinned sample and one in full draw the live trajectories'
        futures alike, each then keeps one in the plan's weight (`_thinned`)."""
        self._simulate_at(self.run.max_in_flight if thin else None)
        self.planner.whatif.completed = self._scaled(self.tracker.started - len(self.tracker.live))
        self.planner.whatif.started = self._scaled(self.tracker.started)
        rng = np.random.default_rng([self.seed, self._plans])
        if not self.use_forecast:
            return Sample(self._present(now, part), [], [], None, rng)
        live = self._live(sampler, now, rng, part)
        new = self._new(sampler, rng) if self.rules.samples_starts else []
        hedges = self._hedges(sampler, rng) if self.rules.samples_starts and len(self.families) > 1 else []
        then = self._next_step(sampler, np.random.default_rng([self.seed, self._plans, 1]))
        return Sample(live, new, hedges, then, rng)

    def _decide(self, planned: ClusterView, at: int, sample: Sample) -> Decision:
        """The planner's decision on one sample of the futures (`_sample`)."""
        return self.planner.decide(planned, at, sample.live, sample.new, self._scaled(self.run.max_in_flight),
                                   sample.hedges, to_end=self._to_end(), then=sample.then)

    def _live(self, sampler: FutureModel, now: float, rng: np.random.Generator,
              part: ClusterSlice | None) -> list[FutureTrajectory]:
        """The sampled futures of the live trajectories a plan simulates (those of the slice, if any)."""
        if part is None:
            futures = sampler.live(now, self.tracker, self.prefix, self._tpot(), rng, self.routes)
        else:
            futures = part.renumbered(sampler.live(now, self.tracker, self.prefix, self._tpot(), rng, self.routes,
                                                   keep=lambda s: part.keeps(s, self.prefix, self.routes)))
        return self._thinned(futures, stratum=home)   # each engine keeps its share

    def _checked(self, view: ClusterView, d: Decision, current: int, sampler: FutureModel,
                 rng: np.random.Generator, part: ClusterSlice | None) -> bool:
        """Whether the switch a plan wants still beats staying by the hysteresis, by the mean over
        `check_samples` fresh samples of the futures (Planner.check says why one sample is not enough):
        in sync RL, and in async RL when a switch drains or reloads engines (`drain`, `reshard`). With
        kv_both an async switch is a router update, and a wrong one is undone at the next plan for
        nothing (docs/decisions/2026-12-07-prorsa-rules.md, R4). With `forecast: false` a plan has no
        sample (the present only)."""
        if not self.rules.checks_switch(self.cluster) or not self.check_samples or not self.use_forecast:
            return True
        starts = self.rules.samples_starts   # async: the fresh samples hold the trajectories to start too
        samples = [(self._live(sampler, view.now, rng, part), self._new(sampler, rng) if starts else [])
                   for _ in range(self.check_samples)]
        stay, move = self.planner.check(view, d, samples, self._scaled(self.run.max_in_flight) if starts else 0,
                                        self._to_end())
        n = len(view.engines)
        log.debug("t=%.1f check over %d fresh samples: %s %.1f s, %s %.1f s", view.now, len(samples),
                  split_name(current, n), stay, split_name(d.split, n), move)
        return move < stay * (1 - self.hysteresis)

    def _plan_step(self, view: ClusterView) -> dict[int, Role] | None:
        """Before a sync step's batch (every engine idle, the prefix caches flushed by the weight update;
        before the first step, a start hedged over the declared mixes is planned here for its own). The
        start of a step is planned for a fresh batch; switches within a step follow its tail, and the
        split a tail wants can be the wrong one to start a batch in (docs/decisions/
        2026-12-07-prorsa-rules.md, R5). So when the switches of the last step left the cluster in
        another allocation than the one its start was planned in, the next step is planned as the
        initial allocation is (forecast.py, samples of a batch from the distributions learned so far),
        each candidate reached from the present roles with its switch priced; where they did not, the
        step starts where the last one did, unless the trainer's declared task mix for the next step
        differs from the one the present split was planned for, or the run started on the neutral prior
        (`priors: none`) and this is its second step: then the step is planned for its own mix and
        from what the run has shown (R6 in the same record).
        With `forecast: false` nothing is planned here: the plan is a forecast of the next batch, and
        before a step nothing is under way to plan from (the ablation's "present turns only")."""
        self.planner.reset()   # switch evidence from the last step's tail is not about the next batch
        current = current_split(view)
        mix = self._next_step_mix()
        guessed = self._start_guessed and self.tracker.started > 0
        if not (self.switching and self.use_forecast) or current is None or (
                current == self._step_split and self._step_split_mix is not None and same_mix(mix, self._step_split_mix)
                and not guessed):
            return None
        self._simulate_at(None)   # a last end within the run
        part = self._slice(view)
        with nested_runs():
            split = self._cluster_split(self._initial_split(view if part is None else part.view(view), mix))
        self._step_split, self._step_split_mix = split, mix
        self._start_guessed = self._start_guessed and not guessed
        if split == current:
            return None
        self._last_switch = view.now
        self.decisions.append((view.now, split))
        n = len(view.engines)
        log.info("t=%.1f step start: %s -> %s", view.now, split_name(current, n), split_name(split, n))
        return target_roles(view, split)

    def route(self, request: TurnRequest, view: ClusterView) -> Route | None:
        route = route_placing(request, view, self.prefix, self.balance, self.work, request.turn)
        if route is not None and self.priority == "remaining_work":
            left = self._work_left[request.family]
            route = Route(route.prefill_engine, route.decode_engine, -float(left[min(request.turn, len(left) - 1)]))
        if route is None:
            self.routes.pop(request.trajectory_id, None)
        else:
            self.routes[request.trajectory_id] = route
        self._routed_turn[request.trajectory_id] = request.turn
        return route

    def forecast_frame(self):
        """Forecast vs actual per bin (forecast.parquet), when forecasting is on."""
        return self.forecast_log.frame() if self.use_forecast else None

    def metrics(self) -> dict:
        out = {"prorsa_decisions": [[round(t, 3), k] for t, k in self.decisions]}
        if self.use_forecast:
            out.update(self.forecast_log.errors())
        return out

    # --- helpers --------------------------------------------------------------------------------
    def _forecast_work_left(self, sampler: FutureModel) -> None:
        """Per family and turn index k, the turns a trajectory has left from its turn k on,
        (1 + E[turns - (k+1) | turns > k]), times the family's mean turn: for `priority: remaining_work`
        its time (mean output x time per token + mean tool call; queues then serve the trajectories with
        the most work left first, the longest-processing-time-first order that shortens a sync step's
        critical path), for `placement: forecast_work` its output tokens (placement.py)."""
        if self.priority != "remaining_work" and self.work is None:
            return
        tpot = self._tpot()
        for f in self.families:
            factor = turns_left_factor(sampler.turns[f], int(self.run.priors[f].max_turns))
            output = float(np.mean(sampler.outputs[f]))
            self._work_left[f] = factor * (output * tpot + float(np.mean(sampler.tool_latency[f])))
            if self.work is not None:
                self.work.left[f] = factor * output

    def future_model(self, now: float, whole_run: bool = False) -> FutureModel:
        """The forecast every plan samples its futures from: the distributions learned so far (`whole_run`:
        an async start whose sample is the whole run; forecast.py `future_sampler`). The plug-in point of
        another forecast: a subclass overrides this method and returns any FutureModel (docs/prorsa.md)."""
        return future_sampler(self.tracker, self.run, self.min_obs, now, self._tpot(), whole_run)

    def _new(self, sampler: FutureModel, rng) -> list[FutureTrajectory]:
        """Async: the next `max_in_flight` trajectories to start (fewer when the run has fewer left:
        num_steps x trajectories_per_step in all). `mix_forecast: schedule`: each in the task mix of the
        batch it will start in (RunInfo.step_weights, the data loader's declared curriculum), so a plan
        sees a mix turn before it happens. `window`: in the mix of the newest `mix_window` starts (the
        workload's step-0 mix before), which sees a turn only once a window of it has started
        (docs/decisions/2026-12-07-prorsa-rules.md, R7)."""
        count = self._new_count()
        if self.mix_forecast == "schedule" and self.run.step_weights:
            return self._scheduled(sampler, self.tracker.started, self._starting(), -1 - count, rng)
        recent = list(self.tracker.start_families)[-self.mix_window:]
        weights = self.weights
        if len(recent) >= self.mix_window:
            weights = [recent.count(f) for f in self.families]
        return sampler.new(self.families, weights, count, -1 - count, rng)

    def _scheduled(self, sampler: FutureModel, start: int, full: int, first_id: int, rng,
                   group: int = 1, weight: int | None = None) -> list[FutureTrajectory]:
        """The run's trajectories `start` to `start + full` (at the slice's share, one in `weight`), each
        in the declared task mix of the batch it starts in."""
        out, per, k = [], self.run.trajectories_per_step, 0
        while k < full:                                    # the run's (start + k)-th trajectory to start
            step = min((start + k) // per, len(self.run.step_weights) - 1)
            n = min(full - k, (step + 1) * per - start - k)
            # the batches' shares add up to the whole's (`_new_count`): rounded one by one, small ones
            # would each round up and overlap the ids after `first_id`
            take = self._scaled(k + n, weight) - self._scaled(k, weight)
            out += sampler.new(self.families, self._step_mix(step), take, first_id + len(out), rng, group)
            k += n
        return out

    def _step_mix(self, step: int) -> list[float]:
        """The declared task mix of RL step `step` (the last declared one past the schedule's end), one
        share per family."""
        shares = self.run.step_weights[min(step, len(self.run.step_weights) - 1)]
        return [shares.get(f, 0.0) for f in self.families]

    def _hedged_start(self) -> bool:
        """Whether the initial plan also weighs each family alone (Planner.initial's hedges)."""
        return len(self.families) > 1 and self._mix_may_change()

    def _mix_may_change(self) -> bool:
        """Whether the run's task mix may move away from its first step's: the declared mixes differ
        between steps, or none is declared. A start hedged against each family alone is a compromise
        between them; where the schedule says the mix stays, it is a compromise against nothing
        (docs/decisions/2026-12-07-prorsa-rules.md, R8)."""
        declared = self.run.step_weights
        if not declared:
            return True
        first = self._step_mix(0)
        return not all(same_mix(self._step_mix(step), first) for step in range(1, len(declared)))

    def _next_step_mix(self) -> list[float]:
        """The declared task mix of the step the next trajectory starts in (the first step's where the
        run declares none)."""
        if not self.run.step_weights:
            return self.weights
        return self._step_mix(self.tracker.started // self.run.trajectories_per_step)

    def _next_step(self, sampler: FutureModel, rng: np.random.Generator) -> Callable[[], list[FutureTrajectory]] | None:
        """Sync: the next step's batch for the forecast (None in async and after the last step), in GRPO
        groups and in its step's task mix; drawn only if the forecast's run reaches it, from a stream
        of its own (`rng`), so the plans' samples (and decisions) are those they would be without it."""
        run = self.run
        if not self.rules.steps or self.tracker.started >= run.total_trajectories:
            return None
        weights = self._next_step_mix()
        count = self._scaled(run.trajectories_per_step)
        return lambda: sampler.new(self.families, weights, count, -1 - count, rng, run.group_size)

    def _to_end(self) -> bool:
        """Async: whether the live trajectories and the next to start are all the run has left, so the
        plan decides when the run ends (its last trajectory), not how fast the pipeline flows
        (docs/decisions/2026-12-07-prorsa-rules.md, R9)."""
        return self.rules.to_end(self.run, self._trajectories_left())

    def _trajectories_left(self) -> int:
        """Trajectories the run has still to start."""
        return self.run.total_trajectories - self.tracker.started

    def _starting(self) -> int:
        """Async: the trajectories a rolling phase starts, never more than the run has left."""
        return max(min(self.run.max_in_flight, self._trajectories_left()), 0)

    def _new_count(self) -> int:
        """The trajectories a plan samples to start (the slice's share of `_starting`)."""
        return self._scaled(self._starting())

    def _hedges(self, sampler: FutureModel, rng) -> list[list[FutureTrajectory]]:
        """Async with several families, when a switch drains the engine (`drain`, `reshard`): the next
        trajectories to start if the mix turned to one family alone (as many as `_new` draws), one set
        per family. None with `kv_both`: a switch there is a router update, so a split that turns out
        wrong when the mix changes is left at the next plan without a drain or a reload
        (docs/decisions/2026-12-07-prorsa-rules.md, R10)."""
        if self.cluster.switch_mechanism == "kv_both":
            return []
        count = self._new_count()
        return sampler.each_family_alone(self.families, count, -1 - count, rng) if count else []

    def _initial_split(self, present: ClusterView | None = None, weights: list[float] | None = None) -> int:
        """The planner's best start for a phase of trajectories drawn from the priors (`initial_samples`
        draws, more while the choice is open, up to `initial_max_samples`); with `present` (before a
        sync step), from the distributions learned so far, reached from the present roles; `weights`:
        the task mix of the phase (the run's first step's by default)."""
        weights = self.weights if weights is None else weights
        now = present.now if present is not None else 0.0
        # a stream of its own per step start (the plans' streams are [seed, plan number])
        rng = np.random.default_rng([self.seed, 0] if present is None else [self.seed, 0, self.tracker.started])
        # sync: a step's batch; async: INITIAL_IN_FLIGHT_SETS sets of max_in_flight (mode_rules.py)
        run = self.run
        full = self.rules.initial_count(run)
        # a sample that is the whole run (async) is scored as a sync step is: by its last end, in GRPO
        # groups with each trajectory's output level, on `initial_max_samples` samples. Why: the run's
        # time is its last end, set by a few long chains of turns, which the allocation slows or speeds
        # while the mean ends tie; one sample's last end spreads by 10-20%, more than the hysteresis
        # (docs/decisions/2026-12-07-prorsa-rules.md, R12).
        # Other async samples are scored by their mean end, each trajectory and turn drawn afresh.
        whole = self.rules.whole_run(run, full)
        sampler = self.future_model(now, whole)
        as_step = self.rules.shares_output(whole)
        group = run.group_size if as_step else 1
        first = self.initial_max_samples if whole else self.initial_samples
        # a thinned sample is drawn whole, then thinned (by GRPO groups where it is scored by its last
        # end: by their longest chains, slice.py), so the screen's finalists race on the same draws whole
        unit = (lambda ft: ft.trajectory_id // group) if as_step else (lambda ft: ft.trajectory_id)
        count = self._scaled(full, 1)
        if self.rules.schedules_start and self.mix_forecast == "schedule" and run.step_weights:
            # an async start's sample spans several batches: each in its declared mix, as plans draw them
            def draw() -> list[FutureTrajectory]:
                return self._scheduled(sampler, 0, full, 0, rng, group, 1)
        else:
            def draw() -> list[FutureTrajectory]:
                return sampler.new(self.families, weights, count, 0, rng, group)
        drawn: list[list[FutureTrajectory]] = []

        def sample() -> list[FutureTrajectory]:
            drawn.append(draw())
            return self._thinned(drawn[-1], unit=unit)
        samples = [sample() for _ in range(first)]
        whole_hedges = sampler.each_family_alone(self.families, count, 0, rng) \
            if present is None and self._hedged_start() else []   # also weigh each family alone
        hedges = [self._thinned(h, unit=unit) for h in whole_hedges]
        in_flight = self.run.max_in_flight
        # a thinned plan is a screen: it draws no sample past the first, since its close calls race again
        # in full, which draws more while the choice is open
        screening = self.weight > 1
        split, scores = self.planner.initial(samples, self._scaled(in_flight), hedges, None if screening else sample,
                                             self.initial_max_samples, present, to_end=whole)
        screen = self.planner.screen() if screening else None
        if screen is not None and len(screen.finalists) > 1:
            # thinned, the plan was a screen: its finalists race again, every trajectory simulated
            thinned_at = self.weight
            self._weigh(1)
            split, scores = self.planner.initial(drawn[:first], self._scaled(in_flight), whole_hedges, draw,
                                                 self.initial_max_samples, present, to_end=whole, screen=screen)
            self._weigh(thinned_at)
        self.plan_scores.append((now, scores))
        n = self.planner.cluster.num_engines
        log.debug("%s plan: %s -> %s", "initial" if present is None else f"t={now:.1f} step start",
                  ", ".join(f"{split_name(k, n)} {v:.1f}" for k, v in sorted(scores.items())), split_name(split, n))
        return split

    def _present(self, now: float, part: ClusterSlice | None) -> list[FutureTrajectory]:
        """The forecast-free view: every live trajectory (of the slice, if any) finishes its current turn
        (at the mean output seen so far) and nothing follows."""
        outs = self.tracker.outputs
        mean = {f: float(np.mean(v)) for f, v in outs.items() if v}
        futures = []
        for s in self.tracker.live.values():
            if s.phase == Phase.TOOL or (part is not None and not part.keeps(s, self.prefix, self.routes)):
                continue
            tokens = max(int(mean.get(s.family, self.run.priors[s.family].output_tokens.median)), 1)
            futures.append(FutureTrajectory.of_live(
                s, 0.0, [FutureTurn(s.context, max(s.context - s.appended, 0), tokens, 0.0)], self.prefix, self.routes))
        return self._thinned(futures if part is None else part.renumbered(futures), stratum=home)

    def _tpot(self) -> float:
        seen = self.tracker.last_tpot()
        return float(np.median(seen)) if seen else self.default_tpot_s

    def _record(self, now: float, outcome) -> None:
        """The plan's run under the present allocation as the forecast (a slice's scaled to the cluster)."""
        w, share = self.horizon_s / self.bins, self.slice_share / self.weight
        prefill, decode = outcome.prefill_tokens, outcome.decode_seqs
        if share < 1.0:
            prefill, decode = prefill / share, decode / share
        self.forecast_log.history.append(Forecast(now, w, prefill, decode))
