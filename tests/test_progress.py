"""The run's progress: a bar with percentage and time left on a terminal, log lines with the same numbers
elsewhere (Ray workers, log files), and a line before the policy plans its start allocation."""
import logging

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
