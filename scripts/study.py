"""What the study scripts (robustness.py, capture.py, thinning.py) share: a resumable Hydra multirun per
block, the static allocations every study compares with, the summaries of a block's runs, and their
`run | table` command line."""
from __future__ import annotations

import argparse
import json
import logging
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd

log = logging.getLogger("study")
ROOT = Path(__file__).resolve().parents[1]
SPLITS = "1,2,3,4,5,6,7"   # the fixed splits of an 8-engine cluster (hindsight_best needs all seven)


def sweep(out: Path, overrides: list[str]) -> None:
    """One Hydra multirun into `out` (complete jobs are skipped on a rerun)."""
    cmd = [sys.executable, "run.py", "-m", f"hydra.sweep.dir={out}", "logger=none", *overrides]
    log.info("%s", " ".join(cmd[1:]))
    subprocess.run(cmd, cwd=ROOT, check=False)


def sweep_statics(out: Path, overrides: list[str]) -> None:
    """Colocation and every fixed split of an 8-engine cluster, as two multiruns into `out`."""
    sweep(out, [*overrides, "policy=colocate"])
    sweep(out, [*overrides, "policy=fixed_pd", f"policy.num_prefill={SPLITS}"])


def slug(name: str) -> str:
    """A condition's name as a folder name."""
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def split_label(job_dir: str) -> str:
    """'colocate', or 'kP' for a fixed split of k prefill engines, from a job's override directory name."""
    match = re.search(r"num_prefill=(\d+)", job_dir)
    return f"{match.group(1)}P" if match else "colocate" if "policy=colocate" in job_dir else job_dir


def mean_wape(per_bin: list[float] | None) -> float:
    """A run's forecast WAPE over the forecast's bins (summary.json has one per bin ahead; nan: none)."""
    return sum(per_bin) / len(per_bin) if per_bin else float("nan")


def summaries(where: Path) -> pd.DataFrame:
    """One row per complete run under `where`."""
    rows = []
    for f in sorted(where.glob("*/summary.json")):
        s = json.loads(f.read_text())
        rows.append({"seed": s["seed"], "policy": s["policy"], "rollout_time_s": s["rollout_time_s"],
                     "switches": s["num_role_switches"], "wall_time_s": s["wall_time_s"],
                     "split": split_label(f.parent.name),
                     "wape_prefill": mean_wape(s.get("forecast_wape_prefill")),
                     "wape_decode": mean_wape(s.get("forecast_wape_decode"))})
    return pd.DataFrame(rows)


def hindsight_best(statics: pd.DataFrame, seed: int) -> pd.Series | None:
    """The fastest of colocation and the seven fixed splits at `seed` (None unless all eight ran)."""
    st = statics[statics.seed == seed]
    return st.loc[st.rollout_time_s.idxmin()] if len(st) >= 8 else None


def colocate_run(statics: pd.DataFrame, seed: int) -> pd.Series:
    """Colocation's run at `seed`."""
    return statics[(statics.seed == seed) & (statics.policy == "colocate")].iloc[0]


def publish(out: Path, name: str, df: pd.DataFrame, lines: list[str] | None) -> None:
    """A study's table: every row as OUT/NAME.csv; the Markdown `lines` (if any) as OUT/NAME.md, printed."""
    df.to_csv(out / f"{name}.csv", index=False)
    if lines:
        (out / f"{name}.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))


def main(doc: str, prog: str, out: str, settings: list[str], default: list[str],
         run: Callable[[Path, list[str], str], None], table: Callable[[Path], pd.DataFrame]) -> None:
    """`prog run [OUT] [--settings a,b] [--seeds 0,1,2]` runs the blocks, then writes the table;
    `prog table [OUT]` writes the table only."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    p.add_argument("command", choices=("run", "table"))
    p.add_argument("out", nargs="?", default=out, type=Path)
    p.add_argument("--settings", default=",".join(default), help=f"comma-separated, of {', '.join(settings)}")
    p.add_argument("--seeds", default="0,1,2")
    a = p.parse_args()
    unknown = [s for s in a.settings.split(",") if s not in settings]
    if unknown:
        p.error(f"--settings: {', '.join(unknown)} not one of {', '.join(settings)}")
    if a.command == "run":
        run(a.out, a.settings.split(","), a.seeds)
    table(a.out)
