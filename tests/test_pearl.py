"""PEARL baseline: its makespan model on hand-computed cases, its choice and hysteresis, its refit from
lifecycle events, and end-to-end runs on the simulator."""
from dataclasses import replace

import pytest

from baselines.pearl import COLOCATED, DecodeFit, MakespanModel, choose
from harness.api import ClusterView, EngineState, FamilyPriors, LogNormalPrior, Role, RunInfo
from harness.api import EventKind as K
from harness.api import LifecycleEvent as E
from harness.experiment import checked
from tests.conftest import SMALL, cluster_of, load_config, policy_of, simulate

HAND = MakespanModel(engines=4, batch=8, turns=3, new_tokens=100, output_tokens=10, gen_fraction=0.5, env_s=6.0,
                     overhead_s=0.1, kv_bytes_per_token=1000, link_bw=1e6, kv_per_seq=50, kv_per_decode_engine=200,
                     tp_colocated=0.001, a_colocated=0.01, b_colocated=0.002,
                     tp_prefill=0.002, a_decode=0.02, b_decode=0.001)


def test_makespan_known_answer():
    # colocated: 3 * [(8*100/4)*0.001 + 10*(0.01 + 0.002*8/4) + 0.1] + 6 = 3 * 0.44 + 6
    assert HAND.makespan(COLOCATED) == pytest.approx(7.32, abs=1e-9)
    # N_P=1: prefill 3*8*100*(0.002/1 + 1000/(1e6*1)) = 7.2; decode 3*10*(0.02 + 0.001*8*0.5/3) = 0.64
    assert HAND.makespan(1) == pytest.approx(7.2 + 3 * 0.1 + 6, abs=1e-9)
    # N_P=2: prefill 2400*(0.002/2 + 1000/(1e6*2)) = 3.6; decode 30*(0.02 + 0.001*4/2) = 0.66
    assert HAND.makespan(2) == pytest.approx(3.6 + 0.3 + 6, abs=1e-9)
    # N_P=3: the one decode engine holds 200 tokens of KV, the batch needs 8*50
    assert not HAND.feasible(3) and HAND.makespan(3) == float("inf")


# S=1, no tools, no transfer, f=1: colocated 8e-5*dL + 1.4; N_P prefill: max(6.4e-4*dL/N_P, 1 + 3.2/N_D)
FLIP = MakespanModel(engines=8, batch=64, turns=1, new_tokens=10, output_tokens=100, gen_fraction=1.0, env_s=0.0,
                     overhead_s=0.0, kv_bytes_per_token=0.0, link_bw=1.0, kv_per_seq=10, kv_per_decode_engine=1000,
                     tp_colocated=1e-5, a_colocated=0.01, b_colocated=0.0005,
                     tp_prefill=1e-5, a_decode=0.01, b_decode=0.0005)


def test_choice_flips_to_pd_when_prefill_grows_and_back_when_decode_kv_binds():
    assert choose(FLIP, None, 0.0).split == COLOCATED                  # 1.4008 vs 1 + 3.2/7
    heavy = replace(FLIP, new_tokens=5000)
    d = choose(heavy, None, 0.0)
    assert d.split == 2                                                  # max(1.6, 1.533) vs 1.8 colocated
    assert d.predicted[2] == pytest.approx(1.6) and d.predicted[COLOCATED] == pytest.approx(1.8)
    # 64 sequences of 100 tokens need 7 decode engines of 1000: only N_P=1 is left, prefill-bound at 3.2
    tight = replace(heavy, kv_per_seq=100)
    d = choose(tight, None, 0.0)
    assert d.split == COLOCATED and d.predicted[2] == float("inf") and d.predicted[1] == pytest.approx(3.2)
    # the current split no longer fits: leave it whatever the hysteresis
    assert choose(tight, 2, 10.0).split == COLOCATED


def test_hysteresis_holds_a_small_gain():
    heavy = replace(FLIP, new_tokens=5000)    # PD gains 0.2 s of 1.8 s (11%) over colocation
    held = choose(heavy, COLOCATED, 0.2)
    assert held.split == COLOCATED and not held.switch
    moved = choose(heavy, COLOCATED, 0.05)
    assert moved.split == 2 and moved.switch


