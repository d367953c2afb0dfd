"""Faults around the run directory, through run.py as its own process: a run or sweep whose directory is not
its own (empty, `.`, a parent, a file, read-only, or a job directory climbing out of the sweep with '..')
is refused before Hydra writes anything; a full disk (simulated by a runner that makes the parquet or
JSON writes fail with ENOSPC, and a real small tmpfs where the test may mount one) ends the run with one
line naming the directory and what was and was not written, no temporary file left, and in a sweep the
job in the failed-jobs list. Each case checks the exit status, the message, that no traceback is printed
and that nothing outside the run directory changed.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["workload.batch_size=2", "workload.group_size=2", "mode.num_steps=1", "logger=none", "progress_interval_s=0"]

# Runs run.py with its arguments; FULL names the writes that fail with ENOSPC: "parquet:<name>" (the
# first parquet file whose name holds <name>), "all" (every result and error file).
RUNNER = r"""
import errno, os, runpy, sys
from pathlib import Path
import pandas as pd
full = os.environ.get("FULL", "")
def no_space(path):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
if full:
    real_parquet, real_write_text = pd.DataFrame.to_parquet, Path.write_text
    def to_parquet(self, path, *a, **k):
        if full == "all" or full.removeprefix("parquet:") in str(path):
            Path(path).write_bytes(b"PAR1 half")   # a partial file, as a full disk leaves
            no_space(path)
        return real_parquet(self, path, *a, **k)
    def write_text(self, *a, **k):
        if full == "all" and self.name.endswith(".json.tmp"):
            no_space(self)
        return real_write_text(self, *a, **k)
    pd.DataFrame.to_parquet, Path.write_text = to_parquet, write_text
sys.path.insert(0, sys.argv[1])
sys.argv = ["run.py", *sys.argv[2:]]
runpy.run_path(os.path.join(sys.path[0], "run.py"), run_name="__main__")
"""


def snapshot(d: Path) -> dict[str, int]:
    return {str(p.relative_to(d)): p.stat().st_mtime_ns for p in d.rglob("*")}


def run(cwd: Path, args: list[str], full: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "FULL": full, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", RUNNER, str(ROOT), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.fixture
def user_dir(tmp_path):
    """A user's directory to start runs in, with a file of theirs that a run must leave alone."""
    d = tmp_path / "user"
    d.mkdir()
    (d / "notes.tmp").write_text("mine")
    (d / "a_file").write_text("")
    return d


REFUSED = [
    ("run_dir_empty", ["hydra.run.dir="], "hydra.run.dir='' is invalid; allowed: a directory of the run's own"),
    ("run_dir_dot", ["hydra.run.dir=."], "hydra.run.dir='.' is invalid; allowed: a directory of the run's own"),
    ("run_dir_dot_slash", ["hydra.run.dir=./"], "hydra.run.dir='./' is invalid"),
    ("run_dir_parent", ["hydra.run.dir=.."], "hydra.run.dir='..' is invalid"),
    ("run_dir_root", ["hydra.run.dir=/"], "hydra.run.dir='/' is invalid"),
    ("run_dir_under_a_file", ["hydra.run.dir=a_file/run"],
     "hydra.run.dir='a_file/run' is invalid; allowed: a directory that can be written"),
    ("sweep_dir_empty", ["-m", "hydra.sweep.dir=", "seed=0,1"], "hydra.sweep.dir='' is invalid"),
    ("sweep_dir_dot", ["-m", "hydra.sweep.dir=.", "seed=0,1"], "hydra.sweep.dir='.' is invalid"),
    ("job_dir_climbs_out", ["-m", "hydra.sweep.dir=sweep", "cluster.name=x/../../../elsewhere,b"],
     "cluster.name=x/../../../elsewhere,b is invalid in a sweep; allowed: values without a '..' path part"),
    ("job_dir_climbs_out_single", ["-m", "hydra.sweep.dir=sweep", "workload.name=a/../../up"],
     "workload.name=a/../../up is invalid in a sweep"),
    ("job_dir_climbs_out_added_key", ["-m", "hydra.sweep.dir=sweep", "+foo=a/../../b"], "+foo=a/../../b is invalid"),
]


@pytest.mark.parametrize("cid,args,expected", REFUSED, ids=[c[0] for c in REFUSED])
def test_a_directory_not_the_runs_own_is_refused_and_nothing_is_touched(tmp_path, user_dir, cid, args, expected):
    before = snapshot(tmp_path)
    res = run(user_dir, [*args, *SMALL])
    assert res.returncode == 1, res.stderr[-3000:]
    assert expected in res.stderr, res.stderr[-3000:]
    assert "Traceback" not in res.stdout + res.stderr
    assert snapshot(tmp_path) == before          # the user's notes.tmp included; no sweep or job directory


