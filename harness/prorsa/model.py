"""What Prorsa plans with, which may differ from the world it plans for: the step-time model of its
what-if simulations (`policy.model`) and its cold-start priors (`policy.priors`).

By default both are the world's own (the cluster's cost model, the workload's priors), which no real
deployment has. `policy.model` times the what-if's steps with another cost model, profile, constants or
factors on prefill and decode step times (harness/perf/scaled.py; the world's are the cluster's
`prefill_time_scale` and `decode_time_scale`); `policy.priors: none` replaces the
workload's priors with one neutral prior for every family, so that the plans learn only from what the
run shows. Configuration the trainer knows stays: the turn cap, the context cap, the declared task mix.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace

from harness.api import FamilyPriors, LogNormalPrior, RunInfo
from harness.cluster import ClusterConfig, perf_constants
from harness.perf.profiled import fit_profile

# The neutral prior: one wide lognormal per quantity, the same for every family, at the order of
# magnitude of an agent turn (a few thousand prompt tokens, hundreds of output tokens, seconds of tool
# call, a handful of turns). sigma 1.0 spans 0.14x-7x of the median at 95%: a belief that says little.
NEUTRAL_SIGMA = 1.0
NEUTRAL = {"prompt_tokens": 2000.0, "output_tokens": 500.0, "tool_output_tokens": 1000.0,
           "tool_latency_s": 2.0, "turns": 4.0}


@dataclass(frozen=True)
class PlanningModel:
    """`policy.model`: null fields take the cluster's own."""
    cost_model: str | None = None         # roofline | profiled
    profile: str | None = None            # a profile file (cost_model=profiled)
    perf: Mapping[str, float] | None = None   # cost-model constants over perf.yaml's ({}: perf.yaml's own)
    prefill_scale: float | None = None    # factor on the cost model's prefill step times (cluster.prefill_time_scale)
    decode_scale: float | None = None     # ... decode (cluster.decode_time_scale)

    @classmethod
    def of(cls, node: Mapping | None) -> PlanningModel:
        return cls(**dict(node or {}))

    def cluster(self, world: ClusterConfig) -> ClusterConfig:
        """The cluster the what-if simulates: the world's, its step times as this model says."""
        cost_model = self.cost_model or world.cost_model
        profile = self.profile if self.profile is not None else world.profile
        if cost_model == "profiled":
            _check_profile(profile)
        perf = world.perf if self.perf is None else perf_constants(self.perf, "policy.model.perf")
        return replace(world, cost_model=cost_model, profile=profile, perf=perf, contended_profile=None,
                       prefill_time_scale=_own(self.prefill_scale, world.prefill_time_scale),
                       decode_time_scale=_own(self.decode_scale, world.decode_time_scale))


def _own(value: float | None, world: float) -> float:
    return world if value is None else value


def _check_profile(path: str | None) -> None:
    """The profile file exists and fits (harness/perf/profiled.py), or a message naming the key."""
    if not path:
        raise ValueError(f"policy.model.profile={path!r} is invalid; allowed: a profile file path "
                         "(policy.model.cost_model=profiled)")
    try:
        with open(path) as f:
            fit_profile(json.load(f))
    except OSError as exc:
        raise ValueError(f"policy.model.profile={path!r} is invalid; allowed: an existing profile file "
                         f"({exc.strerror})") from None
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"policy.model.profile={path!r} is invalid; allowed: a profile file with prefill and "
                         f"decode rows (python -m harness.calibrate writes one): {type(exc).__name__} {exc}") from None


def with_priors(run: RunInfo, priors: str) -> RunInfo:
    """The run as Prorsa is told it: `workload` the workload's priors, `none` the neutral one."""
    if priors == "workload":
        return run
    return replace(run, priors={f: neutral(p) for f, p in run.priors.items()})


def neutral(p: FamilyPriors) -> FamilyPriors:
    """The neutral prior of a family, within the recipe's turn and context caps."""
    def prior(name: str, high: float) -> LogNormalPrior:
        return LogNormalPrior(min(NEUTRAL[name], high), NEUTRAL_SIGMA, high)
    cap = float(p.context_cap)
    return FamilyPriors(prompt_tokens=prior("prompt_tokens", cap), output_tokens=prior("output_tokens", cap),
                        tool_output_tokens=prior("tool_output_tokens", cap),
                        tool_latency_s=prior("tool_latency_s", float("inf")),
                        turns=prior("turns", float(p.max_turns)), max_turns=p.max_turns, context_cap=p.context_cap)
