"""What the terminal shows while a run runs: trajectories done, the percentage and the time left.

On a terminal it is a tqdm bar (the log lines of the run are written above it), named by the policy alone
so that the percentage, count and time left fit an 80-column line (the whole label is on the log line just
above it, harness/experiment.py); where stderr is not a terminal (a Ray worker, a redirected run, a test)
a bar would print a line per refresh, so it is a log line at most every `interval_s` of wall time with
the same numbers. A listener of the cluster sampler (harness/timeseries.py): it runs on the backend's
clock and looks at the wall clock.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from harness.timeseries import Sample

log = logging.getLogger(__name__)


def eta_text(elapsed_s: float, done: int, total: int) -> str:
    """The wall time left at the rate so far ('?' before the first trajectory ends)."""
    if done <= 0:
        return "?"
    return tqdm.format_interval(elapsed_s * (total - done) / done)


@dataclass
class Progress:
    label: str
    interval_s: float
    total: int
    per_step: int = 0               # sync RL: trajectories per step, to say which step runs (0: async)
    num_steps: int = 0
    name: str = ""                  # the bar's name (the label if empty)
    bar: bool = field(default_factory=lambda: sys.stderr.isatty())
    _tqdm: tqdm | None = None
    _last: float = field(default_factory=time.perf_counter)
    _start: float = field(default_factory=time.perf_counter)

    def where(self, s: Sample) -> str:
        step = ""
        if self.per_step:
            step = f"step {min(s.completed_trajectories // self.per_step + 1, self.num_steps)}/{self.num_steps}, "
        return f"{step}simulated {s.t_s:,.1f} s"

    def __call__(self, s: Sample) -> None:
        if self._tqdm is not None:
            self._tqdm.set_postfix_str(self.where(s), refresh=False)
            self._tqdm.update(s.completed_trajectories - self._tqdm.n)
            return
        now = time.perf_counter()
        if now - self._last < self.interval_s:
            return
        self._last = now
        done, elapsed = s.completed_trajectories, now - self._start
        log.info("[%s] %d/%d trajectories (%.0f%%), %s, wall %s, left ~%s", self.label, done, self.total,
                 100 * done / max(self.total, 1), self.where(s), tqdm.format_interval(elapsed),
                 eta_text(elapsed, done, self.total))

    @contextlib.contextmanager
    def shown(self) -> Iterator[None]:
        """The bar while the rollout runs, log records written above it; closed however the run ends."""
        if not self.bar:
            yield
            return
        self._tqdm = tqdm(total=self.total, desc=self.name or self.label, unit="traj", file=sys.stderr,
                          **bar_width(sys.stderr))
        try:
            with logging_redirect_tqdm():
                yield
        finally:
            self._tqdm.close()
            self._tqdm = None


def bar_width(stream) -> dict:
    """tqdm's size keywords: the terminal's size, followed as it is resized; where the terminal says it
    has none (a pseudo-terminal nobody sized: `docker exec -t`, `script`, a CI agent) tqdm would take
    -1 columns and rows and draw nothing, so $COLUMNS and $LINES, or 80 by 24."""
    try:
        size = os.get_terminal_size(stream.fileno())
        if size.columns > 0 and size.lines > 0:
            return {"dynamic_ncols": True}
    except (AttributeError, ValueError, OSError):
        pass
    size = shutil.get_terminal_size()
    return {"ncols": size.columns - 1, "nrows": size.lines - 1}   # less one, as tqdm's own, so it never wraps
