"""Shared helpers: compose the real Hydra config and run the real driver on the simulator."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from harness import native
from harness.api import EventKind
from harness.cluster import cluster_from_config
from harness.experiment import lifecycle_frame, mode_from_config, run_rollout
from harness.policy import Policy
from harness.rollout import run_batches

CONFIGS = str(Path(__file__).resolve().parents[1] / "configs")


def pytest_collection_modifyitems(config, items):
    """Tests marked `sources` patch the simulator's modules, which compiled callers never look up
    again: they run on the sources (`make test` runs them once more with HARNESS_NATIVE=0)."""
    if native.active():
        skip = pytest.mark.skip(reason="patches the simulator, which runs compiled here (HARNESS_NATIVE=0 runs it)")
        for item in items:
            if "sources" in item.keywords:
                item.add_marker(skip)


def load_config(overrides: list[str]):
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        return compose(config_name="config", overrides=["logger=none", *overrides])


def policy_of(name: str, **overrides) -> Policy:
    """The policy `name` as configs/policy/<name>.yaml builds it, with `overrides` (its defaults live there)."""
    return instantiate(load_config([f"policy={name}"]).policy, **overrides)


def simulate(overrides: list[str], policy=None, keep_events: bool = False):
    """Run one rollout in-process; returns (driver result, lifecycle frame, backend)."""
    result, backend = run_rollout(load_config(overrides), policy, keep_events)
    return result, lifecycle_frame(result), backend


def batches_of(overrides: list[str]) -> list[list]:
    """The trajectory scripts a run of `overrides` replays, one RL step's batch at a time."""
    cfg = load_config(overrides)
    workload = instantiate(cfg.workload, seed=cfg.seed)
    return list(run_batches(workload, mode_from_config(OmegaConf.to_container(cfg.mode, resolve=True))))


def scripts_of(overrides: list[str]) -> list:
    return [s for batch in batches_of(overrides) for s in batch]


SMALL = ["workload=synthetic", "workload.batch_size=6", "workload.group_size=4", "mode.num_steps=2"]


@pytest.fixture
def small():
    return list(SMALL)


def cluster_of(overrides: list[str]):
    cfg = load_config(overrides)
    return cluster_from_config(OmegaConf.to_container(cfg.cluster, resolve=True))


class SwitchAt(Policy):
    """Test policy: starts with `initial` roles and, once the clock reaches `at_s` and `after_turns`
    turns have ended, asks for `switch` (engine -> role); routes to whatever roles exist
    (route_by_role). On real servers a switch set by progress, not by the clock, lands mid-rollout
    however fast the machine runs. That plan takes `latency_s` of simulated time (the driver charges it)
    and, on real engines, `sleep_s` of wall time in the planner's thread."""

    name = "switch_at"

    def __init__(self, initial: list, switch: dict, at_s: float, control_interval_s: float, after_turns: int = 0,
                 latency_s: float = 0.0, sleep_s: float = 0.0):
        from harness.routing import PrefixTracker
        self.initial, self.switch, self.at_s, self.after_turns = initial, switch, at_s, after_turns
        self.latency_s, self.sleep_s = latency_s, sleep_s
        self.planned = False     # the last `plan` call made the switch
        self.control_interval_s = control_interval_s
        self.prefix = PrefixTracker()
        self.asked = False
        self.turns_ended = 0

    def initial_roles(self, cluster, run):
        return list(self.initial)

    def observe(self, event):
        self.prefix.observe(event)
        self.turns_ended += event.kind == EventKind.DECODE_END

    def plan(self, view):
        self.planned = False
        if self.asked or view.now < self.at_s or self.turns_ended < self.after_turns:
            return None
        self.asked = self.planned = True
        if self.sleep_s:
            import time
            time.sleep(self.sleep_s)
        return dict(self.switch)

    def plan_latency_s(self, cpu_s: float) -> float | None:
        return self.latency_s if self.planned else None

    def route(self, request, view):
        from harness.routing import route_by_role
        return route_by_role(request, view, self.prefix)

    def metrics(self):
        return {}
