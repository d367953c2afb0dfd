"""Kernel-level GPU profile for the roofline model: GEMM, attention and HBM bandwidth with torch.

Why: the roofline cost model (harness/perf/roofline.py) takes three efficiencies from
configs/catalogue/perf.yaml (gemm_mfu, attn_mfu, mem_efficiency) that came from Vidur's H100
profiles. This script measures them on the GPU at hand, at the shapes of the models we simulate
(Qwen3-8B dense, Qwen3-30B-A3B MoE), and writes them with the raw measurements as JSON:

    python scripts/gpu_profile.py --out results/calibration/h200_profile.json      # ~1-2 min on an H200
    python scripts/gpu_profile.py --smoke --out /tmp/p.json                     # tiny shapes, CPU ok

Definitions (the same as perf.yaml's sources, docs/references.md, section 4):
  gemm_mfu       = achieved FLOP/s of the dense GEMMs at >= 1024 tokens / peak (median over shapes)
  mem_efficiency = weight bytes streamed per second by GEMMs at <= 128 tokens / HBM bandwidth (median)
  attn_mfu       = achieved FLOP/s of causal prefill attention at >= 4096 tokens / peak (median)
  copy_efficiency = bytes (read + written) per second of a large device copy / HBM bandwidth
Peaks are the catalogue's (configs/catalogue/gpus.yaml, h200: 989 TFLOP/s dense BF16, 4.8 TB/s).

It also times whole forward passes (Qwen3-8B, Qwen3-32B and the MoE Qwen3-30B-A3B, one GPU): a
prefill of L tokens run eagerly, and decode steps of B sequences at C cached tokens as a CUDA graph
(as vLLM runs them).
`--reimply` (on a machine with the harness) sets the roofline's step time for each beside it, with
perf.yaml's constants: the check of the model as a whole, not of one constant.

Measuring uses only torch and the standard library, so it runs on the device image as is.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass

try:   # measuring needs torch; --reimply (the roofline beside the measurements) does not
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = F = None

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

# Whole models for the forward-pass steps: (layers, hidden, heads, kv_heads, head_dim, intermediate,
# vocab) from each config.json (configs/catalogue/models.yaml; qwen3_tiny: harness/engines/model.py).
# MoE models: (experts, top_k, expert intermediate) of each MoE layer, whose MLP is the experts'.
STEP_MODELS = {"qwen3_8b": (36, 4096, 32, 8, 128, 12288, 151936),
               "qwen3_32b": (64, 5120, 64, 8, 128, 25600, 151936),
               "qwen3_30b_a3b": (48, 2048, 32, 4, 128, 0, 151936),
               "qwen3_tiny": (4, 256, 4, 2, 64, 512, 4096),
               "tiny_moe": (2, 256, 4, 2, 64, 0, 4096)}   # the smoke run's MoE (no catalogue entry)
STEP_MOE = {"qwen3_30b_a3b": (128, 8, 768), "tiny_moe": (8, 2, 128)}

FULL = dict(tokens=[2 ** i for i in range(15)],            # 1 .. 16384
            prefill_lens=[1024, 4096, 16384],
            decode=[(1, 4096), (32, 4096), (128, 4096), (32, 16384)],   # (batch, context)
            copy_bytes=4 * 2 ** 30, target_s=0.03,
            step_models=["qwen3_8b", "qwen3_32b", "qwen3_30b_a3b"], step_prefill=[1024, 4096, 16384],
            step_decode=[(16, 4096), (64, 4096), (256, 1024)])
SMOKE = dict(tokens=[1, 16, 64], prefill_lens=[64], decode=[(2, 64)], copy_bytes=2 ** 22, target_s=0.002,
             step_models=["qwen3_tiny", "tiny_moe"], step_prefill=[64], step_decode=[(2, 64)])


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


def steps(device, dtype, cfg) -> list[Measurement]:
    """Whole forward passes: RMSNorm, QKV, attention (SDPA, GQA), O, RMSNorm, gate+up, SiLU, down per
    layer, and the LM head (a prefill's last token, every decode token); rotary embeddings left out
    (elementwise, small). One layer's weights and KV serve every layer: each is larger than the L2
    cache at the full shapes, so the HBM traffic is the real model's.

    An MoE layer (STEP_MOE) runs its router GEMM and then the experts as a padded grouped GEMM: each
    token's top-k experts drawn at random, once, outside the timed pass (a batched routing), the tokens
    gathered per expert into [experts, most tokens of any expert, hidden], two batched matmuls and
    SiLU, and the results added back per token. That is torch's bmm, not vLLM's fused MoE kernel;
    every expert's weights are read (at >= 64 tokens with top-8 of 128, all experts are touched anyway)."""
    out = []
    for model in cfg["step_models"]:
        layers, h, nh, nkv, d, inter, vocab = STEP_MODELS[model]
        w = {name: torch.randn(k, n, device=device, dtype=dtype) / k ** 0.5 for name, (k, n) in {
            "qkv": (h, (nh + 2 * nkv) * d), "o": (nh * d, h), "gu": (h, 2 * inter), "down": (inter, h),
            "head": (h, vocab)}.items() if k and n}
        moe = STEP_MOE.get(model)
        if moe:
            experts, top_k, einter = moe
            w["router"] = torch.randn(h, experts, device=device, dtype=dtype) / h ** 0.5
            w["egu"] = torch.randn(experts, h, 2 * einter, device=device, dtype=dtype) / h ** 0.5
            w["edown"] = torch.randn(experts, einter, h, device=device, dtype=dtype) / einter ** 0.5

        def routing(tokens: int):
            """[experts, cap] token indices (padding: `tokens`, a zero row) of a random top-k routing."""
            picks = torch.rand(tokens, experts).argsort(dim=1)[:, :top_k]
            per = [[] for _ in range(experts)]
            for t, row in enumerate(picks.tolist()):
                for e in row:
                    per[e].append(t)
            cap = max(len(p) for p in per)
            return torch.tensor([p + [tokens] * (cap - len(p)) for p in per], device=device)

        def mlp(y, idx):
            if not moe:
                g, u = (y @ w["gu"]).chunk(2, dim=-1)
                return (F.silu(g) * u) @ w["down"]
            y @ w["router"]   # the router's GEMM (its top-k is the fixed routing `idx`)
            padded = torch.cat([y, y.new_zeros(1, h)])
            g, u = torch.bmm(padded[idx], w["egu"]).chunk(2, dim=-1)
            e = torch.bmm(F.silu(g) * u, w["edown"])
            return padded.new_zeros(padded.shape).index_add_(0, idx.flatten(), e.flatten(0, 1))[:-1]

        def forward(x, attend, last_only, idx=None):
            for _ in range(layers):
                q, k, v = (F.rms_norm(x, (h,)) @ w["qkv"]).split([nh * d, nkv * d, nkv * d], dim=-1)
                x = x + attend(q, k, v) @ w["o"]
                x = x + mlp(F.rms_norm(x, (h,)), idx)
            return F.rms_norm(x[-1:] if last_only else x, (h,)) @ w["head"]

        for n in cfg["step_prefill"]:
            x = torch.randn(n, h, device=device, dtype=dtype)

            def causal(q, k, v, n=n):
                q, k, v = (t.view(n, -1, d).transpose(0, 1).unsqueeze(0) for t in (q, k, v))
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                return a.squeeze(0).transpose(0, 1).reshape(n, nh * d)
            idx = routing(n) if moe else None
            s = timed(lambda: forward(x, causal, True, idx), device, cfg["target_s"])
            out.append(Measurement("step_prefill", model, "forward_eager", n, 0, s, 0.0, 0.0))
        for b, c in cfg["step_decode"]:
            x = torch.randn(b, h, device=device, dtype=dtype)
            kc, vc = torch.randn(b, nkv, c, d, device=device, dtype=dtype), torch.randn(b, nkv, c, d, device=device, dtype=dtype)

            def cached(q, k, v, b=b, kc=kc, vc=vc):   # the new token's own K, V left out: 1 of c
                return F.scaled_dot_product_attention(q.view(b, nh, 1, d), kc, vc, enable_gqa=True).reshape(b, nh * d)
            idx = routing(b) if moe else None
            fn, name = (lambda: forward(x, cached, False, idx)), "forward_eager"
            if device.type == "cuda":
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        fn()
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    fn()
                fn, name = graph.replay, "forward_graph"
            s = timed(fn, device, cfg["target_s"])
            out.append(Measurement("step_decode", model, name, b, c, s, 0.0, 0.0))
            del kc, vc
        del w
    return out


def roofline_steps(ms: list[Measurement], gpu: str) -> list[dict]:
    """The roofline's step time (harness/perf/roofline.py, perf.yaml's constants, tp=1) for each
    measured forward pass: the whole step, and its kernels alone (without the fixed per-step and
    per-request overheads, which are the engine's CPU work a bare forward pass does not have)."""
    from harness.perf.catalogue import lookup, model_catalogue, perf_defaults
    from harness.perf.cost_model import prefill_attn_ctx
    from harness.perf.roofline import Parallelism, PerfConstants, RankBatch, RooflineCostModel

    spec, perf = lookup("gpu", gpu, "--gpu"), PerfConstants(**perf_defaults())
    roofs: dict[str, RooflineCostModel] = {}
    rows = []
    for m in ms:
        if not m.kind.startswith("step_") or m.model not in model_catalogue():
            continue   # (the smoke run's tiny MoE has no catalogue entry)
        if m.model not in roofs:
            roofs[m.model] = RooflineCostModel(lookup("model", m.model, "model"), spec, perf, Parallelism())
        roof = roofs[m.model]
        if m.kind == "step_prefill":
            rb, graph = RankBatch(prefill_tokens=m.m, prefill_attn_ctx=prefill_attn_ctx(m.m, 0),
                                  prefill_kv_read=m.m, requests=1), False
        else:
            rb, graph = RankBatch(decode_seqs=m.m, decode_ctx=m.m * m.ctx, requests=m.m), m.name == "forward_graph"
        step, kernels = roof.step_time([rb], graph=graph), roof.rank_time(rb)
        rows.append({"kind": m.kind, "model": m.model, "m": m.m, "ctx": m.ctx, "measured_s": m.seconds,
                     "roofline_s": step, "roofline_kernels_s": kernels, "roofline_over_measured": step / m.seconds})
    return rows


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
    ap.add_argument("--gpu", default="h200", help="the catalogue GPU the roofline steps are computed for (--reimply)")
    args = ap.parse_args()
    if args.reimply:
        with open(args.reimply) as f:
            old = json.load(f)
        ms = [Measurement(**{k: v for k, v in r.items() if k not in ("tflops", "gbps")}) for r in old["measurements"]]
        old["implied"] = implied(ms, old["peak_flops"], old["hbm_bw"])
        old["implied_by_model"] = implied_by_model(ms, old["peak_flops"], old["hbm_bw"])
        old["roofline_steps"] = roofline_steps(ms, args.gpu)
        with open(args.out, "w") as f:
            json.dump(old, f, indent=1)
        print(json.dumps({"implied": old["implied"], "implied_by_model": old["implied_by_model"]}, indent=1))
        for r in old["roofline_steps"]:
            print(f"{r['kind']:12s} {r['model']:10s} m={r['m']:6d} ctx={r['ctx']:6d} measured "
                  f"{r['measured_s'] * 1e3:9.2f} ms  roofline {r['roofline_s'] * 1e3:9.2f} ms  "
                  f"({r['roofline_over_measured']:.3f})")
        return
    if torch is None:
        raise SystemExit("measuring needs torch (the engine environment has it: make test-engines)")
    cfg = SMOKE if args.smoke else FULL
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    ms = gemms(device, dtype, cfg)
    print(f"gemm done {time.perf_counter() - t0:.1f}s", flush=True)
    ms += attention(device, dtype, cfg)
    print(f"attention done {time.perf_counter() - t0:.1f}s", flush=True)
    ms += copy_bw(device, cfg)
    ms += steps(device, dtype, cfg)
    print(f"steps done {time.perf_counter() - t0:.1f}s", flush=True)
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
