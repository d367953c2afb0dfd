"""Statistics that workloads (fitting priors from a trace) and policies (learning online) share."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


# Student's t, 0.975 quantile (two-sided 95%) for 1-30 degrees of freedom: NIST/SEMATECH e-Handbook of
# Statistical Methods, section 1.3.6.7.2, "Critical values of the Student's t distribution".
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(df: int) -> float:
    """Student's t 0.975 quantile with `df` >= 1 degrees of freedom (the normal's 1.960 past 30): the
    half-width of a 95% interval of a mean, in standard errors, when the spread is estimated from the
    same few values."""
    if df < 1:
        raise ValueError(f"t975: degrees of freedom {df} < 1")
    return _T975[df - 1] if df <= len(_T975) else 1.960


def _variance_components(arrays: list[np.ndarray]) -> tuple[float, float, np.ndarray, np.ndarray] | None:
    """One-way random-effects ANOVA, method of moments for unequal group sizes (Searle, Casella &
    McCulloch, "Variance Components", 1992, sec. 3.6): (shared variance, within variance, group means,
    group sizes); None when the data cannot say (fewer than two groups, or no group with two values)."""
    k = len(arrays)
    sizes = np.array([len(a) for a in arrays], dtype=float)
    total = float(sizes.sum()) if k else 0.0
    if k < 2 or total - k < 1:
        return None
    means = np.array([a.mean() for a in arrays])
    grand = float((sizes * means).sum() / total)
    within = sum(float(((a - m) ** 2).sum()) for a, m in zip(arrays, means)) / (total - k)
    between = float((sizes * (means - grand) ** 2).sum()) / (k - 1)
    n0 = (total - float((sizes ** 2).sum()) / total) / (k - 1)
    return max((between - within) / n0, 0.0), within, means, sizes


def intraclass_correlation(groups: Iterable[Sequence[float]]) -> float | None:
    """The share of the variance of values that members of one group share (e.g. the log output
    lengths of one trajectory's turns). None when the data cannot say."""
    parts = _variance_components([np.asarray(g, dtype=float) for g in groups if len(g)])
    if parts is None or parts[0] + parts[1] <= 0:
        return None
    shared, within = parts[0], parts[1]
    return shared / (shared + within)


def size_level_correlation(groups: Iterable[Sequence[float]]) -> float | None:
    """The correlation of a group's log size with its shared level (e.g. a trajectory's log turn count
    with the shared part of its log output lengths): the covariance of log size and group mean (the
    own noise of a mean is independent of the size) over the spread of log sizes and the shared
    variance. None when the data cannot say (no shared variance, or every group the same size)."""
    parts = _variance_components([np.asarray(g, dtype=float) for g in groups if len(g)])
    if parts is None or parts[0] <= 0:
        return None
    shared, _, means, sizes = parts
    logs = np.log(sizes)
    var = float(logs.var(ddof=1))   # unbiased, as the shared variance is
    if var <= 0:
        return None
    cov = float(((logs - logs.mean()) * (means - means.mean())).sum()) / (len(logs) - 1)
    return float(np.clip(cov / np.sqrt(var * shared), -1.0, 1.0))


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares, exactly, for the few coefficients of a step-time fit: the optimum is
    the least-squares solution on its own support, so the best feasible one over every support is it
    (2^k least-squares solves; k <= 12 here). Why: a plain least-squares fit of noisy step times can
    make a coefficient negative (a step that gets faster with its batch), which the model then
    extrapolates from."""
    k = x.shape[1]
    if k > 12:
        raise ValueError(f"nnls: {k} coefficients; this exact solver is for a dozen at most")
    best, best_res = np.zeros(k), float(np.sum(y ** 2))
    for mask in range(1, 1 << k):
        cols = [j for j in range(k) if mask >> j & 1]
        theta = np.linalg.lstsq(x[:, cols], y, rcond=None)[0]
        if (theta < 0).any():
            continue
        res = float(np.sum((y - x[:, cols] @ theta) ** 2))
        if res < best_res - 1e-15 * max(best_res, 1.0):
            full = np.zeros(k)
            full[cols] = theta
            best, best_res = full, res
    return best
