"""Prediction-guided allocation: how many engines prefill and how many decode (or all colocated).

Each candidate split is scored by the latency of a turn in the closed loop of agentic rollouts
(queue for prefill -> prefill -> decode -> tool -> ...), from the forecast demand over the horizon:
  - prefill: the arrival rate (the engines' queued prefill now plus the forecast arrivals, over the
    horizon) against the pool's prefill rate; a turn waits its service time / (1 - utilisation),
    and past saturation half the backlog the horizon would pile up;
  - decode: the sequences decoding at once (the in-flight trajectories not in a tool call) share the
    decode pool; their batch is capped by the pool's KV capacity, beyond which sequences time-share
    (the memory wall); time per output token from the cost model at that batch and context;
  - colocated: every engine does both; the share of steps carrying prefill (its utilisation) run at
    the mixed step's time, which with DP attention is the slowest rank's (one rank's prefill stalls
    every rank's decode: reference/simulator.md, "DP attention").
The score is turn latency x the turns expected in the horizon (trajectory-seconds). A switch costs
the switched engines' share of the in-flight trajectories for the switch time (resharding when the
parallelism changes); the allocator moves only when the gain beats that plus `hysteresis` times the
current score. Rates and step times come from the cluster's cost model (roofline or profiled).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.api import Role
from harness.cluster import ClusterConfig, cost_model
from harness.perf.roofline import RankBatch
from harness.prorsa.forecaster import Forecast

COLOCATED = 0   # the split "no prefill engines": every engine colocated


class CapacityModel:
    """Per-engine rates of each role, from the same cost model the simulator uses."""

    def __init__(self, cluster: ClusterConfig):
        self.cluster = cluster
        self.models = {role: cost_model(cluster, role) for role in Role}
        self.kv_capacity = {r: m.kv_capacity_tokens(cluster.memory_fraction, cluster.activation_reserve_bytes)
                            * m.par.dp for r, m in self.models.items()}
        self.tpot_ideal = min(self.decode_step(r, 1, 0) for r in (Role.DECODE, Role.COLOCATED))

    def prefill_rate(self, role: Role, context: float) -> float:
        """Prefill tokens/s of one engine, full chunks on every rank at the given prefix length."""
        m, c = self.models[role], self.cluster.max_num_batched_tokens
        b = RankBatch(prefill_tokens=c, prefill_attn_ctx=c * (context + (c - 1) / 2),
                      prefill_kv_read=int(context) + c, requests=1)
        return c * m.par.dp / m.step_time([b] * m.par.dp)

    def decode_step(self, role: Role, seqs: float, kv_tokens: float) -> float:
        m = self.models[role]
        dp = m.par.dp
        per_rank = max(seqs / dp, 0.0)
        n = np.full(dp, int(np.ceil(per_rank)))
        return float(m.decode_step_times(n, np.full(dp, kv_tokens / dp), 1)[0])

    def mixed_step(self, role: Role, seqs: float, kv_tokens: float, context: float) -> float:
        """A step with one full prefill chunk on one rank and the decodes spread over all ranks."""
        m, c = self.models[role], self.cluster.max_num_batched_tokens
        dp = m.par.dp
        per_rank = int(np.ceil(seqs / dp))
        decode = RankBatch(decode_seqs=per_rank, decode_ctx=int(kv_tokens / dp), requests=per_rank)
        chunk = RankBatch(decode_seqs=per_rank, decode_ctx=int(kv_tokens / dp), requests=per_rank + 1,
                          prefill_tokens=max(c - per_rank, 1),
                          prefill_attn_ctx=c * (context + (c - 1) / 2), prefill_kv_read=int(context) + c)
        return m.step_time([chunk] + [decode] * (dp - 1))


@dataclass
class Load:
    """The demand over the horizon that the allocator scores splits against."""

    horizon_s: float
    prefill_rate: float       # prefill tokens/s arriving (queued now + forecast arrivals) / horizon
    turn_prefill: float       # prefill tokens of one turn
    output: float             # output tokens of one turn
    turns: float              # turns expected to start in the horizon
    decoding: float           # sequences decoding at once (in flight, not in a tool call)
    kv_per_seq: float         # KV tokens of a decoding sequence
    context: float            # prefix length of a prefill chunk
    in_flight: int

    @classmethod
    def from_forecast(cls, fc: Forecast, backlog: float, decoding: float, context: float, output: float,
                      turn_prefill: float, in_flight: int) -> "Load":
        horizon = fc.bins * fc.bin_s
        kv = float(fc.decode_kv_tokens.max()) / max(float(fc.decode_seqs.max()), 1.0)
        return cls(horizon_s=horizon, prefill_rate=(backlog + float(fc.prefill_tokens.sum())) / horizon,
                   turn_prefill=turn_prefill, output=output, turns=float(fc.decode_tokens.sum()) / max(output, 1.0),
                   decoding=max(decoding, float(fc.decode_seqs.max())), kv_per_seq=max(kv, context),
                   context=context, in_flight=in_flight)


@dataclass
class Decision:
    num_prefill: int              # 0: all colocated
    costs: dict[int, float]
    switch: bool


class Allocator:
    def __init__(self, capacity: CapacityModel, hysteresis: float, allow_colocated: bool):
        self.cap = capacity
        self.n = capacity.cluster.num_engines
        self.hysteresis = hysteresis
        self.allow_colocated = allow_colocated

    def candidates(self) -> list[int]:
        return ([COLOCATED] if self.allow_colocated else []) + list(range(1, self.n))

    def turn_latency(self, num_prefill: int, load: Load) -> float:
        """Seconds from a turn's prompt being ready to its last token, with this split."""
        cap, n = self.cap, self.n
        colocated = num_prefill == COLOCATED
        role = Role.COLOCATED if colocated else Role.DECODE
        engines = n if colocated else n - num_prefill
        rate = (n * cap.prefill_rate(Role.COLOCATED, load.context) if colocated
                else num_prefill * cap.prefill_rate(Role.PREFILL, load.context))
        rho = load.prefill_rate / rate
        service = load.turn_prefill / rate
        wait = service / (1 - rho) if rho < 1 else service + (load.prefill_rate - rate) * load.horizon_s / (2 * rate)
        want = max(load.decoding / engines, 1.0)
        limit = self.cap.cluster.max_num_seqs * cap.models[role].par.dp
        batch = max(min(want, cap.kv_capacity[role] / max(load.kv_per_seq, 1.0), limit), 1.0)
        t_dec = cap.decode_step(role, batch, batch * load.kv_per_seq) * want / batch   # time-sharing
        if colocated:
            t_mix = cap.mixed_step(role, batch, batch * load.kv_per_seq, load.context) * want / batch
            busy = min(rho, 1.0)  # share of time in steps that carry prefill
            t_dec = 1.0 / (busy / t_mix + (1 - busy) / t_dec)
        return wait + load.output * t_dec

    def cost(self, num_prefill: int, load: Load) -> float:
        return self.turn_latency(num_prefill, load) * load.turns

    def switch_cost(self, current: int, target: int, in_flight: int) -> float:
        """The switched engines' share of the in-flight trajectories, idle for the switch time."""
        if current == target:
            return 0.0
        c = self.cap.cluster
        if COLOCATED in (current, target):
            moved = self.n
            reshard = any(c.parallelism[r] != c.parallelism[Role.COLOCATED] for r in (Role.PREFILL, Role.DECODE))
        else:
            moved = abs(current - target)
            reshard = c.parallelism[Role.PREFILL] != c.parallelism[Role.DECODE]
        seconds = c.reshard_switch_time_s if reshard else c.switch_time_s
        return moved / self.n * in_flight * seconds

    def decide(self, current: int, load: Load) -> Decision:
        costs = {k: self.cost(k, load) for k in self.candidates()}
        now_cost = costs.get(current, self.cost(current, load))
        total = {k: costs[k] + self.switch_cost(current, k, load.in_flight) for k in costs}
        best = min(total, key=lambda k: (total[k], k))
        switch = best != current and now_cost - total[best] > self.hysteresis * max(now_cost, 1e-9)
        return Decision(best if switch else current, costs, switch)
