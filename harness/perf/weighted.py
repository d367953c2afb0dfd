"""A step-time model where each simulated sequence stands for `weight` alike ones (a thinned simulation).

Prorsa's what-if simulates one live trajectory in `weight` (harness/prorsa/slice.py) so that a plan's
cost does not grow with the trajectories in flight. Its engines then run the same steps a full batch
would: a rank's decoding sequences, their context, its prefill tokens, their attention work and KV
reads, and its requests all count `weight` times, and a rank holds 1/`weight` of the KV tokens (the
scheduler's limits are divided likewise: `ClusterConfig.weighted`). Per rank, a thinned batch of n
sequences and a prefill chunk of c tokens is timed as the full batch of n x weight and c x weight.
"""
from __future__ import annotations

import numpy as np

from harness.perf.cost_model import CostModel
from harness.perf.roofline import RankBatch


class WeightedCostModel:
    def __init__(self, inner: CostModel, weight: int):
        self.inner, self.par, self.weight = inner, inner.par, weight

    def kv_capacity_tokens(self, memory_fraction: float, activation_reserve_bytes: float) -> int:
        return self.inner.kv_capacity_tokens(memory_fraction, activation_reserve_bytes) // self.weight

    def step_time(self, ranks: list, graph: bool = True) -> float:
        w = self.weight
        return self.inner.step_time([RankBatch(r.decode_seqs * w, r.decode_ctx * w, r.prefill_tokens * w,
                                               r.prefill_attn_ctx * w, r.prefill_kv_read * w, r.requests * w)
                                     for r in ranks], graph)

    def mixed_step_time(self, seqs: list[int], ctx: list[int], prefill: list[tuple], graph: bool = True) -> float:
        w = self.weight
        return self.inner.mixed_step_time([n * w for n in seqs], [c * w for c in ctx],
                                          [(r, t * w, a * w, kv * w, q * w) for r, t, a, kv, q in prefill], graph)

    def decode_step_time(self, seqs: list[int], ctx: list[int], graph: bool = True) -> float:
        w = self.weight
        return self.inner.decode_step_time([n * w for n in seqs], [c * w for c in ctx], graph)

    def decode_step_times(self, seqs: np.ndarray, ctx: np.ndarray, steps: int, graph: bool = True) -> np.ndarray:
        return self.inner.decode_step_times(seqs * self.weight, ctx * self.weight, steps, graph)

    def decode_span_ends(self, seqs: list[int], ctx: list[int], steps: int, graph: bool, start: float) -> list[float]:
        w = self.weight
        return self.inner.decode_span_ends([n * w for n in seqs], [c * w for c in ctx], steps, graph, start)
