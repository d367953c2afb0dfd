"""Statistics that workloads (fitting priors from a trace) and policies (learning online) share."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def intraclass_correlation(groups: Iterable[Sequence[float]]) -> float | None:
    """The share of the variance of values that members of one group share (e.g. the log output
    lengths of one trajectory's turns): one-way random-effects ANOVA, method of moments for unequal
    group sizes (Searle, Casella & McCulloch, "Variance Components", 1992, sec. 3.6). None when the
    data cannot say (fewer than two groups, or no group with two values)."""
    arrays = [np.asarray(g, dtype=float) for g in groups if len(g)]
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
    shared = max((between - within) / n0, 0.0)
    if shared + within <= 0:
        return None
    return shared / (shared + within)
