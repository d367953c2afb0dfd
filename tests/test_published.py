"""scripts/published.py: a published row without a source is refused by name; published cells parse."""
import pandas as pd
import pytest

from scripts.published import POINTS, SOURCES, published_value, read_sources


def test_a_row_without_a_source_is_named(tmp_path):
    rows = pd.read_csv(SOURCES, dtype=str)
    rows.loc[rows["id"] == "lep_prefill_2k", "source"] = ""
    path = tmp_path / "sources.csv"
    rows.to_csv(path, index=False)
    with pytest.raises(ValueError, match="row\\(s\\) lep_prefill_2k have no source"):
        read_sources(path)


def test_every_simulated_point_is_a_published_row():
    ids = set(read_sources(SOURCES)["id"])
    assert {p.id for p in POINTS} <= ids


@pytest.mark.parametrize("cell, value", [("23,789", 23789.0), ("~100", 100.0), ("20-22", 21.0), ("3623", 3623.0)])
def test_published_cells_parse(cell, value):
    assert published_value(cell) == value


def test_a_decode_point_whose_batch_does_not_fit_is_refused_by_name():
    from scripts.published import DecodePoint, decode_point, deepseek_unit
    bf16 = [o for o in deepseek_unit("h100", 72, 256, 16384) if "weight_dtype" not in o]
    with pytest.raises(ValueError, match="too_big: 256 x 2000 KV tokens per rank exceed"):
        decode_point(DecodePoint("too_big", bf16, [256] * 72, 2000, ""))
    value, _ = decode_point(DecodePoint("fits", deepseek_unit("h100", 72, 256, 16384), [256] * 72, 2000, ""))
    assert value > 0


def test_trtllm_bench_limits_known_answers():
    """trtllm-bench's rule, by hand. Llama-3.1-8B, one H100, 1000/1000: KV 2*32*8*128*2 = 131,072 B/token;
    (81,559 MiB - 8.03 GB of FP8 weights) * 0.90 / (131,072 * 2,000) = 266.0 requests -> 384 (>= 256: to
    a multiple of 128); tokens 266.0 * 2 = 532 -> 2,048 (the floor), above 1,000 + 384. Qwen3-235B, 8 H200,
    5000/500: KV 2*94*max(8, 4)*128*2 = 385,024 B/token; (8 * 143,771 MiB - 235 GB) * 0.90 / (385,024 *
    5,500) = 412.7 -> 512; tokens 412.7 * 11 = 4,540 -> 4,608 (a multiple of 512), below 5,000 + 512."""
    from scripts.published import trtllm_bench_limits
    assert trtllm_bench_limits("llama3_1_8b", "h100", 1, 1000, 1000) == [
        "cluster.max_num_seqs=384", "cluster.max_num_batched_tokens=2048"]
    assert trtllm_bench_limits("qwen3_235b_a22b", "h200", 8, 5000, 500) == [
        "cluster.max_num_seqs=512", "cluster.max_num_batched_tokens=5512"]
