"""Prorsa's start plan alone, with every trajectory simulated and thinned (`policy.plan_per_engine=8`),
on each setting of scripts/thinning.py: the start each chooses, the thinned screen's finalists and the
CPU seconds of each (one process, `policy.plan_workers=1`). What the screen costs and saves, apart
from the plans within a run.
  python scripts/start_plans.py [OUT] [--settings heavy_prefill,...] [--seed 0]
Writes OUT/start_plans.csv and OUT/start_plans.md (OUT: results/thinning)."""
from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import pandas as pd
from hydra import compose, initialize_config_dir

sys.path.insert(0, str(Path(__file__).parent))
from study import ROOT, publish  # noqa: E402
from thinning import SETTINGS  # noqa: E402
from harness.allocation import COLOCATED  # noqa: E402
from harness.api import Role  # noqa: E402
from harness.experiment import build_parts, run_info, static_rollout_s  # noqa: E402
from harness.prorsa.planner import SCREEN_MARGIN, Planner, Screen  # noqa: E402
from harness.prorsa.policy import split_name  # noqa: E402
from harness.rollout import plan_cpu_s  # noqa: E402

PLANS = {"full": "null", "thinned": "8"}   # name -> policy.plan_per_engine


def start_plan(overrides: list[str]) -> dict:
    """The start plan of one configuration: its choice, CPU seconds (as summary.json's start_plan_cpu_s)
    and the thinned screen's finalists (0: the plan did not thin)."""
    cfg = compose("config", overrides=[*overrides, "policy=prorsa", "logger=none", "policy.plan_workers=1"])
    parts = build_parts(cfg)
    parts.policy.attach_simulator(partial(static_rollout_s, cfg, parts.cluster, parts.mode))
    screens = []

    def recorded(planner: Planner) -> Screen:   # the screen, as the start plan asks for it
        screens.append(screen(planner))
        return screens[-1]
    screen, Planner.screen = Planner.screen, recorded
    try:
        cpu = plan_cpu_s()
        roles = parts.policy.initial_roles(parts.cluster, run_info(parts.mode, parts.workload))
        cpu = plan_cpu_s() - cpu
    finally:
        Planner.screen = screen
    return {"start": split_name(roles.count(Role.PREFILL) or COLOCATED, len(roles)), "cpu_s": cpu,
            "finalists": len(screens[0].finalists) if screens else 0}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python scripts/start_plans.py", description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="results/thinning")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows = []
    with initialize_config_dir(str(ROOT / "configs"), version_base=None):
        for setting in args.settings.split(","):
            row = {"setting": setting, "seed": args.seed}
            for name, value in PLANS.items():
                got = start_plan([*SETTINGS[setting], f"seed={args.seed}", f"policy.plan_per_engine={value}"])
                row |= {f"{name}_{k}": v for k, v in got.items()}
            rows.append(row)
    df = pd.DataFrame(rows)
    lines = [f"| setting | start: full / thinned | finalists (within {SCREEN_MARGIN:.0%}) | CPU-s: full / thinned | "
             "thinned / full |", "|---|---|---|---|---|"]
    for r in df.itertuples():
        lines.append(f"| {r.setting} | {r.full_start} / {r.thinned_start} | {r.thinned_finalists} | "
                     f"{r.full_cpu_s:.1f} / {r.thinned_cpu_s:.1f} | "
                     f"{r.thinned_cpu_s / r.full_cpu_s:.2f} |")
    same = int((df.full_start == df.thinned_start).sum())
    lines.append(f"| all {len(df)} | {same} of {len(df)} the same | | {df.full_cpu_s.sum():.0f} / "
                 f"{df.thinned_cpu_s.sum():.0f} | {df.thinned_cpu_s.sum() / df.full_cpu_s.sum():.2f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    publish(out, "start_plans", df, lines)


if __name__ == "__main__":
    main()
