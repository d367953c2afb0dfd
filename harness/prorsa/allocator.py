"""Prediction-guided allocation: how many engines prefill and how many decode (or all colocated).

Each candidate split is scored by a fluid model of the forecast horizon, in trajectory-seconds of
delay against an ideal cluster (every prompt prefilled on arrival, every sequence decoding at its
batch-1 speed):
  - prefill: the backlog (now: the engines' queued prefill tokens) grows by each bin's forecast
    arrivals and shrinks by the pool's prefill rate; queued turns wait a bin each;
  - decode: the forecast sequences share the decode pool; each runs at 1/TPOT(batch, context)
    instead of 1/TPOT(1); sequences beyond the pool's KV capacity stall;
  - colocated: every engine prefills and decodes; while it prefills, its decodes run at the mixed
    step's time (with DP attention, one rank's prefill stalls all ranks: reference/simulator.md).
Rates and times come from the cluster's cost model (roofline or profiled), per role parallelism.
A switch costs the switching engines' share of the in-flight trajectories for the switch time;
the allocator moves only when the predicted gain beats that cost plus a hysteresis margin.
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

    def cost(self, num_prefill: int, fc: Forecast, backlog: float, context: float, turn_tokens: float) -> float:
        cap, n, w = self.cap, self.n, fc.bin_s
        delay = 0.0
        if num_prefill == COLOCATED:
            rate = n * cap.prefill_rate(Role.COLOCATED, context)
            kv_cap = n * cap.kv_capacity[Role.COLOCATED]
        else:
            rate = num_prefill * cap.prefill_rate(Role.PREFILL, context)
            n_dec = n - num_prefill
            kv_cap = n_dec * cap.kv_capacity[Role.DECODE]
        for b in range(fc.bins):
            work = backlog + fc.prefill_tokens[b]
            busy = min(1.0, work / (rate * w)) if rate > 0 else 1.0
            backlog = max(0.0, work - rate * w)
            seqs, kv = fc.decode_seqs[b], fc.decode_kv_tokens[b]
            stalled = 0.0 if kv <= kv_cap or kv <= 0 else seqs * (1 - kv_cap / kv)
            active = seqs - stalled
            if num_prefill == COLOCATED:
                t_dec = cap.decode_step(Role.COLOCATED, active / n, min(kv, kv_cap) / n)
                t_mix = cap.mixed_step(Role.COLOCATED, active / n, min(kv, kv_cap) / n, context)
                tokens_per_s = busy / t_mix + (1 - busy) / t_dec
            else:
                tokens_per_s = 1.0 / cap.decode_step(Role.DECODE, active / n_dec, min(kv, kv_cap) / n_dec)
            delay += active * w * max(0.0, 1.0 - tokens_per_s * cap.tpot_ideal) + stalled * w
            delay += backlog / max(turn_tokens, 1.0) * w
        return delay

    def switch_cost(self, current: int, target: int, in_flight: int) -> float:
        """The switching engines' share of the in-flight trajectories, idle for the switch time."""
        if current == target:
            return 0.0
        c = self.cap.cluster
        if COLOCATED in (current, target):
            moved = self.n
            roles = [Role.PREFILL, Role.DECODE]
            reshard = any(c.parallelism[r] != c.parallelism[Role.COLOCATED] for r in roles)
        else:
            moved = abs(current - target)
            reshard = c.parallelism[Role.PREFILL] != c.parallelism[Role.DECODE]
        seconds = c.reshard_switch_time_s if reshard else c.switch_time_s
        return moved / self.n * in_flight * seconds

    def decide(self, current: int, fc: Forecast, backlog: float, context: float, turn_tokens: float,
               in_flight: int) -> Decision:
        costs = {k: self.cost(k, fc, backlog, context, turn_tokens) for k in self.candidates()}
        now_cost = costs.get(current, self.cost(current, fc, backlog, context, turn_tokens))
        best = min(costs, key=lambda k: (costs[k] + self.switch_cost(current, k, in_flight), k))
        gain = now_cost - costs[best] - self.switch_cost(current, best, in_flight)
        switch = best != current and gain > self.hysteresis * max(now_cost, 1e-9)
        return Decision(best if switch else current, costs, switch)
