"""What-if simulation: Prorsa's performance model is the simulator itself, run from the observed present.

Why: a closed-form model of turn latency misses what decides the best allocation in agentic rollouts:
the DP-attention stall (one rank's prefill stretches every rank's step), prefill-decode interference
under each engine's step semantics (vLLM mixed steps, SGLang prefill-first), KV limits, prefix-cache
locality, what a role switch really costs (drain, switch time, lost prefix cache) and, in sync RL, the
critical path of the slowest trajectory. The calibrated simulator models all of them, so the allocator
asks it: "from what we observe now, with these sampled futures, when does the work end under
allocation X?"

Only observations go in (nothing of the workload's scripts):
  - every live trajectory's phase, turn, context and where its KV lives (lifecycle events);
  - its future, sampled from the forecaster's per-family distributions (learned online, priors until
    then): turns left given the turns so far, the rest of the current output given what was generated,
    the rest of a tool call given its elapsed time, and every later turn's output, tool latency and
    tool output; on a trace, as one of its recorded trajectories that reached the same point went on
    (the trace's priors: shapes, never which trajectory runs when);
  - in async mode, new trajectories from the workload's family mix, started as slots free up.
Common random numbers: every candidate allocation is run on the same sampled futures.
The run under the current allocation is also the whole-horizon forecast: prefill tokens that become
ready and sequences decoding, per bin.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from itertools import accumulate

import numpy as np

from harness.api import EventKind, ExampleTrajectory, LifecycleEvent, Role, Route, TurnRequest
from harness.cluster import ClusterConfig, cost_model
from harness.prorsa.tracker import LifecycleTracker, Phase, TrajectoryState
from harness.prorsa.placement import DecodeWork, route_placing
from harness.routing import Balance, PrefixTracker
from harness.sim.backend import SimBackend


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


@dataclass
class Outcome:
    """What the simulator predicts for one allocation."""

    completion_s: float                 # when the last of the trajectories ends, from now
    mean_end_s: float                   # the trajectories' mean end, from now (a throughput measure)
    mean_turn_latency_s: float
    ends: list[float]                   # each trajectory's end, from now
    prefill_tokens: np.ndarray          # per bin: tokens of prompts that become ready
    decode_seqs: np.ndarray             # per bin: sequences decoding at the bin's middle


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
    """Samples trajectories' futures from per-family distributions (sorted samples).

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


@dataclass
class StalenessGate:
    """The driver's staleness rule (harness/rollout.py `_fill_async`) in a what-if: the run's next
    trajectory starts only while its batch is at most `staleness` batches ahead of the batches completed.
    Without it the what-if starts trajectories the run holds back, and over-forecasts the load wherever
    the rule binds (runs of many batches)."""
    per_step: int                       # trajectories per batch
    staleness: int
    started: int                        # trajectories the run has started (the what-if's starts added)
    completed: int                      # ... completed before the what-if (its own ends are added)

    def may_start(self, ended: int) -> bool:
        return self.started // self.per_step <= (self.completed + ended) // self.per_step + self.staleness


def mean_end_deadline(budget: float, floor_sum: float, running: int, waiting: int) -> float:
    """The instant x after which max(floor_sum, running * x) + waiting * x exceeds `budget`: past it the
    `running` unfinished trajectories (each ending at max(x, its floor), whose sum is at least both)
    and the `waiting` ones (each at x + its chain, the chains' sum taken out of `budget`) end too late
    for the bound. Weaker than the exact sum of the maxima, which needs the floors sorted at every end
    and start; this is O(1). -inf: already past."""
    if running and floor_sum + waiting * floor_sum / running > budget:   # passed while the floors still hold
        return (budget - floor_sum) / waiting if waiting else -math.inf
    return budget / (running + waiting)


