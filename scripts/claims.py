"""Claims 1-3 of REPRODUCE.md from the run directories scripts/reproduce.sh writes, each value as the
mean over seeds with its min-max (claim 4 is the report's Prorsa table, harness/report.py):
1. how often prefill and decode coexist under colocation: the share of 1-s timeseries samples with work
   (prefill queued or sequences decoding) where prefill is queued while sequences decode;
2. on heavy_prefill, per allocation: decode time per output token (p50), time from a prompt ready to its
   first token (p50), trajectory completion time (mean, p90) and rollout time;
3. per experiment and mode, the fastest and the slowest fixed split against colocation, seed by seed.
With FILE, the tables go there and their values, per seed, to FILE's .json beside it. `--render`
rewrites every block of REPRODUCE.md between `<!-- rendered: NAME -->` and `<!-- /rendered -->` from
the committed results (results/), so that no number in it is typed; `--check` fails where the document
differs from what they render (tests/test_claims_render.py runs it).
  python scripts/claims.py results/reproduce [results/reference/claims.md]
  python scripts/claims.py --render [REPRODUCE.md] | --check [REPRODUCE.md]"""
import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.experiment import write_atomic  # noqa: E402
from harness.report import find_runs, md_table, runs_frame, spread, static_name  # noqa: E402
from reproduce_tables import render  # noqa: E402

COEXIST = {"search": "search-sync", "swe": "swe-sync", "tooluse": "tooluse-sync", "heavy_prefill": "heavy_prefill"}
# (label, sweep directory, the run directory's name without its seed)
ALLOCATIONS = [("colocate (DP4+EP4)", "heavy_prefill", "+experiment=heavy_prefill,policy=colocate"),
               ("6P2D, TP4 prefill", "heavy_prefill", "+experiment=heavy_prefill,policy.num_prefill=6,policy=fixed_pd"),
               ("6P2D, DP4+EP4 prefill", "stage_parallelism",
                "+experiment=heavy_prefill,cluster.parallelism.prefill.dp=4,cluster.parallelism.prefill.ep=True,"
                "cluster.parallelism.prefill.tp=1,policy.num_prefill=6,policy=fixed_pd")]
SPLITS = ["search-sync", "search-async", "swe-sync", "swe-async", "tooluse-sync", "tooluse-async", "heavy_prefill",
          "drift"]
METRICS = {"decode time per output token p50 (ms)": 1, "prompt ready to first token p50 (s)": 2,   # name: digits
           "trajectory completion mean (s)": 1, "trajectory completion p90 (s)": 1, "rollout time (s)": 1}


def seeds(sweep: Path, name: str) -> list[Path]:
    """The complete runs of one configuration, one per seed (seed 0's directory is named without `seed=`
    unless its sweep named the seed)."""
    runs = {}
    for r in [sweep / name] + sorted(sweep.glob(f"{name},seed=*")):
        if (r / "summary.json").exists():
            runs.setdefault(json.loads((r / "summary.json").read_text())["seed"], r)
    return [runs[s] for s in sorted(runs)]


def coexistence(run: Path) -> float:
    ts = pd.read_parquet(run / "timeseries.parquet")
    prefill, decode = ts.prefill_demand_tokens > 0, ts.decode_requests > 0
    return (prefill & decode).sum() / (prefill | decode).sum()


def effects(run: Path) -> dict:
    df = pd.read_parquet(run / "lifecycle.parquet")
    multi = df[df.output_tokens > 1]
    tpot = (multi.t_decode_end - multi.t_first_token) / (multi.output_tokens - 1)
    g = df.groupby("trajectory_id")
    jct = g.t_decode_end.max() - g.t_ready.min()
    return {"decode time per output token p50 (ms)": 1e3 * tpot.median(),
            "prompt ready to first token p50 (s)": (df.t_first_token - df.t_ready).median(),
            "trajectory completion mean (s)": jct.mean(), "trajectory completion p90 (s)": jct.quantile(0.9),
            "rollout time (s)": json.loads((run / "summary.json").read_text())["rollout_time_s"]}


def cell(values: list[float], digits: int) -> str:
    """mean (min-max, n seeds); the value alone for one seed."""
    return spread(pd.Series(values, dtype=float), digits, count=True)


