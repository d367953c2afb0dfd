"""The real vLLM backend's /metrics parsing (harness/engines/vllm.py `parse_metrics`), on text in the
shape vLLM 0.32 serves: counters per engine summed, the prefix-source split kept, the KV cache size
read from a label, and label values a regular expression would mis-split."""
from __future__ import annotations

from harness.engines.vllm import parse_metrics

TEXT = '''# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="qwen{small}, v2"} 120.0
vllm:prompt_tokens_total{engine="1",model_name="qwen{small}, v2"} 30.0
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",source="local_compute"} 100.0
vllm:prompt_tokens_by_source_total{engine="1",source="local_compute"} 20.0
vllm:prompt_tokens_by_source_total{engine="0",source="local_cache_hit"} 30.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",kv_cache_size_tokens="51200",model_name="m"} 1.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf"} 7.0
vllm:e2e_request_latency_seconds_count{engine="0"} 7.0
vllm:e2e_request_latency_seconds_sum{engine="0"} 3.5
'''


def test_counters_are_summed_over_engines_and_sources_kept_apart():
    m = parse_metrics(TEXT)
    assert m["vllm:prompt_tokens_total"] == 150.0   # a '}' and ',' inside a label value do not break it
    assert m["vllm:prompt_tokens_by_source_total{source=local_compute}"] == 120.0
    assert m["vllm:prompt_tokens_by_source_total{source=local_cache_hit}"] == 30.0
    assert m["kv_cache_size_tokens"] == 51200.0
    assert "vllm:cache_config_info" not in m
    assert m["vllm:e2e_request_latency_seconds_count"] == 7.0
    assert m["vllm:e2e_request_latency_seconds_sum"] == 3.5


def test_empty_text_gives_nothing():
    assert parse_metrics("") == {}
