"""The cost model against published serving measurements: `python scripts/published.py`.

For each row of results/reference/published_sources.csv that the catalogue can express (its model and
GPU in configs/catalogue/, its weights fitting the GPUs in BF16, the only precision the catalogue has),
runs the serving benchmark (mode=serve, harness/serve.py) at the published setup and writes
results/reference/published.csv (published against simulated, signed error) and
results/reference/published.png/.pdf (log-log, one marker per source). Rows it cannot express are listed
with the reason in results/reference/published_not_simulated.csv.

Nothing is fitted here (used_for_fit is false everywhere): this measures the cost model as it is, with
every constant of configs/catalogue/ unchanged. Where a published deployment is larger than one engine
(a prefill or decode unit of several nodes), one engine of that unit is simulated at the published
per-device load and the per-node figure is read from it; the CSV's `simulated_setup` says so.
"""
from __future__ import annotations

import argparse
import logging
import math
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hydra import compose, initialize_config_dir  # noqa: E402

from harness.experiment import run_experiment  # noqa: E402

SOURCES = ROOT / "results" / "reference" / "published_sources.csv"
OUT = ROOT / "results" / "reference"
log = logging.getLogger("published")

# The published setups, as serve runs. GPUs per node: 8 in every source here (H100/H200/H800 HGX nodes).
GPUS_PER_NODE = 8
QWEN235 = ["cluster=qwen235_h200", "cluster.num_engines=1", "policy=colocate"]   # attention DP8 + EP8


def deepseek_unit(gpu: str, gpus: int, max_seqs: int, budget: int, tp: int = 1) -> list[str]:
    """One DeepSeek-V3 engine of `gpus` GPUs with DP attention and EP over all of them (the SGLang and
    DeepSeek deployments), SGLang step semantics, `max_seqs` sequences and `budget` prefill tokens per rank
    (a rank: `tp` GPUs; the published deployments use tp 1, whose replicated BF16 attention weights leave
    no KV memory on an 80 GB GPU)."""
    par = f"{{tp: {tp}, dp: {gpus // tp}, ep: true}}"
    return ["cluster=deepseek_v3_h200", f"cluster.gpu={gpu}", "cluster.num_engines=1", f"cluster.gpus_per_engine={gpus}",
            f"cluster.parallelism.colocated={par}", f"cluster.parallelism.prefill={par}", f"cluster.parallelism.decode={par}",
            "cluster.engine=sglang", f"cluster.max_num_seqs={max_seqs}", f"cluster.max_num_batched_tokens={budget}",
            f"cluster.chunked_prefill_size={budget}", "policy=colocate"]


def requests(n: int, prompt: int, output: int) -> list[str]:
    return ["mode=serve", "workload=requests", f"workload.num_requests={n}", f"workload.prompt_tokens={prompt}",
            f"workload.output_tokens={output}", "mode.request_rate=inf"]


def per_node(key: str, gpus: int) -> Callable[[dict], float]:
    return lambda s: s[key] / (gpus / GPUS_PER_NODE)


@dataclass(frozen=True)
class Point:
    id: str
    overrides: list[str]
    simulated: Callable[[dict], float]   # the published metric, in its unit, from the run's summary.json
    setup: str                           # what was simulated, in words
    extra: list[str] = field(default_factory=list)


