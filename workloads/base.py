"""What a workload is to the driver: B prompts x G samples of trajectory scripts per RL step, and
to a policy: cold-start priors per task family (`priors()`, harness.api.FamilyPriors).

Also the small distribution types every generator's config is made of, so a YAML reads the same
across families: a `LogNormal` (median, sigma, optional cap) and a `Mode` (one weighted component
of a mixture, e.g. successful vs failed SWE trajectories, local tools vs an LLM user simulator).
A prior is a lognormal per quantity with its cap; a mixture of modes keeps its components.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from functools import cached_property
from statistics import NormalDist
from typing import Protocol

import numpy as np

from harness.api import FamilyPriors, LogNormalPrior
from harness.trajectory import TrajectoryScript


class Workload(Protocol):
    name: str
    batch_size: int          # prompts per RL step
    group_size: int          # samples per prompt (a GRPO group)

    def batch(self, step: int) -> list[TrajectoryScript]:
        """The batch_size * group_size trajectories of RL step `step`, the same for a given seed."""
        ...

    def priors(self) -> dict[str, FamilyPriors]:
        """Cold-start priors of every family the workload can draw: what a policy may know of the
        distributions before any trajectory runs (RunInfo), never the scripts themselves."""
        ...


def step_rng(seed: int, step: int) -> np.random.Generator:
    """One independent stream per (seed, step), so step k's batch does not depend on earlier steps."""
    return np.random.default_rng([seed, step])


def trajectory_id(step: int, batch_size: int, group_size: int, index: int) -> int:
    """Ids unique across steps: step * B*G + index within the step."""
    return step * batch_size * group_size + index


def group_id(step: int, batch_size: int, group: int) -> int:
    return step * batch_size + group


@dataclass(frozen=True)
class LogNormal:
    """A positive quantity with a long right tail; `high` is the recipe's cap (values above are cut)."""

    median: float
    sigma: float
    high: float = math.inf

    def __post_init__(self):
        if not (self.median > 0 and self.sigma >= 0 and self.high > 0):
            raise ValueError(f"{self} is invalid; allowed: median > 0, sigma >= 0, high > 0")

    def at(self, z: np.ndarray | float, scale: float = 1.0) -> np.ndarray:
        """The value at standard-normal score `z` (so callers can correlate draws), median scaled."""
        return np.minimum(self.median * scale * np.exp(self.sigma * np.asarray(z)), self.high)

    @property
    def prior(self) -> LogNormalPrior:
        return LogNormalPrior(float(self.median), float(self.sigma), float(self.high))


@dataclass(frozen=True)
class Mode:
    """One component of a mixture: a share `weight` of the population, lognormal within it."""

    name: str
    weight: float
    median: float
    sigma: float
    high: float = math.inf

    def __post_init__(self):
        if not self.weight >= 0:
            raise ValueError(f"mode {self.name!r}: weight={self.weight} is invalid; allowed: >= 0")
        LogNormal(self.median, self.sigma, self.high)

    @cached_property
    def dist(self) -> LogNormal:
        """(Built once: a trajectory's turn count is drawn from it.)"""
        return LogNormal(self.median, self.sigma, self.high)


def from_config(cls, value, where: str):
    """Build a config dataclass from a YAML mapping, naming the key on a typo or a bad value."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}={value!r} is invalid; allowed: a mapping with keys "
                         f"{[f.name for f in fields(cls)]}")
    allowed = {f.name for f in fields(cls)}
    unknown = set(value) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    try:
        return cls(**dict(value))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def modes_from_config(value, where: str) -> tuple[Mode, ...]:
    modes = tuple(from_config(Mode, m, f"{where}[{i}]") for i, m in enumerate(value))
    if not modes or sum(m.weight for m in modes) <= 0:
        raise ValueError(f"{where}: need at least one mode with weight > 0")
    if len({m.name for m in modes}) != len(modes):
        raise ValueError(f"{where}: mode names must be distinct, got {[m.name for m in modes]}")
    return modes


def _mixture_logs(modes: tuple[Mode, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, float]:
    """A mixture of lognormal modes in log space: weights (summing to 1), log medians, sigmas, and the
    mean and variance of the log value (within and between modes)."""
    w = np.array([m.weight for m in modes], dtype=float)
    w = w / w.sum()
    mu = np.log([m.median for m in modes])
    s = np.array([m.sigma for m in modes], dtype=float)
    mean = float(w @ mu)
    return w, mu, s, mean, float(w @ (s ** 2 + mu ** 2)) - mean ** 2


def mixture_group_corr(modes: tuple[Mode, ...], rho: float, per_group: bool) -> float:
    """The within-group correlation of the log of a value drawn from a mixture of lognormal modes with
    the score sqrt(rho) z_group + sqrt(1 - rho) z_own (caps and rounding ignored): with the mode picked
    per sample, two samples share only the score, rho (sum w sigma)^2; picked per group they also share
    the mode, sum w (log median^2 + rho sigma^2) - (sum w log median)^2; over the mixture's variance."""
    w, mu, s, mean, var = _mixture_logs(modes)
    if var <= 0:
        return 0.0
    cov = float(w @ (mu ** 2 + rho * s ** 2)) - mean ** 2 if per_group else rho * float(w @ s) ** 2
    return cov / var


