"""Per-family distributions from observations that are partly still running (right-censored).

Why: what has finished early in a phase is biased short. The first trajectories to end are the ones
with few turns, the first outputs to finish are the short ones; sampling futures from them alone
predicts that the live work ends too soon (at a phase start, every live trajectory would be "about to
end"). The product-limit (Kaplan-Meier) estimator counts each live trajectory as known to last at least
as long as it has so far, which removes that bias; the mass it cannot place (beyond the last observed
end) comes from the workload's prior conditioned above it.
"""
from __future__ import annotations

import numpy as np

POINTS = 1000   # quantile points that represent an estimated distribution (sorted)


def product_limit(events: np.ndarray, censored: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """Sorted quantile points of the product-limit estimate from observed values (`events`) and values
    known to be at least `censored`; the survival left after the largest event is spread over the
    sorted `prior` points above it (or put at the largest value seen, if the prior has none)."""
    events = np.sort(np.asarray(events, dtype=float))
    censored = np.asarray(censored, dtype=float)
    if not len(censored) or not len(events):
        return events if len(events) else np.sort(np.asarray(prior, dtype=float))
    values, ends = np.unique(events, return_counts=True)
    everything = np.sort(np.concatenate([events, censored]))
    at_risk = len(everything) - np.searchsorted(everything, values, side="left")
    survival = np.cumprod(1.0 - ends / at_risk)
    mass = -np.diff(np.concatenate([[1.0], survival]))
    tail = survival[-1]
    if tail > 0:
        above = prior[prior > values[-1]]
        if not len(above):
            above = np.array([max(values[-1], censored.max())])
        values = np.concatenate([values, above])
        mass = np.concatenate([mass, np.full(len(above), tail / len(above))])
    cdf = np.cumsum(mass)
    q = (np.arange(POINTS) + 0.5) / POINTS * cdf[-1]
    return values[np.minimum(np.searchsorted(cdf, q), len(values) - 1)]