POINTS = [
    Point("trtllm_qwen3235ba22b_h100_1000_1000",
          QWEN235 + ["cluster.gpu=h100", "cluster.parallelism.colocated={tp: 2, dp: 4, ep: true}"]
          + requests(3000, 1000, 1000),
          lambda s: s["output_tokens_per_s"],
          "1 engine of 8 H100, attention TP2 x DP4 (DP8 leaves no KV memory with BF16 weights) + EP8, BF16 "
          "weights; 3000 requests 1000/1000 at rate inf; output tokens/s"),
    Point("trtllm_qwen3235ba22b_h200_1000_1000", QWEN235 + requests(3000, 1000, 1000),
          lambda s: s["output_tokens_per_s"],
          "1 engine of 8 H200, attention DP8 + EP8, BF16 weights; 3000 requests 1000/1000 at rate inf; "
          "output tokens/s"),
    Point("trtllm_qwen3235ba22b_h200_5000_500", QWEN235 + requests(1500, 5000, 500),
          lambda s: s["output_tokens_per_s"],
          "1 engine of 8 H200, attention DP8 + EP8, BF16 weights; 1500 requests 5000/500 at rate inf; "
          "output tokens/s"),
    *[Point(f"lep_prefill_{k}", deepseek_unit("h100", 32, 256, 16384, tp=2) + requests(2048, p, 1),
            per_node("input_tokens_per_s", 32),
            f"the prefill unit: 1 engine of 32 H100, attention TP2 x DP16 (DP32 leaves no KV memory with BF16 "
            f"weights) + EP32, BF16; 2048 requests of {p} tokens, 1 output token, at rate inf, 16,384 prefill "
            "tokens per rank per step; input tokens/s / 4 nodes")
      for k, p in (("1k", 1000), ("2k", 2000), ("4k", 4096), ("4k_perfect_eplb", 4096))],
    Point("dsprof_prefill_4k", deepseek_unit("h800", 32, 256, 16384, tp=2) + requests(2048, 4096, 1),
          per_node("input_tokens_per_s", 32),
          "1 engine of 32 H800, attention TP2 x DP16 (DP32 leaves no KV memory with BF16 weights) + EP32, BF16; "
          "2048 requests of 4096 tokens, 1 output token, at rate inf, 16,384 prefill tokens per rank per step; "
          "input tokens/s / 4 nodes"),
]

NOT_SIMULATED = {
    "ds6_prefill_node": "production 24-hour average: idle time and 56.3% on-disk cache hits averaged in; no "
                        "steady-state setup to simulate",
    "ds6_decode_node": "production 24-hour average under varying load; no steady-state setup",
    "ds6_user_speed": "production fleet average; no setup",
    "lep_decode_2k": "256 sequences of 2,000 tokens per H100 need 36 GB of MLA KV per GPU; with BF16 weights "
                     "(DP72 + EP72: 48 GB per GPU) a rank holds 251k KV tokens, under half the 528k the batch needs",
    "dsprof_decode_4k": "128 sequences of 4,096 tokens per H800 need 532k KV tokens per rank; with BF16 weights "
                        "(DP128 + EP128) a rank holds 364k",
    "lep_decode_4k_simmtp": "simulated MTP with dummy attention kernels: the simulator has no speculative decoding",
    "lep_decode_simmtp_no_tbo": "as lep_decode_4k_simmtp (MTP)",
    "lep_headline_input": "the same measurement as lep_prefill_2k, rounded",
    "lep_itl": "approximate ITL of unstated runs",
    "vllm_wideep_h200": "GPU count, lengths and load not stated",
    "h800study_p4d6_input": "4 prefill nodes + 6 decode nodes: the cluster config has one GPU count per engine",
    "h800study_p4d6_output": "as h800study_p4d6_input",
}
REASON_BY_MODEL = "model not in configs/catalogue/models.yaml"
REASON_H20 = "DeepSeek-R1 BF16 weights (1.34 TB) exceed 8 or 16 H20 (768 GB / 1.5 TB with KV); the catalogue has no FP8 weights"


def load_config(overrides: list[str]):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        return compose(config_name="config", overrides=["logger=none", *overrides])


def published_value(text: str) -> float:
    """The number of a published cell ("23,789", "~100", "20-22": the middle)."""
    t = str(text).replace(",", "").replace("~", "").strip()
    if "-" in t[1:]:
        lo, hi = t.split("-", 1)
        return (float(lo) + float(hi)) / 2
    return float(t)


