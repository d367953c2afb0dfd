"""Prorsa's performance model against the simulator's measured runs: predicted vs measured mean turn
latency and rollout time, for colocation and fixed P:D splits, on several experiments.

The prediction is what Prorsa's planner computes before the run starts: trajectories sampled from the
workload's priors (never its scripts), simulated under the allocation (harness/prorsa/whatif.py),
averaged over `--samples` draws. The measurement is the real run of the same experiment under that
allocation (its own scripts). Writes results/reference/whatif_accuracy.csv and prints a markdown table.

    python scripts/whatif_accuracy.py                         # the default experiments, 1 step each
    python scripts/whatif_accuracy.py --experiments browse swe --samples 3
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.cluster import cluster_from_config  # noqa: E402
from harness.experiment import lifecycle_frame, run_info, run_rollout  # noqa: E402
from harness.prorsa.forecast import future_sampler  # noqa: E402
from harness.allocation import COLOCATED, roles_for  # noqa: E402
from harness.prorsa.tracker import LifecycleTracker  # noqa: E402
from harness.prorsa.whatif import WhatIf  # noqa: E402
from harness.rollout import ModeConfig  # noqa: E402

OUT = ROOT / "results" / "reference" / "whatif_accuracy.csv"
EXPERIMENTS = ["heavy_prefill", "browse", "tooluse", "swe", "search"]


def compose_cfg(experiment: str, extra: list[str]):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        return compose(config_name="config", overrides=[f"+experiment={experiment}", "logger=none", *extra])


def allocations(n: int) -> list[int]:
    return sorted({COLOCATED, max(1, n // 4), n // 2, min(n - 1, 3 * n // 4)})


def policy_overrides(split: int) -> list[str]:
    return ["policy=colocate"] if split == COLOCATED else ["policy=fixed_pd", f"policy.num_prefill={split}"]


def predicted(cfg, split: int, samples: int) -> tuple[float, float]:
    cluster = cluster_from_config(OmegaConf.to_container(cfg.cluster, resolve=True))
    mode = ModeConfig(**OmegaConf.to_container(cfg.mode, resolve=True))
    run = run_info(mode, instantiate(cfg.workload, seed=cfg.seed))
    sampler = future_sampler(LifecycleTracker(), run, 1, 0.0, 0.01)   # priors only: nothing observed yet
    families = sorted(run.priors)
    weights = [run.weights.get(f, 0.0) or 1e-9 for f in families]
    count = run.trajectories_per_step * run.num_steps
    roles = roles_for(split, cluster.num_engines)
    whatif = WhatIf(cluster, 5, 4.0)
    latency, completion = [], []
    for k in range(samples):
        new = sampler.new(families, weights, count, 0, np.random.default_rng([cfg.seed, k]))
        outcome = whatif.run([], roles, roles, new, run.max_in_flight if mode.name == "async" else count)
        latency.append(outcome.mean_turn_latency_s)
        completion.append(outcome.completion_s)
    return float(np.mean(latency)), float(np.mean(completion))


def measured(cfg) -> tuple[float, float]:
    result, _ = run_rollout(cfg)
    df = lifecycle_frame(result)
    return float((df["t_decode_end"] - df["t_ready"]).mean()), result.rollout_time_s


def markdown(df: pd.DataFrame) -> str:
    cells = [[f"{v:.3g}" if isinstance(v, float) else str(v) for v in row] for row in df.itertuples(index=False)]
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in cells])


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiments", nargs="+", default=EXPERIMENTS)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1, help="mode.num_steps of each run")
    args = ap.parse_args()
    if args.steps != 1:
        logging.warning("a sync prediction covers one step; --steps %d compares async runs only", args.steps)
    rows = []
    for experiment in args.experiments:
        base = compose_cfg(experiment, [f"mode.num_steps={args.steps}"])
        for split in allocations(int(base.cluster.num_engines)):
            cfg = compose_cfg(experiment, [f"mode.num_steps={args.steps}", *policy_overrides(split)])
            lat_p, roll_p = predicted(cfg, split, args.samples)
            lat_m, roll_m = measured(cfg)
            rows.append({"experiment": experiment, "mode": cfg.mode.name,
                         "allocation": "colocate" if split == COLOCATED else f"{split}P{base.cluster.num_engines - split}D",
                         "turn_latency_predicted_s": lat_p, "turn_latency_measured_s": lat_m,
                         "turn_latency_error": lat_p / lat_m - 1,
                         "rollout_predicted_s": roll_p, "rollout_measured_s": roll_m,
                         "rollout_error": roll_p / roll_m - 1})
            logging.info("%s %s: turn latency %.2f vs %.2f s, rollout %.1f vs %.1f s", experiment,
                         rows[-1]["allocation"], lat_p, lat_m, roll_p, roll_m)
    df = pd.DataFrame(rows)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(OUT, index=False, float_format="%.4g")
    print(markdown(df))
    within = (df.turn_latency_error.abs() <= 0.2).mean()
    logging.info("turn latency within 20%%: %d of %d; wrote %s", round(within * len(df)), len(df), OUT.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
