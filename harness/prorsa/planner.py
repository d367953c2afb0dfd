"""Prorsa's allocation planner: score candidate allocations by what-if simulation, switch when it pays.

Candidates are colocation (if allowed) and every P:D split, each reached from the present roles by
moving the fewest, cheapest-to-drain engines (harness/allocation.py). Each runs on the same sampled futures
(forecast.py) and is scored by when its work ends: in sync RL the step ends with its slowest
trajectory, so the score is the predicted completion of the step's trajectories (the critical path);
in async RL it is the mean end of the live trajectories plus the next `max_in_flight` to start (a
rolling phase). The what-if run of a switch includes its whole price under the cluster's switch
mechanism (drain, switch time, lost prefix cache, resharding), so a switch is taken when the best
candidate beats staying by more than `hysteresis` (a share of the current prediction: sampling
noise, not a cost). Async uses the mean end, not the last, until the plan covers the run's end: async
RL wants throughput, and the last end of a rolling set is a few long chains of turns and tool calls.
The allocation does move those (a split's fewer decode engines each decode more beside a chain:
docs/decisions/2026-12-07-prorsa-rules.md, R26), so an async start whose sample is the whole run is
scored by its last end, on many samples (policy.py `_initial_split`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from harness.api import ClusterView, Role
from harness.cluster import ClusterConfig
from harness.stats import t975
from harness.allocation import COLOCATED, current_split, roles_for, target_roles
from harness.prorsa.forecast import FutureTrajectory
from harness.prorsa.mode_rules import SYNC, ModeRules
from harness.prorsa.whatif import Outcome, WhatIf, decode_floor_s
from harness.prorsa.workers import PlanWorkers


@dataclass
class Decision:
    split: int                          # COLOCATED or the number of prefill engines
    roles: dict[int, Role]
    switch: bool
    scores: dict[int, float]            # split -> predicted score (s from now): sync completion, async mean
                                        # end; inf: sure to lose by more than the hysteresis (not run out)
    current: Outcome                    # the what-if under the present allocation (the forecast)
    closed_for_s: float | None = None   # settled by the critical-path floor: for how long (Planner.settled)


@dataclass(frozen=True)
class Screen:
    """What a thinned start plan leaves to a race with every trajectory simulated (policy.py
    `_initial_split`): the candidates within SCREEN_MARGIN of its choice by the start's rule (the mean
    score, or the worst regret over the task mixes), and per mix (the expected one, then each hedge)
    the best candidate's score over the best finalist's (<= 1), so that the race's regrets are against
    every candidate's best, not only the finalists'."""
    finalists: list[int]
    edges: list[float]


class Planner:
    def __init__(self, cluster: ClusterConfig, whatif: WhatIf, hysteresis: float, allow_colocated: bool,
                 max_candidates: int, rules: ModeRules = SYNC, confirm_plans: int = 1,
                 switch_rule: str = "consecutive", workers: PlanWorkers = PlanWorkers(1)):
        self.cluster, self.whatif, self.rules, self.workers = cluster, whatif, rules, workers
        self.hysteresis, self.allow_colocated = hysteresis, allow_colocated
        self.max_candidates, self.confirm_plans, self.switch_rule = max_candidates, confirm_plans, switch_rule
        self._last: dict[int, float] = {}     # the last plan's scores: the order to try candidates in
        self._start: tuple[dict[int, float], list[dict[int, float]]] = ({}, [])   # the last start plan's rule
                                              # value per candidate still raced, and its scores per mix
        self.evidence: dict[int, float] = {}  # per target, its gains over staying so far (`weigh`)
        self._weighed_at: int | None = None   # the split `evidence` is against
        self._unweighed: tuple[dict[int, float], int | None] | None = None   # both before the last `weigh`
        self.decode_floor_s = decode_floor_s(cluster)

    def score(self, outcome: Outcome, to_end: bool = False) -> float:
        """Sync, and async once the plan covers the run's end: the last end; async before: the mean end of
        the rolling set."""
        return outcome.mean_end_s if self.rules.on_mean_end(to_end) else outcome.completion_s

    def scored_run(self, futures: list[FutureTrajectory], roles_now: list[Role], roles: list[Role],
                   new: list[FutureTrajectory], max_in_flight: int, launched: list[Role] | None,
                   to_end: bool = False, step_start: bool = False) -> float:
        """The score of one what-if run to its end (no bound) under `roles`, reached from `roles_now`
        (`step_start`: between two sync steps, WhatIf.run)."""
        return self.score(self.whatif.run(futures, roles_now, roles, new, max_in_flight,
                                          on_mean_end=self.rules.on_mean_end(to_end), launched_as=launched,
                                          step_start=step_start), to_end)

    def runs(self, run: Callable[..., float], tasks: list[tuple]) -> list[float]:
        """`[run(*task) for task in tasks]` for independent what-if runs, on the plan's workers
        (workers.py); the what-if events they took are counted as if run here."""
        base = self.whatif.events

        def counted(task: tuple) -> tuple[float, int]:
            before = self.whatif.events
            return run(*task), self.whatif.events - before
        out = self.workers.map(counted, tasks)
        self.whatif.events = base + sum(events for _, events in out)
        return [score for score, _ in out]

    def candidates(self, current: int) -> list[int]:
        """Colocation and the splits; on big clusters the ones near the present split and a coarse grid."""
        n = self.cluster.num_engines
        splits = list(range(1, n))
        if len(splits) > self.max_candidates:
            near = {current + d for d in (-2, -1, 1, 2)} if current != COLOCATED else set()
            step = max(1, n // self.max_candidates)
            splits = sorted({*range(step, n, step), *near} & set(range(1, n)))
        return ([COLOCATED] if self.allow_colocated else []) + splits

    def settled(self, trajectories: list[FutureTrajectory], staying: Outcome, to_end: bool) -> float | None:
        """Where the score is the last end: none can end sooner than the longest chain of tool calls and
        decode steps (`critical_path_floor`). When that floor is >= staying's end x (1 - hysteresis), no
        allocation can beat staying by the hysteresis, so no other candidate is run; this returns for how
        long that holds if the world goes as sampled (both shrink by the time t that passes:
        floor - t >= (1 - h)(end - t) while t <= (floor - (1 - h) end) / h). None: not settled."""
        if self.rules.on_mean_end(to_end):
            return None
        slack = critical_path_floor(trajectories, self.decode_floor_s) - (1 - self.hysteresis) * self.score(staying, to_end)
        if slack < 0:
            return None
        return slack / self.hysteresis if self.hysteresis > 0 else 0.0

    def decide(self, view: ClusterView, current: int, futures: list[FutureTrajectory],
               new: list[FutureTrajectory], max_in_flight: int,
               hedges: list[list[FutureTrajectory]] = (), to_end: bool = False,
               then: Callable[[], list[FutureTrajectory]] | None = None) -> Decision:
        """Score the present allocation (run to the end: it is also the forecast), then the other
        candidates, the best of the last plan first (`to_end`: the futures and `new` are all the run has
        left, so they are scored by their last end); a candidate stops as soon as it is sure to end
        later than the best so far by more than the hysteresis (it could not be chosen), and scores inf.

        `hedges` (async, several task families, switches that drain): the trajectories to start if
        the mix turned to one family alone. A switch is made only to a candidate that, for every such
        mix, ends no later than staying (within the hysteresis): the rolling phase cannot see the mix
        change, and a split that suits the present mix but not another is left, when the mix turns,
        only by draining and reloading again (docs/decisions/2026-12-07-prorsa-rules.md, R14).
        Candidates that beat staying are tried in score order. `then` (sync): the next
        step's batch for the present allocation's run, the forecast (WhatIf.run)."""
        now_roles = [e.role for e in view.engines]
        launched = view.launched_roles()
        left = decode_left(futures)
        outcomes: dict[int, Outcome] = {}
        bounds: dict[int, float] = {}     # the score each candidate's run was cut at (inf: run to its end)
        roles_of: dict[int, dict[int, Role]] = {}
        others = sorted(set(self.candidates(current)) - {current}, key=lambda k: (self._last.get(k, np.inf), k))
        for split in [current, *others]:
            roles = target_roles(view, split, left)
            roles_of[split] = roles
            bound = min((self.score(o, to_end) for o in outcomes.values()), default=np.inf) * (1 + self.hysteresis)
            bounds[split] = bound
            outcomes[split] = self.whatif.run(futures, now_roles, [roles[e.engine_id] for e in view.engines],
                                              new, max_in_flight, bound=bound,
                                              on_mean_end=self.rules.on_mean_end(to_end), launched_as=launched,
                                              then=then if split == current else None)
            closed_for = self.settled([*futures, *new], outcomes[current], to_end) if split == current else None
            if closed_for is not None:
                self._last = {current: self.score(outcomes[current], to_end)}
                self.weigh(current, self._last)
                return Decision(current, roles, False, dict(self._last), outcomes[current], closed_for)
        scores = {k: self.score(o, to_end) for k, o in outcomes.items()}
        self._last = scores
        ready = self.weigh(current, scores, bounds)
        moved = {k: sum(roles_of[k][e.engine_id] != e.role for e in view.engines) for k in scores}
        top = min(scores.values())
        # candidates within the sampling noise of the best are equally good: take the one that moves
        # the fewest engines (staying, if it is among them)
        near = [k for k in scores if scores[k] <= top * (1 + self.hysteresis)]
        best = min(near, key=lambda k: (moved[k], scores[k], k))
        better = [k for k in sorted(scores, key=lambda k: (k != best, scores[k], k)) if k in ready]
        hedged: dict[tuple[int, int], float] = {}   # (split, hedge) -> score: staying's is run once

        def hedge_score(split: int, i: int) -> float:
            if (split, i) not in hedged:
                roles = [roles_of[split][e.engine_id] for e in view.engines]
                hedged[split, i] = self.scored_run(futures, now_roles, roles, hedges[i], max_in_flight, launched,
                                                   to_end)
            return hedged[split, i]

        def robust(k: int) -> bool:
            """`k` ends no later than staying, within the hysteresis, whatever family the new
            trajectories come from."""
            return all(hedge_score(k, i) <= hedge_score(current, i) * (1 + self.hysteresis)
                       for i in range(len(hedges)))
        chosen = next((k for k in better if robust(k)), current)
        return Decision(chosen, roles_of[chosen], chosen != current, scores, outcomes[current])

    def weigh(self, current: int, scores: dict[int, float], bounds: dict[int, float] | None = None) -> list[int]:
        """The targets this plan may switch to. `switch_rule: consecutive`: those that beat staying by
        the hysteresis h in this plan (the policy then waits for `confirm_plans` consecutive plans that
        want the same target). `evidence`: those whose evidence over the plans so far is enough (Page's
        CUSUM per target): each plan adds the target's gain over staying, (stay - target) / stay
        clipped to h either way, less h / 2, and the sum never falls below 0; a target is ready once it
        reaches `confirm_plans` x h / 2, and goes no higher (a target held back, by the hedges or a
        failed check, stays ready only while each plan gains h / 2 or more). So `confirm_plans` plans
        that each beat staying by h are enough, as are more plans that each beat it by between h / 2
        and h (a gain that persists while the best target changes from plan to plan), while gains
        under h / 2 never add up. A candidate not run this plan adds the gain it is sure not to exceed
        where its run was cut at a `bounds` score above staying's, else 0. Why: a gain that persists
        while the plans in between disagree never makes two consecutive plans agree
        (docs/decisions/2026-12-07-prorsa-rules.md, R27)."""
        if self.switch_rule == "consecutive":
            return [k for k in scores if k != current and scores[k] < scores[current] * (1 - self.hysteresis)]
        self._unweighed = (dict(self.evidence), self._weighed_at)
        if current != self._weighed_at:
            self.evidence, self._weighed_at = {}, current
        h = max(self.hysteresis, 1e-9)   # with no hysteresis, every plan that finds a target better counts
        ready = self.confirm_plans * h / 2
        stay, bounds = scores[current], bounds or {}
        for k in (set(self.candidates(current)) | set(scores)) - {current}:
            score = scores.get(k, np.inf)
            if not np.isfinite(score):   # not run, or cut: known only to end later than its bound
                score = max(bounds.get(k, 0.0), stay)
            gain = (stay - score) / stay if stay > 0 else 0.0
            self.evidence[k] = min(ready, max(0.0, self.evidence.get(k, 0.0) + min(max(gain, -h), h) - h / 2))
        return [k for k, e in self.evidence.items() if e >= ready * (1 - 1e-9)]

    def unweigh(self) -> None:
        """Undo the last `weigh` (a plan decided again on another sample counts once)."""
        if self._unweighed is not None:
            self.evidence, self._weighed_at = self._unweighed
            self._unweighed = None

    def reset(self) -> None:
        """The allocation moved (a switch made, a step's start planned): `evidence` was against the last one."""
        self.evidence, self._weighed_at = {}, None

    def reject(self, split: int) -> None:
        """A switch to `split` failed a later test (the policy's check on fresh samples): its evidence
        (`switch_rule: evidence`) starts again."""
        self.evidence.pop(split, None)

    def check(self, view: ClusterView, decision: Decision,
              samples: list[tuple[list[FutureTrajectory], list[FutureTrajectory]]], max_in_flight: int = 0,
              to_end: bool = False) -> tuple[float, float]:
        """The mean score of staying and of the switch `decision` wants, over fresh `samples` (the live
        trajectories' futures, and in async RL the trajectories to start; both allocations run on each
        sample: paired), scored as the plan scores (`to_end`). The plan chose its target as
        the best of every candidate on one sample, so that sample's gain is biased up, and on a step's
        slowest trajectory it is noisy (docs/decisions/2026-12-07-prorsa-rules.md, R15)."""
        now_roles = [e.role for e in view.engines]
        target = [decision.roles[e.engine_id] for e in view.engines]
        launched = view.launched_roles()
        scores = self.runs(lambda futures, new, roles: self.scored_run(futures, now_roles, roles, new, max_in_flight,
                                                                       launched, to_end),
                           [(futures, new, roles) for futures, new in samples for roles in (now_roles, target)])
        return float(np.mean(scores[0::2])), float(np.mean(scores[1::2]))

    def initial(self, samples: list[list[FutureTrajectory]], max_in_flight: int,
                hedges: list[list[FutureTrajectory]] = (), more: Callable[[], list[FutureTrajectory]] | None = None,
                max_samples: int = 0, present: ClusterView | None = None,
                to_end: bool = False, screen: Screen | None = None) -> tuple[int, dict[int, float]]:
        """The best allocation to start in (no switch), by the mean score over samples of trajectories
        drawn from the priors (one sample's slowest trajectory is noise). With `more`, samples are
        added (up to `max_samples`) while the choice is still open: while some candidate within the
        hysteresis of the best could, by its paired differences over the samples so far, be better
        than it by more than `INITIAL_TOLERANCE` (`still_open`; docs/decisions/
        2026-12-07-prorsa-rules.md, R16). A start within
        `INITIAL_TOLERANCE` of the best is as good; colocation is taken where it is one of them.
        Every candidate runs on the first `RACE_AFTER` samples; later samples (given or added) go
        only to the candidates the choice is open between: one that ends later than the best by more
        than the hysteresis, by its paired interval, is sampled no further (`out_of_reach`), and the
        best is one of those sampled to the end.

        `hedges`: other task mixes the run may move to (one sample each). When given, the start is the
        allocation whose worst ratio to the best allocation of any mix (the expected one or a hedge) is
        smallest: a start that is right for the first batches but ruinous for another mix cannot be
        left in time when a switch takes a minute (measured: 1P7D on shift_reason_browse with reshard,
        0.64x of the best static allocation; hedged, 1.05x).

        `present`: the cluster between two sync steps (every engine idle, nothing queued). Each candidate
        is then reached from the present roles by moving the fewest engines, its switch priced by the
        what-if, and the present split is left only for one that beats it by more than the hysteresis.

        `to_end` (async): the samples are the whole run, so they are scored by their last end.

        Where the score is the last end, staying (colocation at the start, the present split before a
        step) is run first; when its mean is within the rule's margin of the samples' critical-path
        floor, no candidate can be chosen over it and none is run (as `settled` in a plan).

        `screen`: only its finalists run (`Planner.screen`, after a thinned start plan)."""
        n = self.cluster.num_engines
        current = current_split(present) if present is not None else None
        splits = self.candidates(current if current is not None else COLOCATED if self.allow_colocated else 1)
        if current is not None and current not in splits:
            splits.append(current)
        if screen is not None:
            splits = [k for k in splits if k in screen.finalists]
        if present is None:
            roles = {k: roles_for(k, n) for k in splits}
            now_roles, launched = None, None       # each candidate starts in its own roles
        else:
            roles = {k: [target_roles(present, k)[e.engine_id] for e in present.engines] for k in splits}
            now_roles, launched = [e.role for e in present.engines], present.launched_roles()

        def run(k: int, new: list[FutureTrajectory]) -> float:
            return self.scored_run([], now_roles or roles[k], roles[k], new, max_in_flight, launched, to_end,
                                   step_start=present is not None)
        own: dict[int, list[float]] = {}
        stay = current if current is not None else COLOCATED if self.allow_colocated and not hedges else None
        stay = stay if stay in splits else None
        if stay is not None and not self.rules.on_mean_end(to_end):
            # each sample's critical-path floor is below every candidate's score on it: when staying's mean
            # is that close to the floors' mean, the rules below keep `stay` whatever the other candidates
            # score, so they are not run
            own[stay] = self.runs(run, [(stay, new) for new in samples])
            mean = float(np.mean(own[stay]))
            floor = float(np.mean([critical_path_floor(new, self.decode_floor_s) for new in samples]))
            if (floor >= mean * (1 - self.hysteresis) if current is not None
                    else mean <= floor * (1 + INITIAL_TOLERANCE)):
                self._last = {stay: mean}
                self._start = ({stay: mean}, [])
                return stay, {stay: mean}
        per = {k: own.get(k, []) for k in splits}
        samples = list(samples)

        def sample_all(live: list[int], upto: int) -> None:
            """Every candidate of `live` on the samples up to `upto` it has not run yet."""
            todo = [(k, i) for k in live for i in range(len(per[k]), upto)]
            for (k, _), score in zip(todo, self.runs(run, [(k, samples[i]) for k, i in todo])):
                per[k].append(score)
        live = splits   # the candidates still sampled (`out_of_reach`)
        done = min(RACE_AFTER, len(samples))   # the samples every candidate of `live` has run
        sample_all(live, done)
        # the next sample: one given, or one drawn while the choice is open
        while done < len(samples) or (
                more is not None and done < max_samples and still_open(per, live, self.hysteresis)):
            live = [k for k in live if not out_of_reach(per, live, k, self.hysteresis)]
            if done == len(samples):
                samples.append(more())
            done += 1
            sample_all(live, done)
        scores = {k: float(np.mean(v)) for k, v in per.items()}
        self._last = scores
        best = min(live, key=lambda k: (scores[k], k))
        self._start = ({k: scores[k] for k in live}, [])
        if current is not None:
            return (best if scores[best] < scores[current] * (1 - self.hysteresis) else current), scores
        if not hedges:
            # a start within INITIAL_TOLERANCE of the best is as good: among those, colocation, which bets
            # nothing on a split's costs the samples may miss (a long chain's decodes on fewer decode
            # engines; docs/decisions/2026-12-07-prorsa-rules.md, R17).
            if COLOCATED in live and scores[COLOCATED] <= scores[best] * (1 + INITIAL_TOLERANCE):
                return COLOCATED, scores
            return best, scores
        hedged = iter(self.runs(run, [(k, h) for h in hedges for k in splits]))
        mixes = [scores] + [{k: next(hedged) for k in splits} for _ in hedges]
        edges = screen.edges if screen is not None else [1.0] * len(mixes)
        regret = {k: max(m[k] / (min(m.values()) * edge) for m, edge in zip(mixes, edges)) for k in splits}
        self._start = (regret, mixes)
        return min(splits, key=lambda k: (regret[k], scores[k], k)), scores

    def screen(self) -> Screen:
        """The last start plan (`initial`) as a screen: its finalists are the candidates within
        SCREEN_MARGIN of the best by its rule."""
        rule, mixes = self._start
        top = min(rule.values())
        finalists = sorted(k for k, v in rule.items() if v <= top * (1 + SCREEN_MARGIN))
        return Screen(finalists, [min(m.values()) / min(m[k] for k in finalists) for m in mixes])


def decode_left(futures: list[FutureTrajectory]) -> dict[int, float]:
    """Engine id -> the output tokens its turns under way still have to decode, by the sampled futures
    (a turn's first future turn is the rest of the one under way)."""
    left: dict[int, float] = {}
    for ft in futures:
        if ft.in_progress and ft.route is not None and ft.turns:
            left[ft.route.decode_engine] = left.get(ft.route.decode_engine, 0.0) + ft.turns[0].output_tokens
    return left


def critical_path_floor(futures: list[FutureTrajectory], decode_floor: float) -> float:
    """A lower bound on when the last of `futures` ends under any allocation (FutureTrajectory.chain_s)."""
    return max((ft.chain_s(decode_floor) for ft in futures), default=0.0)


INITIAL_TOLERANCE = 0.01   # a start this close to the best one is as good (a share of the best score)


RACE_AFTER = 3   # every start candidate runs on this many samples; later ones go to those in reach


# A thinned start plan's candidates this close to its best (a share of it) race again with every
# trajectory simulated. At 8 per engine the full plan's choice sat up to 9.3% behind the thinned plan's
# best (browse) on the start plans of 13 experiments (docs/decisions/2026-12-07-screen-margin.md).
SCREEN_MARGIN = 0.10


def paired_low(per: dict[int, list[float]], k: int, best: int, n: int) -> float:
    """The lower end of the 95% interval (Student's t) of candidate `k`'s mean score less `best`'s over
    their first `n` samples (paired: each sample's futures are common to both); needs two samples."""
    d = np.asarray(per[k][:n]) - np.asarray(per[best][:n])
    return float(d.mean() - t975(n - 1) * d.std(ddof=1) / np.sqrt(n))


def leader(per: dict[int, list[float]], live: list[int]) -> tuple[int, int, float]:
    """Of the candidates still sampled, the one with the best mean over the samples they all ran: it,
    that count and that mean."""
    n = min(len(per[k]) for k in live)
    means = {k: float(np.mean(per[k][:n])) for k in live}
    best = min(means, key=lambda k: (means[k], k))
    return best, n, means[best]


def still_open(per: dict[int, list[float]], live: list[int], hysteresis: float) -> bool:
    """Whether a candidate within `hysteresis` of the best mean score may still be better than it by
    more than INITIAL_TOLERANCE: the lower end of its paired difference's 95% interval (Student's t:
    the spread is estimated from these few samples) lies below minus that tolerance. Needs two samples
    (a spread) to say no. Why t and not two standard errors: with a handful of samples, two standard
    errors closed choices that more samples reversed (docs/decisions/2026-12-07-prorsa-rules.md, R28)."""
    best, n, top = leader(per, live)
    if n < 2:
        return True
    return any(paired_low(per, k, best, n) < -INITIAL_TOLERANCE * top
               for k in live if k != best and np.mean(per[k][:n]) <= top * (1 + hysteresis))


def out_of_reach(per: dict[int, list[float]], live: list[int], k: int, hysteresis: float) -> bool:
    """Whether candidate `k` ends later than the leader of those still sampled by more than
    `hysteresis`, by the lower end of their paired difference's 95% interval: no rule of the start
    can then take it, so it is sampled no further (a race: the samples go to the candidates the
    choice is open between)."""
    best, n, top = leader(per, live)
    return k != best and n >= 2 and paired_low(per, k, best, n) > hysteresis * top
