"""The W&B writer: writes one run's W&B run (offline by default, under `<run dir>/wandb/`) from its result
files, in a process of its own that harness/wandb_logger.py starts, detached, once those files and
summary.json are written. The run does not wait for it (why: harness/wandb_logger.py).

Run as a script (`python -P wandb_writer.py`, the spec as one JSON object on stdin: `logger`, the
logger's keys; `config`, the run's resolved config; `out_dir`, `run_name`, `group`, `summary`, and
`files`, the parquet files for the artifact). Once it has read them it forks and ends, so that the run
reaps it at once and the child, detached, writes the W&B run. It imports nothing of the harness, so that
it starts as fast as wandb allows and needs nothing but wandb and pyarrow. Its output goes to
`<run dir>/wandb/writer.log`; the last line says how it ended: "W&B run written: <dir>" (exit 0) or
"W&B <step> failed: <error>" (exit 1).

What the W&B run holds: the config; summary.json's values as its summary; the cluster time series
(timeseries.parquet) as `ts/*` history against `ts/t_s`, thinned to at most `logger.max_points` evenly
spaced samples, the first and the last included (W&B logs a row in about half a millisecond and draws at
most about a thousand points of a line; the full series is in the artifact); the parquet files as a
`results` artifact, by reference; with `logger.tables`, the lifecycle and engine tables as wandb.Table.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

TABLES = ("lifecycle", "engines", "forecast")


def start(spec: dict):
    import wandb

    out, cfg = Path(spec["out_dir"]), spec["logger"]
    # Artifact staging and cache would otherwise go under the home directory.
    os.environ["WANDB_DATA_DIR"] = str(out / "wandb" / "data")
    os.environ["WANDB_CACHE_DIR"] = str(out / "wandb" / "cache")
    os.environ.setdefault("WANDB_SILENT", "true")
    settings = wandb.Settings(console="off", silent=True, x_disable_stats=True, x_disable_meta=True,
                              disable_git=True, disable_code=True, save_code=False, disable_job_creation=True)
    run = wandb.init(project=cfg["project"], entity=cfg["entity"], group=spec["group"], name=spec["run_name"],
                     tags=list(cfg["tags"]), config=spec["config"], dir=str(out), mode=cfg["mode"],
                     settings=settings)
    # No summary of ts/* from every row: it doubled the run file (summary.json's values are the summary).
    run.define_metric("ts/t_s", summary="none")
    run.define_metric("ts/*", step_metric="ts/t_s", summary="none")
    return run


def thinned(rows: list, max_points: int) -> list:
    """At most `max_points` of `rows`, evenly spaced, the first and the last included."""
    if len(rows) <= max_points:
        return rows
    return [rows[round(i * (len(rows) - 1) / (max_points - 1))] for i in range(max_points)]


def log_results(run, spec: dict) -> None:
    import pyarrow.parquet as pq

    import wandb

    out, cfg = Path(spec["out_dir"]), spec["logger"]
    for row in thinned(pq.read_table(out / "timeseries.parquet").to_pylist(), cfg["max_points"]):
        run.log({f"ts/{k}": v for k, v in row.items()})
    run.summary.update(spec["summary"])
    if cfg["tables"]:
        for name in TABLES:
            if f"{name}.parquet" not in spec["files"]:
                continue   # forecast.parquet: only policies that forecast write it
            df = pq.read_table(out / f"{name}.parquet").to_pandas()
            if len(df) > cfg["max_table_rows"]:
                print(f"W&B: {name} has {len(df)} rows > logger.max_table_rows={cfg['max_table_rows']}; "
                      "not logged as a table (it is in the results artifact)", flush=True)
                continue
            # Plain Python rows and no per-column type check: 4x faster than Table(dataframe=df).
            rows = df.astype(object).where(df.notna(), None).to_numpy().tolist()
            run.log({f"{name}_table": wandb.Table(columns=list(df.columns), data=rows, allow_mixed_types=True)})
    artifact = wandb.Artifact(f"results-{run.id}", type="results")
    for name in spec["files"]:
        # immutable: the files are final, so W&B references them instead of copying them.
        artifact.add_file(str(out / name), policy="immutable")
    run.log_artifact(artifact)


def main(spec: dict) -> int:
    """Writes the W&B run `spec` describes; its exit status."""
    step = "start"
    try:
        run = start(spec)
        step = "log_results"
        log_results(run, spec)
        step = "finish"
        where = Path(run.dir).parent   # the offline run's directory (run.dir is its files/)
        run.finish()
    except Exception as exc:   # anything wandb raises: the run's results are already written
        print(f"W&B {step} failed: {type(exc).__name__}: {exc}", flush=True)
        return 1
    print(f"W&B run written: {where}", flush=True)
    return 0


if __name__ == "__main__":
    spec = json.loads(sys.stdin.read())
    if os.fork():   # the run waits for this process only: it ends at once, its child writes the W&B run
        sys.exit(0)
    sys.exit(main(spec))
