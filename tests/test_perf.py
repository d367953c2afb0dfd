"""The roofline cost model: the Vidur golden point, hand-computed step times, and the paper's effects (a), (b)."""
import numpy as np
import pytest

from harness.perf.catalogue import gpu_catalogue, model_catalogue, perf_defaults
from harness.perf.roofline import Parallelism, PerfConstants, RankBatch, RooflineCostModel

PERF = PerfConstants(**perf_defaults())


def model(name, gpu="h100", **par):
    return RooflineCostModel(model_catalogue()[name], gpu_catalogue()[gpu], PERF, Parallelism(**par))


def test_vidur_golden_point_llama2_7b_qkv_projection():
    # reference/simulator.md: Llama-2-7B QKV projection, 4096 tokens, TP1, H100 = 0.584 ms.
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
