"""The agent-rollout generator behind every scripted workload: `workload=search|search_long|swe|tooluse|
browse|reasoning` (the published families) and `workload=synthetic` (round illustrative numbers).

The families share one shape (docs/references.md, section 9): a trajectory is a chain of turns, each
a prefill of new context, a decode, then a tool call whose output is appended. They differ only in
numbers, so one generator reads them all from its YAML, and each YAML cites the rows it uses.

Per RL step, for each of the B prompts (a GRPO group of G samples):
- the prompt length is drawn once and shared by the whole group (the samples share the prompt);
- per-prompt scores z_g ~ N(0, 1), one for the turn count and one for the output length, are
  shared by the group: a sample draws each at sqrt(rho) z_g + sqrt(1 - rho) z_own, so the marginal
  of each quantity is exactly the configured lognormal and the within-group correlation of its log
  is rho (`group_corr`). The two scores are independent in the published families, so trajectory
  totals keep the spread of the turn count (the published fits give both the same sigma); with
  `group_score_corr` c they correlate (c = 1: one difficulty per prompt, whose samples get many turns
  *and* long answers together, as the synthetic workload has it);
- the turn count comes from a mixture of lognormal modes (e.g. SWE successes, early exits, failed
  long tails), picked per sample or per group (`turn_modes_per`: a task source such as tau2 vs
  BFCL is a property of the prompt, a failure is a property of the sample);
- per turn: output tokens (cut at `max_output_tokens`), tool output tokens (cut at the
  observation cap) and tool latency (a per-call mixture, e.g. fast local tools vs an LLM user
  simulator);
- drift: the medians of output length and turn count grow by (1 + rate)^step (responses and
  horizons grow over training, e.g. DeepResearcher's response 2k -> 5.5k).
The context cap ends a trajectory as agent frameworks do: the turn that reaches it has its output
cut to fit, and no turn's prompt + output exceeds the cap.

`priors()` gives a policy the configured distributions at step 0 (no drift), caps included. Turns
and tool latency are mixtures of modes; their prior keeps the components (e.g. tooluse's 20% of 3-s
user-simulator calls beside the 5-ms local tools) and, for models that take one lognormal, the
mixture's median and the spread of its log values (workloads.base.lognormal_mixture).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from harness.api import FamilyPriors
from harness.trajectory import TrajectoryScript, TurnScript
from workloads.base import (LogNormal, Mixture, Mode, from_config, group_id, mixture_group_corr, mixture_prior,
                            mixture_score_corr, modes_from_config, step_rng, trajectory_id)


@dataclass(frozen=True)
class Drift:
    """Growth per RL step of the output-length and turn-count medians (geometric)."""

    output_per_step: float = 0.0
    turns_per_step: float = 0.0

    def __post_init__(self):
        if self.output_per_step <= -1 or self.turns_per_step <= -1:
            raise ValueError(f"{self} is invalid; allowed: rates > -1")


@dataclass
class AgentWorkload:
    name: str
    family: str
    batch_size: int                 # prompts per RL step
    group_size: int                 # samples per prompt
    context_cap: int                # tokens; prompt + output of a turn never exceed it
    max_output_tokens: int          # per-turn output cap of the recipe
    max_turns: int                  # turn cap of the recipe
    prompt: LogNormal               # initial prompt tokens, shared by the group; `high` = prompt cap
    turns: tuple[Mode, ...]         # turns per trajectory, a mixture of modes
    output: LogNormal               # output tokens per turn (before max_output_tokens)
    tool_output: LogNormal          # tool output tokens per call; `high` = observation cap
    tool_latency: tuple[Mode, ...]  # seconds per call, a mixture of modes; a mode's `high` is a timeout
    seed: int = 0
    group_corr: float = 0.5
    group_score_corr: float = 0.0   # correlation of a prompt's turn-count and output-length scores
    turn_modes_per: str = "sample"  # sample | group
    drift: Drift = field(default_factory=Drift)
    targets: dict[str, Any] = field(default_factory=dict)  # published figures for tests and the card

    def __post_init__(self):
        self.prompt = from_config(LogNormal, self.prompt, "workload.prompt")
        self.output = from_config(LogNormal, self.output, "workload.output")
        self.tool_output = from_config(LogNormal, self.tool_output, "workload.tool_output")
        self.drift = from_config(Drift, self.drift, "workload.drift")
        self.turns = modes_from_config(self.turns, "workload.turns")
        self.tool_latency = modes_from_config(self.tool_latency, "workload.tool_latency")
        self._turn_modes, self._latency = Mixture(self.turns), Mixture(self.tool_latency)
        if not self.prompt.high < self.context_cap:
            raise ValueError(f"workload.prompt.high={self.prompt.high} must be below "
                             f"workload.context_cap={self.context_cap} (set the recipe's prompt cap)")
        self.targets = _plain(self.targets)

    def batch(self, step: int) -> list[TrajectoryScript]:
        return [script for script, _ in self.sample(step)]

    def priors(self) -> dict[str, FamilyPriors]:
        return {self.family: FamilyPriors(
            prompt_tokens=self.prompt.prior, output_tokens=self.output.prior,
            tool_output_tokens=self.tool_output.prior, tool_latency_s=mixture_prior(self.tool_latency),
            turns=mixture_prior(self.turns), max_turns=self.max_turns, context_cap=self.context_cap,
            output_shared=self.group_corr,   # every turn's output score has the group's sqrt(rho) z_g
            # the output level (sqrt(rho) x the output score) against the log turn count, whose score
            # loads sqrt(rho) x c on the output score
            turns_output_corr=mixture_score_corr(self.turns, self.group_score_corr * math.sqrt(self.group_corr)),
            turns_group_corr=mixture_group_corr(self.turns, self.group_corr, self.turn_modes_per == "group"))}

    def sample(self, step: int) -> list[tuple[TrajectoryScript, str]]:
        """The step's trajectories, each with the name of the turn mode it was drawn from."""
        rng = step_rng(self.seed, step)
        out = []
        for g in range(self.batch_size):
            z_group = rng.standard_normal(2)  # turn count, output length
            if self.group_score_corr:
                c = self.group_score_corr
                z_group[1] = c * z_group[0] + math.sqrt(1 - c * c) * z_group[1]
            prompt = int(min(max(1, round(float(self.prompt.at(rng.standard_normal())))), self.context_cap - 1))
            per_group = self.turn_modes_per == "group"
            group_mode = self._turn_modes.pick(rng) if per_group else None
            for i in range(self.group_size):
                mode = group_mode if per_group else self._turn_modes.pick(rng)
                tid = trajectory_id(step, self.batch_size, self.group_size, g * self.group_size + i)
                script = self._trajectory(rng, step, tid, group_id(step, self.batch_size, g), prompt, mode, z_group)
                out.append((script, mode.name))
        return out

    def _correlated(self, rng: np.random.Generator, z_group: float, size=None) -> np.ndarray:
        rho = self.group_corr
        return math.sqrt(rho) * z_group + math.sqrt(1 - rho) * rng.standard_normal(size)

    def _trajectory(self, rng, step: int, tid: int, gid: int, prompt: int, mode: Mode,
                    z_group: np.ndarray) -> TrajectoryScript:
        turns_scale = (1 + self.drift.turns_per_step) ** step
        output_scale = (1 + self.drift.output_per_step) ** step
        n = min(max(round(float(mode.dist.at(self._correlated(rng, z_group[0]), turns_scale))), 1), self.max_turns)
        # (np.minimum / np.maximum rather than np.clip, and lists rather than numpy scalars in the loop:
        # the same values, at a third of the cost per trajectory)
        outs = np.minimum(np.maximum(np.rint(self.output.at(self._correlated(rng, z_group[1], n), output_scale)), 1),
                          self.max_output_tokens).astype(int).tolist()
        tools = np.rint(self.tool_output.at(rng.standard_normal(n))).astype(int).tolist()
        lat = self._latency.draw(rng, n).tolist()
        script: list[TurnScript] = []
        context = 0
        for k in range(n):
            new = prompt if k == 0 else tools[k - 1]
            if context + new >= self.context_cap:
                break  # the tool output does not fit: the agent framework ends the trajectory
            output = min(outs[k], self.context_cap - context - new)
            script.append(TurnScript(new_tokens=new, output_tokens=output, tool_latency_s=lat[k]))
            context += new + output
            if output < outs[k]:
                break  # the output was cut at the context cap
        script[-1] = replace(script[-1], tool_latency_s=0.0)  # the last turn makes no tool call
        return TrajectoryScript(trajectory_id=tid, group_id=gid, family=self.family, turns=tuple(script),
                                max_output_tokens=self.max_output_tokens, step=step)


def _plain(value):
    """OmegaConf containers to plain dicts and lists, so targets compare and print simply."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