def test_a_switch_is_priced_by_the_time_its_engines_serve_nothing():
    """PD gains 0.2 s of colocation's 1.8 s; a switch that reloads engines for 60 s (reshard, a new
    parallelism) or drains them for 6 s costs more than that, a kv_both router update nothing."""
    from baselines.pearl import switch_price_s
    heavy = replace(FLIP, new_tokens=5000)
    colocated = view([Role.COLOCATED] * 8, 1.0)
    for overrides, price in ((["cluster.switch_mechanism=reshard"], 60.0), (["cluster.switch_mechanism=drain"], 6.0),
                             (["cluster.switch_mechanism=kv_both"], 0.0)):
        cluster = cluster_of(["cluster=moe_h200", *overrides])
        assert switch_price_s(cluster, colocated, 2) == price
        assert switch_price_s(cluster, colocated, COLOCATED) == 0.0    # staying moves nothing
        d = choose(heavy, COLOCATED, 0.0, {k: switch_price_s(cluster, colocated, k) for k in range(1, 8)})
        assert d.switch == (price == 0.0) and d.predicted[2] == pytest.approx(1.6 + price)


def test_decode_fit_recovers_a_line_and_rejects_no_spread():
    fit = DecodeFit()
    for x in (1.0, 2.0, 4.0, 8.0):
        fit.add(x, 0.01 + 0.002 * x)
    a, b = fit.line(min_points=2)
    assert a == pytest.approx(0.01, abs=1e-12) and b == pytest.approx(0.002, abs=1e-12)
    assert fit.line(min_points=5) is None
    flat = DecodeFit()
    for y in (0.1, 0.2, 0.3):
        flat.add(2.0, y)                 # every point at batch 2: no slope to fit
    assert flat.line(min_points=2) is None
    falling = DecodeFit()
    for x in (1.0, 2.0):
        falling.add(x, 0.1 / x)          # a negative slope: keep the cost model's line
    assert falling.line(min_points=2) is None


def test_decode_fit_integrates_the_engine_batch():
    fit = DecodeFit()
    fit.start((1, 0), engine=5, t=0.0)
    fit.start((2, 0), engine=5, t=1.0)
    fit.stop((2, 0), t=2.0, tokens=10, on_decode_engine=True)     # batch 2 throughout: (2, 0.1 s/token)
    fit.stop((1, 0), t=4.0, tokens=40, on_decode_engine=True)     # batch 1,2,1,1: mean 1.25, 0.1 s/token
    assert (fit.n, fit.sx, fit.sy) == (2, pytest.approx(3.25), pytest.approx(0.2))
    fit.start((3, 0), engine=6, t=0.0)
    fit.stop((3, 0), t=1.0, tokens=10, on_decode_engine=False)    # a colocated engine: not a data point
    assert fit.n == 2 and fit.engines[6][0] == 0


def prior(median: float) -> LogNormalPrior:
    return LogNormalPrior(median, 0.0)


def run_info(per_step: int) -> RunInfo:
    fam = FamilyPriors(prompt_tokens=prior(1000), output_tokens=prior(100), tool_output_tokens=prior(200),
                       tool_latency_s=prior(1.0), turns=prior(3), max_turns=20, context_cap=32768)
    return RunInfo(mode="sync", trajectories_per_step=per_step, max_in_flight=per_step, num_steps=2,
                   priors={"fam": fam}, step_weights=[{"fam": 1.0}])


def view(roles: list[Role], now: float) -> ClusterView:
    return ClusterView(now, [EngineState(i, r, True, 4, 0, 0, 0, 0, 0, 1_000_000) for i, r in enumerate(roles)])


