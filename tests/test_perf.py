"""The roofline cost model: the Vidur golden point, hand-computed step times, and the paper's effects (a), (b)."""
from dataclasses import replace

import numpy as np
import pytest

from harness.perf.catalogue import gpu_catalogue, model_catalogue, perf_defaults
from harness.perf.roofline import Parallelism, PerfConstants, RankBatch, RooflineCostModel

PERF = PerfConstants(**perf_defaults())


def model(name, gpu="h100", **par):
    return RooflineCostModel(model_catalogue()[name], gpu_catalogue()[gpu], PERF, Parallelism(**par))


def test_vidur_golden_point_llama2_7b_qkv_projection():
    # Vidur's H100 profile (microsoft/vidur; docs/references.md, section 1): Llama-2-7B QKV projection, 4096 tokens, TP1, H100 = 0.584 ms.
    m = model("llama2_7b")
    qkv_params = 3 * 4096 * 4096
    t = m.gemm_time(qkv_params, 4096)
    assert t == pytest.approx(0.584e-3, rel=0.15)


def test_kv_bytes_per_token_match_reference():
    cat = model_catalogue()
    assert cat["deepseek_v3"].kv_bytes_per_token == 70_272          # reference: 70,272 B/token (MLA)
    assert cat["qwen3_8b"].kv_bytes_per_token == 2 * 36 * 8 * 128 * 2
    # MoE active parameters follow from the shapes and match the model cards within 5%.
    assert cat["qwen3_30b_a3b"].active_params == pytest.approx(3.3e9, rel=0.05)
    assert cat["qwen3_235b_a22b"].active_params == pytest.approx(22e9, rel=0.05)
    assert cat["deepseek_v3"].active_params == pytest.approx(37e9, rel=0.05)


def test_decode_step_known_answer_by_hand():
    # Qwen3-8B, H100, TP1, 8 sequences of 2000 tokens: memory-bound, so
    # (GEMM weights + KV read) / (HBM * eta) + per-step + per-request overheads.
    cat = model_catalogue()["qwen3_8b"]
    gemm_params = 8.2e9 - 151936 * 4096
    kv = 2 * 36 * 8 * 128 * 2
    bytes_ = gemm_params * 2 + kv * 8 * 2000
    expected = bytes_ / (3.35e12 * 0.80) + 126e-6 + 8 * 4e-6
    m = model("qwen3_8b")
    got = m.decode_step_times(np.array([8]), np.array([16000]), 1)[0]
    assert got == pytest.approx(expected, rel=1e-9)
    assert cat.dense_gemm_params == pytest.approx(gemm_params)


def test_interference_dp_attention_prefill_on_one_rank_slows_all_decodes():
    # Effect 1: colocated DP-attention engine; decode step time rises when one rank prefills.
    m = model("qwen3_30b_a3b", gpu="h200", tp=1, dp=4, ep=True)
    decode = [RankBatch(decode_seqs=32, decode_ctx=32 * 8000, requests=32) for _ in range(4)]
    t_decode_only = m.step_time(decode)
    mixed = [RankBatch(decode_seqs=32, decode_ctx=32 * 8000, requests=33, prefill_tokens=8000,
                       prefill_attn_ctx=8000 * 7999 / 2, prefill_kv_read=8000)] + decode[1:]
    t_mixed = m.step_time(mixed)
    assert t_mixed > 2 * t_decode_only
    # The decode-only step equals the vectorised decode path the simulator uses.
    vec = m.decode_step_times(np.full(4, 32), np.full(4, 32 * 8000), 1)[0]
    assert vec == pytest.approx(t_decode_only, rel=1e-12)


def test_stage_specific_parallelism():
    # Effect 2a: a long prompt prefills faster on a TP8 engine than on one TP1 rank.
    tp8 = model("qwen3_32b", tp=8)
    tp1 = model("qwen3_32b", tp=1, gpu="h200")
    n = 16384
    b = [RankBatch(prefill_tokens=n, prefill_attn_ctx=n * (n - 1) / 2, prefill_kv_read=n, requests=1)]
    assert tp8.step_time(b) < tp1.step_time(b) / 4
    # Effect 2b: DP-attention decode engine holds more sequences than a TP engine of the same GPUs
    # (Qwen3-30B-A3B has 4 KV heads, so TP8 replicates them).
    dp = model("qwen3_30b_a3b", gpu="h200", tp=1, dp=8, ep=True)
    tp = model("qwen3_30b_a3b", gpu="h200", tp=8, ep=False)
    dp_tokens = 8 * dp.kv_capacity_tokens(0.9, 2e9)
    tp_tokens = tp.kv_capacity_tokens(0.9, 2e9)
    assert dp_tokens > 1.5 * tp_tokens


