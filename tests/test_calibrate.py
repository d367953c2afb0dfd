"""Calibration and fidelity, without engines or GPUs: the fits recover known coefficients, the profile
file round-trips into the simulator, and fidelity's errors come out right on hand-made runs."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from harness.fidelity import compare, role_mismatch, switches
from harness.calibrate import (StepMeasurement, fit_kv_transfer, fit_roofline, measurements_from_profile,
                                    profile_from_measurements, profiled_errors, write_profile)
from harness.perf.catalogue import gpu_catalogue, model_catalogue, perf_defaults
from harness.perf.profiled import ProfiledCostModel, fit_profile, load_profile, read_profile
from harness.perf.roofline import Parallelism, PerfConstants, RooflineCostModel

# Known constants, deliberately away from perf.yaml's defaults (the fit starts from those).
TRUE = replace(PerfConstants(**perf_defaults()), gemm_mfu=0.55, attn_mfu=0.35, mem_efficiency=0.65,
               overhead_per_step_s=300e-6, overhead_per_request_s=7e-6, overhead_per_layer_s=15e-6)


def grid() -> list[StepMeasurement]:
    """Steps that see every coefficient: small decode batches (memory-bound), large prefills
    (GEMM-bound), long cached contexts (attention-bound), decode-only vs prefill steps (layer overhead)."""
    out = [StepMeasurement(0.0, decode_batch=b, decode_context=c) for b in (1, 8, 64, 256) for c in (512, 8192)]
    out += [StepMeasurement(0.0, prefill_new=n, prefill_cached=c) for n in (16, 512, 2048, 8192)
            for c in (0, 4096, 32768)]
    out += [StepMeasurement(0.0, prefill_new=1024, prefill_cached=0, decode_batch=32, decode_context=2048)]
    return out


def synthetic(model, gpu, par, perf, noise: float = 0.0, seed: int = 0) -> list[StepMeasurement]:
    truth = RooflineCostModel(model, gpu, perf, par)
    rng = np.random.default_rng(seed)
    return [replace(m, seconds=truth.step_time([m.rank_batch()]) * (1 + noise * rng.standard_normal()))
            for m in grid()]


@pytest.mark.parametrize("tp", [1, 2])
def test_fit_roofline_recovers_known_coefficients(tp):
    model, gpu, par = model_catalogue()["qwen3_8b"], gpu_catalogue()["h100"], Parallelism(tp=tp)
    fit = fit_roofline(synthetic(model, gpu, par, TRUE), model, gpu, par)
    for key in ("gemm_mfu", "attn_mfu", "mem_efficiency", "overhead_per_step_s", "overhead_per_request_s",
                "overhead_per_layer_s"):
        assert getattr(fit.perf, key) == pytest.approx(getattr(TRUE, key), rel=1e-6), key
    assert fit.rel_rmse < 1e-9
    assert fit.regimes["compute"] and fit.regimes["memory"]   # the grid saw both sides of the roofline


def test_fit_roofline_with_noise_stays_close():
    model, gpu, par = model_catalogue()["qwen3_8b"], gpu_catalogue()["h100"], Parallelism()
    fit = fit_roofline(synthetic(model, gpu, par, TRUE, noise=0.01), model, gpu, par)
    for key in ("gemm_mfu", "attn_mfu", "mem_efficiency"):
        assert getattr(fit.perf, key) == pytest.approx(getattr(TRUE, key), rel=0.05), key
    assert fit.rel_rmse < 0.02


def test_fit_roofline_refuses_moe():
    model, gpu = model_catalogue()["qwen3_30b_a3b"], gpu_catalogue()["h200"]
    with pytest.raises(NotImplementedError):
        fit_roofline([StepMeasurement(1e-3, decode_batch=1, decode_context=10)], model, gpu, Parallelism())


LINEAR = {"prefill_base_s": 0.02, "prefill_s_per_token": 3e-4, "prefill_s_per_attn_ctx": 2e-8,
          "decode_base_s": 0.01, "decode_s_per_seq": 1e-3, "decode_s_per_ctx": 4e-7}


def linear_profile() -> dict:
    k = LINEAR
    ms = [StepMeasurement(k["prefill_base_s"] + k["prefill_s_per_token"] * n
                          + k["prefill_s_per_attn_ctx"] * n * (c + (n - 1) / 2), prefill_new=n, prefill_cached=c)
          for n in (32, 256, 1024, 2048) for c in (0, 512, 1536)]
    ms += [StepMeasurement(k["decode_base_s"] + k["decode_s_per_seq"] * b + k["decode_s_per_ctx"] * b * c,
                           decode_batch=b, decode_context=c) for b in (1, 2, 4, 8) for c in (144.0, 528.0, 1552.0)]
    return profile_from_measurements(ms, meta={"source": "test"})


def test_profile_round_trip(tmp_path):
    p = linear_profile()
    path = tmp_path / "profile.json"
    write_profile(path, p)
    back = read_profile(str(path), "cluster.profile")
    assert measurements_from_profile(back) == measurements_from_profile(p)
    assert back["meta"] == {"source": "test"}
    k = fit_profile(back)
    for key, v in LINEAR.items():
        assert k[key] == pytest.approx(v, rel=1e-6, abs=1e-12), key
    assert max(profiled_errors(back).values()) < 1e-9
    # The simulator's cost model reads the same file and gives back the generating step times.
    model, gpu = model_catalogue()["qwen3_tiny"], gpu_catalogue()["cpu_core"]
    cm = ProfiledCostModel(load_profile(str(path), "cluster.profile").fit, model, gpu, PerfConstants(**perf_defaults()),
                           Parallelism())
    for m in measurements_from_profile(back):
        assert cm.step_time([m.rank_batch()]) == pytest.approx(m.seconds, rel=1e-6)


def test_read_profile_rejects_missing_rows(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"prefill": [], "decode": [{"batch": 1, "context": 1, "seconds": 1}]}))
    with pytest.raises(ValueError, match="key 'prefill' is \\[\\], not a non-empty list"):
        read_profile(str(path), "cluster.profile")


def test_simulator_runs_on_a_calibrated_profile(tmp_path, small):
    from tests.conftest import simulate
    path = tmp_path / "profile.json"
    write_profile(path, linear_profile())
    result, df, _ = simulate([*small, "cluster=cpu_small", "cluster.cost_model=profiled",
                              f"cluster.profile={path}", "cluster.kv_transfer_setup_s=0.002",
                              "++cluster.perf.nic_efficiency=0.5"])
    assert result.rollout_time_s > 0 and df["t_decode_end"].notna().all()


def test_fit_kv_transfer_recovers_setup_and_bandwidth():
    kv_bytes, nic = 16384.0, 1.0e9
    rows = [{"tokens": n, "seconds": 0.004 + n * kv_bytes / 2.0e8} for n in (256, 1024, 2048)]
    k = fit_kv_transfer(rows, kv_bytes, nic)
    assert k["kv_transfer_setup_s"] == pytest.approx(0.004)
    assert k["effective_bytes_per_s"] == pytest.approx(2.0e8)
    assert k["nic_efficiency"] == pytest.approx(0.2)


def _life(lat: dict[tuple[int, int], float]) -> pd.DataFrame:
    rows = [{"trajectory_id": t, "turn": k, "t_ready": 10.0 * k, "t_prefill_start": 10.0 * k + 0.05 * v,
             "t_prefill_end": 10.0 * k + 0.25 * v, "t_first_token": 10.0 * k + 0.25 * v,
             "t_decode_end": 10.0 * k + v, "new_tokens": 100} for (t, k), v in lat.items()]
    return pd.DataFrame(rows)


def _eng(rows: list[tuple[int, float, float, str]]) -> pd.DataFrame:
    return pd.DataFrame([{"engine_id": e, "t_start": a, "t_end": b, "role": r, "state": "serving"}
                         for e, a, b, r in rows])


def test_fidelity_errors_on_hand_made_runs():
    real_lat = {(0, 0): 1.0, (0, 1): 2.0, (1, 0): 3.0, (1, 1): 4.0, (2, 0): 5.0}
    sim_lat = {k: 1.1 * v for k, v in real_lat.items()}            # every turn 10% slow
    real_eng = _eng([(0, 0, 100, "colocated"), (1, 0, 50, "prefill"), (1, 50, 100, "decode")])
    sim_eng = _eng([(0, 0, 80, "colocated"), (1, 0, 48, "prefill"), (1, 48, 80, "decode")])   # switch at 60%
    e = compare("fixed_pd", _life(real_lat), _life(sim_lat), real_eng, sim_eng, 100.0, 80.0)
    assert e.rollout_time_err == pytest.approx(-0.2)
    assert e.p50_real_s == pytest.approx(3.0) and e.p50_sim_s == pytest.approx(3.3)
    for err in (e.p50_err, e.p90_err, e.p99_err, e.turn_median_abs_err, e.turn_mean_signed_err):
        assert err == pytest.approx(0.1)
    assert e.role_mismatch == pytest.approx(0.05)                # engine 1 differs on 50-60% of the axis
    assert e.switches_real == e.switches_sim == 1 and e.turns_matched == 5
    assert e.ttft_p50_err == pytest.approx(0.1) and e.decode_p50_err == pytest.approx(0.1)
    assert e.ttft_p50_real_s == pytest.approx(0.75) and e.prefill_tokens_err == 0.0
    # queue: 5% of each turn's latency (median 3.0 s real, 3.3 s sim); prefill: the next 20%
    assert (e.queue_p50_real_s, e.queue_p50_sim_s) == (pytest.approx(0.15), pytest.approx(0.165))
    assert (e.prefill_p50_real_s, e.prefill_p50_sim_s) == (pytest.approx(0.6), pytest.approx(0.66))
    assert math.isnan(e.host_gap_p50_real_s)                         # no real backend's overhead given
    # The real backend's overhead(): 10 ok legs over the 5 turns, client minus server time 50 ms (median).
    overhead = {"legs": 10, "http_gap_ms_p50": 50.0}
    e = compare("fixed_pd", _life(real_lat), _life(sim_lat), real_eng, sim_eng, 100.0, 80.0, overhead)
    assert e.host_gap_p50_real_s == pytest.approx(0.050) and e.legs_per_turn_real == pytest.approx(2.0)


def test_fidelity_against_repeated_real_runs():
    """Three real runs of 9, 10 and 11 s (spread 20%) and p50s of 1.0, 1.0, 1.3 s (spread 27.3%), one
    simulated run of 11.5 s and p50 1.0 s: rollout +15% of the mean (within the spread), p50 -9.1%."""
    from dataclasses import replace as with_
    from harness.fidelity import summarize_repeats
    eng = _eng([(0, 0, 10, "colocated")])
    base = compare("colocate", _life({(0, 0): 1.0}), _life({(0, 0): 1.0}), eng, eng, 10.0, 11.5)
    errs = [with_(base, rollout_time_real_s=t, p50_real_s=p, repeat=i)
            for i, (t, p) in enumerate(((9.0, 1.0), (10.0, 1.0), (11.0, 1.3)))]
    s = summarize_repeats(errs)
    assert (s.repeats, s.rollout_real_mean_s, s.rollout_real_spread) == (3, pytest.approx(10.0), pytest.approx(0.2))
    assert s.rollout_err == pytest.approx(0.15) and s.rollout_within
    assert s.p50_real_spread == pytest.approx(0.3 / 1.1) and s.p50_err == pytest.approx(1.0 / 1.1 - 1)
    assert s.p50_within
    s = summarize_repeats([with_(e, rollout_time_real_s=10.0, p50_real_s=1.2) for e in errs])
    assert not s.rollout_within and not s.p50_within   # no spread: the 5% and 10% tolerances hold


def test_fidelity_unmatched_turns_and_identical_timelines():
    eng = _eng([(0, 0, 10, "prefill"), (0, 10, 20, "decode"), (0, 20, 30, "prefill")])
    assert switches(eng) == 2 and role_mismatch(eng, eng, 30, 30) == 0.0
    real = _life({(0, 0): 2.0, (0, 1): 4.0})
    sim = _life({(0, 0): 2.0})
    e = compare("colocate", real, sim, eng, eng, 30.0, 30.0)
    assert e.turns_matched == 1 and e.turn_median_abs_err == 0.0 and not math.isnan(e.p50_err)


def test_split_prefill_decode_rows_are_excluded_and_flat_kv_falls_back():
    from harness.calibrate import drop_split_batches
    p = {"decode": [{"batch": 2, "context": 1552.0, "prompt_tokens": 1536, "seconds": 0.01},
                    {"batch": 4, "context": 1552.0, "prompt_tokens": 1536, "seconds": 0.03}]}
    drop_split_batches(p, token_budget=4096)
    assert [r["batch"] for r in p["decode"]] == [2]
    assert [r["batch"] for r in p["excluded"]["decode_split_prefill"]] == [4]
    k = fit_kv_transfer([{"tokens": 128, "seconds": 0.09}, {"tokens": 2048, "seconds": 0.03}], 2048.0, 1e9)
    assert k["kv_transfer_setup_s"] == pytest.approx(0.06) and "nic_efficiency" not in k


def test_fidelity_policy_specs():
    from harness.fidelity import policy_overrides
    assert policy_overrides("fixed_pd:num_prefill=1") == ("fixed_pd", ["policy=fixed_pd", "policy.num_prefill=1"])
    assert policy_overrides("colocate") == ("colocate", ["policy=colocate"])


def test_model_overrides_come_from_the_profile(tmp_path):
    from harness.fidelity import model_overrides
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"cluster_overrides": {"cluster.kv_transfer_setup_s": 0.05}}))
    over = model_overrides(str(path))
    assert "cluster.kv_transfer_setup_s=0.05" in over and not any("contended" in o for o in over)
    assert f"cluster.profile={path}" in over and "cluster.cost_model=profiled" in over
    assert model_overrides(str(path), "q.json")[-1] == "++cluster.contended_profile=q.json"


def test_nnls_known_answers():
    """Exact non-negative least squares (harness.stats.nnls), computed by hand."""
    from harness.stats import nnls
    # y = 2 + 3x fits exactly: the non-negative solution is the least-squares one
    x = np.column_stack([np.ones(4), np.arange(4.0)])
    assert np.allclose(nnls(x, 2 + 3 * np.arange(4.0)), [2, 3])
    # y = 5 - x: least squares gives a slope of -1; with the slope held at 0 the intercept is the mean
    theta = nnls(x, 5 - np.arange(4.0))
    assert np.allclose(theta, [3.5, 0.0])
    # dropping the most negative least-squares coefficient and re-solving is not exact: here least
    # squares makes all three negative, that shortcut ends at zero, and the optimum keeps the first
    x = np.array([[-1.71, 0.34, 2.12], [-0.12, -0.35, 1.14], [0.37, 0.08, -0.84], [-0.31, -0.98, 0.62],
                  [-0.62, -0.09, 0.65], [-0.27, -0.79, 0.15]])
    y = np.array([-0.19, -0.57, 1.84, 1.33, 1.08, -0.45])
    assert (np.linalg.lstsq(x, y, rcond=None)[0] < 0).all()
    theta = nnls(x, y)
    assert theta[0] > 0.03 and theta[1] == theta[2] == 0.0
    assert np.sum((y - x @ theta) ** 2) < np.sum(y ** 2)
    grid = np.linspace(0, 0.1, 101)
    assert np.sum((y - x @ theta) ** 2) <= min(np.sum((y - x[:, 0] * a) ** 2) for a in grid) + 1e-12


def test_profile_records_its_machine_and_a_mismatch_is_named():
    """A profile measured on another CPU (or core count) is named as such; one measured here is not;
    one from before profiles recorded their machine says so."""
    from harness.calibrate import machine_mismatch, this_machine
    here = this_machine()
    assert here["cpu"] and here["cores"] >= 1
    assert machine_mismatch({"meta": {"machine": dict(here)}}, here) is None
    other = {**here, "cpu": "Some Other CPU", "cores": here["cores"] + 2}
    why = machine_mismatch({"meta": {"machine": other}}, here)
    assert "'Some Other CPU' there" in why and f"cores {here['cores'] + 2} there" in why
    assert "records no machine" in machine_mismatch({"meta": {}}, here)


@pytest.mark.parametrize("seed", [0, 1])
def test_fidelity_workload_is_big_enough(seed):
    """The fidelity workload: at least 32 trajectories and 150 turns, multi-turn with tool calls."""
    from hydra.utils import instantiate
    from tests.conftest import load_config
    cfg = load_config(["+experiment=vllm_cpu_fidelity", f"seed={seed}"])
    scripts = instantiate(cfg.workload, seed=seed).batch(0)
    assert len(scripts) >= 32 and sum(len(s.turns) for s in scripts) >= 150
    assert cfg.backend.name == "vllm_cpu" and cfg.mode.num_steps == 1
