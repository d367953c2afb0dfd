"""logger=wandb writes an offline W&B run under the run directory with the config, the summary, the time
series, the two tables and the results artifact; checked in the run's .wandb file, not by mocking. The
run is written by a detached writer process once the results are (harness/wandb_logger.py): `written`
waits for it."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from harness.experiment import run_experiment
from tests.conftest import load_config

wandb_pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")

BLOCK, HEADER = 32768, 7       # the .wandb file: a 7-byte header, then LevelDB-log records in 32 KiB blocks


def wandb_records(path: Path):
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:          # a block's tail too short for a record header is padding
            pos += BLOCK - pos % BLOCK
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        pending += data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (1, 4):                        # FULL or LAST chunk of a record
            yield wandb_pb.Record.FromString(pending)
            pending = b""


def written(out: Path, timeout_s: float = 120) -> str:
    """The last line of the run's W&B writer log once the writer has ended ("W&B run written: ..." or
    "W&B <step> failed: ...")."""
    log_file = out / "wandb" / "writer.log"
    for _ in range(int(timeout_s / 0.2)):
        lines = log_file.read_text().splitlines() if log_file.exists() else []
        if lines and lines[-1].startswith("W&B "):
            return lines[-1]
        time.sleep(0.2)
    raise AssertionError(f"the W&B writer did not end within {timeout_s} s: {log_file}")


def finished_records(run_file: Path) -> list:
    """The run file's records once its exit record is written (wandb's service may still be flushing
    the file after run.finish() returns; up to 10 s)."""
    for _ in range(50):
        records = list(wandb_records(run_file))
        if any(r.HasField("exit") for r in records):
            break
        time.sleep(0.2)
    return records


def test_offline_run_holds_config_summary_timeseries_tables_and_artifact(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = load_config(["workload.batch_size=4", "workload.group_size=2", "mode.num_steps=1", "logger=wandb",
                       "logger.tables=true"])
    summary = run_experiment(cfg, tmp_path, run_name="policy=colocate", group="sweep-1")
    assert written(tmp_path).startswith("W&B run written: ")
    [run_file] = list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    records = finished_records(run_file)
    kinds = {r.WhichOneof("record_type") for r in records}
    assert {"run", "history", "summary", "artifact"} <= kinds

    [run] = [r.run for r in records if r.HasField("run")]
    assert run.run_group == "sweep-1" and run.display_name == "policy=colocate"
    config_keys = {item.key for item in run.config.update}
    assert {"policy", "workload", "cluster", "mode", "seed"} <= config_keys

    history = {item.key or "/".join(item.nested_key): item.value_json for r in records if r.HasField("history")
               for item in r.history.item}
    assert {"ts/t_s", "ts/prefill_demand_tokens", "ts/decode_requests", "ts/engines_colocated",
            "ts/waiting_requests"} <= set(history)
    assert int(history["lifecycle_table/nrows"]) == summary["num_turns"]
    assert int(history["lifecycle_table/ncols"]) == len(pd.read_parquet(tmp_path / "lifecycle.parquet").columns)
    assert int(history["engines_table/nrows"]) == len(pd.read_parquet(tmp_path / "engines.parquet"))
    samples = sum(1 for r in records if r.HasField("history")
                  and any((i.key or "/".join(i.nested_key)) == "ts/t_s" for i in r.history.item))
    assert samples == len(pd.read_parquet(tmp_path / "timeseries.parquet"))   # fewer than logger.max_points

    summary_keys = {item.key for r in records if r.HasField("summary") for item in r.summary.update}
    assert {"rollout_time_s", "lower_bound_s", "completed_trajectories"} <= summary_keys

    [artifact] = [r.artifact for r in records if r.HasField("artifact") and r.artifact.type == "results"]
    assert {e.path for e in artifact.manifest.contents} == {"lifecycle.parquet", "engines.parquet",
                                                            "timeseries.parquet"}
    tables = list(tmp_path.glob("wandb/offline-run-*/files/media/table/*.table.json"))
    assert {t.name.split("_table")[0] for t in tables} == {"lifecycle", "engines"}
    assert (tmp_path / "summary.json").exists()


def test_default_run_logs_the_artifact_and_no_tables(tmp_path, monkeypatch):
    """By default the per-turn tables stay in the artifact's parquet files, not wandb.Table (their cost)."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = load_config(["workload.batch_size=4", "workload.group_size=2", "mode.num_steps=1", "logger=wandb"])
    run_experiment(cfg, tmp_path)
    written(tmp_path)
    [run_file] = list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    records = finished_records(run_file)
    assert any(r.HasField("artifact") and r.artifact.type == "results" for r in records)
    assert not list(tmp_path.glob("wandb/offline-run-*/files/media/table/*.table.json"))


def test_bad_logger_mode_names_the_key(tmp_path):
    cfg = load_config(["workload.batch_size=4", "workload.group_size=2", "mode.num_steps=1", "logger=wandb",
                       "logger.mode=sometimes"])
    with pytest.raises(ValueError, match="logger.mode='sometimes' is invalid; allowed: offline, online, disabled"):
        run_experiment(cfg, tmp_path)
    assert not list(tmp_path.glob("wandb/*"))


def test_run_py_leaves_a_complete_offline_run_written_after_the_results(tmp_path, monkeypatch):
    """The design end to end: run.py writes its results, starts the W&B writer and ends; the writer's offline
    run (what `wandb sync` uploads) then holds the exit record, summary.json's values as the summary, the
    time series thinned to logger.max_points evenly spaced samples (first and last kept) and the results
    artifact naming every parquet file."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "run.py", f"hydra.run.dir={tmp_path}", "workload.batch_size=4",
                          "workload.group_size=2", "mode.num_steps=1", "logger=wandb", "logger.max_points=5"],
                         cwd=root, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())   # complete when run.py returns
    last_line = written(tmp_path)
    [offline_run] = tmp_path.glob("wandb/offline-run-*")
    assert last_line == f"W&B run written: {offline_run}"
    records = finished_records(next(offline_run.glob("run-*.wandb")))
    [exit_record] = [r.exit for r in records if r.HasField("exit")]
    assert exit_record.exit_code == 0

    values = {}
    for r in records:
        if r.HasField("summary"):
            values.update({item.key: json.loads(item.value_json) for item in r.summary.update if item.key})
    assert {k: values[k] for k in summary} == summary

    series = pd.read_parquet(tmp_path / "timeseries.parquet")
    logged = [json.loads(i.value_json) for r in records if r.HasField("history") for i in r.history.item
              if (i.key or "/".join(i.nested_key)) == "ts/t_s"]
    assert len(series) > 5 and len(logged) == 5
    assert logged[0] == series["t_s"].iloc[0] and logged[-1] == series["t_s"].iloc[-1]

    [artifact] = [r.artifact for r in records if r.HasField("artifact")]
    assert {e.path for e in artifact.manifest.contents} == {"lifecycle.parquet", "engines.parquet",
                                                            "timeseries.parquet"}
