"""Prorsa's plan on a slice of a big cluster (harness/prorsa/slice.py): which engines and trajectories
a slice holds, how its split maps back, and that it picks the split the whole cluster's plan picks."""
from __future__ import annotations

from hydra.utils import instantiate
from omegaconf import OmegaConf

from harness.api import ClusterView, EngineState, Role, Route
from harness.experiment import run_info
from harness.prorsa.slice import ClusterSlice, cluster_split, scaled
from harness.allocation import COLOCATED, roles_for
from harness.prorsa.tracker import Phase, TrajectoryState
from harness.prorsa.whatif import FutureTrajectory, FutureTurn
from harness.rollout import ModeConfig
from harness.routing import PrefixTracker
from tests.conftest import cluster_of, load_config


def view_of(roles: list[Role]) -> ClusterView:
    return ClusterView(0.0, [EngineState(i, r, True, 4, 0, 0, 0, 0, 0, 1000) for i, r in enumerate(roles)])


def test_a_slice_keeps_each_role_in_proportion_evenly_spaced():
    part = ClusterSlice.of(view_of(roles_for(8, 32)), 8)       # 8P24D -> 2P6D
    assert part.ids == (0, 4, 8, 12, 16, 20, 24, 28)
    assert [e.role for e in part.view(view_of(roles_for(8, 32))).engines] == roles_for(2, 8)
    # 3P29D: 0.75 of a prefill engine rounds to one (every role present keeps one), 29/4 -> 7 decode
    part = ClusterSlice.of(view_of(roles_for(3, 32)), 8)
    roles = [e.role for e in part.view(view_of(roles_for(3, 32))).engines]
    assert roles.count(Role.PREFILL) == 1 and roles.count(Role.DECODE) == 7
    assert ClusterSlice.of(view_of(roles_for(COLOCATED, 32)), 8).share == 0.25


def test_a_slice_split_maps_back_in_proportion():
    assert [cluster_split(k, 0.25, 32) for k in (COLOCATED, 1, 2, 7)] == [COLOCATED, 4, 8, 28]
    assert scaled(100, 0.25) == 25 and scaled(1, 0.25) == 1 and scaled(0, 0.25) == 0
    # the whole cluster (share 1) keeps every count and split
    assert scaled(37, 1.0) == 37 and cluster_split(5, 1.0, 8) == 5


def test_a_slice_keeps_the_trajectories_living_on_its_engines_renumbered():
    part = ClusterSlice((4, 9), 16)
    prefix = PrefixTracker()
    prefix.decode_engine.update({1: 9, 2: 3})
    tool = TrajectoryState(1, "f", 0.0, phase=Phase.TOOL)            # its KV on engine 9: kept
    elsewhere = TrajectoryState(2, "f", 0.0, phase=Phase.TOOL)       # on engine 3: not
    routed = TrajectoryState(3, "f", 0.0, phase=Phase.DECODING)      # decoding on engine 4: kept
    routes = {3: Route(2, 4)}
    assert [part.keeps(s, prefix, routes) for s in (tool, elsewhere, routed)] == [True, False, True]
    # none on any engine yet: the slice's share of them, by id
    homeless = [part.keeps(TrajectoryState(t, "f", 0.0), prefix, {}) for t in range(10, 1610)]
    assert abs(sum(homeless) / len(homeless) - part.share) < 0.03
    turn = [FutureTurn(100, 0, 10, 0.0)]
    out = part.renumbered([FutureTrajectory(1, "f", 0.0, turn, decode_engine=9),
                           FutureTrajectory(3, "f", 0.0, turn, decode_engine=4, prefill_engine=2, route=Route(2, 4))])
    assert (out[0].decode_engine, out[0].prefill_engine, out[0].route) == (1, None, None)
    # its prefill engine is outside the slice: the turn is routed again within it
    assert (out[1].decode_engine, out[1].prefill_engine, out[1].route) == (0, None, None)


def start_split(engines: int, plan_engines: int) -> list[Role]:
    overrides = ["+experiment=heavy_prefill", "policy=prorsa", f"cluster.num_engines={engines}",
                 f"policy.plan_engines={plan_engines}", "workload.batch_size=64"]
    cfg = load_config(overrides)
    mode = ModeConfig(**OmegaConf.to_container(cfg.mode, resolve=True))
    policy = instantiate(cfg.policy)
    return policy.initial_roles(cluster_of(overrides), run_info(mode, instantiate(cfg.workload, seed=cfg.seed)))


def test_the_slice_plans_the_start_the_whole_cluster_plans():
    """heavy_prefill (long prompts, short answers) on 16 engines: the whole cluster's plan and a plan on
    a slice of 8 engines (half the batch) choose the same prefill-heavy start."""
    whole, sliced = start_split(16, 16), start_split(16, 8)
    assert whole == sliced
    assert whole.count(Role.PREFILL) > whole.count(Role.DECODE)
