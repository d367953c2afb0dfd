"""The independent what-if runs of one plan on forked worker processes (`policy.plan_workers`).

A start plan runs every candidate on every sample, and a plan's check and hedges run allocations on
samples drawn before: runs that do not depend on one another, each on its own simulator. Forked
workers inherit the samples and the planner as they stand, so only the scores travel back, and the
results are the ones one process gives, in the same order. The branch-and-bound candidates of a plan
(`Planner.decide`) stay in one process: each is cut at the best score before it.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
import traceback
from typing import Callable, Sequence, TypeVar

from harness.cluster import is_number

T = TypeVar("T")
R = TypeVar("R")

FORK = "fork" in mp.get_all_start_methods()   # Linux; elsewhere the runs stay in one process


def available_cpus() -> int:
    """The CPUs this process may use: inside a Ray task (a sweep under `hydra/launcher=ray`) those Ray
    assigned it, else its affinity mask."""
    ray = sys.modules.get("ray")   # a Ray worker has imported it; importing it here would cost a second
    if ray is not None and ray.is_initialized():
        try:
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
        except AssertionError:     # Ray's driver process, not a task: it has no assignment
            cpus = None
        if cpus:
            return max(1, int(cpus))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class PlanWorkers:
    """Maps a function over independent items on `count` processes: this one and `count - 1` forks."""

    def __init__(self, count: int):
        self.count = count

    @classmethod
    def of(cls, workers: int | str) -> PlanWorkers:
        """`auto`: the CPUs available (`available_cpus`), or an integer >= 1."""
        if workers == "auto":
            return cls(available_cpus() if FORK else 1)
        if is_number(workers) and int(workers) == workers and workers >= 1:
            return cls(int(workers) if FORK else 1)
        raise ValueError(f"policy.plan_workers={workers!r} is invalid; allowed: auto, or an integer >= 1")

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """`[fn(x) for x in items]`: item i on worker i mod n, this process taking worker 0's share."""
        n = min(self.count, len(items))
        if n <= 1:
            return [fn(x) for x in items]
        shares = [list(range(w, len(items), n)) for w in range(n)]
        ctx = mp.get_context("fork")
        forked = []
        try:
            for share in shares[1:]:
                receive, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_serve, args=(fn, [items[i] for i in share], send))
                proc.start()
                send.close()
                forked.append((share, proc, receive))
            out: list = [None] * len(items)
            for i in shares[0]:
                out[i] = fn(items[i])
            for share, proc, receive in forked:
                try:
                    ok, value = receive.recv()
                except EOFError:
                    ok, value = False, f"exit code {proc.exitcode} before it sent its results"
                proc.join()
                if not ok:
                    raise RuntimeError(f"a plan worker failed:\n{value}")
                for i, v in zip(share, value):
                    out[i] = v
            return out
        finally:
            for _, proc, receive in forked:
                if proc.is_alive():
                    proc.terminate()
                proc.join()
                receive.close()


def _serve(fn: Callable, items: list, send) -> None:
    """A forked worker: its share's results, or the traceback of what failed."""
    try:
        send.send((True, [fn(x) for x in items]))
    except BaseException:   # noqa: BLE001 - reported to the plan, which raises it
        send.send((False, traceback.format_exc()))
    finally:
        send.close()
