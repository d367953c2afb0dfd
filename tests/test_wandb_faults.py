"""W&B failing never costs a result. A writer that cannot be started (its directory unusable): the run
writes every result file and summary.json (with `logger_failure`), logs one warning through `logging`,
and exits 3 (1 is a failed run). A writer that fails once started (harness/wandb_writer.py, run here in
this process with one wandb call patched to raise): it says so on its last line and exits 1, the result
files untouched. Real wandb offline runs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from harness.experiment import EXIT_LOGGER_FAILED, config_hash, is_complete, run_experiment
from harness import wandb_writer
from harness.wandb_logger import RESULT_FILES, WandbConfig
from tests.conftest import load_config
from tests.test_wandb import written

wandb = pytest.importorskip("wandb")

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["workload.batch_size=4", "workload.group_size=2", "mode.num_steps=1", "progress_interval_s=1000"]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)


def run_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def assert_results_complete(out: Path, overrides: list[str]) -> dict:
    cfg = load_config(overrides)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config_hash"] == config_hash(cfg) and is_complete(out, cfg)
    assert len(pd.read_parquet(out / "lifecycle.parquet")) == summary["num_turns"] > 0
    for name in RESULT_FILES:
        assert len(pd.read_parquet(out / name)) > 0, name
    return summary


def test_wandb_directory_unusable_run_keeps_results_warns_and_exits_3(tmp_path):
    (tmp_path / "wandb").write_text("")   # a file where W&B makes its offline directory
    res = run_py(f"hydra.run.dir={tmp_path}", *SMALL, "logger=wandb")
    assert res.returncode == EXIT_LOGGER_FAILED, res.stdout[-2000:] + res.stderr[-2000:]
    summary = assert_results_complete(tmp_path, SMALL)
    assert summary["logger_failure"].startswith("W&B start failed: FileExistsError")
    assert "[harness.wandb_logger][WARNING] - W&B start failed: FileExistsError" in res.stdout
    assert "the results are complete, but W&B start failed" in res.stdout
    assert "Traceback" not in res.stdout + res.stderr and not (tmp_path / "error.json").exists()
    # The same numbers as a run without W&B.
    plain = run_experiment(load_config([*SMALL, "logger=none"]), tmp_path / "plain")
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "lifecycle.parquet"),
                                  pd.read_parquet(tmp_path / "plain" / "lifecycle.parquet"))
    assert summary["rollout_time_s"] == plain["rollout_time_s"]


def write_run(out: Path, capsys) -> tuple[int, str]:
    """The W&B writer run in this process on `out`'s results, as the run would start it: its exit status
    and last line."""
    summary = json.loads((out / "summary.json").read_text())
    spec = WandbConfig().make(OmegaConf.to_container(load_config(SMALL), resolve=True), out, "run", None).spec(
        out, summary)
    status = wandb_writer.main(json.loads(json.dumps(spec, default=str)))   # as the writer reads it
    return status, capsys.readouterr().out.splitlines()[-1]


def test_wandb_init_raising_keeps_results(tmp_path, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise RuntimeError("wandb service did not start")
    run_experiment(load_config([*SMALL, "logger=none"]), tmp_path)
    before = {name: (tmp_path / name).read_bytes() for name in (*RESULT_FILES, "summary.json")}
    monkeypatch.setattr(wandb, "init", refuse)
    assert write_run(tmp_path, capsys) == (1, "W&B start failed: RuntimeError: wandb service did not start")
    assert {name: (tmp_path / name).read_bytes() for name in before} == before


def test_wandb_failing_mid_run_says_so_once_and_logs_nothing_after(tmp_path, monkeypatch, capsys):
    from wandb.sdk.wandb_run import Run
    calls, real_log = [], Run.log

    def log_then_fail(self, *args, **kwargs):
        calls.append(1)
        if len(calls) >= 3:
            raise OSError(28, "No space left on device")
        return real_log(self, *args, **kwargs)
    run_experiment(load_config([*SMALL, "logger=none"]), tmp_path)
    monkeypatch.setattr(Run, "log", log_then_fail)
    status, last = write_run(tmp_path, capsys)
    assert (status, last) == (1, "W&B log_results failed: OSError: [Errno 28] No space left on device")
    assert len(calls) == 3, "nothing is logged after the failure"
    assert list(tmp_path.glob("wandb/offline-run-*/run-*.wandb")), "the W&B run was opened"
    assert_results_complete(tmp_path, SMALL)


def test_sweep_exits_3_naming_the_job_whose_logging_failed(tmp_path):
    sweep = tmp_path / "sweep"
    (sweep / "seed=1").mkdir(parents=True)
    (sweep / "seed=1" / "wandb").write_text("")
    res = run_py("-m", f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir='seed=${seed}'", *SMALL, "logger=wandb",
                 "seed=0,1")
    assert res.returncode == EXIT_LOGGER_FAILED, res.stderr[-3000:]
    assert "1 job(s) of the sweep" in res.stderr and "W&B logging failed" in res.stderr
    assert "seed=1: W&B start failed: FileExistsError" in res.stderr
    for seed in (0, 1):
        summary = assert_results_complete(sweep / f"seed={seed}", [*SMALL, f"seed={seed}"])
        assert ("logger_failure" in summary) == (seed == 1)
    assert written(sweep / "seed=0").startswith("W&B run written: ")   # one W&B run per job
