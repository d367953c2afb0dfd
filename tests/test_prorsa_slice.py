"""Prorsa's plan on a slice of a big cluster (harness/prorsa/slice.py): which engines and trajectories
a slice holds, how its split maps back, and that it picks the split the whole cluster's plan picks."""
from __future__ import annotations

from hydra.utils import instantiate
from omegaconf import OmegaConf

from harness.api import ClusterView, EngineState, Role, Route
from harness.experiment import run_info
from harness.prorsa.planner import Planner
from harness.prorsa.policy import Prorsa
from harness.prorsa.slice import ClusterSlice, cluster_split, home, scaled, thinned
from harness.allocation import COLOCATED, roles_for
from harness.prorsa.tracker import Phase, TrajectoryState
from harness.prorsa.forecast import FutureTrajectory, FutureTurn
from harness.rollout import ModeConfig
from harness.routing import PrefixTracker
from tests.conftest import cluster_of, load_config, policy_of, simulate


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


def test_thinning_keeps_each_engines_share_evenly_by_chain_longest_first():
    """Weight 4. Engine 0 holds 8 trajectories whose chains (one turn: n tokens out at 1 s per decode
    step after the first) are 1..8 s, engine 1 holds 6 of 1..6 s, and 2 have no engine (1 and 2 s).
    By hand: engine 0 keeps round(8/4) = 2, positions 0 and 4 of its chains longest first (8 and 4 s);
    engine 1 keeps round(6/4) = 2, positions 0 and 3 (6 and 3 s); the homeless keep 1, the longest."""
    def ft(tid: int, chain: int, engine: int | None) -> FutureTrajectory:
        return FutureTrajectory(tid, "f", 0.0, [FutureTurn(100, 0, chain + 1, 0.0)], decode_engine=engine)
    futures = ([ft(100 + c, c, 0) for c in range(1, 9)] + [ft(200 + c, c, 1) for c in range(1, 7)]
               + [ft(301, 1, None), ft(302, 2, None)])
    kept = thinned(futures, 4, 1.0, stratum=home)
    assert [f.trajectory_id for f in kept] == [104, 108, 203, 206, 302]
    # GRPO groups kept whole: groups of 2 by id, chains (1, 8), (2, 3), (4, 5), (6, 7): weight 2 keeps
    # positions 0 and 2 of the groups by their longest chain (8, 7, 5, 3 s)
    group = [ft(i, c, None) for i, c in enumerate([1, 8, 2, 3, 4, 5, 6, 7])]
    assert [f.trajectory_id for f in thinned(group, 2, 1.0, unit=lambda f: f.trajectory_id // 2)] == [0, 1, 4, 5]
    assert thinned(futures, 1, 1.0) == futures


def started(overrides: list[str]):
    """The configured policy after its `initial_roles` (the start planned), and the roles it chose."""
    cfg = load_config(overrides)
    mode = ModeConfig(**OmegaConf.to_container(cfg.mode, resolve=True))
    policy = instantiate(cfg.policy)
    roles = policy.initial_roles(cluster_of(overrides), run_info(mode, instantiate(cfg.workload, seed=cfg.seed)))
    return policy, roles


def start_split(engines: int, plan_engines: int, *more: str) -> list[Role]:
    return started(["+experiment=heavy_prefill", "policy=prorsa", f"cluster.num_engines={engines}",
                    f"policy.plan_engines={plan_engines}", "workload.batch_size=64", *more])[1]


def test_the_slice_plans_the_start_the_whole_cluster_plans():
    """heavy_prefill (long prompts, short answers) on 16 engines: the whole cluster's plan and a plan on
    a slice of 8 engines (half the batch) choose the same prefill-heavy start."""
    whole, sliced = start_split(16, 16), start_split(16, 8)
    assert whole == sliced
    assert whole.count(Role.PREFILL) > whole.count(Role.DECODE)


def test_a_thinned_plan_chooses_the_start_the_full_plan_chooses():
    """heavy_prefill on 8 engines (64 prompts x 8 = 512 trajectories, 64 per engine): the full plan and
    plans that simulate one trajectory in 4 and in 8 (`plan_per_engine` 16 and 8) choose the same
    prefill-heavy start."""
    full = start_split(8, 32)
    assert full.count(Role.PREFILL) > full.count(Role.DECODE)
    assert start_split(8, 32, "policy.plan_per_engine=16") == full
    assert start_split(8, 32, "policy.plan_per_engine=8") == full


def test_a_thinned_start_draws_no_more_samples_and_its_race_does(monkeypatch):
    """The thinned start plan is a screen: it runs on the samples drawn first, with no sampler for more;
    the race of its finalists (every trajectory simulated) gets one, to sample while its choice is open
    (Prorsa._initial_split). heavy_prefill's screen here leaves more than one finalist."""
    calls = []
    initial = Planner.initial

    def recorded(self, samples, max_in_flight, hedges=(), more=None, *rest, **named):
        calls.append((self.whatif.weight, more is not None, named.get("screen") is not None))
        return initial(self, samples, max_in_flight, hedges, more, *rest, **named)
    monkeypatch.setattr(Planner, "initial", recorded)
    start_split(8, 32, "policy.plan_per_engine=8")
    screen, race = calls
    assert screen[0] > 1 and not screen[1] and not screen[2]
    assert race == (1, True, True)


def two_turns(tid: int) -> FutureTrajectory:
    """A 500-token prompt, 50 tokens out, a 2-s tool call, then a 750-token prompt (550 cached), 30 out."""
    return FutureTrajectory(tid, "f", 0.0, [FutureTurn(500, 0, 50, 2.0), FutureTurn(750, 550, 30, 0.0)])


def test_one_weighted_trajectory_runs_as_the_identical_ones_it_stands_for():
    """One colocated engine (DP1): four identical trajectories arriving together and one trajectory of
    weight 4 take the same steps (the four prompts fit one step's budget, then they decode together),
    so they end at the same instant. On 1P1D the weighted trajectory's KV moves as the four's bytes in
    one transfer (one setup latency instead of four): within 1%."""
    from harness.prorsa.whatif import WhatIf
    colocated = cluster_of(["cluster=dense8_h100", "cluster.num_engines=1"])
    roles = [Role.COLOCATED]
    full = WhatIf(colocated, 5, 4.0).run([two_turns(t) for t in range(4)], roles, roles)
    thinned = WhatIf(colocated, 5, 4.0)
    thinned.weight = 4
    one = thinned.run([two_turns(0)], roles, roles)
    assert one.completion_s == full.completion_s and full.ends == [full.completion_s] * 4
    # ... and later than one trajectory alone (its steps are a quarter of the batch)
    assert WhatIf(colocated, 5, 4.0).run([two_turns(0)], roles, roles).completion_s < one.completion_s
    pd = cluster_of(["cluster=dense8_h100", "cluster.num_engines=2"])
    roles = [Role.PREFILL, Role.DECODE]
    full = WhatIf(pd, 5, 4.0).run([two_turns(t) for t in range(4)], roles, roles)
    thinned = WhatIf(pd, 5, 4.0)
    thinned.weight = 4
    assert abs(thinned.run([two_turns(0)], roles, roles).completion_s / full.completion_s - 1) < 0.01


def test_a_weighted_cluster_divides_its_limits_and_multiplies_its_batches():
    from harness.cluster import cost_model
    from harness.perf.roofline import RankBatch
    cluster = cluster_of(["cluster=dense8_h100"])
    w = cluster.weighted(4)
    assert (w.sequence_weight, w.max_num_seqs, w.max_num_batched_tokens) == (4, 64, 2048)
    assert w.weighted(2).sequence_weight == 8
    full, weighted = cost_model(cluster, Role.COLOCATED), cost_model(w, Role.COLOCATED)
    assert weighted.kv_capacity_tokens(0.9, 0.0) == full.kv_capacity_tokens(0.9, 0.0) // 4
    assert weighted.decode_step_time([3], [900]) == full.decode_step_time([12], [3600])
    assert weighted.step_time([RankBatch(2, 400, 100, 50.0, 120, 3)]) == \
        full.step_time([RankBatch(8, 1600, 400, 200.0, 480, 12)])


def test_thinning_stops_where_a_rank_could_not_hold_the_longest_context_at_its_weight():
    """swe on moe_h200 (512 trajectories on 8 engines; a colocated DP1 rank holds 817,871 KV tokens, the
    context cap is 98,304): one per engine asked would thin by 64, but a rank holds the longest context
    8 times only, so the weight is 8; 16 per engine thins by 4."""
    def weight(per_engine: int) -> int:
        return started(["+experiment=swe", "policy=prorsa", "policy.initial=colocated",
                        f"policy.plan_per_engine={per_engine}"])[0].weight
    assert (weight(1), weight(16)) == (8, 4)


class Recorded(Prorsa):
    """Prorsa keeping (whether the plan scored the mean end, its weight) for each plan, the start first."""

    def __init__(self, **keys):
        super().__init__(**keys)
        self.seen: list[tuple[bool, int]] = []

    def _simulate_at(self, count):
        super()._simulate_at(count)
        self.seen.append((self.rules.on_mean_end(self._to_end()), self.weight))


def weights_planned(overrides: list[str]) -> list[tuple[bool, int]]:
    """(whether the plan scored the mean end, its weight) for each plan of a whole run, the start first."""
    policy = policy_of("prorsa", _target_=f"{__name__}.Recorded", plan_per_engine=2, plan_workers=1)
    simulate(overrides, policy=policy)
    return policy.seen


def test_thinning_leaves_the_plans_within_a_run_that_score_a_last_end():
    """Two trajectories per engine asked (`plan_per_engine=2`). Sync (heavy_prefill, 16 prompts x 8 = 128
    per step on 8 engines): the start thins by 8, every plan within the run by nothing. Async (tooluse,
    64 in flight and as many to start on 8 engines, 4 batches of 64): the start thins, the plans scored by the mean end
    thin, those of the run's last phase (64 or fewer left to start) do not."""
    sync = weights_planned(["+experiment=heavy_prefill", "workload.batch_size=16"])
    assert sync[0] == (False, 8) and len(sync) > 2 and all(w == 1 for _, w in sync[1:])
    asynch = weights_planned(["+experiment=tooluse_async", "workload.batch_size=8", "mode.max_in_flight=64",
                              "mode.num_steps=4"])
    assert asynch[0][1] > 1
    rolling = [w for mean_end, w in asynch[1:] if mean_end]
    last = [w for mean_end, w in asynch[1:] if not mean_end]
    assert rolling and all(w > 1 for w in rolling) and last and all(w == 1 for w in last)


def test_a_switch_a_thinned_rolling_plan_wants_is_decided_again_in_full(monkeypatch):
    """capture_flip_async scaled down (64 in flight on 8 engines, one trajectory in 2 simulated): a
    rolling plan thinned decides to stay alone; one that wants a switch is decided again by the plan in
    full (Prorsa._plan_now), and only such a decision switches."""
    decided = []   # (weight, whether the decision switches), per Planner.decide call
    decide = Planner.decide

    def recorded(self, *args, **named):
        d = decide(self, *args, **named)
        decided.append((self.whatif.weight, d.switch))
        return d
    monkeypatch.setattr(Planner, "decide", recorded)
    overrides = ["+experiment=capture_flip_async", "policy=prorsa", "policy.plan_per_engine=4", "policy.plan_workers=1",
                 "workload.batch_size=4", "mode.max_in_flight=64", "mode.num_steps=4"]
    policy = instantiate(load_config(overrides).policy)
    simulate(overrides, policy=policy)
    wanted = [i for i, (weight, switch) in enumerate(decided) if weight > 1 and switch]
    assert wanted and all(i + 1 < len(decided) and decided[i + 1][0] == 1 for i in wanted)
    assert any(weight > 1 and not switch for weight, switch in decided)   # stays, decided thinned
    assert len(policy.decisions) > 1   # the start, then switches (each decided in full)


def test_small_batches_thinned_add_up_to_the_whole_and_keep_new_ids_negative():
    """Sixteen batches of 16 to start, one trajectory in 32 simulated: each batch's share is half a
    trajectory. Rounded one by one each would draw one (16 in all, ids running into the live ones'
    from -9); their shares add up to 8, ids -9 to -2."""
    import numpy as np
    policy, _ = started(["+experiment=tooluse_async", "policy=prorsa", "policy.initial=colocated",
                         "workload.batch_size=2", "mode.num_steps=16", "mode.max_in_flight=256"])
    count = policy._scaled(256, 32)
    drawn = policy._scheduled(policy.future_model(0.0), 0, 256, -1 - count, np.random.default_rng(0), weight=32)
    assert count == 8 and [ft.trajectory_id for ft in drawn] == list(range(-9, -1))
