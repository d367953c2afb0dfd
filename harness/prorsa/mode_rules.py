"""What Prorsa's plans do differently by mode (RunInfo.mode), in one place: policy.py, planner.py and
forecast.py ask the run's rules (`rules_for`), never the mode's name.

Sync RL runs a batch of trajectories per step, and a step ends when its last trajectory ends, so its
plans score that last end. Async RL keeps a rolling set of `max_in_flight` trajectories, and its plans
score their mean end until the run's last phase. Serving (mode=serve) sends single-turn requests at
arrival times, a rolling set as in async RL: its start is planned on sampled requests, every later plan
on the requests in flight only. The rules behind
each answer: docs/decisions/2026-12-07-prorsa-rules.md (R2, R4, R5, R7, R9, R11-R13, R21).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from harness.api import RunInfo
from harness.cluster import ClusterConfig

# Async: the start is scored on this many sets of `max_in_flight` trajectories. The first set starts on
# an empty cluster and the allocations tie on it; the later ones start as slots free up, so their ends
# carry each allocation's throughput, which sets an async run's time (docs/decisions/
# 2026-12-07-prorsa-rules.md, R2).
INITIAL_IN_FLIGHT_SETS = 4


class ModeRules(ABC):
    """The answers that differ by mode. Stateless: the run is passed where an answer needs it."""

    # the run is steps, each batch started once the last has ended: a step's start makes a plan due, is
    # planned for its batch (Prorsa._plan_step, R5), and the forecast runs on into the next batch (R21)
    steps: bool
    # the what-if replays a weight update after every step's worth of trajectories (WhatIf.update_every)
    updates_in_flight: bool
    # a plan samples the trajectories still to start, and with several families their hedges
    samples_starts: bool
    # the start's sample spans several batches, each drawn in its declared mix (`mix_forecast: schedule`, R7)
    schedules_start: bool

    @abstractmethod
    def checks_switch(self, cluster: ClusterConfig) -> bool:
        """Whether a switch a plan wants must also pass the fresh-sample check (Prorsa._checked)."""

    @abstractmethod
    def to_end(self, run: RunInfo, left: int) -> bool:
        """Whether a plan covers the run's end, with `left` trajectories still to start (Prorsa._to_end)."""

    @abstractmethod
    def initial_count(self, run: RunInfo) -> int:
        """The trajectories of the start plan's sample (Prorsa._initial_split)."""

    @abstractmethod
    def whole_run(self, run: RunInfo, count: int) -> bool:
        """Whether the start plan's sample of `count` trajectories is scored as the whole run."""

    @abstractmethod
    def on_mean_end(self, to_end: bool) -> bool:
        """Whether a plan scores its trajectories' mean end, not their last (`to_end`: it covers the run's
        end)."""

    @abstractmethod
    def shares_output(self, whole_run: bool) -> bool:
        """Whether the futures are drawn as a step's are, each trajectory's turns sharing an output level
        (forecast.py `output_shared`, R13); `whole_run`: the sample is all the run has."""


class SyncRules(ModeRules):
    """Sync RL: a batch per step, the step ending when its last trajectory ends."""

    steps = True               # a batch starts only once the last has ended, on idle engines
    updates_in_flight = False  # the trainer updates the weights between steps, with nothing in flight
    samples_starts = False     # a step's batch starts at once: nothing starts while a plan's run goes on
    schedules_start = False    # the start's sample is one step's batch, in that step's mix

    def checks_switch(self, cluster: ClusterConfig) -> bool:
        """Always: a switch hangs on the step's last end, a few trajectories' on one sample (R4)."""
        return True

    def to_end(self, run: RunInfo, left: int) -> bool:
        """Never: every plan scores its step's last end already."""
        return False

    def initial_count(self, run: RunInfo) -> int:
        """One step's batch: the phase an allocation serves before the next step is planned."""
        return run.trajectories_per_step

    def whole_run(self, run: RunInfo, count: int) -> bool:
        """Never: the sample is one step, scored by its last end as every step is."""
        return False

    def on_mean_end(self, to_end: bool) -> bool:
        """Never: the trainer waits for the step's last trajectory."""
        return False

    def shares_output(self, whole_run: bool) -> bool:
        """Always: a step ends with its longest trajectories, whose turns run long together."""
        return True


class AsyncRules(ModeRules):
    """Async RL: a rolling set of `max_in_flight` trajectories, each started as a slot frees up."""

    steps = False              # trajectories start as slots free up: no step start to plan for
    updates_in_flight = True   # the trainer updates the weights after each step's worth, while others run
    samples_starts = True      # trajectories start while a plan's run goes on, and set its throughput
    schedules_start = True     # the start's sample is INITIAL_IN_FLIGHT_SETS sets, across batches

    def checks_switch(self, cluster: ClusterConfig) -> bool:
        """Where a switch drains or reloads engines: under kv_both it is a router update, and a wrong
        one is undone at the next plan for nothing (R4)."""
        return cluster.switch_mechanism != "kv_both"

    def to_end(self, run: RunInfo, left: int) -> bool:
        """Once the live trajectories and the next to start are all the run has left (R9)."""
        return left <= run.max_in_flight

    def initial_count(self, run: RunInfo) -> int:
        """INITIAL_IN_FLIGHT_SETS sets of `max_in_flight`, never more than the run has: a sample more
        loaded than the run favours splits (R11)."""
        return min(INITIAL_IN_FLIGHT_SETS * run.max_in_flight, run.total_trajectories)

    def whole_run(self, run: RunInfo, count: int) -> bool:
        """When the sample is all the run has: the run's time is then its last end (R12)."""
        return count == run.total_trajectories

    def on_mean_end(self, to_end: bool) -> bool:
        """Until the plan covers the run's end (R9): async RL wants throughput, and the last end of a
        rolling set is a few long chains of turns and tool calls."""
        return not to_end

    def shares_output(self, whole_run: bool) -> bool:
        """Only for a start sampled whole: scored by its last end, as a step is (R12, R13)."""
        return whole_run


class ServeRules(AsyncRules):
    """Serving (mode=serve): a rolling set of requests as in async RL, which the plans see only once
    they arrive; one batch, no weight updates."""

    updates_in_flight = False  # a benchmark updates no weights
    samples_starts = False     # requests arrive on the benchmark's clock, which plans do not forecast
    schedules_start = False    # one batch, with no declared curriculum

    def checks_switch(self, cluster: ClusterConfig) -> bool:
        """Never: the fresh-sample check is a rule of RL runs (R4); a serving plan switches on its one sample."""
        return False

    def to_end(self, run: RunInfo, left: int) -> bool:
        """Never: with no arrivals forecast, no plan sees the run's end."""
        return False

    def whole_run(self, run: RunInfo, count: int) -> bool:
        """Never: a start scored by its last end is a rule of async RL runs (R12); a benchmark's start is
        scored by its mean end."""
        return False


SYNC, ASYNC, SERVE = SyncRules(), AsyncRules(), ServeRules()
RULES: dict[str, ModeRules] = {"sync": SYNC, "async": ASYNC, "serve": SERVE}


def rules_for(run: RunInfo) -> ModeRules:
    """The rules of the run's mode (harness/schema.py ModeSchema names every mode)."""
    return RULES[run.mode]
