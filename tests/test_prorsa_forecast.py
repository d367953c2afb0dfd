"""Another forecast plugged into Prorsa (docs/prorsa.md, "Plugging in another forecast"): a subclass
overrides `Prorsa.future_model`, and the plans of a simulated rollout run on the futures it returns."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from harness.prorsa.forecast import FutureModel, FutureTrajectory, FutureTurn
from harness.prorsa.policy import Prorsa
from tests.conftest import policy_of, scripts_of, simulate

SMALL = ["workload=synthetic", "workload.batch_size=6", "workload.group_size=4", "mode=sync", "mode.num_steps=2"]


class OneTurn:
    """A trivial forecast: a live trajectory ends with its next turn (as the wrapped model samples it), a
    new one is one turn of fixed size in the family the mix weighs most. The per-family distributions
    the policy reads are the wrapped model's."""

    PROMPT, OUTPUT = 500, 200

    def __init__(self, base: FutureModel):
        self.base = base
        self.turns, self.outputs, self.tool_latency = base.turns, base.outputs, base.tool_latency
        self.calls = {"live": 0, "new": 0}

    def live(self, now, tracker, prefix, tpot, rng, routes=None, keep=None) -> list[FutureTrajectory]:
        self.calls["live"] += 1
        futures = self.base.live(now, tracker, prefix, tpot, rng, routes, keep)
        return [replace(ft, turns=[replace(ft.turns[0], tool_latency_s=0.0)]) for ft in futures]

    def new(self, families, weights, count, first_id, rng, group_size=1) -> list[FutureTrajectory]:
        self.calls["new"] += 1
        family = families[int(np.argmax(weights))]
        return [FutureTrajectory(first_id + i, family, 0.0, [FutureTurn(self.PROMPT, 0, self.OUTPUT, 0.0)])
                for i in range(count)]

    def each_family_alone(self, families, count, first_id, rng) -> list[list[FutureTrajectory]]:
        return [self.new(families, [float(f == g) for g in families], count, first_id, rng) for f in families]


class OneTurnProrsa(Prorsa):
    """Prorsa with the trivial forecast; every model it made is kept, to count their calls."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.models: list[OneTurn] = []

    def future_model(self, now: float, whole_run: bool = False) -> FutureModel:
        self.models.append(OneTurn(super().future_model(now, whole_run)))
        return self.models[-1]


def run(**overrides) -> tuple[Prorsa, object, object]:
    """A rollout of SMALL with Prorsa as configs/policy/prorsa.yaml builds it, with `overrides`."""
    policy = policy_of("prorsa", plan_workers=1, **overrides)
    result, df, _ = simulate(SMALL, policy=policy)
    return policy, result, df


def mean_prefill_forecast(policy: Prorsa) -> float:
    """The prompt tokens a forecast predicts to become ready over its horizon, on average over the run's."""
    return float(np.mean([fc.prefill_tokens.sum() for fc in policy.forecast_log.history]))


def test_a_trivial_forecast_plugs_in_and_drives_the_plans():
    """The plans sample the trivial model (live and new trajectories), the rollout completes every
    trajectory, and its forecasts differ from the default model's: with no turn after the next, they
    expect fewer prompt tokens to become ready."""
    trivial, result, df = run(_target_=f"{__name__}.OneTurnProrsa")
    assert sum(m.calls["live"] for m in trivial.models) > 0 and sum(m.calls["new"] for m in trivial.models) > 0
    scripts = scripts_of(SMALL)
    assert result.trajectories == len(scripts) and df["t_decode_end"].notna().all()
    assert len(df) == sum(len(s.turns) for s in scripts)
    default, _, _ = run()
    assert trivial.forecast_log.history and default.forecast_log.history
    assert mean_prefill_forecast(trivial) < mean_prefill_forecast(default)
