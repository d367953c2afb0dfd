"""The serving benchmark's measurements (`mode=serve`): what `vllm bench serve` prints, from the lifecycle
and the simulated engines' token times.

Definitions, as vllm/benchmarks/serve.py `calculate_metrics` (vllm-project/vllm) computes them, times in
seconds here (vLLM prints ms):
- duration: from the benchmark's start to the last request's end (its `benchmark_duration`);
- request throughput: completed requests / duration; input, output and total tokens/s: the requests'
  prompt tokens, output tokens and their sum / duration; per GPU: over every GPU of the cluster;
- TTFT: from a request's send (after it got a `max_concurrency` slot: vLLM starts its timer inside the
  request function, under the semaphore) to its first token;
- TPOT: per request with more than one output token, (latency - TTFT) / (output tokens - 1);
- ITL: every gap between two successive tokens of one request, pooled over all requests (vLLM streams one
  token per chunk here: the simulator has no detokenizer batching);
- E2EL: from send to last token.
Percentiles are numpy's (linear interpolation), as vLLM's.

Token times come from the simulator (SimBackend.set_step_listener, SimEngine.token_steps): each step's
end is the time its tokens are out. A request preempted and recomputed keeps its tokens: the gap over
its recompute is one long ITL, as a client would see it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 99)


def check_serve(mode_name: str, workload, backend_name: str) -> None:
    """mode=serve needs single-turn requests with arrival times, and the simulator's token times; a
    serving workload needs mode=serve. A ValueError naming the key otherwise."""
    serving = hasattr(workload, "arrivals")
    if mode_name == "serve" and not serving:
        raise ValueError(f"workload={workload.name} is invalid with mode=serve; allowed: a single-turn workload "
                         "with arrival times (workload=requests)")
    if mode_name == "serve" and backend_name != "sim":
        raise ValueError(f"backend={backend_name} is invalid with mode=serve; allowed: sim (the token times "
                         "behind ITL are the simulator's)")


@dataclass
class TokenTimes:
    """Inter-token gaps of every request, from each simulated step's end (the listener of
    SimBackend.set_step_listener). A decode span's steps give every request in it the same gaps, kept
    once with their count."""
    last: dict[int, float] = field(default_factory=dict)   # trajectory -> time of its last token
    gaps: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)

    def on_step(self, engine, now: float) -> None:
        ends, requests = engine.token_steps(now)
        if not requests:
            return
        for s in requests:
            tid = s.request.trajectory_id
            before = self.last.get(tid)
            if before is not None:
                self.gaps.append(ends[0] - before)
                self.counts.append(1)
            self.last[tid] = ends[-1]
        if len(ends) > 1:
            self.gaps.extend(np.diff(ends).tolist())
            self.counts.extend([len(requests)] * (len(ends) - 1))

    def itl(self) -> np.ndarray:
        """Every inter-token latency, one per token after a request's first."""
        return np.repeat(np.asarray(self.gaps, dtype=float), np.asarray(self.counts, dtype=int))


def _stats(name: str, values: np.ndarray) -> dict[str, float]:
    """Mean and p50/p90/p99 of `values` (s); NaN where there are none."""
    if not len(values):
        return {f"{name}_mean_s": math.nan, **{f"{name}_p{p}_s": math.nan for p in PERCENTILES}}
    out = {f"{name}_mean_s": float(np.mean(values))}
    out.update({f"{name}_p{p}_s": float(v) for p, v in zip(PERCENTILES, np.percentile(values, PERCENTILES))})
    return out


def serve_metrics(df: pd.DataFrame, itl: np.ndarray, duration_s: float, num_gpus: int) -> dict[str, float]:
    """The benchmark's outputs from the lifecycle (one row per request), its ITLs, its duration and the
    cluster's GPUs (the module's docstring gives each definition)."""
    done = df[df["t_decode_end"].notna()]
    prompt, output = int(done["prompt_tokens"].sum()), int(done["output_tokens"].sum())
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: 0.0)
    out = {"requests_completed": len(done), "benchmark_duration_s": duration_s,
           "request_throughput_per_s": per_s(len(done)),
           "input_tokens_per_s": per_s(prompt), "output_tokens_per_s": per_s(output),
           "total_tokens_per_s": per_s(prompt + output)}
    for key in ("input_tokens_per_s", "output_tokens_per_s", "total_tokens_per_s"):
        out[key.replace("_per_s", "_per_s_per_gpu")] = out[key] / num_gpus
    ttft = (done["t_first_token"] - done["t_ready"]).to_numpy()
    e2el = (done["t_decode_end"] - done["t_ready"]).to_numpy()
    many = done[done["output_tokens"] > 1]
    tpot = ((many["t_decode_end"] - many["t_first_token"]) / (many["output_tokens"] - 1)).to_numpy()
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        out.update(_stats(name, values))
    out["itl_count"] = len(itl)   # the gaps behind the ITL figures: every token after a request's first
    return out
