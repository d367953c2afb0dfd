"""What a workload is to the driver: B prompts x G samples of trajectory scripts per RL step."""
from __future__ import annotations

from typing import Protocol

import numpy as np

from harness.trajectory import TrajectoryScript


class Workload(Protocol):
    name: str
    batch_size: int          # prompts per RL step
    group_size: int          # samples per prompt (a GRPO group)

    def batch(self, step: int) -> list[TrajectoryScript]:
        """The batch_size * group_size trajectories of RL step `step`, the same for a given seed."""
        ...


def step_rng(seed: int, step: int) -> np.random.Generator:
    """One independent stream per (seed, step), so step k's batch does not depend on earlier steps."""
    return np.random.default_rng([seed, step])


def lognormal(rng: np.random.Generator, median: float, sigma: float, size=None) -> np.ndarray:
    return median * np.exp(sigma * rng.standard_normal(size))
