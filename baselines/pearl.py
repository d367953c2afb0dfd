"""pearl: once per RL rollout step, pick colocation or a P:D split from a closed-form makespan model
refit after every step (PEARL, arXiv 2609.35158). The closest published competitor of Prorsa: it
decides between steps from batch averages, where Prorsa decides within a step from a forecast.

The model, for a batch of B trajectories on N engines (written from the paper's description):
  colocated:      T = S*[(B*dL/N)*tp_c + r*(A_c + b_c*B/N) + T_over] + T_env
  disaggregated:  T = max(T_prefill, T_decode) + S*T_over + T_env
                  T_prefill = S*B*dL*(tp_p/N_P + K/BW),   T_decode = S*r*(A_d + b_d*B*f/N_D)
S: turns of the slowest trajectory; dL: new prompt tokens per turn; r: output tokens per turn; A, b:
fixed and per-sequence decode iteration cost; tp: seconds per prefill token of one engine; f: the
share of a trajectory's time in generation, so the decode pool sees B*f sequences at once (the
tool-wait bubble theta = (1-f)/f cuts its concurrency); K: KV bytes per token; BW: the KV-transfer
bandwidth, one engine's link times min(N_P, N_D) (a transfer holds a sender's and a receiver's link);
T_env = (S-1) * mean tool time, the tool time on the critical path; T_over: per-turn overheads.
A split is feasible when the decode pool holds every trajectory's KV: B*K_seq <= N_D*H_max.

The initial choice uses the workload's priors and the cluster's cost model (A, b from decode steps at
two batch sizes, tp from a full prefill chunk). At every step boundary (sync: the step's last
trajectory ended; async: every `trajectories_per_step` completions) the workload terms are refit from
that step's lifecycle events, and A, b by least squares of the observed time per output token on
decode engines against their mean decode batch (kept over the run: the hardware does not drift). A
colocated engine's time per token mixes in prefill chunks, which the model counts in its prefill term,
so only decode engines are fitted; as PEARL has one A and b, the fit also serves colocated engines
with the decode engines' parallelism (other parallelisms keep the cost model's line). T_over cannot be
told apart from queueing in the events, so it stays as configured. B is the trajectories in flight: a
sync step, or the async concurrency. A candidate other than the present split is priced by its switch:
the time its moving engines serve nothing (harness.cluster.switch_delay_s: the reload under reshard,
the switch time under drain, the router update under kv_both) is added to its predicted makespan, as
PEARL's model weighs a reconfiguration against its gain. The policy switches only when the best priced
split beats the current one's makespan by more than `hysteresis` times the current one.
"""
from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field, replace
from statistics import NormalDist

import numpy as np

from harness.allocation import COLOCATED, current_split, target_roles
from harness.api import ClusterView, EventKind, LifecycleEvent, Role, Route, RunInfo, TurnRequest
from harness.cluster import ClusterConfig, cost_model, reshards, switch_delay_s
from harness.perf.cost_model import prefill_attn_ctx
from harness.perf.roofline import RankBatch
from harness.policy import Policy
from harness.routing import Balance, PrefixTracker, route_by_role

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MakespanModel:
    """PEARL's closed-form makespan of one rollout step, for colocation (split 0) or N_P prefill engines."""

    engines: int                 # N
    batch: float                 # B, trajectories in flight
    turns: float                 # S, turns of the slowest trajectory
    new_tokens: float            # dL, new prompt tokens per turn
    output_tokens: float         # r, output tokens per turn
    gen_fraction: float          # f, share of a trajectory's time in generation
    env_s: float                 # T_env, tool time on the critical path
    overhead_s: float            # T_over, per turn
    kv_bytes_per_token: float    # K
    link_bw: float               # bytes/s of one engine's KV-transfer link
    kv_per_seq: float            # K_seq, KV tokens of one trajectory
    kv_per_decode_engine: float  # H_max, KV tokens one decode engine holds
    tp_colocated: float          # s per prefill token, colocated engine
    a_colocated: float           # s per decode iteration, colocated engine
    b_colocated: float           # s per decode iteration per sequence, colocated engine
    tp_prefill: float            # s per prefill token, prefill engine
    a_decode: float              # s per decode iteration, decode engine
    b_decode: float              # s per decode iteration per sequence, decode engine

    def feasible(self, num_prefill: int) -> bool:
        return self.batch * self.kv_per_seq <= (self.engines - num_prefill) * self.kv_per_decode_engine

    def colocated_s(self) -> float:
        B, N = self.batch, self.engines
        turn = (B * self.new_tokens / N * self.tp_colocated
                + self.output_tokens * (self.a_colocated + self.b_colocated * B / N) + self.overhead_s)
        return self.turns * turn + self.env_s

    def disaggregated_s(self, num_prefill: int) -> float:
        B, n_p, n_d = self.batch, num_prefill, self.engines - num_prefill
        bw = self.link_bw * min(n_p, n_d)
        prefill = self.turns * B * self.new_tokens * (self.tp_prefill / n_p + self.kv_bytes_per_token / bw)
        decode = self.turns * self.output_tokens * (self.a_decode + self.b_decode * B * self.gen_fraction / n_d)
        return max(prefill, decode) + self.turns * self.overhead_s + self.env_s

    def makespan(self, split: int) -> float:
        """Predicted seconds of a step; infinite for a split whose decode pool cannot hold the batch."""
        if split == COLOCATED:
            return self.colocated_s()
        return self.disaggregated_s(split) if self.feasible(split) else math.inf


