"""Sweeps through the real entry point: a failed job is reported and does not stop the others, a rerun skips
complete jobs and reruns failed ones, progress is printed, and sampling the cluster changes no result."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.experiment import run_experiment
from tests.conftest import load_config

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["workload.batch_size=4", "workload.group_size=2", "mode.num_steps=1", "logger=none"]


def run_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def job_dir(sweep: Path, num_prefill: int) -> Path:
    [d] = [p for p in sweep.iterdir() if f"policy.num_prefill={num_prefill}," in p.name]
    return d


def test_failed_job_reported_others_run_and_rerun_skips_complete(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", f"hydra.sweep.dir={sweep}", *SMALL, "policy=fixed_pd", "policy.num_prefill=0,2",
            "progress_interval_s=0"]
    first = run_py(*args)
    assert first.returncode != 0, "a sweep with a failed job exits nonzero"
    bad, good = job_dir(sweep, 0), job_dir(sweep, 2)
    error = json.loads((bad / "error.json").read_text())
    assert error["error"] == "ValueError" and "policy.num_prefill=0 is invalid" in error["message"]
    assert error["config"]["policy"]["num_prefill"] == 0 and "Traceback" in error["traceback"]
    assert "policy.num_prefill=0" in error["overrides"]
    assert "1 job(s) of the sweep" in first.stderr and "policy.num_prefill=0 is invalid" in first.stderr
    assert "Traceback" not in first.stderr, "a validation error is one line, not a traceback"
    assert (good / "summary.json").exists() and not (good / "error.json").exists()
    assert "simulated" in first.stdout and "0/8 trajectories (0%)" in first.stdout   # progress lines

    summary_mtime = (good / "summary.json").stat().st_mtime_ns
    os.utime(bad / "error.json", ns=(0, 0))
    second = run_py(*args)
    assert second.returncode != 0
    assert (good / "summary.json").stat().st_mtime_ns == summary_mtime, "a complete job is skipped"
    assert "skipped: complete result" in second.stdout
    assert (bad / "error.json").stat().st_mtime_ns > 0, "a failed job is rerun"

    # A changed config in the same job directory is not complete: it reruns.
    (good / "summary.json").write_text(json.dumps({**json.loads((good / "summary.json").read_text()),
                                                   "config_hash": "stale"}))
    third = run_py(*args[:-2], "policy.num_prefill=2")
    assert third.returncode == 0 and "skipped" not in third.stdout
    assert json.loads((good / "summary.json").read_text())["config_hash"] != "stale"


def test_a_type_error_fails_its_job_only(tmp_path):
    """The schemas are checked inside each job (harness/schema.py), not while Hydra composes the sweep:
    a value of the wrong type fails its own job and the next job still runs."""
    sweep = tmp_path / "sweep"
    res = run_py("-m", f"hydra.sweep.dir={sweep}", *SMALL, "policy=fixed_pd", "policy.num_prefill=1.5,2",
                 "progress_interval_s=0")
    assert res.returncode == 1
    [bad] = [p for p in sweep.iterdir() if "policy.num_prefill=1.5," in p.name]
    error = json.loads((bad / "error.json").read_text())
    assert error["message"] == "policy.num_prefill=1.5 is invalid; allowed: an integer"
    assert (job_dir(sweep, 2) / "summary.json").exists()
    assert "Traceback" not in res.stderr


def test_single_run_validation_error_is_one_line_naming_the_key(tmp_path):
    """Found by the policy's start plan (the split against the cluster's engines), after Hydra made the run
    directory: the directory goes; one that existed before keeps the record of the failure (error.json)."""
    res = run_py(f"hydra.run.dir={tmp_path / 'new'}", *SMALL, "policy=fixed_pd", "policy.num_prefill=9")
    assert res.returncode == 1
    assert "policy.num_prefill=9 is invalid; allowed: an integer in [1, 7]" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "new").exists()
    res = run_py(f"hydra.run.dir={tmp_path}", *SMALL, "policy=fixed_pd", "policy.num_prefill=9")
    assert res.returncode == 1 and "policy.num_prefill=9 is invalid" in res.stderr
    assert (tmp_path / "error.json").exists() and not (tmp_path / "summary.json").exists()


def test_sampling_changes_no_result_and_timeseries_is_consistent(tmp_path):
    overrides = SMALL + ["policy=fixed_pd", "policy.num_prefill=3"]
    dense = run_experiment(load_config(overrides + ["sample_interval_s=0.5"]), tmp_path / "dense")
    sparse = run_experiment(load_config(overrides + ["sample_interval_s=1000"]), tmp_path / "sparse")
    for key in ("rollout_time_s", "completed_trajectories", "prefill_tokens", "turn_latency_p99_s"):
        assert dense[key] == sparse[key], key
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "dense" / "engines.parquet"),
                                  pd.read_parquet(tmp_path / "sparse" / "engines.parquet"))
    ts = pd.read_parquet(tmp_path / "dense" / "timeseries.parquet")
    assert ts["t_s"].is_monotonic_increasing and ts["t_s"].iloc[0] == 0.0
    assert ts["t_s"].iloc[-1] >= dense["rollout_time_s"] > ts["t_s"].iloc[-2]   # sampled until the end
    assert ts["completed_trajectories"].iloc[-1] == ts["total_trajectories"].iloc[-1] == 8
    assert (ts["engines_prefill"] == 3).all() and (ts["engines_decode"] == 5).all()
    assert ts["prefill_demand_tokens"].iloc[0] > 0 and ts["decode_requests"].max() > 0


def test_ray_launcher_runs_the_sweep(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    sweep = tmp_path / "sweep"
    res = run_py("-m", "hydra/launcher=ray", f"hydra.sweep.dir={sweep}", *SMALL, "policy=fixed_pd",
                 "policy.num_prefill=0,2", "+hydra.launcher.ray.init.num_cpus=2",
                 "+hydra.launcher.ray.init.include_dashboard=false")
    assert res.returncode != 0 and "1 job(s) of the sweep" in res.stderr, res.stderr[-3000:]
    assert (job_dir(sweep, 2) / "summary.json").exists() and (job_dir(sweep, 0) / "error.json").exists()


def test_a_settings_own_keys_are_left_out_of_its_job_directory_names(tmp_path):
    """A setting of many agent-workload keys names its jobs by what varies (policy, seed) when the sweep
    leaves the setting's keys out (harness.sweep.unnamed): without it these job names ran past the
    255-byte file-name limit and the jobs failed."""
    from harness.sweep import unnamed
    setting = [*SMALL, "workload.turns.0.median=2", "workload.output.median=30", "workload.tool_output.median=40",
               "workload.tool_latency.0.median=0.1", "workload.prompt.median=200", "++workload.group_score_corr=0.5"]
    override = unnamed(setting)
    assert override.startswith("hydra.job.config.override_dirname.exclude_keys=[hydra.sweep.dir,")
    assert "workload.tool_latency.0.median" in override and ",workload.group_score_corr]" in override
    sweep = tmp_path / "sweep"
    done = run_py("-m", f"hydra.sweep.dir={sweep}", *setting, override, "policy=colocate", "seed=0,1")
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["policy=colocate,seed=0", "policy=colocate,seed=1"]
