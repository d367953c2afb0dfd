"""Switches against the oracle: where `oracle_pd` (told every script) beats the best static split, how
much of that gain Prorsa captures (issue item: (hindsight_best - prorsa) / (hindsight_best - oracle)).

Each capture setting (configs/experiment/capture_*.yaml, committed before its first run) runs colocation,
every fixed split, `oracle_pd` and Prorsa at seeds 0-2. `hindsight_best` is the best static run per seed.

  python scripts/capture.py run   [OUT] [--settings capture_flip_async,...] [--seeds 0,1,2]
  python scripts/capture.py table [OUT]      (writes OUT/capture.csv and OUT/capture.md)

OUT defaults to results/capture. Each block is one Hydra multirun, resumable (complete jobs are skipped).
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

log = logging.getLogger("capture")
ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ("capture_flip_async", "capture_flip_async_drain", "capture_drift_sync", "capture_alternate_sync")
SPLITS = "1,2,3,4,5,6,7"
ORACLE = ["policy=oracle_pd", "policy.decision_interval_s=50"]   # fork and compare every 50 simulated s
MIN_ORACLE_GAIN = 0.03   # settings where the oracle beats hindsight_best by at least this share count


def sweep(out: Path, overrides: list[str]) -> None:
    cmd = [sys.executable, "run.py", "-m", f"hydra.sweep.dir={out}", "logger=none", *overrides]
    log.info("%s", " ".join(cmd[1:]))
    subprocess.run(cmd, cwd=ROOT, check=False)


def run(out: Path, settings: list[str], seeds: str) -> None:
    for setting in settings:
        where, exp = out / setting, f"+experiment={setting}"
        sweep(where / "statics", [exp, f"seed={seeds}", "policy=colocate"])
        sweep(where / "statics", [exp, f"seed={seeds}", "policy=fixed_pd", f"policy.num_prefill={SPLITS}"])
        sweep(where / "prorsa", [exp, f"seed={seeds}", "policy=prorsa"])
        sweep(where / "oracle", [exp, f"seed={seeds}", *ORACLE])


def split_label(job_dir: str) -> str:
    """'colocate', or 'kP' for a fixed split of k prefill engines, from a job's override directory name."""
    match = re.search(r"num_prefill=(\d+)", job_dir)
    return f"{match.group(1)}P" if match else "colocate"


def mean_wape(per_bin: list[float] | None) -> float:
    """A run's forecast WAPE over the forecast's bins (summary.json has one per bin ahead; nan: none)."""
    return sum(per_bin) / len(per_bin) if per_bin else float("nan")


def summaries(where: Path) -> pd.DataFrame:
    rows = []
    for f in sorted(where.glob("*/summary.json")):
        s = json.loads(f.read_text())
        rows.append({"seed": s["seed"], "rollout_time_s": s["rollout_time_s"], "switches": s["num_role_switches"],
                     "wall_time_s": s["wall_time_s"], "split": split_label(f.parent.name),
                     "wape_prefill": mean_wape(s.get("forecast_wape_prefill")),
                     "wape_decode": mean_wape(s.get("forecast_wape_decode"))})
    return pd.DataFrame(rows)


def table(out: Path) -> pd.DataFrame:
    rows = []
    for setting in SETTINGS:
        statics, prorsa, oracle = (summaries(out / setting / k) for k in ("statics", "prorsa", "oracle"))
        if statics.empty or prorsa.empty or oracle.empty:
            continue
        for p in prorsa.itertuples():
            st, orc = statics[statics.seed == p.seed], oracle[oracle.seed == p.seed]
            if len(st) < 8 or orc.empty:
                continue   # not every static, or no oracle, at this seed
            best, o = st.loc[st.rollout_time_s.idxmin()], orc.iloc[0]
            gain = best.rollout_time_s - o.rollout_time_s
            rows.append({"setting": setting, "seed": p.seed, "hindsight_best_s": best.rollout_time_s,
                         "best_static": best.split, "oracle_s": o.rollout_time_s, "oracle_switches": o.switches,
                         "prorsa_s": p.rollout_time_s, "prorsa_switches": p.switches,
                         "oracle_gain": gain / best.rollout_time_s,
                         "prorsa_vs_best": best.rollout_time_s / p.rollout_time_s,
                         "captured": (best.rollout_time_s - p.rollout_time_s) / gain if gain > 0 else float("nan"),
                         "wape_prefill": p.wape_prefill, "wape_decode": p.wape_decode,
                         "prorsa_wall_s": p.wall_time_s})
    df = pd.DataFrame(rows)
    df.to_csv(out / "capture.csv", index=False)
    lines = ["| setting | seed | best static (s) | oracle (s, switches) | oracle gain | Prorsa (s, switches) "
             "| Prorsa / best | captured | forecast WAPE prefill / decode (mean of bins) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        counts = r.oracle_gain >= MIN_ORACLE_GAIN
        captured = f"{r.captured:.2f}" if counts else f"({r.captured:.2f})"
        lines.append(f"| {r.setting} | {r.seed} | {r.hindsight_best_s:,.1f} ({r.best_static}) | {r.oracle_s:,.1f} "
                     f"({r.oracle_switches}) | {r.oracle_gain:+.1%} | {r.prorsa_s:,.1f} ({r.prorsa_switches}) "
                     f"| {r.prorsa_vs_best:.3f} | {captured} | {r.wape_prefill:.2f} / {r.wape_decode:.2f} |")
    (out / "capture.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return df


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(prog="python scripts/capture.py", description=__doc__.splitlines()[0])
    p.add_argument("command", choices=("run", "table"))
    p.add_argument("out", nargs="?", default="results/capture", type=Path)
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of {', '.join(SETTINGS)}")
    p.add_argument("--seeds", default="0,1,2")
    a = p.parse_args()
    unknown = [s for s in a.settings.split(",") if s not in SETTINGS]
    if unknown:
        p.error(f"--settings: {', '.join(unknown)} not one of {', '.join(SETTINGS)}")
    if a.command == "run":
        run(a.out, a.settings.split(","), a.seeds)
    table(a.out)


if __name__ == "__main__":
    main()