def _models():
    """Roofline models in both regimes (memory- and compute-bound ranks, TP all-reduces) and a profiled one."""
    from harness.perf.profiled import ProfiledCostModel
    cat, gpus = model_catalogue(), gpu_catalogue()
    out = [model("qwen3_30b_a3b", "h200", dp=4, ep=True), model("qwen3_30b_a3b", "h200", tp=4),
           model("qwen3_32b", "h100", tp=4), model("qwen3_8b", "h100", tp=2, dp=2), model("qwen3_8b")]
    k = {"prefill_base_s": 0.01, "prefill_s_per_token": 1e-5, "prefill_s_per_attn_ctx": 1e-9,
         "decode_base_s": 0.02, "decode_s_per_seq": 3e-4, "decode_s_per_ctx": 2e-8}
    out.append(ProfiledCostModel(k, cat["qwen3_8b"], gpus["h100"], PERF, Parallelism(dp=2)))
    # slow attention: compute gains on memory as context grows (the span's last step decides)
    out.append(RooflineCostModel(cat["qwen3_8b"], gpus["h100"], replace(PERF, attn_mfu=0.002), Parallelism(dp=2)))
    return out


@pytest.mark.parametrize("m", _models(), ids=lambda m: f"{type(m).__name__}-tp{m.par.tp}-dp{m.par.dp}")
def test_scalar_decode_times_are_bit_identical_to_the_vectorised_ones(m):
    """The simulator's numpy-free decode step and fast-forward span give exactly the bits of
    decode_step_times and its cumulative sum (what the engine used before)."""
    rng = np.random.default_rng(0)
    for case in range(400):
        dp = m.par.dp
        seqs = rng.integers(0, [3, 40, 300, 600][case % 4], dp)
        if case % 5 == 0:
            seqs[rng.integers(dp)] = 0          # an idle rank
        ctx = seqs * rng.integers(1, [50, 4000, 60000, 200][case % 3], dp)   # short contexts: compute-bound
        steps = int(rng.integers(1, [2, 30, 400][case % 3] + 1))
        graph = bool(case % 2)
        start = float(rng.uniform(0, 1000))
        want = np.cumsum(np.concatenate(([start], m.decode_step_times(seqs, ctx, steps, graph))))[1:]
        got = m.decode_span_ends(seqs.tolist(), ctx.tolist(), steps, graph, start)
        assert got == want.tolist()
        if seqs.any():
            assert m.decode_step_time(seqs.tolist(), ctx.tolist(), graph) == m.decode_step_times(seqs, ctx, 1, graph)[0]


def test_upper_envelope_is_the_most_context_at_every_step():
    from harness.perf.roofline import _upper_envelope
    rng = np.random.default_rng(1)
    for _ in range(500):
        k = int(rng.integers(1, 9))
        seqs, ctx = rng.integers(0, 20, k).tolist(), rng.integers(0, 400, k).tolist()
        steps = int(rng.integers(1, 80))
        segs = _upper_envelope(seqs, ctx, steps)
        assert segs[0][0] == 0 and segs[-1][1] == steps and all(a[1] == b[0] for a, b in zip(segs, segs[1:]))
        for j0, j1, n, c0 in segs:
            for j in range(j0, j1):
                assert c0 + j * n == max(c + j * s for s, c in zip(seqs, ctx))


@pytest.mark.parametrize("m", _models(), ids=lambda m: f"{type(m).__name__}-tp{m.par.tp}-dp{m.par.dp}")
def test_mixed_step_time_is_step_time_of_the_batches(m):
    """The simulator's prefill steps skip building RankBatch objects; the bits are step_time's."""
    rng = np.random.default_rng(2)
    for case in range(400):
        dp = m.par.dp
        seqs = rng.integers(0, [3, 40, 300][case % 3], dp).tolist()
        ctx = [n * int(rng.integers(1, 5000)) for n in seqs]
        prefill = []
        for r in range(dp):
            if rng.random() < 0.5:
                tokens = int(rng.integers(1, 8192))
                past = int(rng.integers(0, 30000))
                prefill.append((r, tokens, tokens * (past + (tokens - 1) / 2), past + tokens,
                                seqs[r] + int(rng.integers(1, 4))))
        graph = bool(case % 2)
        batches = [RankBatch(decode_seqs=n, decode_ctx=c, requests=n) for n, c in zip(seqs, ctx)]
        for r, tokens, attn_ctx, kv_read, requests in prefill:
            b = batches[r]
            b.prefill_tokens, b.prefill_attn_ctx, b.prefill_kv_read, b.requests = tokens, attn_ctx, kv_read, requests
        assert m.mixed_step_time(seqs, ctx, prefill, graph) == m.step_time(batches, graph)


