"""Known answers computed by hand, and the effects the model must show (issue: 'effects')."""
import pandas as pd
import pytest

from harness.api import EventKind, Role
from harness.policy import Policy
from tests.conftest import SwitchAt, scripts_of, simulate

ONE_TURN = ["workload.batch_size=1", "workload.group_size=1", "mode.num_steps=1", "workload.turns.0.median=1",
            "workload.turns.0.sigma=0", "workload.group_corr=0", "workload.prompt.median=1000",
            "workload.prompt.sigma=0", "workload.output.median=5", "workload.output.sigma=0"]

# Qwen3-32B on H100, TP4 (configs/catalogue, cluster dense_h100), by hand:
L, HIDDEN, HEADS, D = 64, 5120, 64, 128
P_GEMM = 32.8e9 - 151936 * 5120
KV_GPU = 2 * 64 * 8 * 128 * 2 / 4             # KV bytes per token per GPU, 8 KV heads over TP4
PEAK, HBM, NVLINK = 989e12, 3.35e12, 450e9


def tp4_comm(tokens):
    return 2 * L * (20e-6 + 2 * 3 / 4 * tokens * HIDDEN * 2 / NVLINK)


def prefill_step(n, cached=0):
    compute = 2 * P_GEMM * n / (4 * PEAK * 0.74) + 4 * L * HEADS * D * n * (cached + (n - 1) / 2) / (4 * PEAK * 0.45)
    memory = (P_GEMM * 2 / 4 + KV_GPU * (cached + n)) / (HBM * 0.8)
    return max(compute, memory) + tp4_comm(n) + 126e-6 + 4e-6 + 32e-6 * L


def decode_step(ctx):
    compute = 2 * P_GEMM / (4 * PEAK * 0.74) + 4 * L * HEADS * D * ctx / (4 * PEAK * 0.45)
    memory = (P_GEMM * 2 / 4 + KV_GPU * ctx) / (HBM * 0.8)
    return max(compute, memory) + tp4_comm(1) + 126e-6 + 4e-6


def test_one_turn_colocated_known_answer():
    _, df, _ = simulate(ONE_TURN + ["policy=colocate"])
    row = df.iloc[0]
    assert row.prompt_tokens == 1000 and row.output_tokens == 5
    t_prefill = prefill_step(1000)
    assert row.t_prefill_end == pytest.approx(t_prefill, rel=1e-9)
    assert row.t_first_token == pytest.approx(t_prefill, rel=1e-9)       # the prefill step samples token 1
    # tokens 2..5: four decode steps over contexts 1000..1003
    expected_end = t_prefill + sum(decode_step(1000 + j) for j in range(4))
    assert row.t_decode_end == pytest.approx(expected_end, rel=1e-9)


def test_one_turn_disaggregated_known_answer():
    _, df, _ = simulate(ONE_TURN + ["policy=fixed_pd"])
    row = df.iloc[0]
    t_prefill = prefill_step(1000)
    # KV moves over the 4 NICs of an engine: setup 1 ms + bytes / (4 * 50 GB/s * 0.85).
    t_transfer = 1e-3 + 1000 * 2 * 64 * 8 * 128 * 2 / (4 * 50e9 * 0.85)
    assert row.transferred_tokens == 1000
    assert row.t_transfer_end == pytest.approx(t_prefill + t_transfer, rel=1e-9)
    # The decode side re-feeds the last prompt token: five decode steps over contexts 999..1003.
    expected_end = row.t_transfer_end + sum(decode_step(999 + j) for j in range(5))
    assert row.t_decode_end == pytest.approx(expected_end, rel=1e-9)


def test_one_turn_disaggregated_whole_block_transfer_known_answer():
    """A connector that moves whole blocks (vLLM's ExampleConnector, kv_transfer_block_tokens=128) loads
    the prompt but its last token down to a block boundary, (1000 - 2) // 128 * 128 = 896 tokens; the
    decode engine prefills the other 104 after them, and that step samples the first token."""
    _, df, _ = simulate(ONE_TURN + ["policy=fixed_pd", "+cluster.kv_transfer_block_tokens=128"])
    row = df.iloc[0]
    t_prefill = prefill_step(1000)
    t_transfer = 1e-3 + 896 * 2 * 64 * 8 * 128 * 2 / (4 * 50e9 * 0.85)
    assert row.transferred_tokens == 896
    assert row.t_transfer_end == pytest.approx(t_prefill + t_transfer, rel=1e-9)
    t_first = row.t_transfer_end + prefill_step(104, cached=896)
    assert row.t_decode_start == pytest.approx(t_first, rel=1e-9)
    assert row.t_first_token == pytest.approx(t_first, rel=1e-9)
    # tokens 2..5: four decode steps over contexts 1000..1003, as after a colocated prefill
    assert row.t_decode_end == pytest.approx(t_first + sum(decode_step(1000 + j) for j in range(4)), rel=1e-9)
    assert row.new_tokens == 1000 and row.recomputed_tokens == 0   # the decode side's 104 are not a prefill leg's


