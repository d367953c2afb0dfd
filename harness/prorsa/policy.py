"""Prorsa: prediction-guided P/D allocation with engine role switching (arXiv 2610.16592, abstract).

What the abstract states: Prorsa observes the lifecycle of every trajectory to forecast short-horizon
prefill and decode demand; the forecasts guide worker allocation and trigger role switching, so
that prefill and decode capacity follow the anticipated demand, in sync and async agentic RL.
The algorithm here is ours (see tracker.py, forecaster.py, allocator.py, switcher.py):
  every `control_interval_s`: track -> forecast the next `horizon_s` in `bins` -> score every split
  with the cost model -> switch the cheapest-to-drain engines when the gain beats the switch cost
  plus `hysteresis`, and not sooner than `min_dwell_s` after the last switch.
The priors come from the workload, per family, in the RunInfo given to `initial_roles`; the forecaster
uses each family's own, and the initial plan their mixture weighted by the step-0 family shares.
The initial split (`initial: plan`) is the allocator's choice, with no switch cost, for the load the
priors predict: RunInfo.max_in_flight trajectories released together (a sync step, or the async
concurrency), each with the prior prompt, output and tool lengths; `initial: colocated` starts
colocated. It does not switch in the tail,
when fewer than `min_in_flight_per_engine` trajectories per engine remain.
Ablations (config): `forecast: false` scores splits on the present state only (queued prefill and
current decodes held flat over the horizon); `switching: false` keeps the initial split.
"""
from __future__ import annotations

from dataclasses import fields

import numpy as np

from harness.api import ClusterView, EventKind, FamilyPriors, LifecycleEvent, Role, Route, RunInfo, TurnRequest
from harness.cluster import ClusterConfig
from harness.prorsa.allocator import COLOCATED, Allocator, CapacityModel, Load
from harness.prorsa.forecaster import Forecast, Forecaster
from harness.prorsa.switcher import current_split, target_roles
from harness.prorsa.tracker import LifecycleTracker, Phase
from harness.routing import PrefixTracker, route_by_role
from workloads.base import lognormal_mixture


