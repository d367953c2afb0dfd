"""A sweep killed with SIGKILL mid-run, then run again with the same command and its hydra.sweep.dir: every job
ends complete, once; jobs complete before the kill are skipped, not rerun; a killed job's files are never taken
as complete. Real Hydra multirun subprocesses, with the basic launcher and with the Ray launcher."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from harness.experiment import config_hash, is_complete
from tests.conftest import load_config

ROOT = Path(__file__).resolve().parents[1]
SEEDS = (0, 1, 2, 3)
# ~1 s of simulation per job: long enough to kill the sweep inside a job, short enough for the suite.
JOB = ["workload.batch_size=32", "workload.group_size=8", "mode.num_steps=2", "logger=none",
       "progress_interval_s=1000"]
RAY = ["hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2", "+hydra.launcher.ray.init.include_dashboard=false"]


def sweep_command(sweep: Path, launcher: list[str]) -> list[str]:
    return [sys.executable, "run.py", "-m", f"hydra.sweep.dir={sweep}", *JOB, "seed=" + ",".join(map(str, SEEDS)),
            *launcher]


def job_dirs(sweep: Path) -> dict[int, Path]:
    """seed -> job directory, for the jobs Hydra has created so far."""
    out = {}
    for d in sweep.iterdir() if sweep.is_dir() else ():
        seeds = [p.split("=")[1] for p in d.name.split(",") if p.startswith("seed=")]
        if d.is_dir() and seeds:
            out[int(seeds[0])] = d
    return out


def log_count(job: Path, word: str) -> int:
    """How many times run.py logged `word` (started, done, skipped) for this job, over every attempt."""
    log = job / "run.log"
    return sum(f"] {word}" in line for line in log.read_text().splitlines()) if log.exists() else 0


def session_pids(sid: int) -> list[int]:
    """Processes left in the session the killed sweep led (Ray's agents and workers outlive their driver)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def kill_inside_a_job(cmd: list[str], sweep: Path, out: Path, timeout_s: float = 120) -> tuple[int, dict, set]:
    """Start the sweep; SIGKILL its process once a job has completed and another one is running.
    Returns the process's pid (its session id), per job complete just after the kill (summary bytes,
    mtime), and the jobs seen running just before it (a Ray worker that outlives the driver may finish
    one of them in between)."""
    with out.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = job_dirs(sweep)
        complete = {s for s, d in jobs.items() if (d / "summary.json").exists()}
        running = {s for s, d in jobs.items() if s not in complete and log_count(d, "started")}
        if complete and running:
            break
        assert proc.poll() is None, f"the sweep ended before it could be killed:\n{out.read_text()[-3000:]}"
        assert time.monotonic() < deadline, out.read_text()[-3000:]
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = {s: ((d / "summary.json").read_bytes(), (d / "summary.json").stat().st_mtime_ns)
            for s, d in job_dirs(sweep).items() if (d / "summary.json").exists()}
    return proc.pid, done, running


def check_resumed(sweep: Path, done_at_kill: dict, rerun: subprocess.CompletedProcess) -> None:
    jobs = job_dirs(sweep)
    assert sorted(jobs) == list(SEEDS)
    for seed, job in jobs.items():
        cfg = load_config([*JOB, f"seed={seed}"])
        assert is_complete(job, cfg), f"seed={seed} is not complete"
        summary = json.loads((job / "summary.json").read_text())
        assert summary["config_hash"] == config_hash(cfg) and summary["seed"] == seed
        assert len(pd.read_parquet(job / "lifecycle.parquet")) == summary["num_turns"]
        assert pd.read_parquet(job / "timeseries.parquet")["completed_trajectories"].iloc[-1] == 512
        assert not (job / "error.json").exists() and not list(job.glob("*.tmp"))
        assert log_count(job, "done") == 1, f"seed={seed} completed {log_count(job, 'done')} times"
    for seed, (content, mtime) in done_at_kill.items():
        job = jobs[seed]
        assert (job / "summary.json").read_bytes() == content, f"seed={seed} was rerun"
        assert (job / "summary.json").stat().st_mtime_ns == mtime, f"seed={seed} was rerun"
        assert log_count(job, "started") == 1 and log_count(job, "skipped") == 1
        assert f"seed={seed},workload.batch_size=32,workload.group_size=8] skipped" in rerun.stdout


def resume_after_kill(tmp_path: Path, launcher: list[str], timeout_s: float) -> tuple[dict, dict]:
    sweep = tmp_path / "sweep"
    cmd = sweep_command(sweep, launcher)
    sid, done_at_kill, killed = kill_inside_a_job(cmd, sweep, tmp_path / "first.out", timeout_s)
    try:
        assert 1 <= len(done_at_kill) < len(SEEDS) and killed
        if not launcher:   # jobs ran in the killed process: what it left has no completion marker
            for s in killed - set(done_at_kill):
                assert not is_complete(job_dirs(sweep)[s], load_config([*JOB, f"seed={s}"]))
        started = {s: log_count(d, "started") for s, d in job_dirs(sweep).items()}
        # Ray folds log lines that differ only in numbers ("seed=0 ... skipped", "seed=1 ... skipped")
        # into one; RAY_DEDUP_LOGS=0 (Ray's documented switch) keeps each job's line
        rerun = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                               env={**os.environ, "RAY_DEDUP_LOGS": "0"})
        assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-3000:]
        check_resumed(sweep, done_at_kill, rerun)
    finally:
        left = session_pids(sid)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    attempts = {s: log_count(d, "started") for s, d in job_dirs(sweep).items()}
    rerun_ran = sorted(s for s in SEEDS if attempts[s] > started.get(s, 0))
    print(f"\n{' '.join(launcher) or 'basic launcher'}: {len(SEEDS)} jobs; killed with {len(done_at_kill)} complete "
          f"and {sorted(killed)} running; the rerun ran {rerun_ran} and skipped the others; every job completed "
          f"once; {len(left)} processes of the killed sweep were still alive at the end")
    return done_at_kill, attempts


