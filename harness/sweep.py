"""End-of-sweep check: Hydra runs every job of a sweep; this callback names the ones that failed, and the
ones whose results are complete but whose W&B logging failed.

Why a callback: run.py catches a job's exception (so the other jobs go on, with any launcher) and
leaves error.json in the job's directory; Hydra discards the jobs' return values, so the sweep's exit
status comes from here: 1 if a job failed, else 3 (experiment.EXIT_LOGGER_FAILED) if a job's logging
failed (its summary.json has `logger_failure`). It reads the error.json and summary.json files written
during the sweep (new or changed since it started), which needs the sweep directory on a file system the
jobs share (always true on one machine).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from harness.experiment import ERROR, EXIT_LOGGER_FAILED, SUMMARY

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "config.yaml"


def unnamed(overrides: list[str]) -> str:
    """A Hydra override that leaves the keys of `overrides` out of a sweep's job directory names, beside
    the keys the config leaves out (configs/config.yaml): for a script that gives each setting its own
    sweep directory, which says them. A setting of ten agent-workload keys (`workload.turns.0.median=15`,
    ...) in every job name overflowed the 255-byte file-name limit, and those jobs failed."""
    keys = [*OmegaConf.load(CONFIG).hydra.job.config.override_dirname.exclude_keys,
            *(o.split("=")[0].lstrip("+~") for o in overrides)]
    return f"hydra.job.config.override_dirname.exclude_keys=[{','.join(keys)}]"


@dataclass(frozen=True)
class JobFailure:
    """What run.py returns for a failed job: the failure is listed even where its error.json could not be
    written (a full or read-only disk)."""
    overrides: list[str]
    message: str


class FailedJobs(Callback):
    def __init__(self) -> None:
        self.before: dict[Path, int] = {}
        self.returned: dict[Path, JobFailure] = {}   # job directory -> failure, from this process's jobs

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if job_return.status == JobStatus.COMPLETED and isinstance(job_return.return_value, JobFailure):
            self.returned[Path(str(config.hydra.runtime.output_dir))] = job_return.return_value

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        self.before = {**self._files(sweep_dir, ERROR), **self._files(sweep_dir, SUMMARY)}

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        failed = self._new(sweep_dir, ERROR)
        logging_failed = [(p, s) for p in self._new(sweep_dir, SUMMARY)
                          if (s := self._read(p)) is not None and s.get("logger_failure")]
        recorded = {p.resolve() for p in failed}
        unrecorded = [f for d, f in self.returned.items() if (d / ERROR).resolve() not in recorded]
        if failed or unrecorded:
            print(f"\n{len(failed) + len(unrecorded)} job(s) of the sweep in {sweep_dir} failed:", file=sys.stderr)
            for path in failed:
                record = self._read(path) or {}
                overrides = " ".join(map(str, record.get("overrides") or [])) or "(no overrides)"
                print(f"  {overrides}: {record.get('message', '(its error.json cannot be read)')}\n"
                      f"    details: {path}", file=sys.stderr)
            for f in unrecorded:
                print(f"  {' '.join(f.overrides) or '(no overrides)'}: {f.message}\n"
                      f"    details: none ({ERROR} could not be written)", file=sys.stderr)
        if logging_failed:
            print(f"\n{len(logging_failed)} job(s) of the sweep in {sweep_dir} have complete results but "
                  "their W&B logging failed:", file=sys.stderr)
            for path, summary in logging_failed:
                print(f"  {path.parent.name}: {summary['logger_failure']}", file=sys.stderr)
        if failed or unrecorded:
            sys.exit(1)
        if logging_failed:
            sys.exit(EXIT_LOGGER_FAILED)

    def _new(self, sweep_dir: Path, name: str) -> list[Path]:
        return sorted(p for p, mtime in self._files(sweep_dir, name).items() if self.before.get(p) != mtime)

    @staticmethod
    def _read(path: Path) -> dict | None:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    @staticmethod
    def _files(sweep_dir: Path, name: str) -> dict[Path, int]:
        return {p: p.stat().st_mtime_ns for p in sweep_dir.rglob(name)} if sweep_dir.is_dir() else {}
