"""Prorsa with a planning model that differs from the world, and with its plans' latency charged.

For each setting, Prorsa runs under every condition of CONDITIONS at seeds 0-2, and colocation and every
fixed split run at the same seeds in each world a condition uses (the default one, and the world on the
measured H200 constants); `hindsight_best` is the best of those statics per seed and world. The table
gives Prorsa / hindsight_best (its best static's time over Prorsa's: >= 1 beats every static split).

  python scripts/robustness.py run   [OUT] [--settings heavy_prefill,...] [--seeds 0,1,2]
  python scripts/robustness.py table [OUT]      (writes OUT/robustness.csv and OUT/robustness.md)

OUT defaults to results/robustness. Each block is one Hydra multirun, resumable (complete jobs are skipped).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from study import colocate_run, hindsight_best, main, publish, slug, summaries, sweep, sweep_statics  # noqa: E402


# The world as the H200 forward passes of Qwen3-30B-A3B measured it (results/calibration/h200_profile.json,
# docs/calibration.md, "roofline / measured": prefill of 1k/4k/16k tokens 0.606/0.537/0.779, decode
# 0.650/0.931/0.877), i.e. prefill 1.6x and decode 1.25x the roofline's time (the means of measured over
# roofline), while Prorsa plans on the roofline (policy.model scales 1).
WORLD_H200 = ["++cluster.prefill_time_scale=1.6", "++cluster.decode_time_scale=1.25"]   # ++: presets leave them at 1
CONDITIONS = {
    "exact": ([], []),
    "prefill x0.8": ([], ["policy.model.prefill_scale=0.8"]),
    "prefill x1.25": ([], ["policy.model.prefill_scale=1.25"]),
    "decode x0.8": ([], ["policy.model.decode_scale=0.8"]),
    "decode x1.25": ([], ["policy.model.decode_scale=1.25"]),
    "world H200, plans roofline": (WORLD_H200, ["policy.model.prefill_scale=1.0", "policy.model.decode_scale=1.0"]),
    "priors none": ([], ["policy.priors=none"]),
    "plan latency model": ([], ["policy.plan_latency=model"]),
}   # name -> (world overrides, Prorsa's overrides)
SETTINGS = {"heavy_prefill": ["+experiment=heavy_prefill"], "tooluse_async": ["+experiment=tooluse_async"],
            "kvboth_async": ["+experiment=shift_reason_browse_kvboth"],
            "shift_sync": ["+experiment=shift_reason_browse_sync"]}


def run(out: Path, settings: list[str], seeds: str) -> None:
    for setting in settings:
        worlds = {tuple(world) for world, _ in CONDITIONS.values()}
        for world in sorted(worlds):
            where = out / setting / ("statics_h200" if world else "statics")
            sweep_statics(where, [*SETTINGS[setting], *world, f"seed={seeds}"])
        for name, (world, model) in CONDITIONS.items():
            sweep(out / setting / slug(name), [*SETTINGS[setting], *world, *model, f"seed={seeds}", "policy=prorsa"])


def table(out: Path) -> pd.DataFrame:
    rows = []
    for setting in SETTINGS:
        for name, (world, _) in CONDITIONS.items():
            prorsa = summaries(out / setting / slug(name))
            statics = summaries(out / setting / ("statics_h200" if world else "statics"))
            if prorsa.empty or statics.empty:
                continue
            for r in prorsa.itertuples():
                best = hindsight_best(statics, r.seed)
                if best is None:
                    continue   # not every static ran at this seed
                colocate = colocate_run(statics, r.seed).rollout_time_s
                rows.append({"setting": setting, "condition": name, "seed": r.seed, "prorsa_s": r.rollout_time_s,
                             "hindsight_best_s": best.rollout_time_s, "best_static": best.split,
                             "colocate_s": colocate, "vs_hindsight_best": best.rollout_time_s / r.rollout_time_s,
                             "switches": r.switches, "prorsa_wall_s": r.wall_time_s})
    df = pd.DataFrame(rows)
    lines = None
    if not df.empty:
        piv = df.groupby(["setting", "condition"], sort=False).agg(
            seeds=("seed", "count"), mean=("vs_hindsight_best", "mean"), low=("vs_hindsight_best", "min"),
            high=("vs_hindsight_best", "max"), switches=("switches", "mean")).reset_index()
        lines = ["| setting | condition | seeds | Prorsa / hindsight_best: mean (min-max) | switches (mean) |",
                 "|---|---|---|---|---|"]
        for r in piv.itertuples():
            lines.append(f"| {r.setting} | {r.condition} | {r.seeds} | {r.mean:.3f} ({r.low:.3f}-{r.high:.3f}) "
                         f"| {r.switches:.1f} |")
    publish(out, "robustness", df, lines)
    return df


if __name__ == "__main__":
    main(__doc__, "python scripts/robustness.py", "results/robustness", list(SETTINGS),
         ["heavy_prefill", "tooluse_async"], run, table)