def test_whole_block_transfer_misses_one_token_past_a_block_boundary():
    """ExampleConnector stores align(1025) = 1024 tokens but looks up align(1024) = 896: a 1,025-token
    prompt finds no stored KV, and its decode engine prefills all of it (nothing of it is cached there).
    With nothing to load the connector starts no transfer: no setup is paid, and the decode engine's
    prefill starts when the prefill leg hands off."""
    _, df, _ = simulate(ONE_TURN + ["policy=fixed_pd", "+cluster.kv_transfer_block_tokens=128",
                                    "workload.prompt.median=1025"])
    row = df.iloc[0]
    assert row.prompt_tokens == 1025 and row.transferred_tokens == 0
    t_handoff = prefill_step(1025)
    assert row.t_prefill_end == pytest.approx(t_handoff, rel=1e-9)
    assert row.t_transfer_end == pytest.approx(t_handoff, rel=1e-9)      # (1 ms of setup before)
    assert row.t_first_token == pytest.approx(t_handoff + prefill_step(1025), rel=1e-9)


# Effect 3: on heavy prefill PD finishes trajectories sooner; with decode KV memory the bottleneck it loses.
BASE = ["workload.batch_size=4", "workload.group_size=8", "mode.num_steps=1"]
HEAVY_PREFILL = ["cluster=moe_h200", "workload.tool_output.median=6000", "workload.output.median=100",
                 "workload.tool_latency.0.median=0.5", "workload.context_cap=60000"]
DECODE_MEMORY = ["cluster=dense_h100", "cluster.memory_fraction=0.45", "workload.prompt.median=20000",
                 "workload.prompt.sigma=0.1", "workload.tool_output.median=100", "workload.output.median=1000",
                 "workload.tool_latency.0.median=1", "workload.context_cap=32000"]


def mean_completion(df: pd.DataFrame) -> float:
    g = df.groupby("trajectory_id")
    return float((g.t_decode_end.max() - g.t_ready.min()).mean())


def test_pd_wins_on_heavy_prefill():
    r_co, df_co, _ = simulate(BASE + HEAVY_PREFILL + ["policy=colocate"])
    r_pd, df_pd, _ = simulate(BASE + HEAVY_PREFILL + ["policy=fixed_pd", "policy.num_prefill=4"])
    assert mean_completion(df_pd) < 0.9 * mean_completion(df_co)
    assert r_pd.rollout_time_s < r_co.rollout_time_s


def test_pd_loses_when_decode_kv_memory_is_the_bottleneck():
    r_co, df_co, _ = simulate(BASE + DECODE_MEMORY + ["policy=colocate"])
    r_pd, df_pd, _ = simulate(BASE + DECODE_MEMORY + ["policy=fixed_pd", "policy.num_prefill=6"])
    assert r_pd.rollout_time_s > 1.3 * r_co.rollout_time_s
    assert mean_completion(df_pd) > mean_completion(df_co)


def test_role_switch_drains_waits_and_loses_nothing(small):
    from tests.test_sim_invariants import check_invariants
    result, df, backend = simulate(small + ["cluster.num_engines=3"], policy=SwitchAt(
        [Role.COLOCATED] * 3, {0: Role.PREFILL, 1: Role.DECODE}, at_s=3.0, control_interval_s=1.0))
    check_invariants(scripts_of(small), df, result.rollout_time_s)
    assert result.num_role_switches == 2
    tl = pd.DataFrame(backend.engine_timeline())
    e0 = tl[tl.engine_id == 0].reset_index(drop=True)
    assert list(e0.state) == ["serving", "draining", "switching", "serving"]
    assert list(e0.role) == ["colocated", "colocated", "colocated", "prefill"]
    assert e0.t_start[1] == pytest.approx(3.0)
    assert e0.t_end[2] - e0.t_start[2] == pytest.approx(6.0)        # cluster.switch_time_s
    # Nothing ran on engine 0 while it switched; after it, it only prefills for other decoders.
    switching = e0.iloc[2]
    assert switching.busy_s == 0
    later = df[df.t_prefill_start >= switching.t_end]
    assert len(later[later.engine_prefill == 0]) > 0
    assert (later[later.engine_prefill == 0].engine_decode != 0).all()
    assert (df[df.t_ready >= switching.t_end].engine_decode != 0).all()