def test_scaled_cost_model_known_answers():
    """A step's decode part is the same step without its prefill chunks: decode_scale multiplies it,
    prefill_scale what the prefill adds (harness/perf/scaled.py); scales of 1 leave the model as it is."""
    from harness.api import Role
    from harness.cluster import parallel_cost_model
    from harness.perf.scaled import ScaledCostModel
    from tests.conftest import cluster_of
    cluster = cluster_of(["cluster=moe_h200"])
    par = cluster.parallelism[Role.COLOCATED]
    inner = parallel_cost_model(cluster, par)
    assert not isinstance(inner, ScaledCostModel)
    scaled = parallel_cost_model(replace(cluster, prefill_time_scale=1.25, decode_time_scale=0.8), par)
    assert isinstance(scaled, ScaledCostModel)
    seqs, ctx = [8] * par.dp, [8 * 2000] * par.dp
    decode = inner.decode_step_time(seqs, ctx, True)
    assert scaled.decode_step_time(seqs, ctx, True) == pytest.approx(0.8 * decode)
    prefill = [(0, 4096, 4096 * 2047.5, 4096, 1)]
    mixed = inner.mixed_step_time(seqs, ctx, prefill, True)
    eager = inner.decode_step_time(seqs, ctx, False)   # a step that prefills runs no CUDA graph
    assert mixed > eager
    assert scaled.mixed_step_time(seqs, ctx, prefill, True) == pytest.approx(0.8 * eager + 1.25 * (mixed - eager))
    ends = scaled.decode_span_ends(seqs, ctx, 3, True, 10.0)
    base = inner.decode_span_ends(seqs, ctx, 3, True, 10.0)
    assert ends == pytest.approx([10.0 + 0.8 * (t - 10.0) for t in base])
    assert scaled.kv_capacity_tokens(0.9, 0) == inner.kv_capacity_tokens(0.9, 0)


def test_fp8_weights_by_hand():
    """cluster.weight_dtype=fp8: 1 byte per GEMM weight and the FP8 peak (2x BF16 on H100), the embedding,
    LM head and KV cache in BF16; DeepSeek-V3 fits DP32 + EP32 on 32 H100 only in FP8."""
    cat, gpus = model_catalogue(), gpu_catalogue()
    bf16 = RooflineCostModel(cat["llama3_1_8b"], gpus["h100"], PERF, Parallelism())
    fp8 = RooflineCostModel(replace(cat["llama3_1_8b"], weight_dtype="fp8"), gpus["h100"], PERF, Parallelism())
    head = 128256 * 4096
    assert fp8.weight_bytes_per_gpu() == pytest.approx((8.03e9 - 2 * head) * 1 + 2 * head * 2)
    assert fp8.kv_bytes_per_token_gpu == bf16.kv_bytes_per_token_gpu
    b = RankBatch(prefill_tokens=8192, requests=1)   # compute-bound: GEMMs at 2x, the head at 1x
    gemm = 2 * (8.03e9 - 2 * head) * 8192 / (1979e12 * 0.74) + 2 * head * 8192 / (989e12 * 0.74)
    assert fp8.rank_time(b) == pytest.approx(gemm)
    ds = replace(cat["deepseek_v3"], weight_dtype="fp8")
    dp32 = Parallelism(tp=1, dp=32, ep=True)
    assert RooflineCostModel(cat["deepseek_v3"], gpus["h100"], PERF, dp32).kv_capacity_tokens(0.9, 2e9) == 0
    assert RooflineCostModel(ds, gpus["h100"], PERF, dp32).kv_capacity_tokens(0.9, 2e9) > 400_000


