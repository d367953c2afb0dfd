"""The cost model against published serving measurements: `python scripts/published.py`.

For each row of results/reference/published_sources.csv that the catalogue can express (its model and
GPU in configs/catalogue/, its weights fitting the GPUs; FP8 where the published run used FP8 weights,
`cluster.weight_dtype=fp8`), reproduces the published setup and writes results/reference/published.csv
(published against simulated, signed error) and results/reference/published.png/.pdf (log-log, one
marker per source). Rows it cannot express are listed with the reason in
results/reference/published_not_simulated.csv.

Two kinds of point:
- serve: the serving benchmark (mode=serve, harness/serve.py) at the published requests and lengths;
  where a published deployment is larger than one engine (a prefill unit of several nodes), one engine of
  that unit is simulated at the published per-device load and the per-node figure is read from it.
- decode step: a decode-only measurement at a fixed batch and KV length per device (the large-EP decode
  units, measured with the prefill side unlimited) is the simulated engine's decode step at that batch,
  the one the simulator times each step with (harness/cluster.py parallel_cost_model), after checking
  that the batch's KV fits the engine's memory.
The CSV's `simulated_setup` says which, and what was simulated.

Nothing is fitted here (used_for_fit is false everywhere): this measures the cost model as it is, with
every constant of configs/catalogue/ unchanged.
"""
from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hydra import compose, initialize_config_dir  # noqa: E402

from harness.api import Role  # noqa: E402
from harness.cluster import cluster_from_config, parallel_cost_model  # noqa: E402
from harness.experiment import run_experiment  # noqa: E402
from harness.perf.catalogue import WEIGHT_BYTES, model_catalogue  # noqa: E402

SOURCES = ROOT / "results" / "reference" / "published_sources.csv"
OUT = ROOT / "results" / "reference"
log = logging.getLogger("published")

# The published setups. GPUs per node: 8 in every source here (H100/H200/H800 HGX nodes).
GPUS_PER_NODE = 8
FP8 = ["++cluster.weight_dtype=fp8"]   # every point here ran FP8 GEMMs with FP8 weights (see each source)
QWEN235 = ["cluster=qwen235_h200", "cluster.num_engines=1", "policy=colocate"]   # attention DP8 + EP8
# TensorRT-LLM's steps as vLLM's (decode first, then prefill within the token budget); its batch limits are
# the ones trtllm-bench picks (`trtllm_bench_limits`).
TRTLLM = ["cluster.engine=vllm"]
# trtllm-bench's KV share of the memory left after the weights: the default of `throughput`'s
# --kv_cache_free_gpu_mem_fraction (NVIDIA/TensorRT-LLM tensorrt_llm/bench/benchmark/throughput.py @000a01de).
TRTLLM_KV_FRACTION = 0.90
# The memory NVML reports, which trtllm-bench's rule reads (nvidia-smi memory.total: H100 SXM 80GB HBM3
# 81,559 MiB, H200 143,771 MiB), a little above the datasheets' 80 GB and 141 GB.
NVML_TOTAL_BYTES = {"h100": 81559 * 2**20, "h200": 143771 * 2**20}