@dataclass(frozen=True)
class Decision:
    split: int                    # COLOCATED (0) or the number of prefill engines
    predicted: dict[int, float]   # split -> predicted makespan (s)
    switch: bool


def choose(model: MakespanModel, current: int | None, hysteresis: float,
           price: dict[int, float] | None = None) -> Decision:
    """The split with the smallest predicted makespan, each candidate's switch `price` (s) added; from
    `current`, only if it gains more than `hysteresis` times the current prediction (None: the first
    choice, no hysteresis, nothing to switch from)."""
    price = price or {}
    predicted = {k: model.makespan(k) + price.get(k, 0.0) for k in range(model.engines)}   # 0 is colocation
    best = min(predicted, key=lambda k: (predicted[k], k))
    if current is None:
        return Decision(best, predicted, True)
    now = predicted[current]   # infinite when the current split can no longer hold the batch
    switch = best != current and (math.isinf(now) or now - predicted[best] > hysteresis * now)
    return Decision(best if switch else current, predicted, switch)


def switch_price_s(cluster: ClusterConfig, view: ClusterView, split: int) -> float:
    """The time a switch from the present roles to `split` keeps its moving engines out of service: they
    switch side by side, so the slowest of them (a reload where the parallelism changes under reshard)."""
    roles = target_roles(view, split)
    moves = [(e.launched_as or e.role, roles[e.engine_id]) for e in view.engines if roles[e.engine_id] != e.role]
    return max((switch_delay_s(cluster, reshards(cluster, cluster.parallelism[a], cluster.parallelism[b]))
                for a, b in moves), default=0.0)


# --- cost-model terms ---------------------------------------------------------------------------
def prefill_s_per_token(cluster: ClusterConfig, role: Role, context: float) -> float:
    """One engine's seconds per prefill token: a full chunk on every rank after `context` tokens."""
    m, c = cost_model(cluster, role), cluster.prefill_budget
    chunk = RankBatch(prefill_tokens=c, prefill_attn_ctx=prefill_attn_ctx(c, context),
                      prefill_kv_read=int(context) + c, requests=1)
    return m.step_time([chunk] * m.par.dp) / (c * m.par.dp)


def decode_line(cluster: ClusterConfig, role: Role, context: float) -> tuple[float, float]:
    """(A, b): the line through one engine's decode step time at one sequence per rank and at
    `max_num_seqs` per rank, each sequence with `context` tokens of KV (eager above the CUDA-graph limit)."""
    m = cost_model(cluster, role)
    dp, limit = m.par.dp, cluster.cuda_graph_max_bs

    def step(per_rank: int) -> float:
        graph = not limit or per_rank <= limit
        return float(m.decode_step_times(np.full(dp, per_rank), np.full(dp, per_rank * context), 1, graph)[0])

    lo, hi = dp, dp * cluster.max_num_seqs
    b = (step(cluster.max_num_seqs) - step(1)) / (hi - lo) if hi > lo else 0.0
    return step(1) - b * lo, b


