"""Prorsa's forecast: what was observed (tracker.py) turned into sampled futures for the what-if (whatif.py).

Per family, the distributions of turns, output tokens, tool latency, tool output and first prompt are
learned online, right-censored by the product-limit estimate, with the workload's priors until
`min_observations` have ended (`future_sampler`); a trajectory's turns share an output level
(`output_shared`); new trajectories come in GRPO groups that share a prompt, a level and part of their
turn count (`FutureSampler.group`); on a trace, futures follow the recorded trajectories (`Recorded`).
Why one module: the planner and the what-if need only the sampled futures (`FutureModel`), so a
forecast is changed here, or another one plugged in at one point (policy.py `Prorsa.future_model`).

Why the product-limit estimate: what has finished early in a phase is biased short. The first
trajectories to end are the ones with few turns, the first outputs to finish are the short ones;
sampling futures from them alone predicts that the live work ends too soon (at a phase start, every
live trajectory would be "about to end"). The product-limit (Kaplan-Meier) estimator counts each live
trajectory as known to last at least as long as it has so far, which removes that bias; the mass it
cannot place (beyond the last observed end) comes from the workload's prior conditioned above it.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from harness.api import ExampleTrajectory, LogNormalPrior, Route, RunInfo
from harness.prorsa.mode_rules import rules_for
from harness.prorsa.tracker import LifecycleTracker, Phase, TrajectoryState
from harness.routing import PrefixTracker
from harness.stats import intraclass_correlation


@dataclass
class FutureTurn:
    prompt_tokens: int          # the whole context of the turn's prompt
    cached_tokens: int          # of which the KV is already where the trajectory lives
    output_tokens: int
    tool_latency_s: float       # the tool call after the turn (0: the last turn)


@dataclass
class FutureTrajectory:
    trajectory_id: int
    family: str
    ready_s: float              # when its next turn's prompt is ready, from now
    turns: list[FutureTurn]
    decode_engine: int | None = None    # where its KV lives (the last decode), if anywhere
    prefill_engine: int | None = None
    in_progress: bool = False           # its first turn is the one already under way (not an arrival)
    route: Route | None = None          # the engines the router sent that turn to (queued or running)
    prefilled: bool = False             # that turn's prefill is done (it decodes, or its KV is in transit)
    first_turn: int = 0                 # the trajectory's turn index of turns[0]
    context: int = 0                    # prompt tokens of its present turn (0: not started)

    def chain_s(self, decode_floor: float) -> float:
        """The soonest it can end under any allocation: its next turn's prompt is ready, then every
        tool call and, per turn, every decode step after the first token (which the prefill gives) at
        `decode_floor` at least; queueing, prefill and transfers only add to it."""
        return self.ready_s + sum(t.tool_latency_s + max(t.output_tokens - 1, 0) * decode_floor for t in self.turns)

    @classmethod
    def of_live(cls, s: TrajectoryState, ready_s: float, turns: list[FutureTurn], prefix: PrefixTracker,
                routes: dict[int, Route]) -> FutureTrajectory:
        """A live trajectory's future from its observed state: where its KV lives and, for a turn under
        way, where the router sent it and whether its prefill is done."""
        tid = s.trajectory_id
        return cls(tid, s.family, ready_s, turns, prefix.decode_engine.get(tid), prefix.prefill_engine.get(tid),
                   in_progress=s.phase != Phase.TOOL, route=routes.get(tid) if s.phase in ROUTED else None,
                   prefilled=s.phase in PREFILLED, first_turn=s.turn + (s.phase == Phase.TOOL), context=s.context)


class FutureModel(Protocol):
    """What Prorsa asks of a forecast: futures of the live trajectories and of those still to start, as
    the what-if runs them (FutureSampler is the default model)."""

    # per family, sorted samples of turns, output tokens and tool latency: the work a trajectory has
    # left, for `priority: remaining_work` and `placement: forecast_work` (policy.py `_forecast_work_left`)
    turns: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    tool_latency: dict[str, np.ndarray]

    def live(self, now: float, tracker: LifecycleTracker, prefix: PrefixTracker, tpot: float,
             rng: np.random.Generator, routes: dict[int, Route] | None = None,
             keep: Callable[[TrajectoryState], bool] | None = None) -> list[FutureTrajectory]:
        """The futures of the live trajectories that `keep` accepts, from their observed state."""

    def new(self, families: list[str], weights: list[float], count: int, first_id: int,
            rng: np.random.Generator, group_size: int = 1) -> list[FutureTrajectory]:
        """`count` trajectories to start (ids from `first_id`) in the family mix `weights`, groups of `group_size`."""

    def each_family_alone(self, families: list[str], count: int, first_id: int,
                          rng: np.random.Generator) -> list[list[FutureTrajectory]]:
        """`new` with the mix turned to one family, for each family in turn."""


def sample_excess(values: np.ndarray, above: float, rng: np.random.Generator) -> float:
    """A draw of X given X > above, from a sorted sample (just above it when no sample exceeds it)."""
    i = int(np.searchsorted(values, above, side="right"))
    if i >= len(values):
        return float(above) + 1.0
    return float(values[rng.integers(i, len(values))])


def draw(values: np.ndarray, rng: np.random.Generator) -> float:
    return float(values[rng.integers(len(values))])


# A turn the router has sent stays on the engines it was sent to, queued or running, as on the engines
# (an engine keeps its queue through a kv_both switch; a drain hands the queued legs back, and the
# what-if routes them again; docs/decisions/2026-12-07-prorsa-rules.md, R18).
ROUTED = (Phase.QUEUED, Phase.PREFILLING, Phase.TRANSFERRING, Phase.DECODING)
PREFILLED = (Phase.TRANSFERRING, Phase.DECODING)
MAX_SHARED = 0.95   # keeps some turn-to-turn spread when the data say a trajectory's turns are alike


class Recorded:
    """One family's recorded trajectories, indexed to find those that reached a live trajectory's point."""

    def __init__(self, flat: list[ExampleTrajectory]):
        self.flat = flat
        self.turns = np.array([len(ex.outputs) for ex in flat])
        width = int(self.turns.max())
        self.outputs = np.zeros((len(flat), width))
        for i, ex in enumerate(flat):
            self.outputs[i, :len(ex.outputs)] = ex.outputs
        # running mean of log answer lengths over each trajectory's first j + 1 turns
        logs = np.log(np.maximum(self.outputs, 1.0))
        self.mean_logs = np.cumsum(logs, axis=1) / np.arange(1, width + 1)

    @classmethod
    def of(cls, groups: tuple[tuple[ExampleTrajectory, ...], ...]) -> Recorded:
        return cls([ex for g in groups for ex in g])

    def pick(self, min_turns: int, under_way: tuple[int, int] | None, observed: list[int],
             rng: np.random.Generator) -> ExampleTrajectory | None:
        """A recorded trajectory with at least `min_turns` turns (and, `under_way` = (turn, generated),
        an answer at that turn longer than `generated`), drawn by `weights`; None if there is none."""
        ok = self.turns >= min_turns
        if under_way is not None:
            turn, generated = under_way
            if turn < self.outputs.shape[1]:
                ok &= self.outputs[:, turn] > generated
        index = np.flatnonzero(ok)
        if not len(index):
            return None
        w = self.weights(index, observed)
        return self.flat[int(index[rng.choice(len(index), p=w)] if w is not None else index[rng.integers(len(index))])]

    def weights(self, index: np.ndarray, observed: list[int]) -> np.ndarray | None:
        """Kernel weights on the mean log answer length so far (a Gaussian kernel, bandwidth by
        Silverman's rule of thumb, Silverman 1986, eq. 3.31): a trajectory that wrote long answers goes
        on as the recorded ones that did. None (uniform) before any answer is seen."""
        n = len(observed)
        if not n or len(index) < 2:
            return None
        values = self.mean_logs[index, n - 1]
        spread = min(values.std(), (np.quantile(values, 0.75) - np.quantile(values, 0.25)) / 1.34)
        if spread <= 0:
            return None
        h = 0.9 * spread * len(values) ** -0.2
        d = (values - float(np.mean(np.log(np.maximum(observed, 1))))) / h
        w = np.exp(-0.5 * d * d)
        total = w.sum()
        return w / total if total > 0 else None


@dataclass
class FutureSampler:
    """Samples trajectories' futures from per-family distributions (sorted samples): the default FutureModel.

    A trajectory's output lengths share its own level (`output_shared`, the intraclass correlation of
    log output tokens): a trajectory that wrote long answers so far keeps writing long ones, and a new
    one draws its level once for all its turns. Why: in sync RL the step ends with its slowest
    trajectory, which is the one with many turns *and* long answers; drawing each turn afresh averages
    its answers out and predicted a decode-bound split 14% too fast (heavy_prefill, 6P2D: 34.1 s
    predicted, 39.8 s measured), ranking it above the split that wins."""

    outputs: dict[str, np.ndarray]
    tool_latency: dict[str, np.ndarray]
    tool_outputs: dict[str, np.ndarray]
    turns: dict[str, np.ndarray]
    first_prompts: dict[str, np.ndarray]
    max_context: dict[str, int]         # per family: no turn's prompt + output grows past it
    output_shared: dict[str, float] = field(default_factory=dict)
    turns_output_corr: dict[str, float] = field(default_factory=dict)   # per family: log turns ~ level
    turns_group_corr: dict[str, float] = field(default_factory=dict)    # per family: within a prompt's group
    examples: dict[str, tuple[tuple[ExampleTrajectory, ...], ...]] = field(default_factory=dict)   # recorded

    def __post_init__(self):
        self._recorded = {f: Recorded.of(groups) for f, groups in self.examples.items() if groups}
        # per family with a shared level: (share, mean and variance of log output tokens, correlation of
        # the level with the log turn count, mean and deviation of the log turn count)
        self._levels: dict[str, tuple[float, float, float, float, float, float]] = {}
        for f, rho in self.output_shared.items():
            if rho > 0:
                logs = np.log(np.maximum(np.asarray(self.outputs[f], dtype=float), 1.0))
                turn_logs = np.log(np.maximum(np.asarray(self.turns[f], dtype=float), 1.0))
                self._levels[f] = (min(rho, MAX_SHARED), float(logs.mean()), float(logs.var()),
                                   self.turns_output_corr.get(f, 0.0), float(turn_logs.mean()), float(turn_logs.std()))

    def output_level(self, family: str, observed: list[int], rng, turns: int | None = None) -> float:
        """A trajectory's own log-offset of output length, drawn once per trajectory: its random effect
        given the `observed` outputs of its finished turns (normal-normal posterior, shrunk toward the
        family as the one-way random-effects model gives) and, where the workload links them, given its
        total `turns` (a trajectory with many turns is a hard task with long answers). 0 when turns are
        independent."""
        if family not in self._levels:
            return 0.0
        return self._level(family, observed, float(rng.standard_normal()), turns)

    def _level(self, family: str, observed: list[int], z: float, turns: int | None) -> float:
        rho, mu, var, corr, turns_mu, turns_sd = self._levels[family]
        shared, own = rho * var, (1 - rho) * var
        prior_mean, prior_var = 0.0, shared
        if corr and turns is not None and turns_sd > 0:
            prior_mean = corr * math.sqrt(shared) * (math.log(max(turns, 1)) - turns_mu) / turns_sd
            prior_var = shared * (1 - corr * corr)
        n = len(observed)
        mean = prior_mean * own / (n * prior_var + own) if prior_mean else 0.0
        if n:
            mean += n * prior_var / (n * prior_var + own) * (float(np.mean(np.log(np.maximum(observed, 1)))) - mu)
        return mean + math.sqrt(prior_var * own / (n * prior_var + own)) * z

    def output(self, family: str, level: float, rng, above: float = 0.0) -> float:
        """One turn's output tokens at the trajectory's `level` (more than `above`, if given): a draw from
        the family's distribution, its deviation from the family's log mean kept at the turn's own
        share of the spread and shifted by the level. The family's distribution when `level` is 0 and
        turns are independent."""
        values = self.outputs[family]
        if family not in self._levels:
            return sample_excess(values, above, rng) if above else draw(values, rng)
        rho, mu = self._levels[family][:2]
        if above:   # the same event in the family's scale: level-adjusted x > above
            x = sample_excess(values, math.exp(mu + (math.log(max(above, 1.0)) - mu - level) / math.sqrt(1 - rho)), rng)
        else:
            x = draw(values, rng)
        return self._at_level(family, x, level)

    def _at_level(self, family: str, x: float, level: float) -> float:
        """A draw `x` of the family's distribution moved to a trajectory's `level`."""
        if family not in self._levels:
            return x
        rho, mu = self._levels[family][:2]
        return min(math.exp(mu + level + math.sqrt(1 - rho) * (math.log(max(x, 1.0)) - mu)), float(self.outputs[family][-1]))

    def later_turns(self, family: str, context: int, count: int, rng, level: float = 0.0) -> list[FutureTurn]:
        """`count` turns after a tool call ends a turn whose context (prompt + output) is `context`."""
        out = []
        for _ in range(count):
            new = max(int(draw(self.tool_outputs[family], rng)), 1)
            cap = self.max_context[family]
            if context + new + 1 >= cap:
                break   # the tool output does not fit: the agent framework ends the trajectory
            tokens = min(max(int(self.output(family, level, rng)), 1), cap - context - new)
            out.append(FutureTurn(context + new, context, tokens, draw(self.tool_latency[family], rng)))
            context += new + tokens
        if out:
            out[-1].tool_latency_s = 0.0   # the last turn makes no tool call
        return out

    def turns_left(self, family: str, turn: int, rng) -> int:
        """Turns after the current one (0-based `turn`), given the trajectory has reached it."""
        return max(int(round(sample_excess(self.turns[family], turn + 0.5, rng))) - turn - 1, 0)

    def live(self, now: float, tracker: LifecycleTracker, prefix: PrefixTracker, tpot: float,
             rng: np.random.Generator, routes: dict[int, Route] | None = None,
             keep: Callable[[TrajectoryState], bool] | None = None) -> list[FutureTrajectory]:
        """The futures of the live trajectories (those `keep` accepts: a plan's slice of a big cluster),
        from their observed state (`routes`: where each turn under way was sent)."""
        routes = routes or {}
        futures = []
        for s in tracker.live.values():
            if keep is not None and not keep(s):
                continue
            f = s.family
            if f in self._recorded:
                tool = s.phase == Phase.TOOL
                generated = 0 if tool else round(tracker.generated(s, now, tpot))
                ex = self._recorded[f].pick(s.turn + 1 + tool, None if tool else (s.turn, generated), s.outputs, rng)
                if ex is not None:   # else no recorded trajectory reached its point: the distributions say
                    ft = self._recorded_rest(s, ex, generated, now, rng, prefix, routes)
                    if ft is not None:
                        futures.append(ft)
                    continue
            more = self.turns_left(f, s.turn, rng)
            n_turns = s.turn + 1 + (max(more, 1) if s.phase == Phase.TOOL else more)
            level = self.output_level(f, s.outputs, rng, n_turns)
            if s.phase == Phase.TOOL:
                # a tool call follows every turn but the last: one more turn at least
                elapsed = now - s.phase_since
                ready = sample_excess(self.tool_latency[f], elapsed, rng) - elapsed
                turns = self.later_turns(f, s.context + s.outputs[-1], max(more, 1), rng, level)
                if not turns:
                    continue
            else:
                generated = round(tracker.generated(s, now, tpot))
                total = self.output(f, level, rng, above=generated)
                prompt = s.context + int(generated)
                left = min(max(int(round(total - generated)), 1), max(self.max_context[f] - prompt, 1))
                cached = prompt - (s.appended if s.phase == Phase.QUEUED else 1)
                later = self.later_turns(f, prompt + left, more, rng, level)
                first = FutureTurn(prompt, max(cached, 0), left, draw(self.tool_latency[f], rng) if later else 0.0)
                turns, ready = [first] + later, 0.0
            futures.append(FutureTrajectory.of_live(s, ready, turns, prefix, routes))
        return futures

    def new(self, families: list[str], weights: list[float], count: int, first_id: int,
            rng: np.random.Generator, group_size: int = 1) -> list[FutureTrajectory]:
        """`count` trajectories not started yet, by the workload's family mix; with `group_size` > 1, in
        groups of that many samples of one prompt (`group`)."""
        p = np.asarray(weights, dtype=float) / sum(weights)
        out = []
        if group_size > 1:
            while len(out) < count:
                f = families[int(rng.choice(len(families), p=p))]
                out += self.group(f, min(group_size, count - len(out)), first_id + len(out), rng)
            return out
        for i in range(count):
            f = families[int(rng.choice(len(families), p=p))]
            if f in self._recorded:
                out += self.group(f, 1, first_id + i, rng)
                continue
            cap = self.max_context[f]
            # drawn in this order (the level's normal, prompt, first output, turns) so that plans on
            # workloads without the turn-output link keep their random stream
            z = float(rng.standard_normal()) if f in self._levels else 0.0
            prompt = min(max(int(draw(self.first_prompts[f], rng)), 1), cap - 1)
            x = draw(self.outputs[f], rng)
            more = self.turns_left(f, 0, rng)
            level = self._level(f, [], z, 1 + more) if f in self._levels else 0.0
            out.append(self._starting(f, first_id + i, prompt, x, more, level, rng))
        return out

    def _starting(self, family: str, trajectory_id: int, prompt: int, x: float, more: int, level: float,
                  rng: np.random.Generator) -> FutureTrajectory:
        """A trajectory not started yet: its first turn (output draw `x` moved to its `level`) and `more`
        turns after it."""
        tokens = min(max(int(self._at_level(family, x, level)), 1), self.max_context[family] - prompt)
        later = self.later_turns(family, prompt + tokens, more, rng, level)
        first = FutureTurn(prompt, 0, tokens, draw(self.tool_latency[family], rng) if later else 0.0)
        return FutureTrajectory(trajectory_id, family, 0.0, [first] + later)

    def group(self, family: str, size: int, first_id: int, rng: np.random.Generator) -> list[FutureTrajectory]:
        """The samples of one prompt (a GRPO group): they share the prompt, the output level (the part of
        the output spread a trajectory's turns share is, in the workloads here, the prompt's) and part
        of their turn count (`turns_group_corr`, through a Gaussian copula on the turn distribution),
        and the level goes with the group's turn score (`turns_output_corr` is the per-trajectory
        correlation, sqrt(turns_group_corr) x the group's). Why: a hard prompt puts all its samples
        into the step's tail at once. The group's turn score carries a correlation with the level of
        at most sqrt(turns_group_corr); what it cannot carry goes through each sample's own turn score
        (the level is then partly the sample's; docs/decisions/2026-12-07-prorsa-rules.md, R19)."""
        if family in self._recorded:
            members = self.examples[family][int(rng.integers(len(self.examples[family])))]
            picks = rng.choice(len(members), size, replace=size > len(members))
            return [self._recorded_start(family, members[int(i)], first_id + j) for j, i in enumerate(picks)]
        cap = self.max_context[family]
        prompt = min(max(int(draw(self.first_prompts[family], rng)), 1), cap - 1)
        r = min(max(self.turns_group_corr.get(family, 0.0), 0.0), 1.0)
        z_group = float(rng.standard_normal())
        scale, c, own, shared_level = 0.0, 0.0, 0.0, 0.0
        if family in self._levels:
            rho, _, var, corr = self._levels[family][:4]
            scale = math.sqrt(rho * var)
            c = min(max(corr / math.sqrt(r), -1.0), 1.0) if r > 0 else 0.0
            own = min(max((corr - c * math.sqrt(r)) / math.sqrt(1 - r), -1.0), 1.0) if r < 1 else 0.0
            own = math.copysign(min(abs(own), math.sqrt(1 - c * c)), own)
            shared_level = c * z_group + math.sqrt(max(1 - c * c - own * own, 0.0)) * float(rng.standard_normal())
        turns = self.turns[family]
        out = []
        for i in range(size):
            e = float(rng.standard_normal())
            z = math.sqrt(r) * z_group + math.sqrt(1 - r) * e
            u = 0.5 * (1 + math.erf(z / math.sqrt(2)))
            more = max(int(round(float(turns[min(int(u * len(turns)), len(turns) - 1)]))) - 1, 0)
            level = scale * (shared_level + own * e)
            out.append(self._starting(family, first_id + i, prompt, draw(self.outputs[family], rng), more, level, rng))
        return out

    def _recorded_start(self, family: str, ex: ExampleTrajectory, trajectory_id: int) -> FutureTrajectory:
        """A trajectory not started yet, as a recorded one ran."""
        cap = self.max_context[family]
        prompt = min(max(ex.prompt_tokens, 1), cap - 1)
        tokens = min(ex.outputs[0], cap - prompt)
        later = self._recorded_turns(family, ex, 1, prompt + tokens)
        first = FutureTurn(prompt, 0, tokens, ex.tool_latencies[0] if later else 0.0)
        return FutureTrajectory(trajectory_id, family, 0.0, [first] + later)

    def _recorded_turns(self, family: str, ex: ExampleTrajectory, k: int, context: int) -> list[FutureTurn]:
        """A recorded trajectory's turns from turn `k` on, after a turn whose context (prompt + output)
        is `context` (as later_turns: a tool output that does not fit ends the trajectory)."""
        cap, out = self.max_context[family], []
        for j in range(k, len(ex.outputs)):
            new = max(ex.tool_outputs[j - 1], 1)
            if context + new + 1 >= cap:
                break
            tokens = min(ex.outputs[j], cap - context - new)
            out.append(FutureTurn(context + new, context, tokens, ex.tool_latencies[j] if j < len(ex.tool_latencies) else 0.0))
            context += new + tokens
        if out:
            out[-1].tool_latency_s = 0.0   # the last turn makes no tool call
        return out

    def _recorded_rest(self, s: TrajectoryState, ex: ExampleTrajectory, generated: int, now: float,
                       rng: np.random.Generator, prefix: PrefixTracker, routes: dict[int, Route]) -> FutureTrajectory | None:
        """A live trajectory's rest as the recorded `ex` went on from the same point (Recorded.pick), its
        turn under way `generated` tokens in; None when nothing is left to run."""
        f, k, tool = s.family, s.turn, s.phase == Phase.TOOL
        if tool:
            elapsed = now - s.phase_since
            ready = sample_excess(self.tool_latency[f], elapsed, rng) - elapsed
            turns = self._recorded_turns(f, ex, k + 1, s.context + s.outputs[-1])
            if not turns:
                return None
        else:
            prompt = s.context + int(generated)
            left = min(max(ex.outputs[k] - int(generated), 1), max(self.max_context[f] - prompt, 1))
            cached = prompt - (s.appended if s.phase == Phase.QUEUED else 1)
            later = self._recorded_turns(f, ex, k + 1, prompt + left)
            turns = [FutureTurn(prompt, max(cached, 0), left, ex.tool_latencies[k] if later else 0.0)] + later
            ready = 0.0
        return FutureTrajectory.of_live(s, ready, turns, prefix, routes)

    def each_family_alone(self, families: list[str], count: int, first_id: int,
                          rng: np.random.Generator) -> list[list[FutureTrajectory]]:
        """`new` with the mix turned to one family, for each family in turn (the hedges of a plan)."""
        return [self.new(families, [float(f == g) for g in families], count, first_id, rng) for f in families]


POINTS = 1000   # quantile points that represent an estimated distribution (sorted)


def product_limit(events: np.ndarray, censored: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """Sorted quantile points of the product-limit estimate from observed values (`events`) and values
    known to be at least `censored`; the survival left after the largest event is spread over the
    sorted `prior` points above it (or put at the largest value seen, if the prior has none)."""
    events = np.sort(np.asarray(events, dtype=float))
    censored = np.asarray(censored, dtype=float)
    if not len(censored) or not len(events):
        return events if len(events) else np.sort(np.asarray(prior, dtype=float))
    values, ends = np.unique(events, return_counts=True)
    everything = np.sort(np.concatenate([events, censored]))
    at_risk = len(everything) - np.searchsorted(everything, values, side="left")
    survival = np.cumprod(1.0 - ends / at_risk)
    mass = -np.diff(np.concatenate([[1.0], survival]))
    tail = survival[-1]
    if tail > 0:
        above = prior[prior > values[-1]]
        if not len(above):
            above = np.array([max(values[-1], censored.max())])
        values = np.concatenate([values, above])
        mass = np.concatenate([mass, np.full(len(above), tail / len(above))])
    cdf = np.cumsum(mass)
    q = (np.arange(POINTS) + 0.5) / POINTS * cdf[-1]
    return values[np.minimum(np.searchsorted(cdf, q), len(values) - 1)]


PRIOR_POINTS = 199


def prior_samples(prior: LogNormalPrior) -> np.ndarray:
    """A prior (mixture parts and cap included) as sorted quantile points."""
    return np.asarray(prior.quantiles(PRIOR_POINTS))


def future_sampler(tracker: LifecycleTracker, run: RunInfo, min_observations: int, now: float,
                   tpot: float, whole_run: bool = False) -> FutureSampler:
    """Per family: once `min_observations` values have ended, and no fewer than are still running, the
    product-limit estimate from them and from what the live trajectories have reached so far
    (`product_limit`); the prior until then (turns cut at the family's turn cap); and how much a
    trajectory's turns share their output length, where a plan scores the last end of a whole sync step
    or (`whole_run`) of an async run (output_shared). While most values are still running, the ended ones
    are the short ones and the running ones say only "longer than this", so the estimate's upper half
    rests on little: on mix_reason_browse (dense8_h100, async) at 50 s, 41 ended and 127 decoding
    reasoning turns gave a mean output of 1,260 tokens against 1,861 true (prior 2,264), and the
    what-if ranked 6P2D first (measured: 1.32x colocation's mean end); with the prior it ranked
    colocation first, each allocation within 5% of its forked run."""
    censored = tracker.censored(now, tpot)

    def pick(observed: dict, key: str) -> dict[str, np.ndarray]:
        out = {}
        for family, priors in run.priors.items():
            prior = prior_samples(getattr(priors, key))
            seen = observed.get(family, ())
            running = censored.get(key, {}).get(family, [])
            if len(seen) < max(min_observations, len(running)):
                out[family] = prior
            else:
                out[family] = product_limit(np.asarray(seen, dtype=float), np.asarray(running, dtype=float), prior)
        return out
    turns = pick(tracker.finished_turns, "turns")
    shared = output_shared(tracker, run, min_observations) if rules_for(run).shares_output(whole_run) else {}
    return FutureSampler(outputs=pick(tracker.outputs, "output_tokens"),
                         tool_latency=pick(tracker.tool_latencies, "tool_latency_s"),
                         tool_outputs=pick(tracker.tool_outputs, "tool_output_tokens"),
                         turns={f: np.minimum(v, run.priors[f].max_turns) for f, v in turns.items()},
                         first_prompts=pick(tracker.first_prompts, "prompt_tokens"),
                         max_context={f: p.context_cap for f, p in run.priors.items()},
                         output_shared=shared,
                         turns_output_corr={f: run.priors[f].turns_output_corr for f in shared},
                         turns_group_corr={f: p.turns_group_corr for f, p in run.priors.items()},
                         examples={f: p.examples for f, p in run.priors.items() if p.examples})


def output_shared(tracker: LifecycleTracker, run: RunInfo, min_observations: int) -> dict[str, float]:
    """Per family, how much of the spread of output lengths is the trajectory's own: estimated from the
    trajectories with two finished turns or more once `min_observations` of them are seen (live ones
    included), the workload's prior until then.

    For plans scored by the last end of a whole step or run: that end is the tail of per-trajectory
    totals, which this shapes first-order. A mean end it leaves unbiased while making each plan's
    sample noisier, so the async plans made during a run draw every turn afresh
    (docs/decisions/2026-12-07-prorsa-rules.md, R13)."""
    groups = tracker.output_groups()
    out = {}
    for family, priors in run.priors.items():
        seen = [np.log(np.maximum(g, 1)) for g in groups.get(family, ()) if len(g) >= 2]
        estimate = intraclass_correlation(seen) if len(seen) >= min_observations else None
        out[family] = priors.output_shared if estimate is None else estimate
    return out
