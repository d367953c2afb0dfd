"""A simple synthetic multi-turn agent workload, for tests and the default experiment.

Every length is lognormal with a configured median and sigma; a per-prompt difficulty factor
(lognormal, `group_sigma`) scales the turn count and the output lengths of all samples of one
prompt, so a GRPO group is correlated as in real rollouts. `drift_per_step` multiplies output
lengths by (1 + drift)^step, so later RL steps decode more (as responses grow over training).
The numbers are illustrative, not a published workload (the real families are in their own modules).
`priors()` are the step-0 marginals: the difficulty factor multiplies the turn count and the output
length, so their log spread is sqrt(sigma^2 + group_sigma^2), and a trajectory's turns share the
difficulty's part of the output length's log variance (`output_shared`), which is correlated with the
log turn count by group_sigma / sqrt(group_sigma^2 + turns_sigma^2) (`turns_output_corr`); the samples
of one prompt share the difficulty's part of the log turn count's variance (`turns_group_corr`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.api import FamilyPriors, LogNormalPrior
from harness.trajectory import TrajectoryScript, TurnScript
from workloads.base import lognormal, step_rng


@dataclass
class SyntheticWorkload:
    name: str = "synthetic"
    family: str = "synthetic"
    seed: int = 0
    batch_size: int = 16
    group_size: int = 8
    turns_median: float = 6.0
    turns_sigma: float = 0.5
    max_turns: int = 20
    prompt_median: float = 1500.0
    prompt_sigma: float = 0.3
    output_median: float = 300.0
    output_sigma: float = 0.6
    tool_output_median: float = 800.0
    tool_output_sigma: float = 0.8
    tool_latency_median_s: float = 2.0
    tool_latency_sigma: float = 1.0
    group_sigma: float = 0.3
    context_cap: int = 32768
    max_output_tokens: int = 4096
    drift_per_step: float = 0.0

    def priors(self) -> dict[str, FamilyPriors]:
        return {self.family: FamilyPriors(
            prompt_tokens=LogNormalPrior(float(self.prompt_median), float(self.prompt_sigma)),
            output_tokens=LogNormalPrior(float(self.output_median), math.hypot(self.output_sigma, self.group_sigma)),
            tool_output_tokens=LogNormalPrior(float(self.tool_output_median), float(self.tool_output_sigma)),
            tool_latency_s=LogNormalPrior(float(self.tool_latency_median_s), float(self.tool_latency_sigma)),
            turns=LogNormalPrior(float(self.turns_median), math.hypot(self.turns_sigma, self.group_sigma)),
            max_turns=self.max_turns, context_cap=self.context_cap,
            output_shared=self.group_sigma ** 2 / (self.group_sigma ** 2 + self.output_sigma ** 2 or 1.0),
            # the level is the difficulty's log; the log turn count is the difficulty's plus its own
            turns_output_corr=self.group_sigma / (math.hypot(self.group_sigma, self.turns_sigma) or 1.0),
            turns_group_corr=self.group_sigma ** 2 / (self.group_sigma ** 2 + self.turns_sigma ** 2 or 1.0))}

    def batch(self, step: int) -> list[TrajectoryScript]:
        rng = step_rng(self.seed, step)
        growth = (1 + self.drift_per_step) ** step
        out = []
        n = self.batch_size * self.group_size
        for g in range(self.batch_size):
            difficulty = float(lognormal(rng, 1.0, self.group_sigma))
            prompt = max(1, int(lognormal(rng, self.prompt_median, self.prompt_sigma)))
            for i in range(self.group_size):
                turns = int(np.clip(round(lognormal(rng, self.turns_median * difficulty, self.turns_sigma)),
                                    1, self.max_turns))
                out.append(self._trajectory(rng, step * n + g * self.group_size + i, step * self.batch_size + g,
                                            step, prompt, turns, difficulty * growth))
        return out

    def _trajectory(self, rng, tid, gid, step, prompt, turns, scale) -> TrajectoryScript:
        outs = np.maximum(1, lognormal(rng, self.output_median * scale, self.output_sigma, turns).astype(int))
        outs = np.minimum(outs, self.max_output_tokens)
        tools = np.maximum(0, lognormal(rng, self.tool_output_median, self.tool_output_sigma, turns).astype(int))
        lat = lognormal(rng, self.tool_latency_median_s, self.tool_latency_sigma, turns)
        script, context = [], 0
        for k in range(turns):
            new = prompt if k == 0 else int(tools[k - 1])
            if context + new + outs[k] > self.context_cap:
                break  # the context cap ends the trajectory, as agent frameworks do
            script.append(TurnScript(new_tokens=new, output_tokens=int(outs[k]), tool_latency_s=float(lat[k])))
            context += new + int(outs[k])
        if not script:  # the prompt alone is at the cap: one turn with a truncated prompt
            script.append(TurnScript(new_tokens=min(prompt, self.context_cap - 1), output_tokens=1))
        return TrajectoryScript(trajectory_id=tid, group_id=gid, family=self.family, turns=tuple(script),
                                max_output_tokens=self.max_output_tokens, step=step)
