"""Prorsa's plans thinned (`policy.plan_per_engine`) against its full plans: decisions and cost.

For each setting, Prorsa runs with every trajectory simulated and with plans thinned to 8 trajectories
per engine, at seeds 0-2; colocation and every fixed split run at the same seeds, and
`hindsight_best` is the best of them per seed. The table gives, per setting and plan, Prorsa /
hindsight_best (the best static's time over Prorsa's), the thinned run's time against the full plan's,
and Prorsa's `wall_time_s` (start plan included) against colocation's.

  python scripts/thinning.py run   [OUT] [--settings heavy_prefill,...] [--seeds 0,1,2]
  python scripts/thinning.py table [OUT]      (writes OUT/thinning.csv and OUT/thinning.md)

OUT defaults to results/thinning. Each block is one Hydra multirun, resumable (complete jobs are skipped).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from generalization import SETTINGS as GENERALIZATION, write_traces  # noqa: E402
from study import colocate_run, hindsight_best, main, publish, slug, summaries, sweep, sweep_statics  # noqa: E402
from harness.sweep import unnamed  # noqa: E402

PLANS = {"full": "null", "8 per engine": "8"}   # name -> policy.plan_per_engine
# The first eight were run with every plan thinned (16 and 8 per engine) before the rule of
# `Prorsa._simulate_at` (no thinning for a last end within the run); the next four are held out from that
# rule, committed with it before their first run; the last four (the other experiments of REPRODUCE.md)
# are held out from the screened start (planner.py SCREEN_MARGIN), committed with it before their first run.
SETTINGS = {name: [f"+experiment={name}"] for name in
            ("heavy_prefill", "search", "tooluse", "swe", "drift", "tooluse_async", "shift_reason_browse_sync",
             "capture_flip_async", "capture_alternate_sync", "capture_drift_sync", "capture_flip_async_drain",
             "capture_flip_async_reverse", "browse", "shift_reason_browse", "shift_reason_browse_kvboth",
             "shift_reason_browse_dense8")}
# Held out from the screen's 10% margin (planner.py SCREEN_MARGIN), committed with it before their first
# run: five settings of scripts/generalization.py on 8 engines that no thinning rule was looked at on.
SCREEN_HELD_OUT = ("synth_pages_sglang_sync", "synth_decode_moe_sync", "mix_reason_browse_moe_sync",
                   "synth_manyturns_moe_async", "browse_dense8_drain_async")
# Held out from the screen's sampling (no sample drawn past the first, policy.py `_initial_split`),
# committed with it before its first run: three more such settings.
SAMPLING_HELD_OUT = ("reasoning_moe_sync", "browse_dense8_sync", "tooluse_sglang_sync")
# Held out from the confirmed switch (a switch a thinned rolling plan wants is decided again in full,
# policy.py `_plan_now`), committed with it before its first run: three async settings of
# scripts/generalization.py whose switches cost nothing to undo (kv_both), where a thinned plan may switch
# often.
CONFIRM_HELD_OUT = ("flip_rag_solver_kvboth_async", "dumper_kvboth_async", "browse_kvboth_moe_async")
SETTINGS |= {name: GENERALIZATION[name] for name in SCREEN_HELD_OUT + SAMPLING_HELD_OUT + CONFIRM_HELD_OUT}
HELD_OUT = SCREEN_HELD_OUT + SAMPLING_HELD_OUT + CONFIRM_HELD_OUT + (
    "capture_alternate_sync", "capture_drift_sync", "capture_flip_async_drain", "capture_flip_async_reverse", "browse",
    "shift_reason_browse", "shift_reason_browse_kvboth", "shift_reason_browse_dense8")


def run(out: Path, settings: list[str], seeds: str) -> None:
    traces = (out / "traces").resolve()   # the trace workloads' files (generalization.py `write_traces`)
    for setting in settings:
        overrides = [o.format(traces=traces) for o in SETTINGS[setting]]
        if any("{traces}" in o for o in SETTINGS[setting]) and not traces.exists():
            write_traces(traces)
        # the setting's keys stay out of the job names (its folder says them): a generalization setting's
        # ten workload keys overflow the file-name limit
        named = [*overrides, unnamed(overrides), f"seed={seeds}"]
        sweep_statics(out / setting / "statics", named)
        for name, value in PLANS.items():
            sweep(out / setting / slug(name), [*named, "policy=prorsa", f"policy.plan_per_engine={value}"])


def table(out: Path) -> pd.DataFrame:
    rows = []
    for setting in SETTINGS:
        statics = summaries(out / setting / "statics")
        full = summaries(out / setting / slug("full"))
        for name in PLANS:
            prorsa = summaries(out / setting / slug(name))
            for r in prorsa.itertuples():
                best, base = hindsight_best(statics, r.seed), full[full.seed == r.seed]
                if best is None or base.empty:
                    continue   # not every static, or not the full plan, ran at this seed
                colocate = colocate_run(statics, r.seed)
                rows.append({"setting": setting + (" (held out)" if setting in HELD_OUT else ""), "plan": name,
                             "seed": r.seed, "prorsa_s": r.rollout_time_s,
                             "full_plan_s": base.rollout_time_s.iloc[0], "hindsight_best_s": best.rollout_time_s,
                             "best_static": best.split, "vs_hindsight_best": best.rollout_time_s / r.rollout_time_s,
                             "vs_full_plan": base.rollout_time_s.iloc[0] / r.rollout_time_s, "switches": r.switches,
                             "wall_s": r.wall_time_s, "colocate_wall_s": colocate.wall_time_s,
                             "wall_vs_colocate": r.wall_time_s / colocate.wall_time_s})
    df = pd.DataFrame(rows)
    out.mkdir(parents=True, exist_ok=True)
    lines = None
    if not df.empty:
        piv = df.groupby(["setting", "plan"], sort=False).agg(
            seeds=("seed", "count"), hb=("vs_hindsight_best", "mean"), hb_low=("vs_hindsight_best", "min"),
            full=("vs_full_plan", "mean"), full_low=("vs_full_plan", "min"), full_high=("vs_full_plan", "max"),
            switches=("switches", "mean"), wall=("wall_s", "mean"), ratio=("wall_vs_colocate", "mean")).reset_index()
        lines = ["| setting | plan | seeds | Prorsa / hindsight_best: mean (min) | full plan's time / this one's: "
                 "mean (min-max) | switches (mean) | wall_time_s (mean) | / colocation's (mean) |",
                 "|---|---|---|---|---|---|---|---|"]
        for r in piv.itertuples():
            lines.append(f"| {r.setting} | {r.plan} | {r.seeds} | {r.hb:.3f} ({r.hb_low:.3f}) | {r.full:.4f} "
                         f"({r.full_low:.4f}-{r.full_high:.4f}) | {r.switches:.1f} | {r.wall:.2f} | {r.ratio:.1f}x |")
    publish(out, "thinning", df, lines)
    return df


if __name__ == "__main__":
    main(__doc__, "python scripts/thinning.py", "results/thinning", list(SETTINGS), list(SETTINGS), run, table)
