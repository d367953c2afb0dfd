"""Single-turn requests for the serving benchmark (`mode=serve workload=requests`), in the shape of
`vllm bench serve --dataset-name random` and SGLang's `bench_serving`: `num_requests` prompts of
`prompt_tokens` tokens, each asking for `output_tokens` tokens (fixed, or lognormal around those
medians with `prompt_sigma` / `output_sigma`), sent at Poisson arrival times.

Why a workload of its own: a serving benchmark has no tools, no turns and no GRPO groups, so the agent
generator's keys would all be placeholders. The driver still sees B x G trajectories of one RL step
(B = num_requests, G = 1), each a one-turn script, so routing, lifecycle and summaries stay the
rollout's own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.api import FamilyPriors, LogNormalPrior
from harness.trajectory import TrajectoryScript, TurnScript
from workloads.base import step_rng

# A separate stream for the arrival times (the lengths use step_rng(seed, 0)): the same lengths at
# every request rate, as `vllm bench serve` samples its requests before it times them.
ARRIVALS_STREAM = 1 << 20


@dataclass
class RequestsWorkload:
    name: str
    num_requests: int
    prompt_tokens: int              # median prompt length (the length itself when prompt_sigma is 0)
    output_tokens: int              # median output length (ignore_eos: exactly this many when sigma is 0)
    prompt_sigma: float = 0.0
    output_sigma: float = 0.0
    family: str = "requests"
    seed: int = 0

    def __post_init__(self):
        if self.num_requests < 1:
            raise ValueError(f"workload.num_requests={self.num_requests} is invalid; allowed: an integer >= 1")
        for key in ("prompt_tokens", "output_tokens"):
            if getattr(self, key) < 1:
                raise ValueError(f"workload.{key}={getattr(self, key)} is invalid; allowed: an integer >= 1")
        for key in ("prompt_sigma", "output_sigma"):
            if not getattr(self, key) >= 0:
                raise ValueError(f"workload.{key}={getattr(self, key)} is invalid; allowed: a number >= 0")

    # --- the Workload contract (workloads/base.py) ---------------------------------------------------
    @property
    def batch_size(self) -> int:
        return self.num_requests

    @property
    def group_size(self) -> int:
        return 1

    def batch(self, step: int) -> list[TrajectoryScript]:
        rng = step_rng(self.seed, step)
        prompts = self._lengths(rng, self.prompt_tokens, self.prompt_sigma)
        outputs = self._lengths(rng, self.output_tokens, self.output_sigma)
        first = step * self.num_requests
        return [TrajectoryScript(trajectory_id=first + i, group_id=first + i, family=self.family,
                                 turns=(TurnScript(new_tokens=p, output_tokens=o),), max_output_tokens=o, step=step)
                for i, (p, o) in enumerate(zip(prompts, outputs))]

    def priors(self) -> dict[str, FamilyPriors]:
        """One turn, no tool: what a policy may know before the first request."""
        return {self.family: FamilyPriors(
            prompt_tokens=LogNormalPrior(float(self.prompt_tokens), self.prompt_sigma),
            output_tokens=LogNormalPrior(float(self.output_tokens), self.output_sigma),
            tool_output_tokens=LogNormalPrior(0.0, 0.0), tool_latency_s=LogNormalPrior(0.0, 0.0),
            turns=LogNormalPrior(1.0, 0.0), max_turns=1,
            context_cap=max(s.total_tokens for s in self.batch(0)))}

    # --- the serving benchmark ------------------------------------------------------------------------
    def arrivals(self, request_rate: float) -> list[float]:
        """Send times (s) of the requests at `request_rate` per second, in request order: all at 0 for
        `inf`, else a Poisson process (exponential gaps) scaled so the last one is at
        num_requests / request_rate, as vllm/benchmarks/serve.py get_request does (burstiness 1; it
        rescales the cumulative delays to close the 1-2% gap between seeds)."""
        if not request_rate > 0:
            raise ValueError(f"mode.request_rate={request_rate} is invalid; allowed: a number > 0 or inf")
        if math.isinf(request_rate):
            return [0.0] * self.num_requests
        gaps = np.random.default_rng([self.seed, ARRIVALS_STREAM]).exponential(1.0 / request_rate, self.num_requests)
        t = np.cumsum(gaps)
        return (t * (self.num_requests / request_rate / t[-1])).tolist()

    def _lengths(self, rng: np.random.Generator, median: int, sigma: float) -> list[int]:
        if sigma == 0:
            return [median] * self.num_requests
        return np.maximum(np.rint(median * np.exp(sigma * rng.standard_normal(self.num_requests))), 1).astype(int).tolist()