class Prorsa:
    name = "prorsa"

    def __init__(self, control_interval_s: float = 2.0, horizon_s: float = 20.0, bins: int = 5,
                 hysteresis: float = 0.1, min_dwell_s: float = 10.0, min_observations: int = 30,
                 allow_colocated: bool = True, forecast: bool = True, switching: bool = True,
                 initial: str = "plan", min_in_flight_per_engine: float = 2.0, name: str = "prorsa"):
        if initial not in ("plan", "colocated"):
            raise ValueError(f"policy.initial={initial!r} is invalid; allowed: plan, colocated")
        for key, v in (("control_interval_s", control_interval_s), ("horizon_s", horizon_s)):
            if not v > 0:
                raise ValueError(f"policy.{key}={v} is invalid; allowed: a number > 0")
        if not (isinstance(bins, int) and bins >= 1):
            raise ValueError(f"policy.bins={bins!r} is invalid; allowed: an integer >= 1")
        if hysteresis < 0:
            raise ValueError(f"policy.hysteresis={hysteresis} is invalid; allowed: a number >= 0")
        self.name = name
        self.control_interval_s = control_interval_s
        self.horizon_s, self.bins = horizon_s, bins
        self.hysteresis, self.min_dwell_s, self.min_obs = hysteresis, min_dwell_s, min_observations
        self.allow_colocated, self.use_forecast, self.switching = allow_colocated, forecast, switching
        self.initial, self.min_in_flight_per_engine = initial, min_in_flight_per_engine
        self.tracker = LifecycleTracker()
        self.prefix = PrefixTracker()
        self.decisions: list[tuple[float, int]] = []
        self._last_switch = -np.inf

    # --- Policy contract ----------------------------------------------------------------------
    def initial_roles(self, cluster: ClusterConfig, run: RunInfo) -> list[Role]:
        self.run = run
        self.pooled = pooled_priors(run.priors, run.weights)
        self.capacity = CapacityModel(cluster)
        self.allocator = Allocator(self.capacity, self.hysteresis, self.allow_colocated)
        self.forecaster = Forecaster(self.horizon_s, self.bins, run.priors, self.min_obs, run.mode,
                                     default_tpot_s=self.capacity.decode_step(Role.DECODE, 32, 32 * 4096))
        split = COLOCATED if self.initial == "colocated" else self.prior_split()
        self.decisions.append((0.0, split))
        return self._roles_for(split, cluster.num_engines)

    def observe(self, event: LifecycleEvent) -> None:
        self.tracker.observe(event)
        self.prefix.observe(event)
        if event.kind == EventKind.TURN_READY:
            self.forecaster.observe_arrival(event.t, event.tokens)

    def plan(self, view: ClusterView) -> dict[int, Role] | None:
        fc = self.forecaster.forecast(view.now, self.tracker) if self.use_forecast else None
        current = current_split(view)
        if not self.switching or current is None or view.now - self._last_switch < self.min_dwell_s:
            return None
        if fc is None:
            fc = self.present_state(view)
        live = list(self.tracker.live.values())
        if len(live) < self.min_in_flight_per_engine * len(view.engines):
            return None  # the tail: a switch would delay the last trajectories for little gain
        load = Load.from_forecast(
            fc, backlog=float(sum(e.waiting_prefill_tokens for e in view.engines)),
            decoding=sum(1 for s in live if s.phase != Phase.TOOL),
            context=float(np.mean([s.context for s in live])),
            output=self._recent_mean([o for s in live for o in s.outputs], self.pooled.output_tokens.median),
            turn_prefill=self._recent_mean([tok for _, tok in self.forecaster.arrivals[-1000:]],
                                           self.pooled.tool_output_tokens.median),
            in_flight=len(live))
        d = self.allocator.decide(current, load)
        if not d.switch:
            return None
        self._last_switch = view.now
        self.decisions.append((view.now, d.num_prefill))
        return target_roles(view, d.num_prefill)

    def route(self, request: TurnRequest, view: ClusterView) -> Route | None:
        return route_by_role(request, view, self.prefix)

    def forecast_frame(self):
        """Forecast vs actual per bin (forecast.parquet), when forecasting is on."""
        return self.forecaster.frame() if self.use_forecast else None

    def metrics(self) -> dict:
        out = {"prorsa_decisions": [[round(t, 3), k] for t, k in self.decisions]}
        if self.use_forecast:
            out.update(self.forecaster.errors())
        return out

    # --- helpers --------------------------------------------------------------------------------
    def prior_split(self) -> int:
        """The allocator's split for the load the pooled priors predict at the start of a rollout: every
        trajectory's first prompt at once, then one turn per cycle (a tool call, lognormal mean, and
        a decode at the default time per token), each appending the tool's output."""
        p, n = self.pooled, self.run.max_in_flight
        out, tool, prompt = p.output_tokens.median, p.tool_output_tokens.median, p.prompt_tokens.median
        latency = p.tool_latency_s
        decode_s = out * self.forecaster.default_tpot_s
        cycle = latency.median * np.exp(latency.sigma ** 2 / 2) + decode_s
        turns = min(p.turns.median, 1 + self.horizon_s / cycle)
        context = prompt + p.turns.median / 2 * (out + tool)
        load = Load(horizon_s=self.horizon_s,
                    prefill_rate=n * (prompt + (turns - 1) * tool) / self.horizon_s,
                    turn_prefill=(prompt + (turns - 1) * tool) / turns, output=out, turns=n * turns,
                    decoding=n * min(1.0, decode_s / cycle), kv_per_seq=context, context=context, in_flight=0)
        return self.allocator.decide(COLOCATED, load).num_prefill

    def present_state(self, view: ClusterView) -> Forecast:
        """The forecast-free view: current decodes held flat; arrivals at the recent rate."""
        live = self.tracker.live.values()
        decoding = [s for s in live if s.phase == Phase.DECODING]
        kv = float(sum(s.context for s in decoding))
        recent = [tok for t, tok in self.forecaster.arrivals if t > view.now - self.horizon_s]
        w = self.horizon_s / self.bins
        rate = sum(recent) / self.horizon_s
        ones = np.ones(self.bins)
        outs = [o for s in live for o in s.outputs]
        left = float(np.mean(outs)) if outs else self.pooled.output_tokens.median
        dtok = np.zeros(self.bins)
        dtok[0] = left * sum(1 for s in live if s.phase != Phase.TOOL)
        return Forecast(view.now, w, ones * rate * w, ones * len(decoding), ones * kv, dtok)

    @staticmethod
    def _recent_mean(values: list, prior: float) -> float:
        return float(np.mean(values[-1000:])) if values else prior

    @staticmethod
    def _roles_for(split: int, n: int) -> list[Role]:
        if split == COLOCATED:
            return [Role.COLOCATED] * n
        return [Role.PREFILL] * split + [Role.DECODE] * (n - split)


def pooled_priors(priors: dict[str, FamilyPriors], weights: dict[str, float]) -> FamilyPriors:
    """One family's worth of priors for the whole workload: per quantity, the mixture of the families'
    priors by their step-0 shares (lognormal_mixture); with no shares given, families weigh equally."""
    share = {f: weights.get(f, 0.0) for f in priors} if weights else {f: 1.0 for f in priors}
    return FamilyPriors(**{q.name: lognormal_mixture((share[f], getattr(p, q.name)) for f, p in priors.items())
                           for q in fields(FamilyPriors)})