def kv_tokens_per_engine(cluster: ClusterConfig, role: Role) -> float:
    m = cost_model(cluster, role)
    return float(m.kv_capacity_tokens(cluster.memory_fraction, cluster.activation_reserve_bytes) * m.par.dp)


@dataclass(frozen=True)
class WorkloadTerms:
    """The workload terms of the model, from priors or from one step's observations."""

    new_tokens: float       # dL
    output_tokens: float    # r
    turns: float            # S
    tool_s: float           # mean tool time per call
    kv_per_seq: float       # K_seq
    gen_fraction: float | None   # f; None: derive it from the colocated model (priors)


def prior_workload(run: RunInfo) -> WorkloadTerms:
    """Means of the priors' lognormals, weighted by family share; S is the batch's slowest
    trajectory: the turns prior at quantile B/(B+1) of the family with the longest one."""
    share = {k: (run.weights.get(k, 0.0) if run.weights else 1.0) for k in run.priors}
    fams = {k: p for k, p in run.priors.items() if share[k] > 0}
    w = {k: share[k] for k in fams}
    total = sum(w.values())

    def mean(get) -> float:
        return sum(w[k] * get(p).median * math.exp(get(p).sigma ** 2 / 2) for k, p in fams.items()) / total

    prompt, out = mean(lambda p: p.prompt_tokens), mean(lambda p: p.output_tokens)
    tool_out, turns = mean(lambda p: p.tool_output_tokens), max(mean(lambda p: p.turns), 1.0)
    z = NormalDist().inv_cdf(run.max_in_flight / (run.max_in_flight + 1))
    slowest = max(p.turns.median * math.exp(p.turns.sigma * z) for p in fams.values())
    context = prompt + (turns - 1) * (tool_out + out) + out
    return WorkloadTerms(new_tokens=(context - out) / turns, output_tokens=out, turns=max(slowest, 1.0),
                         tool_s=mean(lambda p: p.tool_latency_s), kv_per_seq=context, gen_fraction=None)


# --- observations -------------------------------------------------------------------------------
@dataclass
class StepObservations:
    """Running sums over one step's lifecycle events (reset at each boundary)."""

    turns_ready: int = 0
    new_tokens: float = 0.0
    decodes: int = 0
    output_tokens: float = 0.0
    tools: int = 0
    tool_s: float = 0.0
    gen_s: float = 0.0
    ended: int = 0
    max_turns: int = 0
    final_context: float = 0.0

    def workload(self, previous: WorkloadTerms) -> WorkloadTerms:
        """This step's terms; a term with no observation keeps its previous value."""
        def ratio(total: float, n: int, keep: float) -> float:
            return total / n if n else keep
        gen_fraction = self.gen_s / (self.gen_s + self.tool_s) if self.gen_s > 0 else previous.gen_fraction
        return WorkloadTerms(new_tokens=ratio(self.new_tokens, self.turns_ready, previous.new_tokens),
                             output_tokens=ratio(self.output_tokens, self.decodes, previous.output_tokens),
                             turns=float(self.max_turns) if self.ended else previous.turns,
                             tool_s=ratio(self.tool_s, self.tools, previous.tool_s),
                             kv_per_seq=ratio(self.final_context, self.ended, previous.kv_per_seq),
                             gen_fraction=gen_fraction)


@dataclass
class LiveTrajectory:
    context: float = 0.0         # prompt tokens so far
    last_output: int = 0
    t_ready: float = 0.0         # this turn's prompt ready
    t_decode_end: float = 0.0    # the previous turn's last token