def test_killed_sweep_resumes_without_rerunning_complete_jobs(tmp_path):
    done_at_kill, attempts = resume_after_kill(tmp_path, [], timeout_s=120)
    # The basic launcher runs jobs one after another in the sweep's process: the kill ended the job it ran,
    # which the rerun ran again from the start; the jobs never started ran once.
    assert sorted(attempts.values()) == [1] * (len(SEEDS) - 1) + [2]


@pytest.mark.slow
def test_killed_ray_sweep_resumes_without_rerunning_complete_jobs(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    done_at_kill, attempts = resume_after_kill(tmp_path, RAY, timeout_s=240)
    # A Ray worker may outlive the killed driver and finish its job (then the rerun waits for the job's
    # lock, if it is still held, and skips it) or die with it (then the rerun runs the job again). Either
    # way each job completed once (check_resumed) and was started at most twice.
    assert all(1 <= n <= 2 for n in attempts.values())


def test_what_a_kill_leaves_is_never_complete(tmp_path):
    """The states a killed job can leave in its directory, and one a full disk can: none is complete, and
    none stops the check (a rerun runs the job again)."""
    from harness.experiment import run_experiment
    cfg = load_config(["workload.batch_size=4", "workload.group_size=2", "mode.num_steps=1"])
    run_experiment(cfg, tmp_path)
    assert is_complete(tmp_path, cfg)
    summary = (tmp_path / "summary.json").read_bytes()

    (tmp_path / "summary.json").rename(tmp_path / "summary.json.tmp")      # killed before the rename
    assert not is_complete(tmp_path, cfg)
    (tmp_path / "summary.json").write_bytes(summary[: len(summary) // 2])  # truncated
    assert not is_complete(tmp_path, cfg)
    (tmp_path / "summary.json").write_bytes(summary)
    assert is_complete(tmp_path, cfg)
    assert not is_complete(tmp_path, load_config(["workload.batch_size=4", "workload.group_size=2",
                                                  "mode.num_steps=1", "seed=5"]))   # another config's
    (tmp_path / "lifecycle.parquet").unlink()                               # a result file missing
    assert not is_complete(tmp_path, cfg)

    run_experiment(cfg, tmp_path)       # a new attempt clears the killed one's temporary files
    assert is_complete(tmp_path, cfg) and not list(tmp_path.glob("*.tmp"))


def test_a_job_still_running_elsewhere_is_waited_for_not_run_again(tmp_path):
    """What a Ray worker that outlived its killed driver does to a rerun: it holds the job's lock while it
    finishes; the rerun waits for it, then finds the job complete."""
    small = ["workload.batch_size=4", "workload.group_size=2", "mode.num_steps=1", "logger=none"]
    job, ready = tmp_path / "job", tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, "-c", f"""
import time
from pathlib import Path
from harness.experiment import job_lock, run_experiment
from tests.conftest import load_config
with job_lock({str(job)!r}):
    Path({str(ready)!r}).touch()
    inode = Path({str(job)!r}, ".lock").stat().st_ino
    # finish only once the rerun waits for the lock (a blocked flock is listed with '->' in /proc/locks)
    deadline = time.time() + 60
    while time.time() < deadline and not any("->" in l and f":{{inode}} " in l for l in open("/proc/locks")):
        time.sleep(0.01)
    run_experiment(load_config({small!r}), {str(job)!r})
"""], cwd=ROOT)
    while not ready.exists():
        assert holder.poll() is None
        time.sleep(0.01)
    rerun = subprocess.run([sys.executable, "run.py", f"hydra.run.dir={job}", *small], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert holder.wait(timeout=120) == 0 and rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"pid {holder.pid}) runs this job; waiting for it" in rerun.stdout
    assert "skipped: complete result" in rerun.stdout and log_count(job, "started") == 0
