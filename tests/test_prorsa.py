"""Prorsa's forecaster on hand-made lifecycles and its allocator on hand-made forecasts."""
from dataclasses import replace

import numpy as np
import pytest

from harness.api import EventKind as K
from harness.api import LifecycleEvent as E
from harness.api import ClusterView, FamilyPriors, LogNormalPrior, Role
from harness.cluster import cluster_from_config
from harness.prorsa.allocator import COLOCATED, Allocator, CapacityModel, Load
from harness.prorsa.forecaster import Forecaster
from harness.prorsa.policy import pooled_priors
from harness.prorsa.switcher import current_split, target_roles
from harness.prorsa.tracker import LifecycleTracker, Phase
from omegaconf import OmegaConf
from tests.conftest import load_config

# Deterministic priors (sigma 0) of the family "fam": every prior sample equals the median.
FAM = FamilyPriors(prompt_tokens=LogNormalPrior(100, 0), output_tokens=LogNormalPrior(40, 0),
                   tool_output_tokens=LogNormalPrior(200, 0), tool_latency_s=LogNormalPrior(3.0, 0),
                   turns=LogNormalPrior(5, 0))
PRIORS = {"fam": FAM}


def feed(tracker, events):
    for e in events:
        tracker.observe(e)


def first_turn(tid=1):
    return [E(K.TRAJECTORY_START, 0.0, tid, 0, detail="fam"), E(K.TURN_READY, 0.0, tid, 0, tokens=100),
            E(K.PREFILL_START, 0.0, tid, 0), E(K.PREFILL_END, 0.1, tid, 0), E(K.DECODE_START, 0.1, tid, 0),
            E(K.FIRST_TOKEN, 0.51, tid, 0, engine_id=0), E(K.DECODE_END, 1.0, tid, 0, engine_id=0, tokens=50)]


def test_tracker_phases_and_history():
    t = LifecycleTracker()
    feed(t, first_turn())
    s = t.live[1]
    assert s.phase == Phase.TOOL and s.phase_since == 1.0 and s.outputs == [50] and s.context == 100
    assert t.tpot[0] == pytest.approx(0.49 / 49)
    feed(t, [E(K.TOOL_END, 4.0, 1, 0, tokens=200), E(K.TURN_READY, 4.0, 1, 1, tokens=250)])
    assert s.tool_latencies == [3.0] and s.tool_outputs == [200] and s.context == 350 and s.turn == 1
    assert s.phase == Phase.QUEUED


def test_forecast_of_a_tool_call_return_known_answer():
    t = LifecycleTracker()
    feed(t, first_turn())
    f = Forecaster(horizon_s=4.0, bins=4, priors=PRIORS, min_observations=30, mode="sync", default_tpot_s=1.0)
    fc = f.forecast(2.0, t)
    # In the tool since t=1, latency 3 s: returns at t=4, i.e. 2 s ahead: bin (1, 2].
    # Tokens: its last output (50) + the expected tool output (200).
    np.testing.assert_allclose(fc.prefill_tokens, [0, 250, 0, 0])
    # It then decodes 40 tokens at the observed 0.01 s/token: 0.4 s, inside bin 1 only.
    np.testing.assert_allclose(fc.decode_seqs, [0, 1, 0, 0])
    assert fc.decode_kv_tokens[1] == pytest.approx(100 + 50 + 200 + 20)


