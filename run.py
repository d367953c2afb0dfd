"""Entry point: `python run.py` (or `prorsa-run`) runs the default experiment; `python run.py -m policy=a,b`
sweeps; `--help` lists the groups and their options.

In a sweep, a job whose directory holds a complete result for the same config is skipped, and a job
that fails leaves error.json and lets the others run (harness/sweep.py reports it at the end).
A single run's bad key or value stops it with one line and leaves nothing, not even its directory
(harness/config_check.py, harness/rundir.py).
Exit status: 0 done, 1 failed (error.json, or nothing for a bad value), 3 results complete but W&B
logging failed (summary.json's `logger_failure` says how); a sweep exits 1 if any job failed, else 3 if
any job's logging failed. Each job's start, skip and completion go to the log (Hydra's `run.log` in the
job directory, appended by every attempt), so a resumed sweep shows what ran where.
"""
import logging
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from harness import cli, rundir, schema
from harness.experiment import (ERROR, EXIT_LOGGER_FAILED, WriteFailed, error_message, is_complete,
                                is_config_error, job_lock, record_failure, run_experiment)
from harness.report import print_summary
from harness.sweep import JobFailure

log = logging.getLogger("run")
schema.register()   # the groups' schemas in Hydra's ConfigStore (schema/<group>/<name>); checked per job
# `--help` (configs/hydra/help/harness.yaml): the groups a user picks, the picked option of each marked.
OmegaConf.register_new_resolver("run_groups", lambda *, _root_: cli.run_help(_root_.hydra.runtime.choices),
                                replace=True)
CONFIGS = str(Path(__file__).resolve().parent / "configs")   # absolute: the same from prorsa-run


def main() -> None:
    """`python run.py` and prorsa-run: the command line's group options and keys are checked
    first (a misspelt one is named with the closest allowed, nothing is written), then Hydra runs."""
    try:
        cli.check_overrides([a for a in sys.argv[1:] if "=" in a and not a.startswith("-")])
    except ValueError as exc:
        print(f"Error: {exc}\nNothing was run or written.", file=sys.stderr, flush=True)
        sys.exit(1)
    run()


@hydra.main(config_path=CONFIGS, config_name="config", version_base=None)
def run(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    name = hc.job.override_dirname or out.name
    with job_lock(out):
        if is_complete(out, cfg):
            log.info(f"[{name}] skipped: complete result in {out}")
            return
        log.info(f"[{name}] started")
        try:
            summary = run_experiment(cfg, out, run_name=name, group=Path(hc.sweep.dir).name if multirun else None)
        except Exception as exc:
            # A single run's bad value found once it started (a split the cluster cannot hold) leaves nothing,
            # as one found before its directory was made (harness/config_check.py).
            if (not multirun and is_config_error(exc) and not isinstance(exc, WriteFailed)
                    and rundir.discard_new(out)):
                print(f"Error: {error_message(exc)}\nNothing was run or written.", file=sys.stderr, flush=True)
                sys.exit(1)
            return failed(exc, cfg, out, name, multirun)
        log.info(f"[{name}] done: {out}")
    print_summary(summary)
    if summary.get("logger_failure"):
        log.warning(f"[{name}] the results are complete, but {summary['logger_failure']}")
        if not multirun:   # a sweep reports it at the end (harness/sweep.py)
            sys.exit(EXIT_LOGGER_FAILED)


def failed(exc: Exception, cfg: DictConfig, out: Path, name: str, multirun: bool) -> JobFailure:
    """Records a failed job (error.json) and says so; a single run exits 1."""
    hc = HydraConfig.get()
    message = record_failure(out, cfg, list(hc.overrides.task), exc)
    if not is_config_error(exc):
        traceback.print_exception(exc)
    details = out / ERROR if (out / ERROR).is_file() else f"none: {ERROR} could not be written in {out}"
    print(f"[{name}] FAILED: {message} (details: {details})", file=sys.stderr, flush=True)
    if not multirun:
        sys.exit(1)
    return JobFailure(list(hc.overrides.task), message)   # listed at the end even without error.json


if __name__ == "__main__":
    main()