def test_mla_prefill_is_unabsorbed_by_hand():
    """DeepSeek-V3 (MLA) prefills as multi-head attention over up-projected K/V (q.k over 128 + 64 dims,
    p.v over 128: head dim (128 + 64 + 128) / 2 = 160) and up-projects each chunk's cached prefix again
    (kv_b_proj, 512 -> 128 heads x (128 + 128), 61 layers); decode stays absorbed (head dim 544).
    By hand, H100, TP1, BF16, one chunk of 1,000 tokens after a 3,000-token prefix:
      attention  4 * 61 * 128 * 160 * 1000 * (3000 + 999/2) / (989e12 * 0.45) = 39.29 ms
      up-proj    2 * 61 * 512 * 128 * 256 * 3000 / (989e12 * 0.74)             =  8.39 ms
      GEMMs      2 * dense_gemm_params * 1000 / (989e12 * 0.74)                 (compute-bound)"""
    ds = model_catalogue()["deepseek_v3"]
    assert ds.prefill_attn_head_dim == 160
    assert ds.mla_up_proj_params == 61 * 512 * 128 * 256
    m = model("deepseek_v3", dp=1)
    attn = 4 * 61 * 128 * 160 * 1000 * (3000 + 999 / 2) / (989e12 * 0.45)
    up = 2 * 61 * 512 * 128 * 256 * 3000 / (989e12 * 0.74)
    gemm = 2 * ds.dense_gemm_params * 1000 / (989e12 * 0.74)
    assert attn == pytest.approx(39.29e-3, rel=1e-3) and up == pytest.approx(8.39e-3, rel=1e-3)
    b = RankBatch(prefill_tokens=1000, prefill_attn_ctx=1000 * (3000 + 999 / 2), prefill_kv_read=4000, requests=1)
    assert m.rank_time(b) == pytest.approx(gemm + attn + up, rel=1e-12)
    # decode: absorbed, 544 dims over the latent (memory-bound here: weights + latent KV read)
    d = RankBatch(decode_seqs=64, decode_ctx=64 * 4000, requests=64)
    compute = 2 * ds.dense_gemm_params * 64 / (989e12 * 0.74) + 4 * 61 * 128 * 544 * 64 * 4000 / (989e12 * 0.45)
    memory = (ds.dense_gemm_params * 2 + 70_272 * 64 * 4000) / (3.35e12 * 0.80)
    assert m.rank_time(d) == pytest.approx(max(compute, memory), rel=1e-12)
    # any other model: one head dim in both phases, no up-projection
    q = model("qwen3_8b")
    assert q._prefill_attn_ratio == 1.0 and q._prefix_s_per_token == 0.0


def test_multi_node_ep_prefill_all_to_all_by_hand():
    """A step that prefills on more than one node of EP: DeepEP's normal kernels send a token once per
    other node holding one of its experts (RDMA), then forward it over NVLink; decode-only steps keep
    the low-latency kernels, every expert copy over RDMA. By hand, DeepSeek-V3 FP8 on 32 H100 (4 nodes,
    64 experts each), 16,384 tokens per GPU, FP8 dispatch + BF16 combine = 7168 * 3 bytes a copy:
      P(another node holds none of 8 experts) = C(192, 8) / C(256, 8) = 0.09645
      remote nodes per token = 3 * (1 - 0.09645)                       = 2.7107
      RDMA   16384 * 2.7107 * 21504 / (50e9 * 0.85)                    = 22.47 ms a layer
      NVLink 16384 * 8 * 21504 * 7/8 / 450e9                           =  5.48 ms (overlapped, shorter)
      low-latency 16384 * 8 * 31/32 * 21504 / (50e9 * 0.85)            = 64.25 ms a layer
    so the prefill step's MoE is 58 * (64.25 - 22.47) ms = 2.423 s shorter than a decode step's."""
    from math import comb
    ds = replace(model_catalogue()["deepseek_v3"], weight_dtype="fp8")
    m = RooflineCostModel(ds, gpu_catalogue()["h100"], PERF, Parallelism(tp=1, dp=32, ep=True))
    miss = comb(192, 8) / comb(256, 8)
    assert miss == pytest.approx(0.09645, abs=1e-5)
    rdma = 16384 * 3 * (1 - miss) * 7168 * 3 / (50e9 * 0.85)
    assert rdma == pytest.approx(22.47e-3, rel=1e-3)
    assert m._forwarded_all_to_all(16384) == pytest.approx(rdma, rel=1e-12)
    low_latency = 16384 * 8 * 31 / 32 * 7168 * 3 / (50e9 * 0.85)
    tokens = 32 * 16384
    assert m.moe_time(tokens, False) - m.moe_time(tokens, True) == pytest.approx(58 * (low_latency - rdma), rel=1e-9)
    assert 58 * (low_latency - rdma) == pytest.approx(2.423, rel=1e-3)
    # step_time prices the step as prefilling when any rank prefills
    idle = RankBatch()
    pre = RankBatch(prefill_tokens=tokens, prefill_attn_ctx=0.0, prefill_kv_read=tokens, requests=1)
    assert m.step_time([pre] + [idle] * 31) == pytest.approx(m.rank_time(pre) + m.moe_time(tokens, True)
                                                              + m._fixed(1, True), rel=1e-12)
    # within one node (EP <= 8) prefill and decode steps pay the same NVLink all-to-all
    one_node = model("qwen3_30b_a3b", gpu="h200", dp=4, ep=True)
    assert one_node.moe_time(4096, True) == one_node.moe_time(4096, False)
