"""One run: build workload, policy, backend and driver from a resolved config; write the result files.

Every run writes, next to Hydra's `.hydra/config.yaml`: lifecycle.parquet (one row per turn),
engines.parquet (each engine's role over time and its utilisation), timeseries.parquet (cluster state
every `sample_interval_s`) and summary.json. Files are written to a temporary name and renamed, so a
crash never leaves a half-written result; summary.json is written last and marks the run complete
(a new attempt removes the old one first, so a killed rerun never pairs old completion with new files).
A run that raised leaves error.json instead (its config, error and traceback), for the report and
for the end-of-sweep check (harness/sweep.py). `job_lock` keeps two processes from running one job
directory at once (a rerun of a killed sweep whose Ray workers still finish their jobs).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import json
import logging
import math
import os
import time
import traceback
import typing
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from harness.api import Role, RunInfo
from harness import schema
from harness.cluster import ClusterConfig, cluster_from_config, is_number
from harness.metrics import lower_bound_s, turn_latency_percentiles
from harness.policy import Policy
from harness.rollout import ModeConfig, PlanRecord, RolloutDriver, RolloutResult, plan_cpu_s, run_batches
from harness.serve import TokenTimes, check_serve, serve_metrics
from harness.timeline import COLUMNS as TIMELINE_COLUMNS
from harness.progress import Progress
from harness.ticks import event_count
from harness.timeseries import ClusterSampler
from harness.trajectory import TURN_COLUMNS
from harness.wandb_logger import RESULT_FILES
from workloads.base import Workload

SUMMARY = "summary.json"
ERROR = "error.json"
LOCK = ".lock"
log = logging.getLogger(__name__)
# Keys that cannot change a run's results: a rerun with other values still finds the run complete.
NON_RESULT_KEYS = ("logger", "progress_interval_s")
# Every file a run writes in its directory (each through a temporary `<name>.tmp`).
OWN_FILES = (*RESULT_FILES, "forecast.parquet", "legs.parquet", SUMMARY, ERROR)
# run.py's exit status when the results are complete but the experiment logger (W&B) failed.
EXIT_LOGGER_FAILED = 3


def build_backend(cfg: DictConfig, cluster: ClusterConfig, roles):
    """The backend `cfg.backend._target_` names, built for `cluster` with the policy's initial `roles`
    (each factory takes the cluster, the roles, the seed and the backend group's keys). Through Hydra's
    instantiate, as every `_target_`: its blocklist refuses targets that would run what a config says."""
    factory = instantiate(cfg.backend, _partial_=True, _convert_="all")
    return factory(cluster, roles, seed=int(cfg.seed))


def run_info(mode: ModeConfig, workload: Workload) -> RunInfo:
    """What a policy is told at the start: the mode, the sizes, the workload's priors and the family
    shares of each step's batch (counted here, so that the policy sees shares, never scripts)."""
    per_step = workload.batch_size * workload.group_size
    shares = []
    for step in range(mode.num_steps):
        batch = workload.batch(step)
        shares.append({f: n / len(batch) for f, n in Counter(s.family for s in batch).items()})
    in_flight = {"async": mode.max_in_flight, "serve": mode.max_concurrency or per_step}.get(mode.name, per_step)
    return RunInfo(mode=mode.name, trajectories_per_step=per_step, max_in_flight=in_flight,
                   num_steps=mode.num_steps, priors=workload.priors(), step_weights=shares,
                   group_size=workload.group_size, staleness=mode.staleness if mode.name == "async" else None)


def run_rollout(cfg: DictConfig, policy=None, keep_events: bool = False):
    """The rollout `cfg` describes, run in-process with nothing written or logged (tests, scripts):
    the driver's result and the backend. `policy` replaces the configured one."""
    cluster = cluster_from_config(OmegaConf.to_container(cfg.cluster, resolve=True))
    mode = mode_from_config(OmegaConf.to_container(cfg.mode, resolve=True))
    workload = instantiate_checked(cfg.workload, "workload", seed=cfg.seed)
    check_serve(mode.name, workload, str(cfg.backend.name))
    policy = policy or instantiate_checked(cfg.policy, "policy")
    backend = build_backend(cfg, cluster, policy.initial_roles(cluster, run_info(mode, workload)))
    return RolloutDriver(workload, policy, backend, mode, keep_events=keep_events).run(), backend


def static_rollout_s(cfg: DictConfig, cluster: ClusterConfig, mode: ModeConfig, roles: list[Role],
                     policy: Policy, limit_s: float = math.inf) -> float | None:
    """The rollout time of the run `cfg` describes, from the start, its engines launched in `roles` and
    `policy` driving (its `initial_roles` is not asked): what `Policy.attach_simulator` hands a policy.
    None as soon as it is sure to exceed `limit_s` (RolloutDriver.run_within)."""
    workload = instantiate(cfg.workload, seed=cfg.seed)
    backend = build_backend(cfg, cluster, roles)
    return RolloutDriver(workload, policy, backend, mode).run_within(limit_s)


def config_hash(cfg: DictConfig) -> str:
    """Identifies what a run computed, so a rerun of a sweep can tell a complete job from a changed one."""
    c = OmegaConf.to_container(cfg, resolve=True)
    for key in NON_RESULT_KEYS:
        c.pop(key, None)
    return hashlib.sha256(json.dumps(c, sort_keys=True, default=str).encode()).hexdigest()[:16]


def is_complete(out_dir: str | os.PathLike, cfg: DictConfig) -> bool:
    """summary.json for this config, and the result files it completes; anything else (no summary, one
    that cannot be read, another config's) is a job to run."""
    out = Path(out_dir)
    try:
        summary = json.loads((out / SUMMARY).read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(summary, dict) and summary.get("config_hash") == config_hash(cfg)
            and all((out / name).is_file() for name in RESULT_FILES))


@contextmanager
def job_lock(out_dir: str | os.PathLike) -> Iterator[None]:
    """Holds an exclusive lock on `<out_dir>/.lock` while a job is checked and run. Ray workers outlive a
    killed sweep driver and may finish the job they run; a rerun waits for them and then finds the job
    complete instead of running it a second time. The kernel drops the lock when its holder dies, so a
    killed job never leaves it held. Needs the job directories on one machine's file system."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / LOCK, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            log.warning("%s: another process (pid %s) runs this job; waiting for it", out, f.read().strip() or "?")
            fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield


@dataclass
class Parts:
    """What a run is built from, every key checked: a config error is found here, before anything runs."""
    cluster: ClusterConfig
    mode: ModeConfig
    logger: typing.Any      # the logger's config object; its `make` starts the run's logger
    workload: Workload
    policy: Policy


def build_parts(cfg: DictConfig) -> Parts:
    """Validates `cfg` and builds its parts; raises an error naming the key (is_config_error) on bad input.
    Cheap: nothing is simulated, started or written (run.py runs it before Hydra makes the run directory)."""
    schema.check(OmegaConf.to_container(cfg, resolve=True), schema.RunSchema, "")
    cluster = cluster_from_config(OmegaConf.to_container(cfg.cluster, resolve=True))
    mode = mode_from_config(OmegaConf.to_container(cfg.mode, resolve=True))
    logger_cfg = instantiate_checked(cfg.logger, "logger")
    checked(cfg.backend, "backend")
    workload = instantiate_checked(cfg.workload, "workload", seed=cfg.seed)
    check_serve(mode.name, workload, str(cfg.backend.name))
    policy = instantiate_checked(cfg.policy, "policy")
    if not isinstance(policy, Policy):   # its optional hooks are called on every policy
        raise ValueError(f"policy._target_={cfg.policy._target_!r} is invalid; allowed: a subclass of "
                         "harness.policy.Policy")
    interval = getattr(policy, "control_interval_s", None)   # the driver ticks the policy at this interval
    if interval is not None and not (is_number(interval) and interval > 0):
        raise ValueError(f"policy.control_interval_s={interval!r} is invalid; allowed: a number > 0")
    return Parts(cluster, mode, logger_cfg, workload, policy)


def run_experiment(cfg: DictConfig, out_dir: str | os.PathLike, run_name: str = "run",
                   group: str | None = None) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / ERROR).unlink(missing_ok=True)   # a new attempt replaces an old failure
    # Everything is validated before anything is simulated or logged.
    parts = build_parts(cfg)
    cluster, mode, workload, policy = parts.cluster, parts.mode, parts.workload, parts.policy
    if cfg.backend.name == "sim":
        policy.attach_simulator(partial(static_rollout_s, cfg, cluster, mode))
    label = progress_label(policy, workload, mode, cluster, cfg.seed)
    wall0 = time.perf_counter()   # the policy's start plan is part of what the run costs
    log.info("[%s] %s plans the start allocation", label, policy.name)   # seconds for a planning policy
    cpu0 = plan_cpu_s()
    roles = policy.initial_roles(cluster, run_info(mode, workload))
    start_cpu_s = plan_cpu_s() - cpu0
    backend = build_backend(cfg, cluster, roles)
    driver = RolloutDriver(workload, policy, backend, mode)
    tokens = None
    if mode.name == "serve":   # the benchmark's inter-token latencies, from the simulated steps
        tokens = TokenTimes()
        backend.set_step_listener(tokens.on_step)
    policy.attach_driver(driver)
    sampler = ClusterSampler(backend, lambda: (driver.completed, driver.total), float(cfg.sample_interval_s),
                             ticks=driver.ticks)   # neither ticker counts the other's ticks as activity
    # This attempt replaces whatever an earlier one left: no completion marker until it ends, and no
    # temporary file of a killed attempt.
    (out / SUMMARY).unlink(missing_ok=True)
    for name in OWN_FILES:   # only this harness's names: the directory may hold a user's own *.tmp
        (out / f"{name}.tmp").unlink(missing_ok=True)
    progress = Progress(label, float(cfg.progress_interval_s), driver.total,
                        per_step=driver.batch_traj if mode.name == "sync" else 0, num_steps=mode.num_steps,
                        name=policy.name)
    sampler.listeners.append(progress)
    sampler.start()
    with progress.shown():
        result = driver.run()
    wall = time.perf_counter() - wall0
    lifecycle = lifecycle_frame(result)
    summary = summarize(cfg, cluster, mode, workload, result, lifecycle, backend, wall, policy.name, start_cpu_s)
    summary.update(policy.metrics())
    if tokens is not None:
        summary.update(serve_metrics(lifecycle, tokens.itl(), result.rollout_time_s,
                                     cluster.num_engines * cluster.gpus_per_engine))
    forecast, legs = policy.forecast_frame(), backend.leg_frame()
    files = {}
    if forecast is not None:
        files["forecast.parquet"] = lambda p: forecast.to_parquet(p, index=False)
    if legs is not None:
        files["legs.parquet"] = lambda p: legs.to_parquet(p, index=False)
        summary["harness_overhead"] = backend.overhead()
    summary["config_hash"] = config_hash(cfg)
    timeline = clip_timeline(backend.engine_timeline(), driver.finished_at)
    # The results and summary.json first, W&B after (off the run's critical path: harness/wandb_logger.py),
    # so a logger that fails or fills the disk never costs a result.
    write_files(out, {**files, **result_writers(lifecycle, timeline, sampler.frame()), SUMMARY: summary_writer(summary)})
    logger = parts.logger.make(OmegaConf.to_container(cfg, resolve=True), out, run_name, group)
    logger.log_results(out, summary)
    if logger.failure:   # the results are complete; what W&B lacks is said where the results are
        summary["logger_failure"] = logger.failure
        write_files(out, {SUMMARY: summary_writer(summary)})
    return summary


def mode_from_config(c: dict) -> ModeConfig:
    schema.check(c, schema.ModeSchema, "mode")
    if c["name"] == "async" and "max_in_flight" not in c:
        raise ValueError("mode.max_in_flight=None is invalid; allowed: an integer >= 1 (async runs need it)")
    if c["name"] == "serve" and c["num_steps"] != 1:
        raise ValueError(f"mode.num_steps={c['num_steps']} is invalid with mode=serve; allowed: 1 (one benchmark)")
    return ModeConfig(**c)


def checked(node: DictConfig, group: str) -> None:
    """Checks the group's keys (resolved) against the schema of its `_target_` (harness/schema.py);
    a `_target_` with no schema (a user's own class) against the keys its signature takes and the
    types its annotations give (int, float, bool, str)."""
    if node.get("_target_") is None:
        raise ValueError(f"{group}._target_=None is invalid; allowed: a class path (configs/{group}/*.yaml)")
    keys = OmegaConf.to_container(node, resolve=True)
    if schema.check_group(group, keys):
        return
    target = keys["_target_"]
    try:   # resolved as instantiate resolves it, its blocklist included, without calling it
        component = instantiate({"_target_": target, "_partial_": True}).func
        params = inspect.signature(component).parameters
    except Exception as exc:   # an unknown or blocklisted class path: Hydra's message names it
        reason = " ".join(str(exc).split())
        raise ValueError(f"{group}._target_={target!r} is invalid; allowed: an importable class that Hydra's "
                         f"instantiate accepts ({reason})") from None
    try:
        hints = typing.get_type_hints(component.__init__ if inspect.isclass(component) else component)
    except Exception:   # noqa: BLE001 - annotations that do not resolve: the signature check alone
        hints = {}
    for key, value in keys.items():
        if key in hints and key in params:
            schema.check_annotated(value, hints[key], f"{group}.{key}")
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        allowed = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        for key, value in keys.items():
            if not key.startswith("_") and key not in allowed:
                raise ValueError(schema.unknown_key(f"{group}.{key}", value, allowed) if allowed
                                 else f"{group}.{key}={value!r} is invalid; {target} takes no keys")


def instantiate_checked(node: DictConfig, group: str, **kwargs):
    """hydra's instantiate of a group's `_target_`, after its keys are checked (`checked`)."""
    checked(node, group)
    return instantiate(node, **kwargs)


def is_config_error(exc: BaseException) -> bool:
    """A bad key or value (one line naming it is the whole story) rather than a fault in the code (whose
    traceback is printed): validation errors, Hydra's wrapping of them, OmegaConf's missing keys, and a
    result that could not be written (WriteFailed names the directory and the files)."""
    return any(isinstance(e, (ValueError, OmegaConfBaseException, WriteFailed)) for e in (exc, exc.__cause__))


def progress_label(policy, workload, mode: ModeConfig, cluster: ClusterConfig, seed) -> str:
    """What a progress line says the run is: a few words at any size (not every override)."""
    return f"{policy.name} {workload.name} {mode.name} {cluster.name} seed {seed}"


def clip_timeline(rows: list[dict], end: float) -> list[dict]:
    """The engine timeline covers the rollout: the sampler's (or a control) tick after the last
    trajectory ends moves the clock past the end, and that idle tail is not part of the rollout."""
    clipped = []
    for r in rows:
        if r["t_start"] >= end:
            continue
        if r["t_end"] > end:
            r = {**r, "t_end": end, "utilisation": r["busy_s"] / (end - r["t_start"])}
        clipped.append(r)
    return clipped


def error_message(exc: BaseException) -> str:
    """One line naming the bad key: harness validation errors already do; Hydra wraps those raised
    while instantiating a `_target_` in an InstantiationException, so the cause is shown instead."""
    if isinstance(exc, InstantiationException) and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, MissingMandatoryValue) and getattr(exc, "full_key", None):
        return f"{exc.full_key}=??? is invalid; allowed: a value (the key is required: {exc.full_key}=...)"
    if isinstance(exc, OmegaConfBaseException):   # its text ends with the key on a line of its own
        text = str(exc).splitlines()[0].strip() if str(exc).strip() else type(exc).__name__
        key = getattr(exc, "full_key", None)
        return f"{text} (key: {key})" if key and key not in text else text
    text = str(exc).strip().replace("\n", " ")
    return text if isinstance(exc, (ValueError, WriteFailed)) else f"{type(exc).__name__}: {text}"


def record_failure(out_dir: str | os.PathLike, cfg: DictConfig, overrides: list[str], exc: BaseException) -> str:
    """Writes error.json (job overrides, error, traceback, config) and returns the one-line message."""
    message = error_message(exc)
    record = {"overrides": overrides, "error": type(exc).__name__, "message": message,
              "traceback": "".join(traceback.format_exception(exc)),
              "config": OmegaConf.to_container(cfg, resolve=False)}
    out = Path(out_dir)
    try:   # a full or read-only disk: the message is still said (run.py, the end-of-sweep list)
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / ERROR, lambda p: p.write_text(json.dumps(record, indent=2, default=str) + "\n"))
    except OSError as exc:
        log.error("%s: cannot write %s: %s", out, ERROR, exc.strerror or exc)
    return message


def lifecycle_frame(result: RolloutResult) -> pd.DataFrame:
    return pd.DataFrame(result.turns.columns(), columns=TURN_COLUMNS)


def summarize(cfg, cluster: ClusterConfig, mode: ModeConfig, workload: Workload, result: RolloutResult,
              df: pd.DataFrame, backend, wall_s: float, policy_name: str, start_cpu_s: float) -> dict:
    done = int(df.groupby("trajectory_id")["t_decode_end"].apply(lambda s: s.notna().all()).sum()) if len(df) else 0
    batches = run_batches(workload, mode)
    if mode.name == "serve":   # all requests at once, at most max_concurrency in flight (arrivals only add)
        lb = lower_bound_s(cluster, batches, "async", mode.max_concurrency or 0)
    else:
        lb = lower_bound_s(cluster, batches, mode.name, mode.max_in_flight)   # the cap applies in async only
    summary = {
        "policy": policy_name, "workload": workload.name, "mode": mode.name,
        "backend": str(cfg.backend.name), "cluster": cluster.name, "seed": int(cfg.seed),
        "num_trajectories": result.trajectories, "completed_trajectories": done,
        "rollout_time_s": result.rollout_time_s,
        "throughput_traj_per_s": done / result.rollout_time_s if result.rollout_time_s > 0 else 0.0,
        "lower_bound_s": lb,
        "efficiency_vs_lower_bound": lb / result.rollout_time_s if result.rollout_time_s > 0 else 0.0,
        "num_role_switches": result.num_role_switches,
        "num_turns": len(df), "prefill_tokens": int(df["new_tokens"].sum()),
        "cached_tokens": int(df["cached_tokens"].sum()), "output_tokens": int(df["output_tokens"].sum()),
        "preemptions": int(df["preemptions"].sum()),
        "step_times_s": [b - a for a, b in result.step_windows],
        "wall_time_s": wall_s,
        "start_plan_cpu_s": start_cpu_s,   # the policy's start plan (`initial_roles`), its workers included
    }
    events = event_count(backend)   # the simulator's only
    if events is not None:
        summary["sim_events"] = events
    summary.update(turn_latency_percentiles(df))
    summary.update(plan_metrics(result.plans))
    return summary


def plan_metrics(plans: list[PlanRecord]) -> dict:
    """The policy's plans: how many, their CPU seconds (measured) and latency (charged in the simulator,
    waited on real engines), and how many decisions were dropped as stale (harness/rollout.py)."""
    cpu = [p.cpu_s for p in plans]
    latency = [p.latency_s for p in plans if not math.isnan(p.latency_s)]
    out = {"plans": len(plans), "plans_dropped_stale": sum(p.dropped_stale for p in plans)}
    for name, values in (("plan_cpu_s", cpu), ("plan_latency_s", latency)):
        out[f"{name}_p50"] = float(np.median(values)) if values else 0.0
        out[f"{name}_max"] = float(max(values)) if values else 0.0
    return out


def write_atomic(path: Path, write) -> None:
    """Write to a temporary name, flush it to disk, rename: a killed process or a crashed machine leaves
    the old file or the new one, never a part of one; a write that fails (a full disk) removes its
    temporary file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)   # the rename itself
    finally:
        os.close(dir_fd)


class WriteFailed(Exception):
    """A result file could not be written (a full or read-only disk): the message names the directory,
    the files written and those not, and is the whole story (no traceback)."""


def write_files(out: Path, writers: dict) -> None:
    """Each of `writers` (file name -> function writing that path), in order, atomically; an OSError
    becomes WriteFailed naming what was and was not written."""
    done = []
    for name, write in writers.items():
        try:
            write_atomic(out / name, write)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise WriteFailed(f"cannot write {name} in {out}: {reason}; written: {', '.join(done) or 'nothing'}; "
                              f"not written: {', '.join(list(writers)[len(done):])}") from exc
        done.append(name)


def result_writers(lifecycle: pd.DataFrame, timeline: list[dict], timeseries: pd.DataFrame) -> dict:
    return {"lifecycle.parquet": lambda p: lifecycle.to_parquet(p, index=False),
            "engines.parquet": lambda p: pd.DataFrame(timeline, columns=TIMELINE_COLUMNS).to_parquet(p, index=False),
            "timeseries.parquet": lambda p: timeseries.to_parquet(p, index=False)}


def summary_writer(summary: dict):
    return lambda p: p.write_text(json.dumps(summary, indent=2) + "\n")