@dataclass
class DecodeFit:
    """Least squares of time per output token against the mean decode batch of a decode engine.

    Each engine's batch is integrated over time (area under the count of decoding sequences), so a
    sequence's mean batch is the area over its decode divided by its duration; the sums are bounded.
    """

    engines: dict[int, list[float]] = field(default_factory=dict)      # id -> [count, area, t_last]
    live: dict[tuple[int, int], tuple[int, float, float]] = field(default_factory=dict)  # seq -> engine, t, area
    n: int = 0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def _area(self, engine: int, t: float) -> list[float]:
        e = self.engines.setdefault(engine, [0.0, 0.0, t])
        e[1] += e[0] * (t - e[2])
        e[2] = t
        return e

    def start(self, seq: tuple[int, int], engine: int, t: float) -> None:
        e = self._area(engine, t)
        e[0] += 1
        self.live[seq] = (engine, t, e[1])

    def stop(self, seq: tuple[int, int], t: float, tokens: int, on_decode_engine: bool) -> None:
        """Ends a sequence's decode; a completed one (tokens > 0) on a decode engine is a data point."""
        if seq not in self.live:
            return
        engine, t0, area0 = self.live.pop(seq)
        e = self._area(engine, t)
        e[0] -= 1
        if on_decode_engine and tokens > 0 and t > t0:
            self.add((e[1] - area0) / (t - t0), (t - t0) / tokens)

    def add(self, batch: float, s_per_token: float) -> None:
        x, y = batch, s_per_token
        self.n += 1
        self.sx, self.sy, self.sxx, self.sxy = self.sx + x, self.sy + y, self.sxx + x * x, self.sxy + x * y

    def line(self, min_points: int) -> tuple[float, float] | None:
        """(A, b), or None with too few points, no spread in batch size, or a negative coefficient."""
        den = self.n * self.sxx - self.sx ** 2
        if self.n < min_points or den <= 1e-9 * self.n * self.sxx:
            return None
        b = (self.n * self.sxy - self.sx * self.sy) / den
        a = (self.sy - b * self.sx) / self.n
        return (a, b) if a >= 0 and b >= 0 else None


