"""The step-time model interface every part of the harness uses (the simulator's engines, the lower
bound, PEARL's model, calibration): the roofline model (roofline.py) and the model fitted to a real
engine's profile (profiled.py) both implement it, and `harness.cluster.parallel_cost_model` picks one
by `cluster.cost_model`.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np


def prefill_attn_ctx(new: float, cached: float) -> float:
    """The attention work of prefilling `new` tokens after `cached` ones: each new token attends to the
    cached ones and to the new ones before it, new * (cached + (new - 1) / 2) context tokens in all."""
    return new * (cached + (new - 1) / 2)


class CostModel(Protocol):
    """Times of engine steps and the KV memory of a rank, for one engine parallelism (`par`).

    A step's work per data-parallel attention rank is a RankBatch (roofline.py); the list forms
    (`mixed_step_time`, `decode_step_time`, `decode_span_ends`) give the same bits as building the
    batches, for the simulator's hot path."""

    par: object   # harness.perf.roofline.Parallelism

    def kv_capacity_tokens(self, memory_fraction: float, activation_reserve_bytes: float) -> int:
        """Tokens of KV one attention rank can hold."""

    def step_time(self, ranks: list, graph: bool = True) -> float:
        """One step over every rank's RankBatch (ranks with no work take part: DP attention)."""

    def mixed_step_time(self, seqs: list[int], ctx: list[int], prefill: list[tuple], graph: bool = True) -> float:
        """`step_time` of per-rank decodes (`seqs`, summed context `ctx`) and prefill chunks
        ((rank, tokens, attention context, KV read, requests), in rank order)."""

    def decode_step_time(self, seqs: list[int], ctx: list[int], graph: bool = True) -> float:
        """One decode-only step."""

    def decode_step_times(self, seqs: np.ndarray, ctx: np.ndarray, steps: int, graph: bool = True) -> np.ndarray:
        """`steps` consecutive decode-only steps of an unchanging batch (each adds seqs[r] to ctx[r])."""

    def decode_span_ends(self, seqs: list[int], ctx: list[int], steps: int, graph: bool, start: float) -> list[float]:
        """End times of `steps` decode-only steps from `start` (the cumulative sum of their times)."""
