"""The serving benchmark (mode=serve, workload=requests): known answers from the cost model, invariants,
bad input."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from harness.cluster import parallel_cost_model
from harness.experiment import error_message, run_experiment
from harness.perf.cost_model import prefill_attn_ctx
from harness.serve import serve_metrics
from tests.conftest import cluster_of, load_config
from workloads.requests import RequestsWorkload

ONE_ENGINE = ["cluster.num_engines=1"]


def serve(tmp_path, overrides: list[str]) -> tuple[dict, pd.DataFrame]:
    cfg = load_config(["mode=serve", "workload=requests", *overrides])
    summary = run_experiment(cfg, tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    return summary, pd.read_parquet(tmp_path / "lifecycle.parquet")


def colocated_model(overrides: list[str]):
    cluster = cluster_of(overrides)
    return parallel_cost_model(cluster, cluster.parallelism["colocated"])


def test_one_request_alone_is_one_prefill_step_then_batch_one_decode_steps(tmp_path):
    P, O = 2000, 50
    s, df = serve(tmp_path, ONE_ENGINE + ["workload.num_requests=1", f"workload.prompt_tokens={P}",
                                          f"workload.output_tokens={O}"])
    m = colocated_model(ONE_ENGINE)
    prefill = m.mixed_step_time([0], [0], [(0, P, prefill_attn_ctx(P, 0), P, 1)])
    assert s["ttft_p50_s"] == pytest.approx(prefill, rel=1e-12)
    # then O - 1 decode steps at batch 1, the context growing from the prompt by a token a step
    decode = [m.decode_step_time([1], [P + k]) for k in range(O - 1)]
    assert s["e2el_p50_s"] == pytest.approx(prefill + sum(decode), rel=1e-9)
    assert s["tpot_p50_s"] == pytest.approx(sum(decode) / (O - 1), rel=1e-9)
    assert s["itl_p50_s"] == pytest.approx(float(np.median(decode)), rel=1e-9)
    assert s["itl_p99_s"] == pytest.approx(float(np.percentile(decode, 99)), rel=1e-9)
    assert s["request_throughput_per_s"] == pytest.approx(1 / (prefill + sum(decode)), rel=1e-9)
    assert s["output_tokens_per_s_per_gpu"] == pytest.approx(O / (prefill + sum(decode)) / 4, rel=1e-9)


def test_rate_inf_on_one_engine_prefills_together_and_keeps_the_engine_busy(tmp_path):
    N, P, O = 8, 1000, 40   # N * P fits one step's token budget (8192)
    s, df = serve(tmp_path, ONE_ENGINE + [f"workload.num_requests={N}", f"workload.prompt_tokens={P}",
                                          f"workload.output_tokens={O}", "mode.request_rate=inf"])
    m = colocated_model(ONE_ENGINE)
    chunks = sum(prefill_attn_ctx(P, 0) for _ in range(N))
    step = m.mixed_step_time([0], [0], [(0, N * P, chunks, N * P, N)])
    assert s["ttft_p50_s"] == pytest.approx(step, rel=1e-12)
    assert s["ttft_p99_s"] == pytest.approx(step, rel=1e-12)   # every first token from that one step
    decode = sum(m.decode_step_time([N], [N * (P + k)]) for k in range(O - 1))
    assert s["benchmark_duration_s"] == pytest.approx(step + decode, rel=1e-9)
    engines = pd.read_parquet(tmp_path / "engines.parquet")
    assert engines["utilisation"].iloc[0] == pytest.approx(1.0)   # never idle: the throughput is the steps'
    assert s["request_throughput_per_s"] == pytest.approx(N / (step + decode), rel=1e-9)
    assert s["total_tokens_per_s"] == pytest.approx(N * (P + O) / (step + decode), rel=1e-9)


@pytest.mark.parametrize("policy", ["colocate", "fixed_pd"])
def test_every_request_completes_once_under_the_concurrency_cap(tmp_path, policy):
    N, cap, O = 40, 6, 30
    s, df = serve(tmp_path, [f"policy={policy}", f"workload.num_requests={N}", "workload.prompt_tokens=500",
                             f"workload.output_tokens={O}", "workload.prompt_sigma=0.5", "mode.request_rate=50",
                             f"mode.max_concurrency={cap}"])
    assert sorted(df["trajectory_id"]) == list(range(N)) and (df["turn"] == 0).all()
    assert df["t_decode_end"].notna().all() and (df["output_tokens"] == O).all()
    assert s["requests_completed"] == N and s["completed_trajectories"] == N
    arrivals = RequestsWorkload("requests", N, 500, O, prompt_sigma=0.5).arrivals(50.0)
    assert (df.sort_values("trajectory_id")["t_ready"].to_numpy() >= np.array(arrivals) - 1e-12).all()
    # at no instant more than `cap` requests between their send and their last token
    events = sorted([(t, 1) for t in df["t_ready"]] + [(t, -1) for t in df["t_decode_end"]])
    assert max(np.cumsum([d for _, d in events])) == cap
    assert (df["t_first_token"] > df["t_ready"]).all()
    if policy == "fixed_pd":
        assert (df["engine_prefill"] != df["engine_decode"]).all() and (df["transferred_tokens"] > 0).all()


@pytest.mark.parametrize("policy", ["colocate", "fixed_pd"])
def test_itl_counts_every_token_after_the_first(tmp_path, policy):
    s, df = serve(tmp_path, [f"policy={policy}", "workload.num_requests=30", "workload.output_tokens=20",
                             "workload.output_sigma=0.7", "mode.request_rate=100"])
    assert s["itl_count"] == int((df["output_tokens"] - 1).sum())
    # a request's gaps add up to its decode time after its first token: pooled, so do the sums
    assert s["itl_mean_s"] * s["itl_count"] == pytest.approx((df["t_decode_end"] - df["t_first_token"]).sum(), rel=1e-9)


def test_arrivals_are_poisson_rescaled_to_n_over_rate_and_seeded():
    w = RequestsWorkload("requests", 1000, 100, 10, seed=3)
    t = w.arrivals(20.0)
    assert t[-1] == pytest.approx(1000 / 20.0) and np.all(np.diff(t) >= 0)
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.1)   # exponential: cv 1
    assert w.arrivals(20.0) == t and RequestsWorkload("requests", 1000, 100, 10, seed=4).arrivals(20.0) != t
    assert w.arrivals(math.inf) == [0.0] * 1000
    assert [s.turns[0].new_tokens for s in w.batch(0)] == [100] * 1000


def test_serve_metrics_by_hand():
    df = pd.DataFrame({"t_ready": [0.0, 1.0], "t_first_token": [0.5, 1.2], "t_decode_end": [1.5, 2.0],
                       "prompt_tokens": [10, 30], "output_tokens": [3, 1]})
    m = serve_metrics(df, np.array([0.4, 0.6]), duration_s=2.0, num_gpus=4)
    assert m["request_throughput_per_s"] == 1.0
    assert m["input_tokens_per_s"] == 20.0 and m["output_tokens_per_s"] == 2.0 and m["total_tokens_per_s"] == 22.0
    assert m["total_tokens_per_s_per_gpu"] == 5.5
    assert m["ttft_p50_s"] == pytest.approx(0.35) and m["ttft_p99_s"] == pytest.approx(0.5 - 0.003)
    assert m["tpot_p50_s"] == pytest.approx(0.5)   # only the request with more than one output token
    assert m["itl_p50_s"] == pytest.approx(0.5) and m["e2el_mean_s"] == pytest.approx(1.25)


@pytest.mark.parametrize("overrides, message", [
    (["workload=synthetic"], "workload=synthetic is invalid with mode=serve; allowed: a single-turn workload"),
    (["workload=requests", "mode.request_rate=0"], "mode.request_rate=0 is invalid; allowed: a number > 0 or inf"),
    (["workload=requests", "mode.request_rate=-2.5"], "mode.request_rate=-2.5 is invalid"),
    (["workload=requests", "workload.num_requests=0"], "workload.num_requests=0 is invalid; allowed: an integer >= 1"),
    (["workload=requests", "mode.max_concurrency=0"], "mode.max_concurrency=0 is invalid"),
    (["workload=requests", "mode.num_steps=2"], "mode.num_steps=2 is invalid with mode=serve; allowed: 1"),
])
def test_bad_serve_input_names_the_key(tmp_path, overrides, message):
    cfg = load_config(["mode=serve", *overrides])
    with pytest.raises(Exception) as err:
        run_experiment(cfg, tmp_path)
    assert message in error_message(err.value)
    assert not list(tmp_path.iterdir()), "nothing may be written for a rejected config"
