"""Kernel-level GPU profile for the roofline model: GEMM, attention and HBM bandwidth with torch.

Why: the roofline cost model (harness/perf/roofline.py) takes three efficiencies from
configs/catalogue/perf.yaml (gemm_mfu, attn_mfu, mem_efficiency) that came from Vidur's H100
profiles. This script measures them on the GPU at hand, at the shapes of the models we simulate
(Qwen3-8B dense, Qwen3-30B-A3B MoE), and writes them with the raw measurements as JSON:

    python scripts/gpu_profile.py --out results/reference/h200_profile.json      # ~1-2 min on an H200
    python scripts/gpu_profile.py --smoke --out /tmp/p.json                     # tiny shapes, CPU ok

Definitions (the same as perf.yaml's sources, docs/references.md, section 4):
  gemm_mfu       = achieved FLOP/s of the dense GEMMs at >= 1024 tokens / peak (median over shapes)
  mem_efficiency = weight bytes streamed per second by GEMMs at <= 128 tokens / HBM bandwidth (median)
  attn_mfu       = achieved FLOP/s of causal prefill attention at >= 4096 tokens / peak (median)
  copy_efficiency = bytes (read + written) per second of a large device copy / HBM bandwidth
Peaks are the catalogue's (configs/catalogue/gpus.yaml, h200: 989 TFLOP/s dense BF16, 4.8 TB/s).
Only torch and the standard library are used, so it runs on the device image as is.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

# configs/catalogue/gpus.yaml, h200 (datasheet dense BF16 and HBM3e bandwidth).
H200_PEAK_FLOPS = 989.0e12
H200_HBM_BW = 4.8e12

# (name, K, N) of one GEMM y[M,N] = x[M,K] @ W[K,N]; shapes from each model's config.json
# (configs/catalogue/models.yaml). Qwen3-8B: hidden 4096, 32 heads, 8 KV heads, head_dim 128,
# intermediate 12288. Qwen3-30B-A3B: hidden 2048, 32 heads, 4 KV heads, head_dim 128, expert
# intermediate 768 (one expert's GEMM; with 128 experts and top-8, M tokens give ~M/16 rows per expert).
GEMM_SHAPES = {
    "qwen3_8b": [("qkv", 4096, (32 + 2 * 8) * 128), ("o", 32 * 128, 4096),
                 ("gate_up", 4096, 2 * 12288), ("down", 12288, 4096)],
    "qwen3_30b_a3b": [("qkv", 2048, (32 + 2 * 4) * 128), ("o", 32 * 128, 2048),
                      ("expert_gate_up", 2048, 2 * 768), ("expert_down", 768, 2048)],
}
# Attention shapes (heads, kv_heads, head_dim) of the same models.
ATTN_SHAPES = {"qwen3_8b": (32, 8, 128), "qwen3_30b_a3b": (32, 4, 128)}

FULL = dict(tokens=[2 ** i for i in range(15)],            # 1 .. 16384
            prefill_lens=[1024, 4096, 16384],
            decode=[(1, 4096), (32, 4096), (128, 4096), (32, 16384)],   # (batch, context)
            copy_bytes=4 * 2 ** 30, target_s=0.03)
SMOKE = dict(tokens=[1, 16, 64], prefill_lens=[64], decode=[(2, 64)], copy_bytes=2 ** 22, target_s=0.002)


@dataclass
class Measurement:
    kind: str           # gemm | prefill_attn | decode_attn | copy
    model: str
    name: str
    m: int              # tokens (GEMM rows, prefill length) or decode batch
    ctx: int            # decode context (0 otherwise)
    seconds: float
    flops: float
    bytes: float

    @property
    def tflops(self) -> float:
        return self.flops / self.seconds / 1e12

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9


def timed(fn, device: torch.device, target_s: float) -> float:
    """Median seconds of one call: 3 warm-ups, then enough calls for ~target_s, in 3 timed groups.
    CUDA events on a GPU (wall-clock timers would include launch queueing), perf_counter on a CPU."""
    for _ in range(3):
        fn()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t0, 1e-6)
    reps = max(3, min(200, int(target_s / one)))
    samples = []
    for _ in range(3):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / reps)
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            samples.append((time.perf_counter() - t0) / reps)
    return statistics.median(samples)


def gemms(device, dtype, cfg) -> list[Measurement]:
    out = []
    el = torch.tensor([], dtype=dtype).element_size()
    for model, shapes in GEMM_SHAPES.items():
        for name, k, n in shapes:
            w = torch.randn(k, n, device=device, dtype=dtype)
            for m in cfg["tokens"]:
                x = torch.randn(m, k, device=device, dtype=dtype)
                s = timed(lambda: x @ w, device, cfg["target_s"])
                out.append(Measurement("gemm", model, name, m, 0, s, 2.0 * m * k * n, el * (k * n + m * k + m * n)))
            del w
    return out


def attention(device, dtype, cfg) -> list[Measurement]:
    out = []
    el = torch.tensor([], dtype=dtype).element_size()
    for model, (h, kvh, d) in ATTN_SHAPES.items():
        for n in cfg["prefill_lens"]:       # causal self-attention over a fresh prompt of n tokens
            q = torch.randn(1, h, n, d, device=device, dtype=dtype)
            k = torch.randn(1, kvh, n, d, device=device, dtype=dtype)
            v = torch.randn_like(k)
            s = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                      device, cfg["target_s"])
            # 4*h*d*n*ctx_eff with ctx_eff = (n-1)/2 (roofline.py's prefill attention FLOPs)
            out.append(Measurement("prefill_attn", model, "sdpa_causal", n, 0, s, 4.0 * h * d * n * (n - 1) / 2,
                                   el * (2 * h * n * d + 2 * kvh * n * d)))
        for b, ctx in cfg["decode"]:        # one new token per sequence against ctx cached tokens
            q = torch.randn(b, h, 1, d, device=device, dtype=dtype)
            k = torch.randn(b, kvh, ctx, d, device=device, dtype=dtype)
            v = torch.randn_like(k)
            s = timed(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), device, cfg["target_s"])
            out.append(Measurement("decode_attn", model, "sdpa", b, ctx, s, 4.0 * h * d * b * ctx,
                                   el * 2 * b * kvh * ctx * d))
            del k, v
    return out


def copy_bw(device, cfg) -> list[Measurement]:
    n = cfg["copy_bytes"]
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    s = timed(lambda: dst.copy_(src), device, cfg["target_s"])
    return [Measurement("copy", "-", "device_copy", n, 0, s, 0.0, 2.0 * n)]


def implied_by_model(ms: list[Measurement], peak: float, hbm: float) -> dict[str, dict[str, float]]:
    """Per model, weighted as the roofline sees a layer (all its GEMMs as one): mem_efficiency = all
    dense weight bytes / the summed time of its GEMMs at each token count <= 128 (median over counts);
    gemm_mfu = all FLOPs / summed time at each count >= 1024 (median over counts)."""
    out = {}
    for model in GEMM_SHAPES:
        dense = [m for m in ms if m.kind == "gemm" and m.model == model and not m.name.startswith("expert")]
        by_m: dict[int, list[Measurement]] = {}
        for m in dense:
            by_m.setdefault(m.m, []).append(m)
        mem = [sum(x.bytes for x in g) / sum(x.seconds for x in g) / hbm for k, g in by_m.items() if k <= 128]
        mfu = [sum(x.flops for x in g) / sum(x.seconds for x in g) / peak for k, g in by_m.items() if k >= 1024]
        out[model] = {"gemm_mfu": statistics.median(mfu) if mfu else float("nan"),
                      "mem_efficiency": statistics.median(mem) if mem else float("nan"),
                      "layer_gemm_floor_us": 1e6 * sum(x.seconds for x in by_m[min(by_m)])}
    return out


def implied(ms: list[Measurement], peak: float, hbm: float) -> dict[str, float]:
    """The roofline constants these kernels imply (definitions in the module docstring)."""
    dense = [m for m in ms if m.kind == "gemm" and not m.name.startswith("expert")]
    big = [m.flops / m.seconds for m in dense if m.m >= 1024] or [max(m.flops / m.seconds for m in dense)]
    small = [m for m in dense if m.m <= 128]
    weight_bw = [m.bytes / m.seconds for m in small]
    pre = [m.flops / m.seconds for m in ms if m.kind == "prefill_attn" and m.m >= 4096] or \
          [m.flops / m.seconds for m in ms if m.kind == "prefill_attn"]
    dec = [m.bytes / m.seconds for m in ms if m.kind == "decode_attn"]
    cp = [m.bytes / m.seconds for m in ms if m.kind == "copy"]
    return {"gemm_mfu": statistics.median(big) / peak,
            "mem_efficiency": statistics.median(weight_bw) / hbm,
            "attn_mfu": statistics.median(pre) / peak,
            "decode_attn_mem_efficiency": statistics.median(dec) / hbm,
            "copy_efficiency": statistics.median(cp) / hbm,
            "gemm_tflops_max": max(m.tflops for m in dense),
            "copy_gbps": statistics.median(cp) / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (a CPU check of the script)")
    ap.add_argument("--reimply", help="recompute the implied constants of an existing JSON (no measuring)")
    ap.add_argument("--peak-flops", type=float, default=H200_PEAK_FLOPS)
    ap.add_argument("--hbm-bw", type=float, default=H200_HBM_BW)
    args = ap.parse_args()
    if args.reimply:
        with open(args.reimply) as f:
            old = json.load(f)
        ms = [Measurement(**{k: v for k, v in r.items() if k not in ("tflops", "gbps")}) for r in old["measurements"]]
        old["implied"] = implied(ms, old["peak_flops"], old["hbm_bw"])
        old["implied_by_model"] = implied_by_model(ms, old["peak_flops"], old["hbm_bw"])
        with open(args.out, "w") as f:
            json.dump(old, f, indent=1)
        print(json.dumps({"implied": old["implied"], "implied_by_model": old["implied_by_model"]}, indent=1))
        return
    cfg = SMOKE if args.smoke else FULL
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    ms = gemms(device, dtype, cfg)
    print(f"gemm done {time.perf_counter() - t0:.1f}s", flush=True)
    ms += attention(device, dtype, cfg)
    print(f"attention done {time.perf_counter() - t0:.1f}s", flush=True)
    ms += copy_bw(device, cfg)
    result = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "dtype": str(dtype).removeprefix("torch."), "smoke": args.smoke,
        "peak_flops": args.peak_flops, "hbm_bw": args.hbm_bw,
        "implied": implied(ms, args.peak_flops, args.hbm_bw),
        "implied_by_model": implied_by_model(ms, args.peak_flops, args.hbm_bw),
        "elapsed_s": time.perf_counter() - t0,
        "measurements": [{**asdict(m), "tflops": m.tflops, "gbps": m.gbps} for m in ms],
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result["implied"], indent=1))
    for m in ms:
        print(f"{m.kind:13s} {m.model:14s} {m.name:15s} m={m.m:6d} ctx={m.ctx:6d} "
              f"{m.seconds * 1e6:10.1f} us {m.tflops:8.2f} TFLOP/s {m.gbps:8.1f} GB/s")


if __name__ == "__main__":
    main()
