"""A step-time model off by known factors: a planning model that differs from the world it plans for.

Prorsa's what-if times steps with its own model (`policy.model`); scaling that model's prefill and
decode times is how a robustness study makes it wrong on purpose (the measured H200 MoE prefill ran at
1.3-1.9x the roofline's time: docs/calibration.md). A step's decode part is the same step without its
prefill chunks; `prefill_scale` multiplies what the prefill adds to it, `decode_scale` the rest.
"""
from __future__ import annotations

import numpy as np

from harness.perf.cost_model import CostModel
from harness.perf.roofline import RankBatch


class ScaledCostModel:
    def __init__(self, inner: CostModel, prefill_scale: float, decode_scale: float):
        self.inner, self.par = inner, inner.par
        self.prefill_scale, self.decode_scale = prefill_scale, decode_scale

    def kv_capacity_tokens(self, memory_fraction: float, activation_reserve_bytes: float) -> int:
        return self.inner.kv_capacity_tokens(memory_fraction, activation_reserve_bytes)

    def _scaled(self, total: float, decode: float) -> float:
        return self.decode_scale * decode + self.prefill_scale * max(total - decode, 0.0)

    def step_time(self, ranks: list, graph: bool = True) -> float:
        decode_only = [RankBatch(r.decode_seqs, r.decode_ctx, requests=r.decode_seqs) for r in ranks]
        # a step that prefills runs eagerly (no CUDA graph): its decode part is timed so too
        decode_graph = graph and not any(r.prefill_tokens for r in ranks)
        return self._scaled(self.inner.step_time(ranks, graph), self.inner.step_time(decode_only, decode_graph))

    def mixed_step_time(self, seqs: list[int], ctx: list[int], prefill: list[tuple], graph: bool = True) -> float:
        decode_graph = graph and not any(chunk[1] for chunk in prefill)
        return self._scaled(self.inner.mixed_step_time(seqs, ctx, prefill, graph),
                            self.inner.decode_step_time(seqs, ctx, decode_graph))

    def decode_step_time(self, seqs: list[int], ctx: list[int], graph: bool = True) -> float:
        return self.decode_scale * self.inner.decode_step_time(seqs, ctx, graph)

    def decode_step_times(self, seqs: np.ndarray, ctx: np.ndarray, steps: int, graph: bool = True) -> np.ndarray:
        return self.decode_scale * self.inner.decode_step_times(seqs, ctx, steps, graph)

    def decode_span_ends(self, seqs: list[int], ctx: list[int], steps: int, graph: bool, start: float) -> list[float]:
        return [start + self.decode_scale * (t - start)
                for t in self.inner.decode_span_ends(seqs, ctx, steps, graph, start)]