def _round_up(x: float, step: int) -> int:
    return int(-(-x // step) * step)


def trtllm_bench_limits(model: str, gpu: str, tp: int, isl: int, osl: int) -> list[str]:
    """max_batch_size and max_num_tokens by the rule `trtllm-bench throughput` applies when the command
    gives neither (the perf overview's runs), for a BF16 KV cache (the simulator's): as many requests as
    the KV memory holds at ISL + OSL tokens each (rounded up), and a token budget of that unrounded count's
    share of prompt tokens (rounded up), at least the longest prompt plus the batch (no chunked prefill).
    NVIDIA/TensorRT-LLM tensorrt_llm/bench/build/tuning.py @04cba882 (`calc_engine_setting`,
    `finetune_setting`); the floor: bench/benchmark/utils/general.py @0171265e (`get_settings`). Attention
    DP is not in that rule, and its limits apply to each attention rank."""
    spec, mem = model_catalogue()[model], NVML_TOTAL_BYTES[gpu]
    kv_per_token = spec.kv_bytes_per_token // spec.kv_heads * max(tp, spec.kv_heads)   # KV heads replicated up to TP
    weight_bytes = spec.total_params * WEIGHT_BYTES["fp8"]
    requests = (mem * tp - weight_bytes) * TRTLLM_KV_FRACTION / (kv_per_token * (isl + osl))
    raw = min(requests, 4096)
    bs = max(_round_up(raw, 32), 64) if raw < 256 else _round_up(raw, 128) if raw < 1024 else _round_up(raw, 256)
    tokens = min(raw * (1 + isl / osl), 32768)
    tokens = (max(_round_up(tokens, 256), 2048) if tokens < 4096 else _round_up(tokens, 512) if tokens < 8192
              else _round_up(tokens, 1024))
    return [f"cluster.max_num_seqs={bs}", f"cluster.max_num_batched_tokens={max(tokens, isl + bs)}"]


def dense_engine(model: str, gpu: str, tp: int) -> list[str]:
    """One engine of a dense model on `tp` GPUs (TP), FP8 weights, TensorRT-LLM's batch limits."""
    par = f"{{tp: {tp}, dp: 1, ep: false}}"
    return ["cluster=dense_h100", f"cluster.model={model}", f"cluster.gpu={gpu}", "cluster.num_engines=1",
            f"cluster.gpus_per_engine={tp}", f"cluster.parallelism.colocated={par}",
            f"cluster.parallelism.prefill={par}", f"cluster.parallelism.decode={par}", "policy=colocate",
            *TRTLLM, *FP8]


def deepseek_unit(gpu: str, gpus: int, max_seqs: int, budget: int) -> list[str]:
    """One DeepSeek-V3 engine of `gpus` GPUs with DP attention (one GPU per rank) and EP over all of them
    (the SGLang and DeepSeek deployments), FP8 weights, SGLang step semantics, `max_seqs` sequences and
    `budget` prefill tokens per rank."""
    par = f"{{tp: 1, dp: {gpus}, ep: true}}"
    return ["cluster=deepseek_v3_h200", f"cluster.gpu={gpu}", "cluster.num_engines=1", f"cluster.gpus_per_engine={gpus}",
            f"cluster.parallelism.colocated={par}", f"cluster.parallelism.prefill={par}", f"cluster.parallelism.decode={par}",
            "cluster.engine=sglang", f"cluster.max_num_seqs={max_seqs}", f"cluster.max_num_batched_tokens={budget}",
            f"cluster.chunked_prefill_size={budget}", "policy=colocate", *FP8]


def requests(n: int, prompt: int, output: int) -> list[str]:
    return ["mode=serve", "workload=requests", f"workload.num_requests={n}", f"workload.prompt_tokens={prompt}",
            f"workload.output_tokens={output}", "mode.request_rate=inf"]


def per_node(key: str, gpus: int) -> Callable[[dict], float]:
    return lambda s: s[key] / (gpus / GPUS_PER_NODE)


@dataclass(frozen=True)
class Point:
    """A serve point: the serving benchmark at `overrides`, the published metric read from its summary."""
    id: str
    overrides: list[str]
    simulated: Callable[[dict], float]   # the published metric, in its unit, from the run's summary.json
    setup: str                           # what was simulated, in words
    extra: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DecodePoint:
    """A decode-only point: `seqs[r]` sequences of `ctx` tokens of KV on each rank r of the engine of
    `overrides`; the metric is output tokens/s of one decode step per node, per engine (`per="engine"`) or
    per sequence (`per="request"`)."""
    id: str
    overrides: list[str]
    seqs: list[int]
    ctx: int
    setup: str
    per: str = "node"


def ranks(total: int, n: int) -> list[int]:
    """`total` sequences spread over `n` ranks as evenly as whole sequences go."""
    return [total // n + (1 if r < total % n else 0) for r in range(n)]


POINTS: list = [
    Point("trtllm_qwen3235ba22b_h100_1000_1000",
          QWEN235 + ["cluster.gpu=h100"] + TRTLLM + trtllm_bench_limits("qwen3_235b_a22b", "h100", 8, 1000, 1000) + FP8
          + requests(3000, 1000, 1000),
          lambda s: s["output_tokens_per_s"],
          "serve: 1 engine of 8 H100, attention DP8 + EP8, FP8 weights, TensorRT-LLM batch limits; 3000 requests "
          "1000/1000 at rate inf; output tokens/s"),
    Point("trtllm_qwen3235ba22b_h200_1000_1000",
          QWEN235 + TRTLLM + trtllm_bench_limits("qwen3_235b_a22b", "h200", 8, 1000, 1000) + FP8 + requests(3000, 1000, 1000),
          lambda s: s["output_tokens_per_s"],
          "serve: 1 engine of 8 H200, attention DP8 + EP8, FP8 weights, TensorRT-LLM batch limits; 3000 requests "
          "1000/1000 at rate inf; output tokens/s"),
    Point("trtllm_qwen3235ba22b_h200_5000_500",
          QWEN235 + TRTLLM + trtllm_bench_limits("qwen3_235b_a22b", "h200", 8, 5000, 500) + FP8 + requests(1500, 5000, 500),
          lambda s: s["output_tokens_per_s"],
          "serve: 1 engine of 8 H200, attention DP8 + EP8, FP8 weights, TensorRT-LLM batch limits; 1500 requests "
          "5000/500 at rate inf; output tokens/s"),
    *[Point(f"trtllm_{name}_{gpu}_{p}_{o}",
            dense_engine(model, gpu, tp) + trtllm_bench_limits(model, gpu, tp, p, o) + requests(n, p, o),
            lambda s: s["output_tokens_per_s"],
            f"serve: 1 engine of {tp} {gpu.upper()}, TP{tp}, FP8 weights (KV BF16), TensorRT-LLM batch limits; "
            f"{n} requests {p}/{o} at rate inf; output tokens/s")
      for name, model, gpu, tp, p, o, n in (
          ("llama318b", "llama3_1_8b", "h100", 1, 1000, 1000, 3000),
          ("llama318b", "llama3_1_8b", "h100", 1, 2048, 128, 3000),
          ("llama318b", "llama3_1_8b", "h100", 1, 128, 2048, 3000),
          ("llama318b", "llama3_1_8b", "h200", 1, 1000, 1000, 3000),
          ("llama3370b", "llama3_3_70b", "h100", 2, 1000, 1000, 3000),
          ("llama3370b", "llama3_3_70b", "h100", 2, 2048, 128, 3000),
          ("llama3370b", "llama3_3_70b", "h200", 1, 1000, 1000, 3000))],
    *[Point(f"lep_prefill_{k}", deepseek_unit("h100", 32, 256, 16384) + requests(2048, p, 1),
            per_node("input_tokens_per_s", 32),
            f"serve, the prefill unit: 1 engine of 32 H100, attention DP32 + EP32, FP8 weights; 2048 requests of "
            f"{p} tokens, 1 output token, at rate inf, 16,384 prefill tokens per rank per step; input tokens/s / 4 nodes")
      for k, p in (("1k", 1000), ("2k", 2000), ("4k", 4096), ("4k_perfect_eplb", 4096))],
    Point("dsprof_prefill_4k", deepseek_unit("h800", 32, 256, 16384) + requests(2048, 4096, 1),
          per_node("input_tokens_per_s", 32),
          "serve, the prefill unit: 1 engine of 32 H800, attention DP32 + EP32, FP8 weights; 2048 requests of 4096 "
          "tokens, 1 output token, at rate inf, 16,384 prefill tokens per rank per step; input tokens/s / 4 nodes"),
    Point("h800study_p4d6_input", deepseek_unit("h800", 32, 256, 16384) + requests(1024, 1024, 1),
          lambda s: s["input_tokens_per_s"],
          "serve, the prefill unit alone: 1 engine of 32 H800 (4 nodes), attention DP32 + EP32, FP8 weights; 1024 "
          "requests of 1024 tokens, 1 output token, at rate inf; input tokens/s of the unit"),
    DecodePoint("lep_decode_2k", deepseek_unit("h100", 72, 256, 16384), [256] * 72, 2000,
                "decode step: 1 engine of 72 H100, attention DP72 + EP72, FP8 weights, CUDA graph; 256 sequences "
                "of 2,000 KV tokens per rank; output tokens/s / 9 nodes"),
    DecodePoint("dsprof_decode_4k", deepseek_unit("h800", 128, 256, 16384), [128] * 128, 4096,
                "decode step: 1 engine of 128 H800, attention DP128 + EP128, FP8 weights, CUDA graph; 128 "
                "sequences of 4,096 KV tokens per rank; output tokens/s / 16 nodes"),
    DecodePoint("ds6_decode_node", deepseek_unit("h800", 144, 256, 16384), [128] * 144, 4989,
                "decode step: 1 engine of 144 H800, attention DP144 + EP144, FP8 weights, CUDA graph; 128 sequences "
                "(the batch the SGLang post's table gives this column) of 4,989 KV tokens per rank; output tokens/s "
                "/ 18 nodes (the published value is a 24-hour average under varying load)"),
    DecodePoint("h800study_p4d6_output", deepseek_unit("h800", 48, 256, 16384), ranks(1024, 48), 1024 + 128,
                "decode step, the decode unit alone: 1 engine of 48 H800 (6 nodes), attention DP48 + EP48, FP8 "
                "weights, CUDA graph; 1024 sequences over 48 ranks at 1,152 KV tokens (1K prompt + half of 256 "
                "outputs); output tokens/s of the unit", per="engine"),
]

POINTS.append(DecodePoint(
    "ds6_user_speed", deepseek_unit("h800", 144, 256, 16384), [128] * 144, 4989,
    "decode step: as ds6_decode_node; output tokens/s per sequence (1 / step time)", per="request"))

NOT_SIMULATED = {
    "ds6_prefill_node": "production 24-hour average: idle time and 56.3% on-disk cache hits averaged in; no "
                        "steady-state setup to simulate",
    "lep_decode_4k_simmtp": "simulated MTP with dummy attention kernels: the simulator has no speculative decoding",
    "lep_decode_simmtp_no_tbo": "as lep_decode_4k_simmtp (MTP)",
    "lep_headline_input": "the same measurement as lep_prefill_2k, rounded",
    "lep_itl": "approximate ITL of unstated runs",
    "vllm_wideep_h200": "GPU count, lengths and load not stated",
    "k2_prefill": "Kimi-K2 not in configs/catalogue/models.yaml (its total parameter count to the precision the "
                  "dense share needs was not read), and the post does not say whether batch 480 is per GPU",
    "k2_decode": "as k2_prefill",
}
REASON_BY_MODEL = "model not in configs/catalogue/models.yaml"
REASON_MLPERF = ("Llama-2-70B not in configs/catalogue/models.yaml, and the input lengths of MLPerf's OpenOrca set "
                 "(needed for every metric) were not found in the sources read")
REASON_H20 = ("DeepSeek-R1 on H20: FP8 weights at TP8 take 84 GB of the catalogue's 96e9 bytes per GPU, under 1 GB "
              "of KV at memory_fraction 0.9 (the post's memory settings were not read); the decode rows run MTP, "
              "which the simulator lacks")


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


def decode_point(p: DecodePoint) -> tuple[float, dict]:
    """Output tokens/s per node (or per sequence) of one decode step of the engine at the point's batch, once
    the batch's KV is checked to fit each rank's memory."""
    cluster = cluster_from_config(load_config(p.overrides).cluster)
    cm = parallel_cost_model(cluster, cluster.parallelism[Role.DECODE])
    capacity = cm.kv_capacity_tokens(cluster.memory_fraction, cluster.activation_reserve_bytes)
    if max(p.seqs) * p.ctx > capacity:
        raise ValueError(f"{p.id}: {max(p.seqs)} x {p.ctx} KV tokens per rank exceed its {capacity}")
    t = cm.decode_step_time(p.seqs, [n * p.ctx for n in p.seqs], True)
    rate = {"request": 1 / t, "engine": sum(p.seqs) / t,
            "node": sum(p.seqs) / t / (cluster.gpus_per_engine / GPUS_PER_NODE)}[p.per]
    return rate, {"preemptions": 0, "wall_time_s": 0.0}


def not_simulated_reason(row: pd.Series) -> str:
    if row["id"] in NOT_SIMULATED:
        return NOT_SIMULATED[row["id"]]
    model = str(row["model"])
    if model.startswith("n/a") or "communication only" in model:
        return "a communication or transfer microbenchmark, not a serving point"
    if "H20" == str(row["hardware"]).strip() and "DeepSeek" in model:
        return REASON_H20
    if "Llama-2-70B" in model:
        return REASON_MLPERF
    if not any(m in model for m in ("Qwen3-235B", "DeepSeek-V3", "DeepSeek (V3")):
        return REASON_BY_MODEL
    return "not expressed yet"


def figure(df: pd.DataFrame, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    from harness.figure_style import COLUMN_IN, rc, save
    with plt.rc_context(rc()):
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
            save(fig, path.with_suffix(f".{ext}"), dpi=200)
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
        value, summary = decode_point(p) if isinstance(p, DecodePoint) else run_point(p)
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