@dataclass
class _Run:
    """The bookkeeping of one what-if simulation (a small agent loop over the simulator)."""

    backend: SimBackend
    futures: dict[int, FutureTrajectory]
    waiting_new: list[FutureTrajectory]
    max_in_flight: int
    bin_s: float
    bins: int
    prefix: PrefixTracker = field(default_factory=PrefixTracker)
    balance: Balance = field(default_factory=Balance)   # the router's rule (the cluster's)
    ready_at: dict[int, float] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    parked: list[TurnRequest] = field(default_factory=list)
    decode_spans: list[tuple[float, float]] = field(default_factory=list)
    decode_start: dict[int, float] = field(default_factory=dict)
    in_flight: int = 0
    bound: float = math.inf             # the score to beat (the last end, or the mean end if on_mean_end)
    on_mean_end: bool = False
    deadline: float = math.inf          # past this instant the run cannot score under its bound
    ends_total: float = 0.0
    weight_updates: frozenset = frozenset()   # after how many of its ends the trainer updates the weights
    work: DecodeWork | None = None      # the policy's decode placement (placement.py), if it places by work
    then: Callable[[], list[FutureTrajectory]] | None = None   # sync: the next step's batch (WhatIf.run)
    next_step: set[int] = field(default_factory=set)           # its trajectory ids, once started
    after_switch: bool = False          # sync step start: the batch waits for the switches (WhatIf.run)
    gate: StalenessGate | None = None   # async: new trajectories wait for their batch's turn
    decode_floor: float = 0.0           # no sequence decodes a token faster (WhatIf.decode_floor_s)

    def __post_init__(self):
        self.prefill = np.zeros(self.bins)
        self.scored = len(self.futures)     # the trajectories the score is made of
        # the soonest each scored trajectory can end (FutureTrajectory.chain_s): in flight, when; waiting
        # to start, how long after its start
        self.chain = {tid: ft.chain_s(self.decode_floor) - ft.ready_s for tid, ft in self.futures.items()}
        waiting = {ft.trajectory_id for ft in self.waiting_new}
        self.floors = {tid: ft.ready_s + self.chain[tid] for tid, ft in self.futures.items() if tid not in waiting}
        self.floor_sum = math.fsum(self.floors.values())       # of the unfinished in flight
        self.max_floor = max(self.floors.values(), default=0.0)   # of every one in flight so far (a last end's bound)
        # the waiting ones start from the end of `waiting_new`: the chains' sum and max of its first k
        chains = [self.chain[ft.trajectory_id] for ft in self.waiting_new]
        self.waiting_sum = [0.0, *accumulate(chains)]
        self.waiting_max = [0.0, *accumulate(chains, max)]
        self.backend.set_listener(self.on_event, self.route)

    @property
    def horizon_s(self) -> float:
        return self.bins * self.bin_s

    def start_waiting(self) -> None:
        """Start the new trajectories waiting, as many as the in-flight limit and the staleness let."""
        while self.waiting_new and self.in_flight < self.max_in_flight and (
                self.gate is None or self.gate.may_start(len(self.ends))):
            ft = self.waiting_new.pop()
            floor = self.floors[ft.trajectory_id] = self.backend.now() + self.chain[ft.trajectory_id]
            self.floor_sum += floor
            self.max_floor = max(self.max_floor, floor)
            self.start(ft, 0.0)
            if self.gate is not None:
                self.gate.started += 1

    def start(self, ft: FutureTrajectory, delay: float) -> None:
        self.in_flight += 1
        self.backend.call_later(delay, partial(self.turn_ready, ft, 0))

    def place(self, ft: FutureTrajectory) -> None:
        """The turn under way goes on the engines it runs on, now."""
        self.in_flight += 1
        self.turn_ready(ft, 0, ft.route, decode_only=ft.prefilled and ft.route.disaggregated)

    def turn_ready(self, ft: FutureTrajectory, k: int, route: Route | None = None, decode_only: bool = False) -> None:
        """Turn `k` is ready: routed as new, or on `route`; `decode_only`: a disaggregated turn under way
        whose prefill is done goes straight to its decode engine, as on the engines (before, its prefill
        ran again on the prefill engine: with long contexts that engine's cache could not hold every
        decoding context, and the what-if recomputed them; 16k-token tool outputs with 8,000-token
        answers on 8 DP4 engines at 250 s, rest of the step at 1P7D: 855.8 s predicted on the true
        futures, 699.9 s forked)."""
        t = ft.turns[k]
        now = self.backend.now()
        b = int(now // self.bin_s)
        if b < self.bins and not (k == 0 and ft.in_progress):   # the forecast counts arrivals only
            # the tokens the turn appends to the context (the last turn's output and the tool's), as
            # TURN_READY counts them; turns[0] of a turn under way holds what it has generated so far.
            # (the uncached part alone leaves the last output out: docs/decisions/2026-12-07-prorsa-rules.md, R29)
            before = ft.turns[k - 1].prompt_tokens if k and not (k == 1 and ft.in_progress) else ft.context
            self.prefill[b] += t.prompt_tokens - before
        self.ready_at[ft.trajectory_id] = now
        req = TurnRequest(trajectory_id=ft.trajectory_id, group_id=ft.trajectory_id, turn=k, family=ft.family,
                          prompt_tokens=t.prompt_tokens, appended_tokens=t.prompt_tokens - t.cached_tokens,
                          max_output_tokens=t.output_tokens, output_tokens=t.output_tokens, t_ready=now)
        if route is None:
            self.route(req)
        elif decode_only:
            self.backend.submit_decode(req, route)
        else:
            self.backend.submit(req, route)

    def route(self, req: TurnRequest) -> None:
        r = route_placing(req, self.backend.view(), self.prefix, self.balance, self.work,
                          self.futures[req.trajectory_id].first_turn + req.turn)
        if r is None:
            self.parked.append(req)
        else:
            self.backend.submit(req, r)

    def on_end(self) -> None:
        """Move the deadline, past which the run's score is sure to exceed its bound, after every end and
        start: no trajectory ends before its chain of tool calls and decode steps (`floors`; one waiting
        to start, before now + its chain), so the last end exceeds the bound once a floor does, and the
        mean end once the ends so far plus every unfinished trajectory ending at max(now, its floor)
        would. Without the floors (each ending right now) a candidate that cannot win ran on until most
        of its trajectories had ended (results/reference/plan_cost.md)."""
        left = self.scored - len(self.ends)
        if self.bound == math.inf or not left:
            return
        waiting = len(self.waiting_new)
        if self.on_mean_end:   # the sums lose a hair to rounding: never cut on it
            budget = self.bound * self.scored - self.ends_total - self.waiting_sum[waiting] * (1 - 1e-9)
            self.deadline = mean_end_deadline(budget, self.floor_sum * (1 - 1e-9), len(self.floors), waiting)
        elif self.max_floor > self.bound:   # one in flight (or ended since) ends after it
            self.deadline = -math.inf
        else:
            self.deadline = self.bound - self.waiting_max[waiting]

    def ended(self, trajectory_id: int, t: float) -> None:
        """A scored trajectory ended at `t`."""
        self.ends.append(t)
        self.ends_total += t
        self.floor_sum -= self.floors.pop(trajectory_id)
        if len(self.ends) in self.weight_updates:
            self.backend.update_weights()   # flushes the prefix caches if the cluster does
        self.start_waiting()
        self.on_end()
        if len(self.ends) == self.scored and self.then is not None and t < self.horizon_s:
            self.start_next_step()

    def start_next_step(self) -> None:
        """Sync: the step's last trajectory ended within the forecast's horizon, so the next step starts,
        as the driver starts it (harness/rollout.py: the weight update, then the whole batch at once).
        It runs to the horizon's end for the forecast's bins only."""
        self.backend.update_weights()
        for ft in self.then():
            self.futures[ft.trajectory_id] = ft
            self.next_step.add(ft.trajectory_id)
            self.start(ft, 0.0)
        self.deadline = self.horizon_s

    def on_event(self, e: LifecycleEvent) -> None:
        self.prefix.observe(e)
        if self.work is not None and e.kind == EventKind.DECODE_MIGRATED:
            self.work.move(e.trajectory_id, e.engine_id)
        K = EventKind
        if e.kind == K.DECODE_START:
            self.decode_start[e.trajectory_id] = e.t
        elif e.kind == K.DECODE_END:
            self.decode_spans.append((self.decode_start.pop(e.trajectory_id, e.t), e.t))
            ft = self.futures[e.trajectory_id]
            scored = e.trajectory_id not in self.next_step
            if scored:
                self.latencies.append(e.t - self.ready_at[e.trajectory_id])
            if e.turn + 1 < len(ft.turns):
                self.backend.call_later(ft.turns[e.turn].tool_latency_s, partial(self.turn_ready, ft, e.turn + 1))
            else:
                if self.work is not None:
                    self.work.drop(e.trajectory_id)
                self.in_flight -= 1
                if scored:
                    self.ended(e.trajectory_id, e.t)
        elif e.kind == K.ROLE_SWITCH_END and (self.parked or self.after_switch) and not self.backend.view().switching():
            # as the driver does (harness/rollout.py): parked turns and a sync step's batch wait for the
            # whole transition, or they all pile onto the first engine back and stay there (sticky KV)
            if self.after_switch:
                self.after_switch = False
                self.start_waiting()
                self.on_end()
            parked, self.parked = self.parked, []
            for req in parked:
                self.route(req)


def _on_engines(ft: FutureTrajectory, roles: list[Role], cluster: ClusterConfig) -> bool:
    """The trajectory's turn under way is on engines that still serve it, so the what-if continues it
    there. Under kv_both that is where the router sent it, whatever the engines' roles are now: a
    switch drains nothing, the engines keep their queued and running legs, and a prefilled turn needs
    nothing more of its prefill engine than the KV it may still be pulling. With decode migration a
    turn whose decode engine is now a prefill engine is routed again instead, since its decode would
    be shipped off (the what-if's engines start with `ships_decodes` off, so a kept turn would decode
    there). The rule by roles alone routed every such turn again as new, and the forecast lost the
    decodes left behind (docs/decisions/2026-12-07-prorsa-rules.md, R30). Drain and reshard keep the
    rule by roles: a drain hands
    queued legs back and lets running ones finish, so the rule errs there only on a prefilled turn
    whose prefill engine switched since, and changing it moves every drain and reshard run that
    switches (not done)."""
    r = ft.route
    if r is None or not ft.in_progress:
        return False
    if cluster.switch_mechanism == "kv_both":
        return not (cluster.migrate_decodes_on_switch and roles[r.decode_engine] == Role.PREFILL)
    if r.disaggregated:
        return roles[r.prefill_engine] == Role.PREFILL and roles[r.decode_engine] == Role.DECODE
    return roles[r.prefill_engine] in (Role.COLOCATED, Role.DECODE)


def _switch(backend: SimBackend, roles_now: list[Role], roles: list[Role]) -> None:
    for i, (a, b) in enumerate(zip(roles_now, roles)):
        if a != b:
            backend.switch_role(i, b)


def decode_floor_s(cluster: ClusterConfig) -> float:
    """The shortest decode step any engine of `cluster` takes: one sequence, no context, on the
    fastest of the parallelisms an engine may be launched with (step times grow with batch and context)."""
    floor = np.inf
    for role in (Role.COLOCATED, Role.PREFILL, Role.DECODE):
        model = cost_model(cluster, role)
        seqs = np.zeros(model.par.dp, dtype=int)
        seqs[0] = 1
        floor = min(floor, float(model.decode_step_times(seqs, np.zeros(model.par.dp), 1)[0]))
    return floor


class WhatIf:
    """Runs the simulator forward from the present under a candidate allocation."""

    def __init__(self, cluster: ClusterConfig, bins: int, bin_s: float, staleness: int | None = None):
        """What the policy sets before a plan (at the plan's share of the run: slice.py):
        `update_every` (async): the trainer updates the weights after every `update_every` completed
        trajectories of the `total` the run has (harness/rollout.py), and each update flushes every
        prefix cache when the cluster does so (`flush_prefix_cache_on_weight_update`; docs/decisions/
        2026-12-07-prorsa-rules.md, R20)."""
        self.cluster, self.bins, self.bin_s = cluster, bins, bin_s
        self.weight = 1           # each simulated trajectory stands for this many (slice.py)
        self.update_every = 0     # 0: no weight update within a what-if
        self.total = 0
        self.staleness = staleness   # async: the driver's staleness (None: no such rule)
        self.completed = 0        # trajectories the run has completed
        self.started = 0          # ... and started
        self.placement: DecodeWork | None = None   # the policy's decode placement by forecast work, if any
        self.events = 0           # simulator events of every what-if run so far (a plan's cost)
        self.decode_floor_s = decode_floor_s(cluster)   # no trajectory decodes a token faster (chain_s)

    def _weight_updates(self, count: int) -> frozenset:
        """The what-if's end counts (of `count` trajectories) at which the weights are updated."""
        if not self.update_every:
            return frozenset()
        first = self.update_every - self.completed % self.update_every
        return frozenset(n for n in range(first, count + 1, self.update_every) if self.completed + n < self.total)

    def run(self, futures: list[FutureTrajectory], roles_now: list[Role], roles: list[Role],
            new: list[FutureTrajectory] = (), max_in_flight: int = 0, bound: float = math.inf,
            on_mean_end: bool = False, launched_as: list[Role] | None = None,
            then: Callable[[], list[FutureTrajectory]] | None = None, step_start: bool = False) -> Outcome:
        """The what-if under `roles` (reached from `roles_now`). With a `bound`, the run stops as soon
        as its score (the last end; the mean end if `on_mean_end`) is sure to exceed it, and scores inf:
        a candidate that cannot win is not run to its end (branch and bound; the result is exact).
        `then` (sync, the forecast's run): the next step's batch, drawn and started when the last of the
        trajectories ends, if that is within the horizon; it runs to the horizon's end and counts in the
        forecast's bins, not in the score. Without it the later bins of a plan made near a step's end
        forecast nothing where the next step's first prompts arrive (docs/decisions/
        2026-12-07-prorsa-rules.md, R21).
        `launched_as`: per engine, the role whose parallelism it runs with (EngineState.launched_as):
        under kv_both a switched engine keeps the parallelism it was launched with (a DP4+EP4 decode
        engine turned prefill engine stays DP4; docs/decisions/2026-12-07-prorsa-rules.md, R22).
        `step_start` (sync, between two steps): `new` is the next step's batch, which starts once the
        switches to `roles` are done, as the driver starts it."""
        cluster = self.cluster.weighted(self.weight) if self.weight > 1 else self.cluster
        backend = SimBackend(cluster, list(roles_now), launched_as=launched_as)
        self._warm_caches(backend, futures)
        run = _Run(backend, {f.trajectory_id: f for f in [*futures, *new]}, list(reversed(new)),
                   max(max_in_flight, len(futures)), self.bin_s, self.bins,
                   balance=Balance.of(cluster),   # the router's rule, as the run's policy routes
                   bound=bound, on_mean_end=on_mean_end,
                   weight_updates=self._weight_updates(len(futures) + len(new)),
                   work=self.placement.copy() if self.placement is not None else None, then=then,
                   gate=StalenessGate(self.update_every, self.staleness, self.started, self.completed)
                   if self.staleness is not None and self.update_every else None, decode_floor=self.decode_floor_s)
        for ft in futures:   # where each trajectory's KV lives, as the real router knows it
            if ft.decode_engine is not None:
                run.prefix.decode_engine[ft.trajectory_id] = ft.decode_engine
            if ft.prefill_engine is not None:
                run.prefix.prefill_engine[ft.trajectory_id] = ft.prefill_engine
        # Turns under way go back on their engines first, so an engine that switches away finishes them
        # before its switch begins (a drain takes as long as its running turns do); the switches start
        # once every engine has taken its first step's work.
        placed, arriving = [], []
        for ft in futures:
            (placed if _on_engines(ft, roles_now, self.cluster) else arriving).append(ft)
        for ft in placed:
            run.place(ft)
        backend.call_later(0.0, partial(_switch, backend, roles_now, roles))
        for ft in arriving:
            run.start(ft, ft.ready_s)
        if step_start and list(roles) != list(roles_now):
            run.after_switch = True
        else:
            run.start_waiting()
        run.on_end()
        stops = bound < math.inf or then is not None
        backend.run((lambda: backend.loop.now > run.deadline) if stops else None)
        self.events += backend.loop.events_processed
        mids = (np.arange(self.bins) + 0.5) * self.bin_s
        decode = np.zeros(self.bins)
        for a, b in run.decode_spans + [(a, math.inf) for a in run.decode_start.values()]:   # open: stopped
            decode += (mids >= a) & (mids < b)
        ends = run.ends
        if len(ends) < run.scored:
            return Outcome(math.inf, math.inf, math.inf, ends, run.prefill, decode)   # stopped at its bound
        return Outcome(completion_s=max(ends, default=0.0), mean_end_s=float(np.mean(ends)) if ends else 0.0,
                       mean_turn_latency_s=float(np.mean(run.latencies)) if run.latencies else 0.0,
                       ends=ends, prefill_tokens=run.prefill, decode_seqs=decode)

    @staticmethod
    def _warm_caches(backend: SimBackend, futures: list[FutureTrajectory]) -> None:
        """Each trajectory's prefix sits where it was last decoded and prefilled, and where its turn under
        way runs, as in the real cluster. Within a data-parallel engine, on the rank with the fewest
        cached tokens so far: an engine puts a new trajectory on its least loaded rank, so its
        trajectories spread over the ranks (which rank holds which is not observable from outside).
        Before, rank = trajectory id mod ranks: trajectories routed to one engine often share that
        residue, and on 4 engines of DP8 a sync step of 8,000-token answers put every prefix on 2 of
        an engine's 8 ranks; the what-if on the true scripts then predicted colocation's step at
        2,176 s where the forked run took 1,223 s."""
        placed: dict[int, list[int]] = {}
        for ft in futures:
            cached = ft.turns[0].cached_tokens
            if not cached:
                continue
            on = {ft.route.prefill_engine, ft.route.decode_engine} if ft.route else set()
            for engine_id in sorted({ft.decode_engine, ft.prefill_engine, *on} - {None}):
                e = backend.engines[engine_id]
                load = placed.setdefault(engine_id, [0] * e.par.dp)
                i = min(range(len(load)), key=lambda j: (load[j], j))
                load[i] += cached
                e.scheduler.cache_prefix(i, ft.trajectory_id, cached)
        for e in backend.engines:
            e.scheduler.fit_caches()
