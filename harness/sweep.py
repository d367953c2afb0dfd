"""End-of-sweep check: Hydra runs every job of a sweep; this callback names the ones that failed.

Why a callback: run.py catches a job's exception (so the other jobs go on, with any launcher) and
leaves error.json in the job's directory; Hydra discards the jobs' return values, so the sweep's exit
status comes from here. It reads the error.json files written during the sweep (new or changed since it
started), which needs the sweep directory on a file system the jobs share (always true on one machine).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from harness.experiment import ERROR


class FailedJobs(Callback):
    def __init__(self) -> None:
        self.before: dict[Path, int] = {}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.before = self._errors(Path(str(config.hydra.sweep.dir)))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        failed = sorted(p for p, mtime in self._errors(sweep_dir).items() if self.before.get(p) != mtime)
        if not failed:
            return
        print(f"\n{len(failed)} job(s) of the sweep in {sweep_dir} failed:", file=sys.stderr)
        for path in failed:
            record = json.loads(path.read_text())
            print(f"  {' '.join(record['overrides']) or '(no overrides)'}: {record['message']}\n"
                  f"    details: {path}", file=sys.stderr)
        sys.exit(1)

    @staticmethod
    def _errors(sweep_dir: Path) -> dict[Path, int]:
        return {p: p.stat().st_mtime_ns for p in sweep_dir.rglob(ERROR)} if sweep_dir.is_dir() else {}
