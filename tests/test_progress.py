"""The run's progress: a bar with percentage and time left on a terminal, log lines with the same numbers
elsewhere (Ray workers, log files), and a line before the policy plans its start allocation. The last
tests run run.py as its own process on a pseudo-terminal (sized as a terminal window is, and unsized as
`docker exec -t` or a CI agent leaves one) and with its output to a pipe."""
import fcntl
import logging
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from harness.progress import Progress, eta_text
from harness.timeseries import Sample
from tests.conftest import load_config


def sample(t_s: float, done: int, total: int) -> Sample:
    return Sample(t_s, 0, 0, 0, 1, 0, 0, 0, 0, 4, 0, done, total)


def test_without_a_terminal_a_log_line_says_percentage_step_and_time_left(caplog):
    progress = Progress("run", interval_s=0, total=8, per_step=4, num_steps=2, bar=False)
    with caplog.at_level(logging.INFO, logger="harness.progress"), progress.shown():
        progress(sample(12.0, 2, 8))
        progress(sample(30.0, 6, 8))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "2/8 trajectories (25%), step 1/2, simulated 12.0 s" in lines[0]
    assert "6/8 trajectories (75%), step 2/2, simulated 30.0 s" in lines[1] and "left ~" in lines[1]


def test_log_lines_at_most_every_interval(caplog):
    progress = Progress("run", interval_s=3600, total=8, bar=False)
    with caplog.at_level(logging.INFO, logger="harness.progress"):
        for done in range(8):
            progress(sample(float(done), done, 8))
    assert not caplog.records


def test_on_a_terminal_a_bar_with_percentage_and_no_log_lines(capsys, caplog):
    progress = Progress("run", interval_s=0, total=8, bar=True)
    with caplog.at_level(logging.INFO, logger="harness.progress"), progress.shown():
        progress(sample(5.0, 4, 8))
        progress(sample(9.0, 8, 8))
    err = capsys.readouterr().err
    assert "100%" in err and "8/8" in err and "traj" in err, err
    assert not caplog.records


def test_time_left_from_the_rate_so_far():
    assert eta_text(10.0, 0, 8) == "?"
    assert eta_text(10.0, 2, 8) == "00:30"


def test_a_line_is_logged_before_the_start_plan(tmp_path, monkeypatch, caplog):
    from baselines.colocate import Colocate
    from harness.experiment import run_experiment
    seen = []
    original = Colocate.initial_roles

    def initial_roles(self, cluster, run):
        seen.extend(r.getMessage() for r in caplog.records)
        return original(self, cluster, run)

    monkeypatch.setattr(Colocate, "initial_roles", initial_roles)
    cfg = load_config(["workload.batch_size=2", "workload.group_size=2", "mode.num_steps=1"])
    with caplog.at_level(logging.INFO, logger="harness.experiment"):
        run_experiment(cfg, tmp_path)
    assert any("colocate plans the start allocation" in m for m in seen), seen


ROOT = Path(__file__).resolve().parents[1]
SMALL = ["logger=none", "workload.batch_size=2", "workload.group_size=2", "mode.num_steps=2"]   # 8 trajectories
BAR = re.compile(r": +(\d+)%\|[^|]*\| (\d+)/8 \[(\d\d:\d\d)<(\d\d:\d\d|\?), +(\S+)traj/s")   # tqdm's fields


def run_py(tmp_path: Path, args: list[str], **streams) -> subprocess.Popen:
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "100", "LINES": "24",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(ROOT / "run.py"), *SMALL, *args,
                             f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, **streams)


def on_a_terminal(tmp_path: Path, args: list[str], columns: int) -> str:
    """What run.py writes to a pseudo-terminal `columns` wide (0: one whose size nobody set)."""
    master, slave = pty.openpty()
    if columns:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    try:
        proc = run_py(tmp_path, args, stdin=slave, stdout=slave, stderr=slave)
    finally:
        os.close(slave)
    out = b""
    try:
        while chunk := os.read(master, 65536):   # EOF (EIO on Linux) once the process has exited
            out += chunk
    except OSError:
        pass
    finally:
        os.close(master)
    assert proc.wait(timeout=60) == 0, out.decode(errors="replace")
    return out.decode().replace("\r\n", "\n")   # the terminal's line discipline writes \n as \r\n


@pytest.mark.parametrize("columns", [100, 0], ids=["sized", "unsized"])
def test_run_py_on_a_terminal_draws_a_bar_that_ends_at_100_percent(tmp_path, columns):
    out = on_a_terminal(tmp_path, [], columns)
    assert "Traceback" not in out, out
    frames = [f for line in out.split("\n") for f in line.split("\r") if BAR.search(f)]
    assert frames, out
    for f in frames:   # the percentage, count, elapsed<left and rate, in one line the terminal's width
        assert len(f) < 100, f
    done = BAR.search(frames[-1])
    assert done.group(1, 2) == ("100", "8") and done.group(4) != "?", frames[-1]
    assert re.search(r", step 2/2, simulated [\d,.]+ s\]$", frames[-1]), frames[-1]   # nothing cut off
    plan, first, last = (out.index("colocate plans the start allocation\n"), out.index(frames[0]),
                         out.index(frames[-1]))
    assert plan < first, out   # the start-plan line above the bar, not in it
    assert out[last + len(frames[-1])] == "\n", out   # closed: the next output starts on a line of its own
    assert out.index("] done: ") > last, out
    for line in out.split("\n"):   # no log record written into a bar's line
        assert not (BAR.search(line) and "[INFO]" in line), line


def test_run_py_to_a_pipe_logs_lines_with_the_same_numbers_and_no_bar(tmp_path):
    proc = run_py(tmp_path, ["progress_interval_s=0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in out, out
    assert "\r" not in out and not re.search(r"\d+%\|", out), out
    lines = re.findall(r"\[colocate synthetic sync dense_h100 seed 0\] (\d+)/8 trajectories \((\d+)%\), step (\d)/2, "
                       r"simulated [\d,.]+ s, wall \d\d:\d\d, left ~(\d\d:\d\d|\?)", out)
    assert lines and lines[-1][:3] == ("8", "100", "2"), out
    assert all(pct == f"{100 * int(done) / 8:.0f}" for done, pct, _, _ in lines), lines
