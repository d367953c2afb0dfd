"""Experiment loggers: `logger=wandb` (offline by default, files under the run directory) or `logger=none`.

Why a logger and not only files: W&B groups the runs of a sweep so they can be compared in its UI;
the result files stay the source of truth (report.py reads only them). The W&B logger never needs the
network unless `logger.mode=online` is asked for (with WANDB_API_KEY in the environment).

Why W&B is written after the run, by a process of its own (harness/wandb_writer.py): importing wandb,
starting its service and logging cost about 4.5 s per run, more than a simulated run itself. Once the
result files and summary.json are written, the run starts the writer, detached, and ends; in a sweep the
writer of one job runs beside the next job. So W&B failing never costs a result: the files are written
first. A failure to start the writer (its directory not usable) is the run's: a warning, `logger_failure`
in summary.json and exit status 3. A failure inside the writer (wandb.init raising) is said on the last
line of `<run dir>/wandb/writer.log`, which says "W&B run written" when it succeeded. A wrong `logger.*`
value is a config error like any other and stops the run before it starts (harness/schema.py).
"""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

RESULT_FILES = ("lifecycle.parquet", "engines.parquet", "timeseries.parquet")
PROJECT = "prorsa-harness"      # the default W&B project of runs and reports
WRITER = Path(__file__).resolve().with_name("wandb_writer.py")
WRITER_LOG = "writer.log"       # in <run dir>/wandb/: what the writer said; its last line, how it ended
log = logging.getLogger(__name__)


class RunLogger(Protocol):
    failure: str | None     # why the results could not be handed to the logger; None if they were

    def log_results(self, out_dir: Path, summary: dict) -> None: ...


class NoLogger:
    failure = None

    def log_results(self, out_dir: Path, summary: dict) -> None:
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
    max_points: int = 500           # ts/* rows logged at most, evenly spaced (timeseries.parquet has them all)

    def make(self, config: dict, out_dir: Path, run_name: str, group: str | None) -> WandbLogger:
        return WandbLogger(self, config, run_name, group)


class WandbLogger:
    """One W&B run per harness run, its files in `<out_dir>/wandb/`, written by a detached writer process
    (harness/wandb_writer.py) that `log_results` starts once the results are written."""

    def __init__(self, cfg: WandbConfig, config: dict, run_name: str, group: str | None):
        self.cfg, self.config, self.run_name, self.group = cfg, config, run_name, group
        self.failure: str | None = None

    def spec(self, out_dir: Path, summary: dict) -> dict:
        """What the writer is given (harness/wandb_writer.py)."""
        out = Path(out_dir).resolve()
        return {"logger": asdict(self.cfg), "config": self.config, "out_dir": str(out), "run_name": self.run_name,
                "group": self.cfg.group or self.group, "summary": summary,
                "files": [n for n in (*RESULT_FILES, "forecast.parquet") if (out / n).exists()]}

    def log_results(self, out_dir: Path, summary: dict) -> None:
        out = Path(out_dir).resolve()
        failure = None
        try:
            (out / "wandb").mkdir(exist_ok=True)
            with open(out / "wandb" / WRITER_LOG, "a") as messages:
                # -P: the writer's directory is not put on sys.path (harness/ would shadow modules wandb
                # imports); a session of its own: it outlives the run and a Ctrl-C meant for the run.
                writer = subprocess.Popen([sys.executable, "-P", str(WRITER)], stdin=subprocess.PIPE,
                                          stdout=messages, stderr=subprocess.STDOUT, start_new_session=True,
                                          text=True)
            with writer.stdin:
                writer.stdin.write(json.dumps(self.spec(out, summary), default=str))
            # Until it has read the spec and forked the process that writes the run (milliseconds).
            if writer.wait() != 0:
                failure = f"the writer exited with status {writer.returncode}"
        except OSError as exc:
            failure = f"{type(exc).__name__}: {exc}"
        if failure is not None:
            self.failure = f"W&B start failed: {failure}"
            log.warning("%s; the result files are written as usual", self.failure)
            return
        log.info("W&B: the run is being written in %s (%s says when it is done)", out / "wandb",
                 out / "wandb" / WRITER_LOG)