def mixture_score_corr(modes: tuple[Mode, ...], loading: float) -> float:
    """The correlation of a standard-normal score Z with the log of a value drawn from a mixture of
    lognormal modes (picked apart from Z) at a score that loads `loading` on Z (caps and rounding
    ignored): loading x (sum w sigma) over the mixture's log spread; `loading` for one mode."""
    w, _, s, _, var = _mixture_logs(modes)
    return loading * float(w @ s) / math.sqrt(var) if loading and var > 0 else 0.0


def mixture_prior(modes: tuple[Mode, ...]) -> LogNormalPrior:
    """The modes' mixture as a prior: its components (with their caps) in `parts`, and one lognormal
    standing in for the whole (lognormal_mixture) for models that take a single one."""
    parts = tuple((float(m.weight), m.dist.prior) for m in modes if m.weight > 0)
    if len(parts) == 1:
        return parts[0][1]
    whole = lognormal_mixture(parts)
    return LogNormalPrior(whole.median, whole.sigma, parts=parts)


def lognormal_mixture(parts: Iterable[tuple[float, LogNormalPrior]]) -> LogNormalPrior:
    """One lognormal standing in for a weighted mixture of lognormals: the mixture's median, and the
    standard deviation of its log values (within and between components). A mixture is not lognormal;
    this keeps its middle and its spread, which is what a cold-start prior needs, and a single
    component (weight > 0) is returned as it is."""
    parts = [(float(w), p) for w, p in parts if w > 0]
    if not parts:
        raise ValueError("a mixture needs at least one component with weight > 0")
    if len(parts) == 1:
        return parts[0][1]
    w = np.array([x for x, _ in parts]) / sum(x for x, _ in parts)
    mu = np.log([p.median for _, p in parts])
    s = np.array([p.sigma for _, p in parts])
    mean = float(w @ mu)
    sigma = math.sqrt(max(float(w @ (s ** 2 + mu ** 2)) - mean ** 2, 0.0))

    def cdf(x: float) -> float:   # of the log value; a component with sigma 0 is a step
        return sum(wi * (NormalDist(m, si).cdf(x) if si > 0 else float(x >= m)) for wi, m, si in zip(w, mu, s))

    lo, hi = float(np.min(mu - 10 * s)), float(np.max(mu + 10 * s))
    for _ in range(100):   # bisection for the log median, to float precision
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if cdf(mid) >= 0.5 else (mid, hi)
    return LogNormalPrior(math.exp(hi), sigma)


def fit_lognormal(values: Iterable[float]) -> LogNormalPrior:
    """The lognormal of observed values: their median and the standard deviation of their logs. Zeros
    (a tool that returned nothing) count in the median but have no log; no values at all (a family
    that never calls a tool) give a point mass at 0, which is what was seen. Where the logs are
    clearly multimodal (a mixture of up to MAX_PARTS normals in log space beats one by BIC; fitted
    only when no value is 0), the mixture's components are kept in `parts`, so a sampler draws from
    the modes; `median` and `sigma` stay the data's own. Why: one lognormal through bimodal values
    (tool calls of ~60 tokens and analyses of ~900, 70:30) has their median but half their mean
    (175 against 352 tokens), and a plan fed it saw half the decode work of a sync step."""
    v = np.asarray(list(values), dtype=float)
    if not len(v):
        return LogNormalPrior(0.0, 0.0)
    positive = v[v > 0]
    sigma = float(np.log(positive).std()) if len(positive) > 1 else 0.0
    parts = log_mixture(np.log(v)) if len(positive) == len(v) and sigma > 0 else ()
    return LogNormalPrior(float(np.median(v)), sigma, parts=parts)


