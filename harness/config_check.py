"""A single run's config checked before Hydra makes its directory: a bad key or value leaves nothing in
results/ (no results/runs/<time>/ holding only an error.json, which a report would list as a failed run).

Why a callback: Hydra creates the run directory, writes `.hydra/` and opens `run.log` before the task
function starts; `on_run_start` comes first. It builds the run's parts (experiment.build_parts: every
key checked, nothing simulated) and on a config error exits 1 with the one-line message. A sweep's jobs
are checked in the jobs themselves: a bad job writes its error.json and the others run (harness/sweep.py
lists it at the end).
"""
from __future__ import annotations

import copy
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, open_dict

from harness.experiment import build_parts, error_message, is_config_error


class ConfigCheck(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        job = copy.deepcopy(config)
        with open_dict(job):
            del job["hydra"]
        try:
            build_parts(job)
        except Exception as exc:   # noqa: BLE001 - a fault in the code is the run's to record (error.json)
            if is_config_error(exc):
                sys.stderr.write(f"Error: {error_message(exc)}\nNothing was run or written.\n")
                raise SystemExit(1) from None
