"""Prorsa's wall time against colocation's, per experiment and seed, from a reproduce.sh output directory
(each run's summary.json: `wall_time_s` covers the start plan; `plans`, `plan_cpu_s_p50`).

  python scripts/wall_time.py [OUT]     (OUT defaults to results/reproduce; prints a Markdown table)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).parent.parent))
from harness.report import find_runs  # noqa: E402


def runs(out: Path) -> pd.DataFrame:
    """Colocation's and Prorsa's complete runs, by the sweep directory they are in; a run that sets any
    `policy.` key (an ablation, a variant) is not the default policy and is left out."""
    rows = []
    for r in find_runs([out]):
        s = r.summary
        if not r.complete or s["policy"] not in ("colocate", "prorsa") or \
                any(o.lstrip("+~").startswith("policy.") for o in r.overrides):
            continue
        rows.append({"experiment": r.path.relative_to(out).parts[0], "seed": s["seed"], "policy": s["policy"],
                     "wall_time_s": s["wall_time_s"], "plans": s.get("plans", 0),
                     "plan_cpu_s_p50": s.get("plan_cpu_s_p50", 0.0)})
    return pd.DataFrame(rows, columns=["experiment", "seed", "policy", "wall_time_s", "plans", "plan_cpu_s_p50"])


def table(out: Path) -> str:
    df = runs(out)
    colocate = df[df.policy == "colocate"].drop(columns=["policy", "plans", "plan_cpu_s_p50"])
    both = df[df.policy == "prorsa"].merge(colocate, on=["experiment", "seed"], suffixes=("", "_colocate"))
    lines = ["| experiment | seed | colocate wall s | Prorsa wall s | ratio | Prorsa plans | CPU-s per plan (p50) |",
             "|---|---|---|---|---|---|---|"]
    for r in both.sort_values(["experiment", "seed"]).itertuples():
        lines.append(f"| {r.experiment} | {r.seed} | {r.wall_time_s_colocate:.1f} | {r.wall_time_s:.1f} "
                     f"| {r.wall_time_s / r.wall_time_s_colocate:.1f}x | {r.plans} | {r.plan_cpu_s_p50:.2f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(prog="python scripts/wall_time.py", description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default="results/reproduce", type=Path)
    print(table(p.parse_args().out))


if __name__ == "__main__":
    main()