MAX_PARTS = 3          # mixture components tried in log space (fit_lognormal)
MIN_PART_SIGMA = 0.05  # a component's floor: integer values (turn counts) would otherwise make spikes
MIN_MIXTURE_VALUES = 50


def log_mixture(x: np.ndarray) -> tuple[tuple[float, LogNormalPrior], ...]:
    """Components (weight, lognormal) of the Gaussian mixture of log values `x` with the lowest BIC,
    1 to MAX_PARTS components; () when one component is best or there are too few values to tell."""
    n = len(x)
    if n < MIN_MIXTURE_VALUES:
        return ()
    one = (np.ones(1), np.array([x.mean()]), np.array([max(x.std(), MIN_PART_SIGMA)]))
    best, best_bic = (), -2 * _normal_loglik(x, *one) + 2 * math.log(n)
    for k in range(2, MAX_PARTS + 1):
        fit = _em(x, k)
        if fit is None:
            continue
        bic = -2 * _normal_loglik(x, *fit) + (3 * k - 1) * math.log(n)
        if bic < best_bic:
            w, mu, sd = fit
            best_bic = bic
            best = tuple((float(w[i]), LogNormalPrior(float(math.exp(mu[i])), float(sd[i]))) for i in np.argsort(mu))
    return best


def _em(x: np.ndarray, k: int, iterations: int = 200) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """EM for a `k`-component Gaussian mixture of `x`, started from an equal-count split of the sorted
    values (deterministic); None when a component empties."""
    chunks = np.array_split(np.sort(x), k)
    w = np.full(k, 1 / k)
    mu = np.array([c.mean() for c in chunks])
    sd = np.array([max(c.std(), MIN_PART_SIGMA) for c in chunks])
    for _ in range(iterations):
        dens = w * np.exp(-0.5 * ((x[:, None] - mu) / sd) ** 2) / sd
        resp = dens / np.maximum(dens.sum(axis=1, keepdims=True), 1e-300)
        nk = resp.sum(axis=0)
        if (nk < 1).any():
            return None
        w_new, mu_new = nk / len(x), (resp * x[:, None]).sum(axis=0) / nk
        sd = np.maximum(np.sqrt((resp * (x[:, None] - mu_new) ** 2).sum(axis=0) / nk), MIN_PART_SIGMA)
        converged = np.abs(mu_new - mu).max() < 1e-6 and np.abs(w_new - w).max() < 1e-6
        w, mu = w_new, mu_new
        if converged:
            break
    return w, mu, sd


def _normal_loglik(x: np.ndarray, w: np.ndarray, mu: np.ndarray, sd: np.ndarray) -> float:
    dens = w * np.exp(-0.5 * ((x[:, None] - mu) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))
    return float(np.log(np.maximum(dens.sum(axis=1), 1e-300)).sum())


class Mixture:
    """Draws from a mixture of modes, its arrays built once (a trajectory draws from it per turn).
    A pick is numpy's `Generator.choice(len(modes), p=weights)` written out: the same uniform draw
    and the same search of the normalised cumulative weights, so the same numbers, without choice's
    per-call checks (about a quarter of generating a batch)."""

    def __init__(self, modes: tuple[Mode, ...]):
        self.modes = modes
        w = np.array([m.weight for m in modes], dtype=float)
        cdf = (w / w.sum()).cumsum()   # choice's: the probabilities' cumulative sum, over its last value
        cdf /= cdf[-1]
        self.cdf = cdf
        self.median = np.array([m.median for m in modes])
        self.sigma = np.array([m.sigma for m in modes])
        self.high = np.array([m.high for m in modes])

    def pick(self, rng: np.random.Generator) -> Mode:
        """One mode, picked by weight."""
        return self.modes[int(self.cdf.searchsorted(rng.random(), side="right"))]

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """`size` independent draws, each from a mode picked by weight."""
        pick = self.cdf.searchsorted(rng.random(size), side="right")
        return np.minimum(self.median[pick] * np.exp(self.sigma[pick] * rng.standard_normal(size)), self.high[pick])