@pytest.mark.parametrize("reset", [True, False])
def test_switch_to_colocation_spreads_trajectories_when_the_cache_was_reset(small, reset):
    """2P2D -> colocated. Turns that become ready while every engine switches wait for the whole
    transition. Their trajectories' KV was on the former decode engines (2, 3); when the switch resets
    those engines' prefix cache (SGLang PR #28403) the KV is gone, the router forgets them as holders
    and the waiting turns spread over all four engines; without the reset all of them go back to 2, 3."""
    overrides = small + ["cluster.num_engines=4", "workload.batch_size=8", "mode.num_steps=1",
                         f"cluster.reset_prefix_cache_on_switch={str(reset).lower()}"]
    roles = [Role.PREFILL, Role.PREFILL, Role.DECODE, Role.DECODE]
    result, df, backend = simulate(overrides, policy=SwitchAt(roles, {i: Role.COLOCATED for i in range(4)},
                                                              at_s=3.0, control_interval_s=1.0), keep_events=True)
    ends = sorted(e.t for e in result.events if e.kind == EventKind.ROLE_SWITCH_END)
    assert len(ends) == 4 and ends[0] < ends[-1]
    waited = df[(df.t_ready >= 3.0) & (df.t_ready < ends[0])]   # every engine was switching
    assert len(waited) > 4 and (waited.turn > 0).all() and (waited.t_prefill_start >= ends[-1]).all()
    on_former = waited.engine_decode.isin({2, 3})
    assert on_former.all() != reset
    cleared = [e.engine_id for e in result.events if e.kind == EventKind.PREFIX_CACHE_CLEARED]
    assert sorted(cleared) == ([0, 1, 2, 3] if reset else [])


def test_prefix_tracker_forgets_an_engine_whose_cache_was_cleared():
    from harness.api import LifecycleEvent
    from harness.routing import PrefixTracker
    p = PrefixTracker()
    for tid, (pe, de) in enumerate([(0, 2), (1, 2), (0, 3)]):
        p.observe(LifecycleEvent(EventKind.PREFILL_END, 1.0, tid, 0, engine_id=pe))
        p.observe(LifecycleEvent(EventKind.DECODE_END, 2.0, tid, 0, engine_id=de))
    p.observe(LifecycleEvent(EventKind.PREFIX_CACHE_CLEARED, 3.0, engine_id=2))
    assert p.decode_engine == {2: 3} and p.prefill_engine == {0: 0, 1: 1, 2: 0}
    p.observe(LifecycleEvent(EventKind.PREFIX_CACHE_CLEARED, 3.0, engine_id=0))
    assert p.prefill_engine == {1: 1}


@pytest.mark.parametrize("priorities, order", [((0, 0, 0), [0, 1, 2]), ((0, -2, -1), [1, 2, 0]),
                                               ((-1, -1, 0), [0, 1, 2])])
def test_queue_order_follows_route_priority(priorities, order):
    """One engine that runs one sequence at a time (max_num_seqs=1) gets three turns at once: it serves
    them by the routes' priority, lower first, and in arrival order among equals (vLLM's priority
    scheduling; all 0 is FCFS)."""
    from harness.api import Route, TurnRequest
    from harness.sim.backend import SimBackend
    from tests.conftest import cluster_of
    backend = SimBackend(cluster_of(["cluster=dense_h100", "cluster.num_engines=1", "cluster.max_num_seqs=1"]),
                         [Role.COLOCATED])
    ends = []
    backend.set_listener(lambda e: ends.append(e.trajectory_id) if e.kind == EventKind.DECODE_END else None,
                         lambda r: None)
    for tid, p in enumerate(priorities):
        backend.submit(TurnRequest(trajectory_id=tid, group_id=tid, turn=0, family="f", prompt_tokens=500,
                                   appended_tokens=500, max_output_tokens=20, output_tokens=20, t_ready=0.0),
                       Route(0, 0, priority=p))
    backend.run(None)
    assert ends == order


