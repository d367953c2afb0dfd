"""Experiment loggers: `logger=wandb` (offline by default, files under the run directory) or `logger=none`.

Why a logger and not only files: W&B groups the runs of a sweep so they can be compared in its UI;
the result files stay the source of truth (report.py reads only them). The W&B logger never needs the
network unless `logger.mode=online` is asked for (with WANDB_API_KEY in the environment).

So W&B failing (its directory not writable, wandb.init raising, the service dying mid-run) never costs
a result: `GuardedLogger` turns the first failure into a warning, stops logging for the rest of the
run and keeps the message (`failure`) for summary.json and the exit status. A wrong `logger.*` value is
a config error like any other and stops the run before it starts (harness/schema.py).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from harness.timeseries import Sample

RESULT_FILES = ("lifecycle.parquet", "engines.parquet", "timeseries.parquet")
PROJECT = "prorsa-harness"      # the default W&B project of runs and reports
log = logging.getLogger(__name__)


class RunLogger(Protocol):
    def log_sample(self, sample: Sample) -> None: ...

    def log_results(self, out_dir: Path, summary: dict) -> None: ...

    def finish(self, failed: bool) -> None: ...


class NoLogger:
    failure = None

    def log_sample(self, sample: Sample) -> None:
        pass

    def log_results(self, out_dir: Path, summary: dict) -> None:
        pass

    def finish(self, failed: bool) -> None:
        pass


@dataclass(frozen=True)
class NoLoggerConfig:
    """`logger=none` (configs/logger/none.yaml's `_target_`)."""
    name: str = "none"

    def make(self, config: dict, out_dir: Path, run_name: str, group: str | None) -> NoLogger:
        return NoLogger()


@dataclass(frozen=True)
class WandbConfig:
    """`logger=wandb` (configs/logger/wandb.yaml's `_target_`; its keys are checked by
    harness/schema.py WandbLoggerSchema before the run starts)."""
    name: str = "wandb"
    mode: str = "offline"
    project: str = PROJECT
    entity: str | None = None
    group: str | None = None        # None: the sweep directory's name in a multirun, no group otherwise
    tags: list[str] = field(default_factory=list)
    tables: bool = False            # lifecycle and engine timeline as wandb.Table too (the artifact holds them)
    max_table_rows: int = 20000     # a larger table is left to the parquet artifact (~0.5 s per 1,000 rows)

    def make(self, config: dict, out_dir: Path, run_name: str, group: str | None) -> GuardedLogger:
        """The run's logger: W&B behind a guard, so that a W&B failure never costs a result."""
        return GuardedLogger(lambda: WandbLogger(self, config, out_dir, run_name, group))


class WandbLogger:
    """One W&B run per harness run, its files in `<out_dir>/wandb/`."""

    def __init__(self, cfg: WandbConfig, config: dict, out_dir: Path, run_name: str, group: str | None):
        import wandb  # imported here: `logger=none` runs never pay for it

        self.wandb = wandb
        self.cfg = cfg
        os.environ.setdefault("WANDB_SILENT", "true")
        # Artifact staging and cache would otherwise go under the home directory.
        os.environ["WANDB_DATA_DIR"] = str(out_dir / "wandb" / "data")
        os.environ["WANDB_CACHE_DIR"] = str(out_dir / "wandb" / "cache")
        settings = wandb.Settings(console="off", silent=True, x_disable_stats=True, x_disable_machine_info=True,
                                  disable_git=True, disable_code=True, save_code=False, disable_job_creation=True)
        self.run = wandb.init(project=cfg.project, entity=cfg.entity, group=cfg.group or group, name=run_name,
                              tags=list(cfg.tags), config=config, dir=str(out_dir), mode=cfg.mode,
                              settings=settings, reinit="finish_previous")
        self.run.define_metric("ts/t_s")
        self.run.define_metric("ts/*", step_metric="ts/t_s")

    def log_sample(self, sample: Sample) -> None:
        self.run.log({f"ts/{k}": v for k, v in sample.__dict__.items()})

    def log_results(self, out_dir: Path, summary: dict) -> None:
        import pandas as pd

        self.run.summary.update(summary)
        if self.cfg.tables:
            for name in ("lifecycle", "engines", "forecast"):
                if not (out_dir / f"{name}.parquet").exists():
                    continue   # forecast.parquet: only policies that forecast write it
                df = pd.read_parquet(out_dir / f"{name}.parquet")
                if len(df) > self.cfg.max_table_rows:
                    log.info(f"W&B: {name} has {len(df)} rows > logger.max_table_rows={self.cfg.max_table_rows}; "
                             f"not logged as a table (it is in the results artifact)")
                    continue
                # Plain Python rows and no per-column type check: 4x faster than Table(dataframe=df).
                rows = df.astype(object).where(df.notna(), None).to_numpy().tolist()
                self.run.log({f"{name}_table": self.wandb.Table(columns=list(df.columns), data=rows,
                                                                allow_mixed_types=True)})
        artifact = self.wandb.Artifact(f"results-{self.run.id}", type="results")
        for name in RESULT_FILES + ("forecast.parquet",):
            if (out_dir / name).exists():
                # immutable: the files are final, so W&B references them instead of copying them.
                artifact.add_file(str(out_dir / name), policy="immutable")
        self.run.log_artifact(artifact)

    def finish(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class GuardedLogger:
    """Runs a logger so that its failures never reach the run: the first exception (building it
    included) is logged as a warning and kept in `failure`, and nothing more is logged; `finish` is
    still tried, to close what was opened."""

    def __init__(self, make: Callable[[], RunLogger], what: str = "W&B") -> None:
        self.what = what
        self.failure: str | None = None
        self.logger: RunLogger | None = None
        self.logger = self._call("start", make)

    def _call(self, step: str, fn: Callable, *args):
        try:
            return fn(*args)
        except Exception as exc:   # anything the logging library raises: the results do not depend on it
            if self.failure is None:
                self.failure = f"{self.what} {step} failed: {type(exc).__name__}: {exc}"
                log.warning("%s; logging to %s is off for the rest of the run, the result files are written "
                            "as usual", self.failure, self.what)
            return None

    def log_sample(self, sample: Sample) -> None:
        if self.failure is None and self.logger is not None:
            self._call("log", self.logger.log_sample, sample)

    def log_results(self, out_dir: Path, summary: dict) -> None:
        if self.failure is None and self.logger is not None:
            self._call("log_results", self.logger.log_results, out_dir, summary)

    def finish(self, failed: bool) -> None:
        if self.logger is not None:
            self._call("finish", self.logger.finish, failed)
