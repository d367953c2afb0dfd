"""Statistics of generated trajectories, compared with the published figures a YAML lists as targets.

A YAML's `targets` maps a population to metrics to statistics:
    targets:
      success:                 # 'all', a turn-mode name, or mode names joined by '+'
        total_tokens: {p50: 16000, p90: 31600}   # SWE-Gym Table 8
Statistics: `mean`, `pNN` (percentile NN) and `below_X` (the fraction of values below X).
Tolerances are stated here, once, for tests and the card: they are about how well a lognormal fitted
to a few published percentiles can match them, not about sampling noise (samples are large).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from harness.trajectory import TrajectoryScript

TOLERANCE = {
    "center": 0.15,    # relative, for the mean and percentiles p10..p75
    "tail": 0.25,      # relative, for p90 and above (a lognormal fit's tail is its weakest part)
    "fraction": 0.05,  # absolute, for below_X fractions
}


def metric_values(scripts: Sequence[TrajectoryScript], metric: str) -> np.ndarray:
    """One value per trajectory (turns, prompt, totals) or per turn / per tool call (lengths, latency)."""
    if metric == "turns":
        return np.array([len(s.turns) for s in scripts], dtype=float)
    if metric == "prompt_tokens":
        return np.array([s.turns[0].new_tokens for s in scripts], dtype=float)
    if metric == "output_tokens":
        return np.array([t.output_tokens for s in scripts for t in s.turns], dtype=float)
    if metric == "tool_output_tokens":
        return np.array([t.new_tokens for s in scripts for t in s.turns[1:]], dtype=float)
    if metric == "tool_latency_s":
        return np.array([t.tool_latency_s for s in scripts for t in s.turns[:-1]], dtype=float)
    if metric == "generated_tokens":
        return np.array([sum(t.output_tokens for t in s.turns) for s in scripts], dtype=float)
    if metric == "total_tokens":
        return np.array([s.total_tokens for s in scripts], dtype=float)
    raise ValueError(f"unknown metric {metric!r}; allowed: {METRICS}")


METRICS = ("turns", "prompt_tokens", "output_tokens", "tool_output_tokens", "tool_latency_s",
           "generated_tokens", "total_tokens")


def statistic(values: np.ndarray, stat: str) -> float:
    if len(values) == 0:
        return float("nan")
    if stat == "mean":
        return float(values.mean())
    if stat.startswith("p"):
        return float(np.percentile(values, float(stat[1:])))
    if stat.startswith("below_"):
        return float((values < float(stat[len("below_"):])).mean())
    raise ValueError(f"unknown statistic {stat!r}; allowed: mean, pNN, below_X")


def within_tolerance(stat: str, generated: float, published: float) -> tuple[bool, str]:
    """Whether `generated` matches `published`, and the tolerance as text."""
    if stat.startswith("below_"):
        tol = TOLERANCE["fraction"]
        return abs(generated - published) <= tol, f"±{tol:g}"
    tol = TOLERANCE["tail"] if stat.startswith("p") and float(stat[1:]) >= 90 else TOLERANCE["center"]
    return abs(generated - published) <= tol * abs(published), f"±{tol:.0%}"


def population(labelled: Iterable[tuple[TrajectoryScript, str]], name: str) -> list[TrajectoryScript]:
    """The trajectories of a target population: 'all' or turn-mode names joined by '+'."""
    if name == "all":
        return [s for s, _ in labelled]
    wanted = set(name.split("+"))
    return [s for s, mode in labelled if mode in wanted]


def compare(labelled: list[tuple[TrajectoryScript, str]], targets: dict) -> list[dict]:
    """One row per published figure: population, metric, stat, generated, published, tolerance, ok."""
    rows = []
    for pop, metrics in targets.items():
        scripts = population(labelled, pop)
        if not scripts:
            raise ValueError(f"target population {pop!r} matches no trajectory (a mode name, '+'-joined, or 'all')")
        for metric, stats in metrics.items():
            values = metric_values(scripts, metric)
            for stat, published in stats.items():
                generated = statistic(values, stat)
                ok, tol = within_tolerance(stat, generated, float(published))
                rows.append(dict(population=pop, metric=metric, stat=stat, generated=generated,
                                 published=float(published), tolerance=tol, ok=ok))
    return rows
