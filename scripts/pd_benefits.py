"""Claim 2 of REPRODUCE.md from run directories: per policy, decode time per output token (p50),
time to first token after the prompt is ready (p50), and trajectory completion time (mean, p90).
  python scripts/pd_benefits.py results/reproduce > table.md"""
import json
import sys
from pathlib import Path

import pandas as pd


def row(run: Path) -> dict:
    s = json.loads((run / "summary.json").read_text())
    df = pd.read_parquet(run / "lifecycle.parquet")
    multi = df[df.output_tokens > 1]
    tpot = (multi.t_decode_end - multi.t_first_token) / (multi.output_tokens - 1)
    g = df.groupby("trajectory_id")
    jct = g.t_decode_end.max() - g.t_ready.min()
    name = run.parent.name + "/" + run.name.replace("+experiment=heavy_prefill,", "")
    return {"run": name, "policy": s["policy"], "cluster": s["cluster"], "rollout_s": round(s["rollout_time_s"], 1),
            "tpot_p50_ms": round(1e3 * tpot.median(), 1), "ttft_p50_s": round((df.t_first_token - df.t_ready).median(), 2),
            "completion_mean_s": round(jct.mean(), 1), "completion_p90_s": round(jct.quantile(0.9), 1)}


def main(root: str) -> None:
    runs = [p.parent for d in ("heavy_prefill", "stage_parallelism") for p in sorted((Path(root) / d).glob("*/summary.json"))]
    keep = [r for r in runs if "policy=colocate" in r.name or "num_prefill=6" in r.name]
    rows = [row(r) for r in keep]
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