def test_a_sweep_directory_name_with_dots_inside_it_is_fine(tmp_path, user_dir):
    """'..' only counts as a path part: a value with dots in a name, or one starting with '../' (a name
    'key=..' inside the sweep directory), is not refused."""
    res = run(user_dir, ["-m", "hydra.sweep.dir=sweep", "cluster.name=a..b,../c", *SMALL])
    assert res.returncode == 0, res.stderr[-3000:]
    jobs = sorted(str(p.parent.relative_to(user_dir / "sweep")) for p in (user_dir / "sweep").rglob("summary.json"))
    assert [j.split(",")[0] for j in jobs] == ["cluster.name=../c", "cluster.name=a..b"], jobs


@contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A 64 KiB tmpfs mounted at `path` (with `options`) for the block, unmounted after; the test is skipped
    where none can be mounted."""
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=64k{options}", "tmpfs", str(path)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only tmpfs needs root")
def test_a_read_only_run_directory_is_refused(tmp_path, user_dir):
    with tmpfs(tmp_path / "ro", ",ro") as ro:
        for args, key in ([f"hydra.run.dir={ro / 'run'}"], "hydra.run.dir"), (["-m", f"hydra.sweep.dir={ro}", "seed=0,1"],
                                                                             "hydra.sweep.dir"):
            res = run(user_dir, [*args, *SMALL])
            assert res.returncode == 1 and f"{key}=" in res.stderr and "is read-only" in res.stderr, res.stderr
            assert "Traceback" not in res.stdout + res.stderr


def test_a_full_disk_names_the_directory_and_what_was_written(tmp_path, user_dir):
    out = tmp_path / "run"
    (out).mkdir()
    (out / "notes.tmp").write_text("mine")
    res = run(user_dir, [f"hydra.run.dir={out}", *SMALL], full="parquet:engines")
    assert res.returncode == 1, res.stderr[-3000:]
    assert (f"cannot write engines.parquet in {out}: No space left on device; written: lifecycle.parquet; "
            "not written: engines.parquet, timeseries.parquet, summary.json") in res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    files = {p.name for p in out.iterdir()}
    assert "error.json" in files and "summary.json" not in files and "engines.parquet" not in files
    assert [p.name for p in out.glob("*.tmp")] == ["notes.tmp"]   # the harness's own removed, the user's kept
    assert (user_dir / "notes.tmp").read_text() == "mine"


def test_a_full_disk_in_a_sweep_lists_the_jobs_even_without_their_error_json(tmp_path, user_dir):
    sweep = tmp_path / "sweep"
    res = run(user_dir, ["-m", f"hydra.sweep.dir={sweep}", "seed=0,1", *SMALL], full="all")
    assert res.returncode == 1, res.stderr[-3000:]
    assert f"2 job(s) of the sweep in {sweep} failed:" in res.stderr, res.stderr[-3000:]
    assert res.stderr.count("details: none (error.json could not be written)") == 2
    assert "Traceback" not in res.stdout + res.stderr
    assert not list(sweep.rglob("*.tmp")) and not list(sweep.rglob("error.json"))


def test_a_full_disk_in_a_sweep_goes_on_to_the_next_job(tmp_path, user_dir):
    sweep = tmp_path / "sweep"
    res = run(user_dir, ["-m", f"hydra.sweep.dir={sweep}", "seed=0,1", *SMALL], full="parquet:timeseries")
    assert res.returncode == 1
    assert f"2 job(s) of the sweep in {sweep} failed:" in res.stderr and "written: lifecycle.parquet, " \
        "engines.parquet; not written: timeseries.parquet, summary.json" in res.stderr, res.stderr[-3000:]
    assert len(list(sweep.rglob("error.json"))) == 2 and not list(sweep.rglob("*.tmp"))


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_real_full_tmpfs(tmp_path, user_dir):
    with tmpfs(tmp_path / "disk", "") as disk:
        res = run(user_dir, ["-m", f"hydra.sweep.dir={disk / 'sweep'}", "seed=0,1", "workload.batch_size=64",
                             "workload.group_size=2", "mode.num_steps=1", "logger=none"])
        assert res.returncode == 1, res.stderr[-3000:]
        assert "2 job(s) of the sweep" in res.stderr and "No space left on device" in res.stderr
        assert "Traceback" not in res.stdout + res.stderr
        assert not list(disk.rglob("*.tmp")) and not list(disk.rglob("summary.json"))


def test_results_and_summary_are_written_before_the_logger_sees_them(tmp_path, monkeypatch):
    """W&B after the files: a logger that fails, or fills the disk, finds summary.json already there."""
    from harness.experiment import run_experiment
    from harness.wandb_logger import NoLogger
    from tests.conftest import load_config
    seen = {}

    def log_results(self, out_dir, summary):
        seen.update({p.name: p.stat().st_size for p in Path(out_dir).iterdir()})

    monkeypatch.setattr(NoLogger, "log_results", log_results)
    run_experiment(load_config(["workload.batch_size=2", "workload.group_size=2", "mode.num_steps=1"]), tmp_path)
    assert {"summary.json", "lifecycle.parquet", "engines.parquet", "timeseries.parquet"} <= set(seen)
    assert seen["summary.json"] > 0