def test_refit_from_one_step_of_events_and_decide_only_at_the_boundary():
    p = policy_of("pearl", hysteresis=0.0)
    roles = p.initial_roles(cluster_of(["cluster=dense_h100"]), run_info(per_step=2))
    assert p.workload.new_tokens == pytest.approx((1000 + 2 * 300) / 3) and p.workload.turns == pytest.approx(3)
    events = []
    for tid, outputs, tool in ((2, [30], 0.0), (1, [50, 70], 2.0)):   # 1 ends last, at 4 s
        t = 0.0
        events.append(E(K.TRAJECTORY_START, t, tid, 0, detail="fam"))
        for turn, out in enumerate(outputs):
            events += [E(K.TURN_READY, t, tid, turn, tokens=1000 if turn == 0 else 250),
                       E(K.DECODE_START, t + 0.5, tid, turn, engine_id=7),
                       E(K.DECODE_END, t + 1.0, tid, turn, engine_id=7, tokens=out)]
            t += 1.0
            if turn + 1 < len(outputs):
                t += tool
                events.append(E(K.TOOL_END, t, tid, turn))
        events.append(E(K.TRAJECTORY_END, t, tid, len(outputs) - 1))
    for e in sorted(events[:-1], key=lambda e: e.t):
        p.observe(e)
    assert p.plan(view(roles, 3.0)) is None and len(p.decisions) == 1    # the step has not ended
    p.observe(events[-1])
    w = p.workload
    assert w.new_tokens == pytest.approx((1000 + 250 + 1000) / 3)
    assert w.output_tokens == pytest.approx(50.0) and w.turns == 2 and w.tool_s == pytest.approx(2.0)
    assert w.gen_fraction == pytest.approx(3.0 / 5.0)                   # 3 s generating, 2 s in a tool
    assert w.kv_per_seq == pytest.approx((1250 + 70 + 1000 + 30) / 2)
    assert p.model.env_s == pytest.approx(2.0) and p.observed == [4.0]
    p.plan(view(roles, 4.5))
    assert len(p.decisions) == 2 and p.decisions[1][0] == 4.5
    assert p.plan(view(roles, 5.0)) is None and len(p.decisions) == 2      # one decision per boundary


def test_plan_moves_as_few_engines_as_possible():
    p = policy_of("pearl", hysteresis=0.0)     # kv_both: a switch costs nothing, so only the engines moved are at stake
    p.initial_roles(cluster_of(["cluster=dense_h100", "cluster.switch_mechanism=kv_both"]), run_info(per_step=1))
    heavy = replace(FLIP, new_tokens=5000)           # best: 2 prefill engines
    for before, changed in (([Role.PREFILL] * 3 + [Role.DECODE] * 5, 1), ([Role.COLOCATED] * 8, 8)):
        p.observe(E(K.TRAJECTORY_START, 0.0, 9, 0))
        p.observe(E(K.TRAJECTORY_END, 1.0, 9, 0))    # a step boundary
        p.model = heavy
        wanted = p.plan(view(before, 1.0))
        assert len(wanted) == changed
        after = [wanted.get(i, r) for i, r in enumerate(before)]
        assert after.count(Role.PREFILL) == 2 and after.count(Role.DECODE) == 6


@pytest.mark.parametrize("mode", [[], ["mode=async", "mode.max_in_flight=12"]])
def test_end_to_end_completes_every_trajectory(mode):
    p = policy_of("pearl")
    result, lifecycle, _ = simulate(SMALL + ["policy=pearl", *mode], policy=p)
    assert lifecycle.trajectory_id.nunique() == 2 * 24
    m = p.metrics()
    assert m["pearl_decisions"][0][0] == 0.0 and len(m["pearl_observed_step_s"]) == 2   # a boundary per step
    assert len(m["pearl_decisions"]) == len(m["pearl_predicted_makespan_s"]) >= 2


def test_invalid_values_name_the_key():
    for override, message in (("policy.hysteresis=-1", r"policy.hysteresis=-1 is invalid; allowed: a number >= 0"),
                              ("policy.min_fit_points=1", r"policy.min_fit_points=1 is invalid; allowed: an integer >= 2"),
                              ("policy.control_interval_s=0", r"policy.control_interval_s=0 is invalid")):
        with pytest.raises(ValueError, match=message):
            checked(load_config(["policy=pearl", override]).policy, "policy")