def test_forecast_of_a_decoding_sequence_known_answer():
    t = LifecycleTracker()
    feed(t, [E(K.TRAJECTORY_START, 0.0, 7, 0, detail="fam"), E(K.TURN_READY, 0.0, 7, 0, tokens=100),
             E(K.PREFILL_START, 0.5, 7, 0), E(K.PREFILL_END, 1.0, 7, 0), E(K.DECODE_START, 1.0, 7, 0)])
    priors = {"fam": replace(FAM, output_tokens=LogNormalPrior(100, 0), tool_latency_s=LogNormalPrior(0.5, 0))}
    f = Forecaster(horizon_s=2.0, bins=4, priors=priors, min_observations=30, mode="sync", default_tpot_s=0.01)
    fc = f.forecast(1.2, t)
    # 20 of 100 tokens done at 0.01 s/token: 0.8 s left; bin mids 0.25, 0.75 are before, 1.25 after.
    np.testing.assert_allclose(fc.decode_seqs, [1, 1, 0, 0])
    # Next turn (turn 0 of 5 always continues): after 0.8 s of decode and a 0.5 s tool call -> 1.3 s,
    # bin (1.0, 1.5]; it brings its 100 output tokens and 200 tool tokens.
    np.testing.assert_allclose(fc.prefill_tokens, [0, 0, 300, 0])


def test_forecast_error_is_recorded_per_bin():
    t = LifecycleTracker()
    feed(t, first_turn())
    f = Forecaster(horizon_s=4.0, bins=4, priors=PRIORS, min_observations=30, mode="sync", default_tpot_s=1.0)
    for e in first_turn():
        if e.kind == K.TURN_READY:
            f.observe_arrival(e.t, e.tokens)
    f.forecast(2.0, t)
    f.observe_arrival(4.0, 250)          # the return happened where forecast: bin (1, 2] after t=2
    f.forecast(7.0, t)                   # a later sample closes the horizon
    err = f.errors()
    assert err["forecast_wape_prefill"][1] == 0.0
    rows = f.frame()                     # forecast.parquet: the forecast at t=2 against what happened
    first = rows[rows.t == 2.0].set_index("bin")
    assert first.loc[1, "prefill_forecast"] == first.loc[1, "prefill_actual"] == 250
    assert len(err["forecast_wape_decode"]) == 4


def test_pooled_prior_keeps_one_family_and_mixes_two_by_share():
    assert pooled_priors(PRIORS, {"fam": 1.0}) == FAM
    long = replace(FAM, turns=LogNormalPrior(20, 0))
    mixed = pooled_priors({"fam": FAM, "long": long}, {"fam": 0.75, "long": 0.25})
    # 75% of trajectories take 5 turns: the median; the log spread is the two-point mixture's
    assert mixed.turns.median == pytest.approx(5)
    assert mixed.turns.sigma == pytest.approx(np.sqrt(0.75 * 0.25) * np.log(4))
    assert mixed.output_tokens.median == pytest.approx(40) and mixed.output_tokens.sigma == pytest.approx(0)


def capacity(name="moe_h200"):
    cfg = load_config([f"cluster={name}"])
    return CapacityModel(cluster_from_config(OmegaConf.to_container(cfg.cluster, resolve=True)))


def load(prefill_rate, decoding, kv_per_seq, output=200, turn_prefill=2000, context=None, in_flight=0):
    return Load(horizon_s=20.0, prefill_rate=prefill_rate, turn_prefill=turn_prefill, output=output,
                turns=decoding, decoding=decoding, kv_per_seq=kv_per_seq,
                context=kv_per_seq if context is None else context, in_flight=in_flight)


def test_allocator_more_prefill_demand_never_means_fewer_prefill_engines():
    a = Allocator(capacity(), hysteresis=0.0, allow_colocated=False)
    chosen = [a.decide(4, load(rate, decoding=256, kv_per_seq=8000)).num_prefill
              for rate in [1e3, 1e4, 1e5, 1e6]]
    assert chosen == sorted(chosen)
    assert chosen[0] < chosen[-1]


def test_allocator_prefers_colocation_when_decode_kv_needs_every_engine():
    cap = capacity("dense_h100")
    a = Allocator(cap, hysteresis=0.0, allow_colocated=True)
    seqs = 256
    kv = 0.9 * 8 * cap.kv_capacity[Role.COLOCATED] / seqs     # 90% of the whole cluster's KV memory
    d = a.decide(COLOCATED, load(1e3, decoding=seqs, kv_per_seq=kv, context=2000))
    assert d.num_prefill == COLOCATED and not d.switch
    assert min(v for k, v in d.costs.items() if k != COLOCATED) > d.costs[COLOCATED]