class SplitBetweenSteps(Policy):
    """Test policy: in `initial` roles (colocated on two engines by default), never ticked; asked between
    the two sync steps, it asks for `switch` (1P1D by default)."""

    name = "split_between_steps"
    control_interval_s = None

    def __init__(self, initial=(Role.COLOCATED, Role.COLOCATED), switch=None):
        from harness.routing import PrefixTracker
        self.prefix, self.calls = PrefixTracker(), []
        self.initial, self.switch = list(initial), switch or {0: Role.PREFILL, 1: Role.DECODE}

    def initial_roles(self, cluster, run):
        return list(self.initial)

    def observe(self, event):
        self.prefix.observe(event)

    def plan(self, view):
        self.calls.append((view.now, [e.running_requests + e.waiting_requests for e in view.engines]))
        return dict(self.switch) if view.now > 0 else None

    def plan_latency_s(self, cpu_s: float) -> None:
        return None   # test policy

    def route(self, request, view):
        from harness.routing import route_by_role
        return route_by_role(request, view, self.prefix)

    def metrics(self):
        return {}


def test_sync_step_boundary_plan_sets_the_roles_the_next_step_starts_in(small):
    from tests.test_sim_invariants import check_invariants
    policy = SplitBetweenSteps()
    result, df, backend = simulate(small + ["cluster.num_engines=2"], policy=policy)
    check_invariants(scripts_of(small), df, result.rollout_time_s)
    (first_end, second_end) = (b for _, b in result.step_windows)
    # asked before each step's batch, with nothing running or queued anywhere
    assert policy.calls == [(0.0, [0, 0]), (pytest.approx(first_end), [0, 0])]
    one, two = df[df.step == 0], df[df.step == 1]
    assert (one.engine_prefill == one.engine_decode).all()                    # colocated
    assert ((two.engine_prefill == 0) & (two.engine_decode == 1)).all()       # every turn split 1P1D
    # the step's first turns waited, parked, for the switch: 6 s (cluster.switch_time_s; idle engines
    # drain at once) counted in the step's window
    assert two.t_prefill_start.min() == pytest.approx(first_end + 6.0)
    assert result.step_windows[1][0] == pytest.approx(first_end)


def test_sync_step_starts_after_its_router_update_and_spreads_over_the_new_prefill_engine(small):
    """kv_both, 1P2D; between the steps decode engine 1 becomes a prefill engine (a router update, 0 s).
    Step 1's batch starts once the switch is done, so its 24 first turns spread over both prefill
    engines (least queued prefill tokens) instead of all going to engine 0, the one prefill engine
    while engine 1 switched, and staying there (sticky prefixes)."""
    from tests.test_sim_invariants import check_invariants
    policy = SplitBetweenSteps([Role.PREFILL, Role.DECODE, Role.DECODE], {1: Role.PREFILL})
    result, df, _ = simulate(small + ["cluster.num_engines=3", "cluster.switch_mechanism=kv_both",
                                      "cluster.router_update_s=0.0"], policy=policy)
    check_invariants(scripts_of(small), df, result.rollout_time_s)
    first_end = result.step_windows[0][1]
    one, two = df[df.step == 0], df[df.step == 1]
    assert set(one.engine_prefill) == {0}
    firsts = two[two.turn == 0]
    assert firsts.t_ready.min() == pytest.approx(first_end)                   # a router update costs nothing
    counts = firsts.engine_prefill.value_counts().to_dict()
    assert set(counts) == {0, 1} and max(counts.values()) <= 16, counts        # 24 first turns, both engines
    assert (two.engine_decode == 2).all()


def test_decode_migration_moves_every_decode_off_the_switched_engine_and_loses_nothing(small):
    """kv_both with migration, 1P2D; at 3 s decode engine 1 becomes a prefill engine. Its decodes under
    way move to engine 2 (the only decode engine left) and finish there with every token; nothing decodes
    on engine 1 after the step that was under way."""
    from tests.test_sim_invariants import check_invariants
    overrides = small + ["cluster.num_engines=3", "cluster.switch_mechanism=kv_both",
                         "cluster.migrate_decodes_on_switch=true", "workload.output.median=600"]
    result, df, _ = simulate(overrides, policy=SwitchAt([Role.PREFILL, Role.DECODE, Role.DECODE],
                                                        {1: Role.PREFILL}, at_s=3.0, control_interval_s=1.0),
                             keep_events=True)
    check_invariants(scripts_of(overrides), df, result.rollout_time_s)
    moved = [e for e in result.events if e.kind == EventKind.DECODE_MIGRATED]
    assert moved and all(e.engine_id == 2 and e.t >= 3.0 for e in moved)
    assert any(e.tokens > 0 and e.extra_tokens > 0 for e in moved)   # decodes under way, with their KV
    after = df[df.t_decode_end > 4.0]
    assert len(after) and (after.engine_decode == 2).all()
    rows = df.set_index(["trajectory_id", "turn"])
    assert all(rows.loc[(e.trajectory_id, e.turn), "engine_decode"] == 2 for e in moved)
