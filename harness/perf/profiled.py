"""A step-time model fitted to measured step times of a real engine (a profile file).

The profile is JSON: {"prefill": [{"new_tokens", "cached_tokens", "seconds"}, ...],
"decode": [{"batch", "context", "seconds"}, ...]}. Step time is fitted as DistServe's simulator
does (DistServe's simulator; docs/references.md, section 1): prefill a + b*tokens + c*attention context, decode d + e*batch +
f*summed context, every coefficient non-negative (harness.stats.nnls); a mixed step adds the prefill
and decode terms to the larger intercept.
Memory (KV capacity) still follows from the GPU and the model, as in the roofline model.
"""
from __future__ import annotations

import json

import numpy as np

from harness.perf.cost_model import prefill_attn_ctx
from harness.perf.catalogue import GPUSpec, ModelSpec
from harness.perf.roofline import Parallelism, PerfConstants, RankBatch, RooflineCostModel
from harness.stats import nnls


def fit_profile(profile: dict) -> dict[str, float]:
    pf = profile["prefill"]
    x = np.array([[1.0, r["new_tokens"], prefill_attn_ctx(r["new_tokens"], r["cached_tokens"])]
                  for r in pf])
    a, b, c = nnls(x, np.array([r["seconds"] for r in pf]))
    dc = profile["decode"]
    x = np.array([[1.0, r["batch"], r["batch"] * r["context"]] for r in dc])
    d, e, f = nnls(x, np.array([r["seconds"] for r in dc]))
    return {"prefill_base_s": a, "prefill_s_per_token": b, "prefill_s_per_attn_ctx": c,
            "decode_base_s": d, "decode_s_per_seq": e, "decode_s_per_ctx": f}


class ProfiledCostModel(RooflineCostModel):
    def __init__(self, coefficients: dict[str, float], model: ModelSpec, gpu: GPUSpec, perf: PerfConstants,
                 par: Parallelism):
        super().__init__(model, gpu, perf, par)
        self.k = coefficients

    @classmethod
    def from_file(cls, path: str, model: ModelSpec, gpu: GPUSpec, perf: PerfConstants,
                  par: Parallelism) -> ProfiledCostModel:
        with open(path) as f:
            return cls(fit_profile(json.load(f)), model, gpu, perf, par)

    def rank_time(self, b: RankBatch) -> float:
        k = self.k
        base = max(k["prefill_base_s"], k["decode_base_s"]) if b.prefill_tokens else k["decode_base_s"]
        return (base + k["prefill_s_per_token"] * b.prefill_tokens + k["prefill_s_per_attn_ctx"] * b.prefill_attn_ctx
                + k["decode_s_per_seq"] * b.decode_seqs + k["decode_s_per_ctx"] * b.decode_ctx)

    def step_time(self, ranks: list[RankBatch], graph: bool = True) -> float:
        """The profile measured the engine as it ran (graph or not): `graph` does not apply."""
        return max(self.rank_time(r) for r in ranks)

    def decode_step_times(self, seqs: np.ndarray, ctx: np.ndarray, steps: int, graph: bool = True) -> np.ndarray:
        k = self.k
        j = np.arange(steps, dtype=np.float64)[:, None]
        c = ctx[None, :].astype(np.float64) + j * seqs[None, :]
        t = k["decode_base_s"] + k["decode_s_per_seq"] * seqs[None, :] + k["decode_s_per_ctx"] * c
        return t.max(axis=1)

    def mixed_step_time(self, seqs: list[int], ctx: list[int], prefill: list[tuple], graph: bool = True) -> float:
        batches = [RankBatch(n, c, 0, 0.0, 0, n) for n, c in zip(seqs, ctx)]
        for r, tokens, attn_ctx, kv_read, requests in prefill:
            b = batches[r]
            b.prefill_tokens, b.prefill_attn_ctx, b.prefill_kv_read, b.requests = tokens, attn_ctx, kv_read, requests
        return self.step_time(batches, graph)

    def decode_step_time(self, seqs: list[int], ctx: list[int], graph: bool = True) -> float:
        """`decode_step_times(seqs, ctx, 1)[0]` for lists of ints, without numpy (the same bits)."""
        k = self.k
        return max(k["decode_base_s"] + k["decode_s_per_seq"] * float(n) + k["decode_s_per_ctx"] * float(c)
                   for n, c in zip(seqs, ctx))

    def decode_span_ends(self, seqs: list[int], ctx: list[int], steps: int, graph: bool, start: float) -> list[float]:
        times = self.decode_step_times(np.array(seqs), np.array(ctx), steps, graph)
        return np.cumsum(np.concatenate(([start], times)))[1:].tolist()