# --- the policy ---------------------------------------------------------------------------------
class Pearl(Policy):
    name = "pearl"

    def __init__(self, *, control_interval_s: float, hysteresis: float, turn_overhead_s: float,
                 min_fit_points: int):
        self.control_interval_s = control_interval_s
        self.hysteresis, self.turn_overhead_s, self.min_fit_points = hysteresis, turn_overhead_s, min_fit_points
        self.prefix = PrefixTracker()
        self.fit = DecodeFit()
        self.step = StepObservations()
        self.live: dict[int, LiveTrajectory] = {}
        self.roles: dict[int, Role] = {}
        self.decisions: list[tuple[float, int]] = []
        self.predicted: list[float] = []
        self.observed: list[float] = []
        self._boundary_t = 0.0
        self._due = False

    # --- Policy contract ----------------------------------------------------------------------
    def initial_roles(self, cluster: ClusterConfig, run: RunInfo) -> list[Role]:
        self.cluster, self.run = cluster, run
        self.balance = Balance.of(cluster)
        self.workload = prior_workload(run)
        self.model = self._model(self.workload, decode_ab=None)
        d = choose(self.model, None, self.hysteresis)
        self._record(0.0, d)
        roles = ([Role.COLOCATED] * cluster.num_engines if d.split == COLOCATED
                 else [Role.PREFILL] * d.split + [Role.DECODE] * (cluster.num_engines - d.split))
        self.roles = dict(enumerate(roles))
        return roles

    def observe(self, e: LifecycleEvent) -> None:
        self.prefix.observe(e)
        K, s = EventKind, self.step
        if e.kind == K.TRAJECTORY_START:
            self.live[e.trajectory_id] = LiveTrajectory()
            return
        traj = self.live.get(e.trajectory_id)
        if traj is None:
            return
        if e.kind == K.TURN_READY:
            traj.context += e.tokens
            traj.t_ready = e.t
            s.turns_ready += 1
            s.new_tokens += e.tokens
        elif e.kind == K.DECODE_START:
            self.fit.start((e.trajectory_id, e.turn), e.engine_id, e.t)
        elif e.kind == K.PREEMPTED:
            self.fit.stop((e.trajectory_id, e.turn), e.t, 0, False)
        elif e.kind == K.DECODE_END:
            self.fit.stop((e.trajectory_id, e.turn), e.t, e.tokens, self.roles.get(e.engine_id) == Role.DECODE)
            traj.last_output, traj.t_decode_end = e.tokens, e.t
            s.decodes += 1
            s.output_tokens += e.tokens
            s.gen_s += e.t - traj.t_ready
        elif e.kind == K.TOOL_END:
            s.tools += 1
            s.tool_s += e.t - traj.t_decode_end
        elif e.kind == K.TRAJECTORY_END:
            del self.live[e.trajectory_id]
            s.ended += 1
            s.max_turns = max(s.max_turns, e.turn + 1)
            s.final_context += traj.context + traj.last_output
            if s.ended == self.run.trajectories_per_step:
                self._end_step(e.t)

    def plan(self, view: ClusterView) -> dict[int, Role] | None:
        self.roles = {e.engine_id: e.role for e in view.engines}
        current = current_split(view)
        if not self._due or current is None:   # between boundaries, or a switch still under way
            return None
        self._due = False
        d = choose(self.model, current, self.hysteresis,
                   {k: switch_price_s(self.cluster, view, k) for k in range(self.cluster.num_engines) if k != current})
        self._record(view.now, d)
        if not d.switch:
            return None
        log.info("pearl: t=%.1f s split %d -> %d (predicted %.1f s -> %.1f s)", view.now, current, d.split,
                 d.predicted[current], d.predicted[d.split])
        return {k: r for k, r in target_roles(view, d.split).items() if r != self.roles[k]}

    def plan_latency_s(self, cpu_s: float) -> None:
        return None   # a closed-form model: free

    def route(self, request: TurnRequest, view: ClusterView) -> Route | None:
        return route_by_role(request, view, self.prefix, self.balance)

    def metrics(self) -> dict:
        return {"pearl_decisions": [[round(t, 3), k] for t, k in self.decisions],
                "pearl_predicted_makespan_s": [round(x, 3) for x in self.predicted],
                "pearl_observed_step_s": [round(x, 3) for x in self.observed],
                "pearl_model": {k: float(v) for k, v in asdict(self.model).items()}}

    # --- helpers --------------------------------------------------------------------------------
    def _end_step(self, t: float) -> None:
        """A step boundary: refit the model from this step's events; plan() decides at its next call."""
        self.observed.append(t - self._boundary_t)
        self._boundary_t = t
        self.workload = self.step.workload(self.workload)
        self.step = StepObservations()
        self.model = self._model(self.workload, self.fit.line(self.min_fit_points))
        self._due = True

    def _model(self, w: WorkloadTerms, decode_ab: tuple[float, float] | None) -> MakespanModel:
        """The model for workload terms `w`; cost-model terms at the mean context of a turn."""
        c, n = self.cluster, self.cluster.num_engines
        context = w.kv_per_seq / 2
        a_d, b_d = decode_ab or decode_line(c, Role.DECODE, context)
        same_engine = c.parallelism[Role.COLOCATED] == c.parallelism[Role.DECODE]
        a_c, b_c = (a_d, b_d) if decode_ab and same_engine else decode_line(c, Role.COLOCATED, context)
        model = MakespanModel(
            engines=n, batch=float(self.run.max_in_flight), turns=w.turns, new_tokens=w.new_tokens,
            output_tokens=w.output_tokens, gen_fraction=1.0, env_s=max(w.turns - 1, 0.0) * w.tool_s,
            overhead_s=self.turn_overhead_s, kv_bytes_per_token=float(c.model.kv_bytes_per_token),
            link_bw=c.gpus_per_engine * c.gpu.nic_bw * c.perf.nic_efficiency, kv_per_seq=w.kv_per_seq,
            kv_per_decode_engine=kv_tokens_per_engine(c, Role.DECODE),
            tp_colocated=prefill_s_per_token(c, Role.COLOCATED, context), a_colocated=a_c, b_colocated=b_c,
            tp_prefill=prefill_s_per_token(c, Role.PREFILL, context), a_decode=a_d, b_decode=b_d)
        f = w.gen_fraction
        if f is None:   # priors: the colocated model's generation time against its tool time
            total = model.colocated_s()
            f = (total - model.env_s) / total
        return replace(model, gen_fraction=min(max(f, 1e-3), 1.0))

    def _record(self, t: float, d: Decision) -> None:
        self.decisions.append((t, d.split))
        self.predicted.append(d.predicted[d.split])
