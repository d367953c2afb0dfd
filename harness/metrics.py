"""Per-run metrics and the lower bound on rollout time.

lower_bound_s: no policy can finish faster on this cluster and workload, under the cost model's own
rates. For a set of trajectories released together it is the larger of
  - the critical path: the slowest trajectory run alone, with a perfect prefix cache (each turn
    prefills only the tokens the environment appended: the previous output's KV was written by its
    decode), on the fastest role parallelism,
    the prefill in one step, the decode at batch 1, plus its tool latencies; and
  - the work bound: all prefill tokens at the best per-engine prefill rate, or all decode tokens at
    the best per-engine decode rate (a full batch at zero context), spread over every engine.
sync: the sum of that bound over the RL steps; async: the bound over all trajectories at once, and
at least the slot bound: a trajectory holds one of the `max_in_flight` slots from its start to its
end, at least its critical path, so the run takes at least the summed critical paths / max_in_flight.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from itertools import chain

import numpy as np

from harness.cluster import ClusterConfig, parallel_cost_model
from harness.perf.cost_model import prefill_attn_ctx
from harness.perf.roofline import RankBatch
from harness.trajectory import TrajectoryScript


class LowerBound:
    def __init__(self, cluster: ClusterConfig):
        self.cluster = cluster
        self.models = [parallel_cost_model(cluster, p) for p in set(cluster.parallelism.values())]
        budget = cluster.prefill_budget
        self.prefill_rate = max(budget / m.step_time([RankBatch(prefill_tokens=budget, requests=1,
                                                               prefill_attn_ctx=prefill_attn_ctx(budget, 0),
                                                               prefill_kv_read=budget)]
                                                    + [RankBatch()] * (m.par.dp - 1))
                                for m in self.models)
        self._extend(1 << 16)
        seqs = cluster.max_num_seqs
        self.decode_rate = max(
            seqs * m.par.dp / float(m.decode_step_times(np.full(m.par.dp, seqs), np.zeros(m.par.dp), 1)[0])
            for m in self.models)

    def prefill_alone(self, new: int, cached: int) -> float:
        return min(m.step_time([RankBatch(prefill_tokens=new, prefill_attn_ctx=prefill_attn_ctx(new, cached),
                                          prefill_kv_read=cached + new, requests=1)]
                               + [RankBatch()] * (m.par.dp - 1)) for m in self.models)

    def decode_alone(self, context: int, steps: int) -> float:
        """Batch-1 decode of `steps` tokens from `context`: a difference of cumulative step times."""
        if steps <= 0:
            return 0.0
        end = context + steps
        if end >= len(self._cumulative[0]):
            self._extend(2 * end)
        return min(float(c[end] - c[context]) for c in self._cumulative)

    def _extend(self, length: int) -> None:
        self._cumulative = []
        for m in self.models:
            one = np.array([1] + [0] * (m.par.dp - 1))
            times = m.decode_step_times(one, np.zeros(m.par.dp), length)   # context j at step j
            self._cumulative.append(np.concatenate(([0.0], np.cumsum(times))))

    def critical_path(self, s: TrajectoryScript) -> float:
        t, context = 0.0, 0
        for k, turn in enumerate(s.turns):
            new = turn.new_tokens   # the previous output's KV was written by its decode
            t += self.prefill_alone(new, context)
            context += new
            t += self.decode_alone(context, turn.output_tokens - 1)
            context += turn.output_tokens
            if k + 1 < len(s.turns):
                t += turn.tool_latency_s
        return t

    def bound(self, scripts: Iterable[TrajectoryScript], max_in_flight: int = 0) -> float:
        """The larger of the work bound and the critical path; with `max_in_flight` (async), also the
        slot bound (the module's docstring). One pass: `scripts` may be generated as it goes."""
        prefill = decode = 0
        longest = paths = 0.0
        for s in scripts:
            prefill += sum(t.new_tokens for t in s.turns)
            decode += sum(t.output_tokens for t in s.turns)
            path = self.critical_path(s)
            longest, paths = max(longest, path), paths + path
        n = self.cluster.num_engines
        work = max(prefill / (n * self.prefill_rate), decode / (n * self.decode_rate))
        slots = paths / max_in_flight if max_in_flight else 0.0
        return max(work, longest, slots)


def lower_bound_s(cluster: ClusterConfig, batches: Iterable[list[TrajectoryScript]], mode: str,
                  max_in_flight: int = 0) -> float:
    """`batches`: the run's trajectories, one RL step's at a time (harness.rollout.run_batches);
    `max_in_flight`: the async cap on trajectories in flight (0: no slot bound)."""
    lb = LowerBound(cluster)
    if mode == "async":
        return lb.bound(chain.from_iterable(batches), max_in_flight)
    return sum(lb.bound(batch) for batch in batches)


def turn_latency_percentiles(df) -> dict[str, float]:
    """Per-turn latency: prompt ready to last token."""
    lat = (df["t_decode_end"] - df["t_ready"]).to_numpy()
    lat = lat[~np.isnan(lat)]
    if not len(lat):
        return {"turn_latency_p50_s": math.nan, "turn_latency_p90_s": math.nan, "turn_latency_p99_s": math.nan}
    p50, p90, p99 = np.percentile(lat, [50, 90, 99])
    return {"turn_latency_p50_s": float(p50), "turn_latency_p90_s": float(p90), "turn_latency_p99_s": float(p99)}
