"""Where a run may write: a directory of its own that can be written, never the current directory or one
above it, and in a sweep every job's directory inside the sweep directory.

Why a Hydra callback: Hydra creates the run (or job) directory, writes `.hydra/` and opens `run.log` in
it before the task function starts, so the check must come first (`on_run_start`, `on_multirun_start`).
Hydra turns a callback's exception into a warning and goes on, so a refusal exits (status 1, the message
on stderr as Hydra prints a bad override).
An empty `hydra.run.dir=` wrote results into the current directory, and an override value with `/../`
(`cluster.name=x/../../../elsewhere`) put a job's directory outside the sweep directory, where the
end-of-sweep check (harness/sweep.py) never looked.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class BadRunDir(ValueError):
    """A run or job directory that is not the run's own; the message names the override."""


def check_own_dir(key: str, value: str) -> None:
    """`value` (the directory `key` names) is a directory of its own: not empty, not the current
    directory, nor a directory that holds it."""
    cwd = Path.cwd().resolve()
    if not value.strip() or cwd.is_relative_to(Path(value).resolve()):
        raise BadRunDir(
            f"{key}={value!r} is invalid; allowed: a directory of the run's own, not the current directory "
            f"({cwd}) or one above it (e.g. {key}=results/runs/mine)")


def check_writable(key: str, value: str, file: bool = False) -> None:
    """The directory `key` names (with `file`: the directory of the file it names), or the nearest one
    above it that exists, can be written: else Hydra's log set-up fails with a traceback ("Unable to
    configure handler 'file'") before the run starts, and a tool fails after its work is done."""
    path = Path(value).resolve()
    if file and path.is_dir():
        raise BadRunDir(f"{key}={value!r} is invalid; allowed: a file that can be written ({path} is a directory)")
    directory = path.parent if file else path
    existing = next(p for p in (directory, *directory.parents) if p.exists())
    if not (existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)):
        allowed = "a file in a directory that can be written" if file else "a directory that can be written"
        raise BadRunDir(f"{key}={value!r} is invalid; allowed: {allowed} ({existing} "
                        f"is {'read-only' if existing.is_dir() else 'not a directory'})")


def check_job_dirs(overrides: list[str], exclude_keys: list[str]) -> None:
    """No override in a job directory's name (Hydra's `override_dirname`: `key=value` joined by commas)
    climbs out of the sweep directory: a '..' between slashes in its text, sweep values included."""
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key.startswith("hydra") or key in exclude_keys:
            continue
        if ".." in override.split("/"):
            raise BadRunDir(
                f"{override} is invalid in a sweep; allowed: values without a '..' path part (the job's "
                f"directory, named after its overrides, would be outside hydra.sweep.dir)")


# Single runs' directories that did not exist before Hydra made them (this process's runs).
NEW_RUN_DIRS: set[Path] = set()


class RunDirCheck(Callback):
    """Refuses a run or sweep whose directories are not its own, before Hydra writes anything; notes a
    single run's directory that Hydra is about to make (`discard_new`)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_own_dir("hydra.run.dir", str(config.hydra.run.dir))
            check_writable("hydra.run.dir", str(config.hydra.run.dir))
        except BadRunDir as exc:
            refuse(exc)
        run_dir = Path(str(config.hydra.run.dir)).resolve()
        if not run_dir.exists():
            NEW_RUN_DIRS.add(run_dir)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_own_dir("hydra.sweep.dir", str(config.hydra.sweep.dir))
            check_writable("hydra.sweep.dir", str(config.hydra.sweep.dir))
            check_job_dirs(list(config.hydra.overrides.task),
                           list(config.hydra.job.config.override_dirname.exclude_keys))
        except BadRunDir as exc:
            refuse(exc)


def discard_new(out: Path) -> bool:
    """Removes a single run's directory if Hydra made it for this run: a bad value found once the run
    started (a P:D split the cluster cannot hold, checked by the policy's start plan) leaves nothing, as
    one found before (harness/config_check.py). A directory that existed before is left as it is."""
    if out.resolve() not in NEW_RUN_DIRS:
        return False
    shutil.rmtree(out, ignore_errors=True)
    return True


def refuse(exc: BadRunDir) -> None:
    sys.stderr.write(f"Error: {exc}\nNothing was run or written.\n")
    raise SystemExit(1)