def splits(sweep: Path) -> dict:
    """Claim 3 for one sweep (one setting, as scripts/reproduce.sh writes them), per seed: the best split,
    and the best and the worst split's speedup over colocation (empty where not run)."""
    none = {"best": [], "best_speedup": [], "worst_speedup": []}
    df = runs_frame(find_runs([sweep])) if sweep.is_dir() else None
    if df is None or not (df["policy_name"] == "fixed_pd").any():
        return none
    colocate = df[df["policy_name"] == "colocate"].groupby("seed")["rollout_time_s"].mean()
    fixed = df[(df["policy_name"] == "fixed_pd") & df["seed"].isin(colocate.index)].copy()
    if fixed.empty:
        return none      # no colocation at the splits' seeds
    fixed["speedup"] = fixed["seed"].map(colocate) / fixed["rollout_time_s"]
    best = fixed.loc[fixed.groupby("seed")["speedup"].idxmax()]
    worst = fixed.groupby("seed")["speedup"].min()
    return {"best": [static_name(*r) for r in zip(best["policy_name"], best["num_prefill"], best["num_engines"])],
            "best_speedup": list(best["speedup"]), "worst_speedup": list(worst)}


def split_cells(s: dict) -> list[str]:
    if not s["best"]:
        return ["-", "-", "-"]      # not run (yet)
    return [", ".join(s["best"]), cell(s["best_speedup"], 2), cell(s["worst_speedup"], 2)]


def table(header: list[str], rows: list[list[str]]) -> str:
    return md_table(pd.DataFrame(rows, columns=header))


def measure(out: Path) -> dict:
    """Claims 1-3's values per seed, from the run directories under `out`."""
    measured = {label: [effects(r) for r in seeds(out / d, name)] for label, d, name in ALLOCATIONS}
    return {"coexist": {exp: [coexistence(r) for r in seeds(out / d, f"+experiment={exp},policy=colocate")]
                        for exp, d in COEXIST.items()},
            "allocations": {label: {m: [x[m] for x in runs] for m in METRICS} for label, runs in measured.items()},
            "splits": {d: splits(out / d) for d in SPLITS}}


def claims(values: dict) -> str:
    """The three tables as markdown."""
    share = [cell(values["coexist"][exp], 2) for exp in COEXIST]
    rows = [[m] + [cell(values["allocations"][label][m], digits) for label, _, _ in ALLOCATIONS]
            for m, digits in METRICS.items()]
    columns = [split_cells(values["splits"][d]) for d in SPLITS]
    names = ["best fixed split per seed", "best fixed / colocate", "worst fixed / colocate"]
    return "\n".join([
        "Claim 1: share of 1-s samples with work where prefill is queued while sequences decode (colocate, sync)\n",
        table(list(COEXIST), [share]),
        "\nClaim 2: heavy_prefill on moe_h200, per allocation\n",
        table(["", *(label for label, _, _ in ALLOCATIONS)], rows),
        "\nClaim 3: fixed splits against colocation (policy=fixed_pd policy.num_prefill=1..7)\n",
        table(["", *SPLITS], [[name, *(c[i] for c in columns)] for i, name in enumerate(names)])]) + "\n"


def main(argv: list[str]) -> None:
    if argv and argv[0] in ("--render", "--check"):
        doc = Path(argv[1]) if len(argv) > 1 else ROOT / "REPRODUCE.md"
        text = doc.read_text()
        try:
            rendered = render(text, doc.name)
        except (ValueError, FileNotFoundError) as e:
            sys.exit(f"claims.py: {e}")
        if argv[0] == "--check":
            if rendered != text:
                sys.exit(f"claims.py: {doc.name} differs from what the committed results render: "
                         "python scripts/claims.py --render")
            return
        write_atomic(doc, lambda p: p.write_text(rendered))
        return
    if len(argv) not in (1, 2):
        sys.exit("usage: python scripts/claims.py OUT [FILE]   (OUT: the directory scripts/reproduce.sh wrote; "
                 "FILE: write the tables there, and their values to FILE's .json, instead of printing them)\n"
                 "       python scripts/claims.py --render | --check [REPRODUCE.md]")
    out = Path(argv[0])
    if not out.is_dir():
        sys.exit(f"claims.py: no such directory: {out} (the OUT of scripts/reproduce.sh)")
    values = measure(out)
    text = claims(values)
    if len(argv) == 1:
        print(text, end="")
        return
    write_atomic(Path(argv[1]), lambda p: p.write_text(text))
    write_atomic(Path(argv[1]).with_suffix(".json"), lambda p: p.write_text(json.dumps(values, indent=1) + "\n"))


if __name__ == "__main__":
    main(sys.argv[1:])