def read_sources(path: Path) -> pd.DataFrame:
    """The published rows; a row without a source or citation is refused, naming it."""
    sources = pd.read_csv(path, dtype=str)
    for key in ("source", "citation"):
        missing = sources[sources[key].isna() | (sources[key].fillna("").str.strip() == "")]
        if not missing.empty:
            raise ValueError(f"{path.name}: row(s) {', '.join(missing['id'])} have no {key}")
    return sources


def run_point(p: Point) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as d:
        summary = run_experiment(load_config(p.overrides + p.extra), d)
    return p.simulated(summary), summary


def not_simulated_reason(row: pd.Series) -> str:
    if row["id"] in NOT_SIMULATED:
        return NOT_SIMULATED[row["id"]]
    model = str(row["model"])
    if model.startswith("n/a") or "communication only" in model:
        return "a communication or transfer microbenchmark, not a serving point"
    if "H20" == str(row["hardware"]).strip() and "DeepSeek" in model:
        return REASON_H20
    if not any(m in model for m in ("Qwen3-235B", "DeepSeek-V3", "DeepSeek (V3")):
        return REASON_BY_MODEL
    return "not expressed yet"


def figure(df: pd.DataFrame, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    from harness.figure_style import COLUMN_IN, RC
    with plt.rc_context(RC):
        fig, ax = plt.subplots(figsize=(COLUMN_IN, COLUMN_IN))
        for (source, unit), g in df.groupby(["source", "unit"]):
            ax.scatter(g["published_value"], g["simulated_value"], label=f"{source} ({unit})", s=14)
        lo = min(df["published_value"].min(), df["simulated_value"].min()) / 1.5
        hi = max(df["published_value"].max(), df["simulated_value"].max()) * 1.5
        ax.plot([lo, hi], [lo, hi], color="0.5", lw=0.8)
        for f in (0.75, 1.25):
            ax.plot([lo, hi], [lo * f, hi * f], color="0.7", lw=0.6, ls="--")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="published", ylabel="simulated",
               title="dashed: ±25%")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(NullFormatter())
        ax.legend(fontsize=5, loc="upper left")
        fig.tight_layout()
        for ext in ("png", "pdf"):
            fig.savefig(path.with_suffix(f".{ext}"), dpi=200)
        plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="ids to run (default: all)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("fontTools").setLevel(logging.WARNING)   # its PDF font subsetting logs at INFO
    sources = read_sources(SOURCES)
    by_id = sources.set_index("id")
    rows = []
    for p in POINTS:
        if args.only and p.id not in args.only:
            continue
        if p.id not in by_id.index:
            raise ValueError(f"{p.id}: no such row in {SOURCES.name}")
        src = by_id.loc[p.id]
        value, summary = run_point(p)
        published = published_value(src["published_value"])
        rows.append({"id": p.id, "source": src["source"], "model": src["model"], "hardware": src["hardware"],
                     "parallelism": src["parallelism"], "workload": src["workload"], "metric": src["metric"],
                     "unit": src["unit"], "published_value": published, "simulated_value": value,
                     "signed_error": value / published - 1, "used_for_fit": False, "simulated_setup": p.setup,
                     "preemptions": summary["preemptions"], "citation": src["citation"]})
        log.info("%-40s published %10.1f simulated %10.1f error %+6.1f%% (wall %.1f s)", p.id, published, value,
                 100 * (value / published - 1), summary["wall_time_s"])
    df = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "published.csv", index=False)
    skipped = sources[~sources["id"].isin([p.id for p in POINTS])]
    pd.DataFrame({"id": skipped["id"], "source": skipped["source"],
                  "reason": [not_simulated_reason(r) for _, r in skipped.iterrows()]}).to_csv(
        args.out / "published_not_simulated.csv", index=False)
    if not df.empty:
        figure(df, args.out / "published")
        err = df["signed_error"].abs()
        log.info("%d points: median |error| %.1f%%, max %.1f%%, within 25%%: %d", len(df), 100 * err.median(),
                 100 * err.max(), int((err <= 0.25).sum()))


if __name__ == "__main__":
    main()
