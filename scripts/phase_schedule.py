"""What a schedule that knows the phases of a shifting mix achieves: the split changes to the one given
for each batch's phase once `lag` of that batch has started (shift_reason_browse: batches 0-1 and 4-5
reasoning-heavy, 2-3 and 6-7 browse-heavy). A yardstick for Prorsa on the shifting experiments, not a
policy: it is told the phases and the splits.
  python scripts/phase_schedule.py +experiment=shift_reason_browse_kvboth --reasoning 3 --browse 4 --lag 0.25 [seed=N]
"""
import argparse
import logging
from pathlib import Path

from hydra import compose, initialize_config_dir

from harness.allocation import current_split, roles_for, target_roles
from harness.api import ClusterView, EventKind, LifecycleEvent, Role, Route, TurnRequest
from harness.experiment import run_rollout
from harness.policy import Policy
from harness.routing import Balance, PrefixTracker, route_by_role

log = logging.getLogger("phase_schedule")
PHASES = ["reasoning", "reasoning", "browse", "browse"] * 2   # the experiments' schedule, batch by batch


class PhaseSchedule(Policy):
    """Holds `splits[b]` while batch b is the newest batch `lag` of whose trajectories have started."""

    name = "phase_schedule"
    control_interval_s = 1.0

    def __init__(self, splits: list[int], lag: float):
        self.splits, self.lag = splits, lag
        self.prefix = PrefixTracker()
        self.starts = 0
        self.switches: list[tuple[float, int, int]] = []

    def initial_roles(self, cluster, run) -> list[Role]:
        self.per_batch = run.trajectories_per_step
        self.balance = Balance.of(cluster)
        return roles_for(self.splits[0], cluster.num_engines)

    def observe(self, event: LifecycleEvent) -> None:
        self.prefix.observe(event)
        self.starts += event.kind == EventKind.TRAJECTORY_START

    def plan(self, view: ClusterView) -> dict[int, Role] | None:
        batch = max(self.starts - 1 - int(self.lag * self.per_batch), 0) // self.per_batch
        want = self.splits[min(batch, len(self.splits) - 1)]
        now = current_split(view)
        if now is None or now == want:
            return None
        self.switches.append((round(view.now, 1), now, want))
        return target_roles(view, want)

    def plan_latency_s(self, cpu_s: float) -> None:
        return None   # a schedule told in advance

    def route(self, request: TurnRequest, view: ClusterView) -> Route | None:
        return route_by_role(request, view, self.prefix, self.balance)

    def metrics(self) -> dict:
        return {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. +experiment=shift_reason_browse_kvboth seed=1")
    ap.add_argument("--reasoning", type=int, required=True, help="prefill engines in reasoning phases (0: colocated)")
    ap.add_argument("--browse", type=int, required=True, help="prefill engines in browse phases (0: colocated)")
    ap.add_argument("--lag", type=float, default=0.0, help="share of a batch started before its split is taken")
    args = ap.parse_intermixed_args()   # overrides may come before or after the options
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parent.parent / "configs"), version_base=None):
        cfg = compose("config", overrides=["logger=none", *args.overrides])
    policy = PhaseSchedule([args.reasoning if p == "reasoning" else args.browse for p in PHASES], args.lag)
    result, _ = run_rollout(cfg, policy)
    log.info("rollout %.1f s; switches (t, from, to): %s", result.rollout_time_s, policy.switches)


if __name__ == "__main__":
    main()