def test_allocator_picks_pd_under_heavy_prefill_with_dp_attention():
    a = Allocator(capacity("moe_h200"), hysteresis=0.0, allow_colocated=True)
    # the load the forecaster saw at the start of a heavy-prefill rollout (tool outputs ~6k tokens)
    d = a.decide(COLOCATED, load(1.45e5, decoding=256, kv_per_seq=1900, output=100, turn_prefill=1600))
    assert d.num_prefill != COLOCATED and d.switch


def test_colocated_decode_slows_with_prefill_load_pd_decode_does_not():
    a = Allocator(capacity("moe_h200"), hysteresis=0.0, allow_colocated=True)
    light, heavy = load(1e3, 128, 8000), load(1e5, 128, 8000)
    wait = lambda k, l: a.turn_latency(k, l)
    # colocated: prefill load raises the decode part of a turn (interference)
    assert wait(COLOCATED, heavy) - wait(COLOCATED, light) > 0
    # the decode pool's time per token does not depend on prefill load: only the prefill wait grows,
    # and by no more than the queueing model says
    t = lambda l: a.cap.decode_step(Role.DECODE, 128 / 6, 128 / 6 * 8000) * 200
    assert wait(2, light) - t(light) < wait(2, heavy) - t(heavy)


def test_hysteresis_and_switch_cost_hold_a_small_gain():
    a = Allocator(capacity("moe_h200"), hysteresis=0.0, allow_colocated=False)
    l = load(1e5, decoding=256, kv_per_seq=8000)
    free = a.decide(3, l)
    assert free.num_prefill != 3, "the test needs a case where another split is better"
    gain = free.costs[3] - free.costs[free.num_prefill]
    strict = Allocator(a.cap, hysteresis=gain / free.costs[3] * 1.01, allow_colocated=False)
    assert strict.decide(3, l).num_prefill == 3
    # ...and so does a switch cost larger than the gain (many trajectories in flight).
    assert a.decide(3, load(1e5, 256, 8000, in_flight=10**7)).num_prefill == 3


def engines(roles, decoding=None, waiting=None, target=None):
    from harness.api import EngineState
    n = len(roles)
    decoding, waiting, target = decoding or [0] * n, waiting or [0] * n, target or [None] * n
    return ClusterView(now=0.0, engines=[
        EngineState(engine_id=i, role=r, available=t is None, gpus=4, waiting_requests=0,
                    waiting_prefill_tokens=w, running_requests=d, decoding_requests=d, kv_used_tokens=100 * d,
                    kv_capacity_tokens=10**6, target_role=t)
        for i, (r, d, w, t) in enumerate(zip(roles, decoding, waiting, target))])


def test_switcher_moves_the_cheapest_engines_to_drain():
    P, D, C = Role.PREFILL, Role.DECODE, Role.COLOCATED
    view = engines([P, D, D, D], decoding=[0, 9, 2, 5])
    assert current_split(view) == 1
    # one more prefill engine: the decode engine with the fewest running sequences (engine 2)
    assert target_roles(view, 2) == {0: P, 1: D, 2: P, 3: D}
    # one fewer: the prefill engine with the least queued prefill becomes a decode engine
    view = engines([P, P, D, D], waiting=[500, 100, 0, 0])
    assert target_roles(view, 1) == {0: P, 1: D, 2: D, 3: D}
    # from colocation: the least decode-loaded engines become the prefill pool
    view = engines([C, C, C, C], decoding=[7, 1, 3, 0])
    assert current_split(view) == COLOCATED
    assert target_roles(view, 2) == {0: D, 1: P, 2: D, 3: P}
    # while any engine is switching, the split is not settled and Prorsa waits
    assert current_split(engines([P, D, D, D], target=[None, P, None, None])) is None
