"""End-of-sweep check: Hydra runs every job of a sweep; this callback names the ones that failed.

Why a callback: run.py catches a job's exception (so the other jobs go on, with any launcher) and
leaves error.json in the job's directory; Hydra discards the jobs' return values, so the sweep's exit
status comes from here. It reads error.json files written since the sweep started, which needs the
sweep directory on a file system the jobs share (always true on one machine).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from harness.experiment import ERROR


class FailedJobs(Callback):
    def __init__(self) -> None:
        self.started = 0.0

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = time.time()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        failed = sorted(p for p in sweep_dir.rglob(ERROR) if p.stat().st_mtime >= self.started)
        if not failed:
            return
        print(f"\n{len(failed)} job(s) of the sweep in {sweep_dir} failed:", file=sys.stderr)
        for path in failed:
            record = json.loads(path.read_text())
            print(f"  {' '.join(record['overrides']) or '(no overrides)'}: {record['message']}\n"
                  f"    details: {path}", file=sys.stderr)
        sys.exit(1)
