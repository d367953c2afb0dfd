"""Prorsa on hand-made lifecycles: the tracker, the sampled futures (multi-turn forecasts), forecast
error bookkeeping, the what-if performance model against measured runs, the planner and the switcher."""
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from harness.api import EventKind as K
from harness.api import LifecycleEvent as E
from harness.api import ClusterView, FamilyPriors, LogNormalPrior, Role, Route, RunInfo
from harness.prorsa.forecast import future_sampler
from harness.prorsa.forecast_log import Forecast, ForecastLog
from harness.prorsa.mode_rules import ASYNC, rules_for
from harness.prorsa.planner import Planner, critical_path_floor
from harness.allocation import COLOCATED, current_split, roles_for, target_roles
from harness.prorsa.tracker import LifecycleTracker, Phase
from harness.prorsa.whatif import WhatIf
from harness.routing import PrefixTracker
from tests.conftest import cluster_of, load_config, policy_of, simulate

# Deterministic priors (sigma 0) of the family "fam": every prior sample equals the median.
FAM = FamilyPriors(prompt_tokens=LogNormalPrior(100, 0), output_tokens=LogNormalPrior(40, 0),
                   tool_output_tokens=LogNormalPrior(200, 0), tool_latency_s=LogNormalPrior(3.0, 0),
                   turns=LogNormalPrior(5, 0), max_turns=20, context_cap=100_000)
RUN = RunInfo(mode="sync", trajectories_per_step=4, max_in_flight=4, num_steps=1, priors={"fam": FAM},
              step_weights=[{"fam": 1.0}])


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
    assert t.last_tpot() == [pytest.approx(0.49 / 49)]
    feed(t, [E(K.TOOL_END, 4.0, 1, 0, tokens=200), E(K.TURN_READY, 4.0, 1, 1, tokens=250)])
    assert s.tool_latencies == [3.0] and s.tool_outputs == [200] and s.context == 350 and s.turn == 1
    assert s.phase == Phase.QUEUED


def test_generated_tokens_use_the_turns_that_decoded_beside_it():
    """Trajectory 2 decodes on engine 0 from t=10. Turns that ended there before it began (10 ms per
    token) say nothing of its span; the two that ended since (30 and 50 ms per token) do: at t=40 it
    has generated 30 s / 40 ms = 750 tokens. On another engine with no report, the default applies."""
    t = LifecycleTracker()
    feed(t, [E(K.TRAJECTORY_START, 0.0, 2, 0, detail="fam"), E(K.TURN_READY, 0.0, 2, 0, tokens=100),
             E(K.DECODE_START, 10.0, 2, 0, engine_id=0)])
    for tid, (first, end, tokens) in enumerate([(1.0, 2.0, 101), (11.0, 14.0, 101), (20.0, 25.0, 101)], start=10):
        feed(t, [E(K.TRAJECTORY_START, 0.0, tid, 0, detail="fam"), E(K.TURN_READY, 0.0, tid, 0, tokens=10),
                 E(K.DECODE_START, first, tid, 0, engine_id=0), E(K.FIRST_TOKEN, first, tid, 0, engine_id=0),
                 E(K.DECODE_END, end, tid, 0, engine_id=0, tokens=tokens)])
    s = t.live[2]
    assert t.generated(s, 40.0, default_tpot=1.0) == pytest.approx(750)
    s.engine = 1
    assert t.generated(s, 40.0, default_tpot=0.1) == pytest.approx(300)
    assert t.censored(40.0, 0.1)["output_tokens"]["fam"] == [pytest.approx(300)]
    # counted by the backend (a streaming client): the count, at the instant it was taken
    t.count_generated(40.0, {2: 512})
    assert t.generated(s, 40.0, default_tpot=0.1) == 512
    assert t.censored(40.0, 0.1)["output_tokens"]["fam"] == [512]
    assert t.generated(s, 41.0, default_tpot=0.1) == pytest.approx(310)   # later: estimated again


def two_live_futures():
    """At t=2: trajectory 1 in its tool call after turn 0 (first_turn), trajectory 2 decoding its turn
    0 since t=1.8; their futures sampled from the deterministic priors."""
    t = LifecycleTracker()
    feed(t, first_turn(1))
    feed(t, [E(K.TRAJECTORY_START, 1.8, 2, 0, detail="fam"), E(K.TURN_READY, 1.8, 2, 0, tokens=100),
             E(K.PREFILL_START, 1.8, 2, 0), E(K.PREFILL_END, 1.8, 2, 0), E(K.DECODE_START, 1.8, 2, 0)])
    prefix = PrefixTracker()
    feed(prefix, first_turn(1))
    return future_sampler(t, RUN, 30, 2.0, 0.01).live(2.0, t, prefix, tpot=0.01, rng=np.random.default_rng(0))


def test_futures_of_hand_made_lifecycles_known_answer():
    """Priors with no spread: 5 turns of 40 output tokens, 3-s tool calls returning 200 tokens.
    Trajectory 1 is in the tool call after turn 0 (output 50), 1 s into it: it comes back in 2 s with
    turns 1-4 to go, each prompt the last context + 200 tokens, 200 of them new. Trajectory 2 decodes
    turn 0 (prompt 100), 20 tokens in at 0.01 s per token: 20 tokens are left, then turns 1-4."""
    futures = {f.trajectory_id: f for f in two_live_futures()}
    one, two = futures[1], futures[2]
    assert one.ready_s == pytest.approx(2.0) and one.decode_engine == 0
    assert [(x.prompt_tokens, x.cached_tokens, x.output_tokens) for x in one.turns] == [
        (350, 150, 40), (590, 390, 40), (830, 630, 40), (1070, 870, 40)]
    assert [x.tool_latency_s for x in one.turns] == [3.0, 3.0, 3.0, 0.0]
    assert two.ready_s == 0.0 and len(two.turns) == 5
    assert (two.turns[0].prompt_tokens, two.turns[0].output_tokens) == (120, 20)
    assert two.turns[1].prompt_tokens == 120 + 20 + 200


def test_forecast_counts_the_tokens_each_turn_appends():
    """The forecast's prefill is what TURN_READY counts: the last turn's output plus the tool's output.
    The futures of the known-answer test above (priors: 40-token answers, 200-token tool outputs):
    trajectory 1 comes back from its tool call with turn 1 (its turn 0 wrote 50: 250 tokens), then
    turns 2-4 (240 each); trajectory 2 decodes turn 0 (20 of its 40 tokens so far), then turns 1-4
    (240 each). All arrive within one long bin: 250 + 3 x 240 + 4 x 240 = 1,930 tokens (counting the
    uncached part alone gave 8 x 200 = 1,600)."""
    futures = two_live_futures()
    assert {f.trajectory_id: f.context for f in futures} == {1: 100, 2: 100}
    cluster = cluster_of(["cluster=dense8_h100", "cluster.num_engines=2"])
    roles = [Role.COLOCATED] * 2
    outcome = WhatIf(cluster, 1, 1_000.0).run(futures, roles, roles)
    assert len(outcome.ends) == 2 and outcome.prefill_tokens.tolist() == [1_930]


def test_sync_forecast_runs_into_the_next_step():
    """Sync: the step's one trajectory (a 1,000-token prompt, 10 tokens out) ends within the first 4-s
    bin, so the forecast's run starts the next step's batch there (a 700-token prompt) and counts it;
    the score (the step's end) is the same as without it. When the step ends past the horizon, the
    next step is never drawn."""
    from harness.prorsa.forecast import FutureTrajectory, FutureTurn
    cluster = cluster_of(["cluster=dense8_h100", "cluster.num_engines=2"])
    roles = [Role.COLOCATED] * 2
    step = [FutureTrajectory(0, "f", 0.0, [FutureTurn(1_000, 0, 10, 0.0)])]
    drawn = []

    def then():
        drawn.append(True)
        return [FutureTrajectory(-2, "f", 0.0, [FutureTurn(700, 0, 10_000, 0.0)])]
    alone = WhatIf(cluster, 5, 4.0).run(step, roles, roles)
    with_next = WhatIf(cluster, 5, 4.0).run(step, roles, roles, then=then)
    assert alone.completion_s < 4.0 and with_next.completion_s == alone.completion_s
    assert with_next.ends == alone.ends and with_next.mean_turn_latency_s == alone.mean_turn_latency_s
    assert alone.prefill_tokens.tolist() == [1_000, 0, 0, 0, 0]
    assert with_next.prefill_tokens.tolist() == [1_700, 0, 0, 0, 0]
    # the next step's 10,000-token answer decodes through the horizon, where its run stops
    assert with_next.decode_seqs.tolist()[1:] == [1, 1, 1, 1] and alone.decode_seqs.sum() == 0
    drawn.clear()
    WhatIf(cluster, 1, alone.completion_s / 2).run(step, roles, roles, then=then)
    assert not drawn


def test_forecast_error_is_recorded_per_bin():
    f = ForecastLog(horizon_s=4.0, bins=4)
    f.history.append(Forecast(2.0, 1.0, np.array([0.0, 250.0, 0.0, 0.0]), np.array([1.0, 1.0, 0.0, 0.0])))
    for t, n in ((2.0, 1), (3.0, 1), (4.0, 1), (5.0, 0), (7.0, 0)):
        f.observe_decoding(t, n)
    f.observe_arrival(4.0, 250)          # the return happened where forecast: bin (1, 2] after t=2
    err = f.errors()
    assert err["forecast_wape_prefill"][1] == 0.0
    rows = f.frame()                     # forecast.parquet: the forecast at t=2 against what happened
    first = rows[rows.t == 2.0].set_index("bin")
    assert first.loc[1, "prefill_forecast"] == first.loc[1, "prefill_actual"] == 250
    assert err["forecast_wape_decode"][0] == 0.0 and err["forecast_wape_decode"][2] == pytest.approx(1.0)


def test_forecast_log_keeps_arrivals_for_a_window_and_reports_as_if_it_kept_all():
    """Arrivals are dropped once no forecast can count them; the frame is the one all arrivals give."""
    rng = np.random.default_rng(0)
    f = ForecastLog(horizon_s=4.0, bins=4)
    arrivals, kept = [], []
    for k in range(2000):
        t = k * 0.1
        if k % 20 == 0:
            f.history.append(Forecast(t, 1.0, rng.integers(0, 500, 4).astype(float), rng.random(4)))
        for _ in range(int(rng.integers(0, 3))):
            tokens = int(rng.integers(1, 1000))
            f.observe_arrival(t, tokens)
            arrivals.append((t, tokens))
        if k % 5 == 0:
            f.observe_decoding(t, int(rng.integers(0, 50)))
        kept.append(len(f.arrivals))
    assert max(kept) < 200 < len(arrivals)        # about two horizons of arrivals, not all 2000 ticks'
    reference = ForecastLog(horizon_s=4.0, bins=4)
    reference.history, reference.actual_decode, reference.arrivals = f.history, f.actual_decode, arrivals
    pd.testing.assert_frame_equal(f.frame(), reference.frame())
    assert len(f.frame()) == 4 * 98 and len(f.prefill_actual) == 96   # 2 settled at the end


HEAVY = ["+experiment=heavy_prefill", "mode.num_steps=1", "workload.batch_size=8", "cluster.num_engines=4"]


@pytest.mark.parametrize("split", [COLOCATED, 2])
def test_whatif_predicts_the_measured_rollout(split):
    """The performance model: steps sampled from the workload's priors, simulated under a static
    allocation, against the real run (its own scripts) -- their mean within 20% on rollout time. A
    step ends with its slowest trajectory, so one sample is noisy: over 8 samples the colocated step
    spans 29-55 s against 40 s measured (as the initial plan does, the test averages samples)."""
    from tests.conftest import load_config
    from harness.experiment import run_info
    from harness.rollout import ModeConfig
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    cfg = load_config(HEAVY)
    cluster = cluster_of(HEAVY)
    workload = instantiate(cfg.workload, seed=0)
    run = run_info(ModeConfig(**OmegaConf.to_container(cfg.mode, resolve=True)), workload)
    sampler = future_sampler(LifecycleTracker(), run, 30, 0.0, 0.01)
    roles = roles_for(split, 4)
    predicted = np.mean([WhatIf(cluster, 5, 4.0).run([], roles, roles, sampler.new(
        sorted(run.priors), [1.0], run.trajectories_per_step, 0, np.random.default_rng(r)), run.max_in_flight).completion_s
        for r in range(4)])
    policy = ["policy=colocate"] if split == COLOCATED else ["policy=fixed_pd", f"policy.num_prefill={split}"]
    measured, _, _ = simulate(HEAVY + policy)
    assert predicted == pytest.approx(measured.rollout_time_s, rel=0.2)


def test_whatif_switch_to_colocation_spreads_the_turns_that_waited():
    """While every engine switches, the what-if parks turns as the driver does and routes them once the
    whole transition is over: leaving 2P2D for colocation ends about one switch time after staying
    colocated (dense_h100: every role TP4, so a 6-s switch). Routing each parked turn as the first
    engine came back put them all on it: 2.1x colocation's end (101.5 vs 48.8 s)."""
    overrides = ["workload=synthetic", "cluster.num_engines=4"]
    cluster = cluster_of(overrides)
    sampler = future_sampler(LifecycleTracker(), RUN_HEAVY(), 30, 0.0, 0.01)
    new = sampler.new(["synthetic"], [1.0], 32, 0, np.random.default_rng(0))
    whatif = WhatIf(cluster, 5, 4.0)
    stay = whatif.run([], roles_for(COLOCATED, 4), roles_for(COLOCATED, 4), new, 32).completion_s
    moved = whatif.run([], roles_for(2, 4), roles_for(COLOCATED, 4), new, 32).completion_s
    assert cluster.switch_time_s == 6.0
    assert stay < moved < stay + 2 * cluster.switch_time_s


def test_planner_picks_pd_under_heavy_prefill_and_hysteresis_holds_a_small_gain():
    cluster = cluster_of(HEAVY)
    sampler = future_sampler(LifecycleTracker(), RUN_HEAVY(), 30, 0.0, 0.01)
    new = sampler.new(["synthetic"], [1.0], 64, 0, np.random.default_rng(0))
    planner = Planner(cluster, WhatIf(cluster, 5, 4.0), hysteresis=0.05, allow_colocated=True, max_candidates=8)
    split, scores = planner.initial([new], 64)
    assert split != COLOCATED and scores[split] < 0.9 * scores[COLOCATED]
    view = engines([Role.COLOCATED] * 4)
    # mid-run, leaving colocation reloads every engine (60 s, PEARL Table 3): it does not pay here
    d = planner.decide(view, COLOCATED, [], new, 64)
    assert not d.switch and d.scores[COLOCATED] < min(d.scores[k] for k in (1, 2, 3))
    # with vLLM's kv_both a switch is a routing change: it pays
    kv_both = cluster_of(HEAVY + ["cluster.switch_mechanism=kv_both"])
    planner = Planner(kv_both, WhatIf(kv_both, 5, 4.0), hysteresis=0.05, allow_colocated=True, max_candidates=8)
    d = planner.decide(view, COLOCATED, [], new, 64)
    assert d.switch and d.split != COLOCATED and set(d.scores) == {COLOCATED, 1, 2, 3}
    planner.hysteresis = 0.99   # no candidate ends 99% sooner: stay
    assert not planner.decide(view, COLOCATED, [], new, 64).switch


def test_critical_path_floor_known_answer():
    """Ready at 2 s, a turn of 11 tokens then a 5 s tool call, then a turn of one token: 2 + 5 + 10
    decode steps of 0.1 s (the first token comes with the prefill) = 8 s; the longest trajectory sets it."""
    from harness.prorsa.forecast import FutureTrajectory, FutureTurn
    long = FutureTrajectory(0, "f", 2.0, [FutureTurn(100, 0, 11, 5.0), FutureTurn(120, 110, 1, 0.0)])
    short = FutureTrajectory(1, "f", 0.0, [FutureTurn(100, 0, 3, 0.0)])
    assert critical_path_floor([long, short], 0.1) == pytest.approx(8.0)
    assert critical_path_floor([], 0.1) == 0.0


def test_no_allocation_ends_before_the_critical_path_floor():
    """The floor is a lower bound on every candidate's simulated end (prefill-heavy and tool-bound phases)."""
    cluster = cluster_of(HEAVY)
    sampler = future_sampler(LifecycleTracker(), RUN_HEAVY(), 30, 0.0, 0.01)
    planner = Planner(cluster, WhatIf(cluster, 5, 4.0), hysteresis=0.05, allow_colocated=True, max_candidates=8)
    heavy = sampler.new(["synthetic"], [1.0], 64, 0, np.random.default_rng(0))
    tool_bound = [replace(ft, turns=[replace(t, tool_latency_s=300.0) for t in ft.turns[:-1]] + ft.turns[-1:])
                  for ft in sampler.new(["synthetic"], [1.0], 16, 0, np.random.default_rng(1))]
    for new in (heavy, tool_bound):
        floor = critical_path_floor(new, planner.decode_floor_s)
        for split in planner.candidates(COLOCATED):
            roles = roles_for(split, 4)
            assert floor <= planner.whatif.run([], roles, roles, new, 64).completion_s


def test_mean_end_deadline_known_answers():
    """Floors 10 and 20 (sum 30) of two running trajectories: the bound on their sum is max(30, 2x), so a
    budget of 35 is passed at x = 17.5, 50 at x = 25, and 25 already (-inf). One more trajectory waiting to
    start (its chain taken out of the budget) adds x: 30 + x passes 35 at x = 5 (2x + x = 45 at the
    floors' x = 15, so there). None running: three waiting pass a budget of 9 at x = 3."""
    from harness.prorsa.whatif import mean_end_deadline
    assert mean_end_deadline(35.0, 30.0, 2, 0) == pytest.approx(17.5)
    assert mean_end_deadline(50.0, 30.0, 2, 0) == pytest.approx(25.0)
    assert mean_end_deadline(25.0, 30.0, 2, 0) == -np.inf
    assert mean_end_deadline(35.0, 30.0, 2, 1) == pytest.approx(5.0)
    assert mean_end_deadline(9.0, 0.0, 0, 3) == pytest.approx(3.0)


@pytest.mark.parametrize("tool_s", [5.0, 30.0])
def test_a_candidate_is_cut_only_when_sure_to_lose_and_sooner_with_the_floors(monkeypatch, tool_s):
    """Mean-end what-ifs with a bound at the best candidate's score + 5%: a run cut (inf) scores above the
    bound when run out, one not cut scores as run out; and a cut comes after fewer events than with the
    old rule (every unfinished trajectory ending now at the soonest, i.e. every chain 0)."""
    from harness.prorsa.forecast import FutureTrajectory
    cluster = cluster_of(HEAVY)
    sampler = future_sampler(LifecycleTracker(), RUN_HEAVY(), 30, 0.0, 0.01)
    new = [replace(ft, turns=[replace(t, tool_latency_s=tool_s) for t in ft.turns[:-1]] + ft.turns[-1:])
           for ft in sampler.new(["synthetic"], [1.0], 32, 0, np.random.default_rng(1))]

    def run(split, bound=np.inf):
        whatif, roles = WhatIf(cluster, 5, 4.0), roles_for(split, 4)
        return whatif.run([], roles, roles, new, 16, bound=bound, on_mean_end=True), whatif.events
    full = {split: run(split)[0].mean_end_s for split in (COLOCATED, 1, 2, 3)}
    bound = min(full.values()) * 1.05
    cut = []
    for split, score in full.items():
        outcome, events = run(split, bound)
        if np.isinf(outcome.mean_end_s):
            assert score > bound
            cut.append((split, events))
        else:
            assert outcome.mean_end_s == score
    monkeypatch.setattr(FutureTrajectory, "chain_s", lambda self, floor: self.ready_s)
    for split, events in cut:
        old, old_events = run(split, bound)
        assert np.isinf(old.mean_end_s) and events < old_events
    assert cut or tool_s == 30.0   # at 5-s tools colocation loses by 13%; at 30 s every allocation ties


def test_a_last_end_run_stops_once_a_floor_passes_its_bound(monkeypatch):
    """Scored by the last end with a bound below the longest chain (300-s tool calls): the run stops at
    its start and scores inf; by the old rule it ran until the clock passed the bound."""
    from harness.prorsa.forecast import FutureTrajectory
    cluster = cluster_of(HEAVY)
    sampler = future_sampler(LifecycleTracker(), RUN_HEAVY(), 30, 0.0, 0.01)
    new = [replace(ft, turns=[replace(t, tool_latency_s=300.0) for t in ft.turns[:-1]] + ft.turns[-1:])
           for ft in sampler.new(["synthetic"], [1.0], 16, 0, np.random.default_rng(1))]
    whatif, roles = WhatIf(cluster, 5, 4.0), roles_for(2, 4)
    bound = critical_path_floor(new, whatif.decode_floor_s) / 2
    assert np.isinf(whatif.run([], roles, roles, new, 64, bound=bound).completion_s)
    monkeypatch.setattr(FutureTrajectory, "chain_s", lambda self, floor: self.ready_s)
    old = WhatIf(cluster, 5, 4.0)
    assert np.isinf(old.run([], roles, roles, new, 64, bound=bound).completion_s)
    assert whatif.events < old.events / 2


def test_a_settled_choice_stays_closed_while_the_floor_keeps_it():
    """Staying ends at 100 s, the floor is 98 s (a 98-s tool call), hysteresis 5%: settled, and the choice
    stays closed while 98 - t >= 0.95 (100 - t), i.e. for (98 - 95) / 0.05 = 60 s. A floor of 94 s is
    below 95: not settled."""
    from harness.prorsa.whatif import Outcome
    from harness.prorsa.forecast import FutureTrajectory, FutureTurn
    cluster = cluster_of(HEAVY)
    planner = Planner(cluster, WhatIf(cluster, 5, 4.0), hysteresis=0.05, allow_colocated=True, max_candidates=8)
    staying = Outcome(100.0, 50.0, 1.0, [100.0], np.zeros(5), np.zeros(5))
    chain = [FutureTrajectory(0, "f", 0.0, [FutureTurn(100, 0, 1, 98.0), FutureTurn(120, 110, 1, 0.0)])]
    assert planner.settled(chain, staying, False) == pytest.approx(60.0)
    chain = [FutureTrajectory(0, "f", 0.0, [FutureTurn(100, 0, 1, 94.0), FutureTurn(120, 110, 1, 0.0)])]
    assert planner.settled(chain, staying, False) is None


def test_a_plan_bound_by_its_critical_path_runs_only_the_present_allocation():
    """Tool calls of 300 s between turns: the phase ends with its longest chain of tool calls whatever
    the allocation, so the plan stays after one what-if run, as the full plan (every candidate run) does."""
    cluster = cluster_of(HEAVY)
    sampler = future_sampler(LifecycleTracker(), RUN_HEAVY(), 30, 0.0, 0.01)
    new = [replace(ft, turns=[replace(t, tool_latency_s=300.0) for t in ft.turns[:-1]] + ft.turns[-1:])
           for ft in sampler.new(["synthetic"], [1.0], 16, 0, np.random.default_rng(1))]
    view = engines(roles_for(2, 4))
    planner = Planner(cluster, WhatIf(cluster, 5, 4.0), hysteresis=0.05, allow_colocated=True, max_candidates=8)
    d = planner.decide(view, 2, [], new, 64)
    assert not d.switch and set(d.scores) == {2} and d.closed_for_s > 0
    full = Planner(cluster, WhatIf(cluster, 5, 4.0), hysteresis=0.05, allow_colocated=True, max_candidates=8)
    full.settled = lambda *args: None
    whole = full.decide(view, 2, [], new, 64)
    assert not whole.switch and set(whole.scores) == {COLOCATED, 1, 2, 3}
    assert whole.scores[2] == d.scores[2] and full.whatif.events > 3 * planner.whatif.events


def test_a_start_bound_by_its_critical_path_runs_only_staying():
    """Tool calls of 300 s between turns: colocation's mean end is within INITIAL_TOLERANCE of the
    samples' critical-path floor, so the start is colocation after its runs alone, as when every
    candidate runs; before a sync step the present split is kept the same way."""
    cluster = cluster_of(HEAVY)
    sampler = future_sampler(LifecycleTracker(), RUN_HEAVY(), 30, 0.0, 0.01)
    samples = [[replace(ft, turns=[replace(t, tool_latency_s=300.0) for t in ft.turns[:-1]] + ft.turns[-1:])
                for ft in sampler.new(["synthetic"], [1.0], 16, 0, np.random.default_rng(seed))] for seed in (1, 2)]
    bound = Planner(cluster, WhatIf(cluster, 5, 4.0), hysteresis=0.05, allow_colocated=True, max_candidates=8)
    split, scores = bound.initial(samples, 64)
    assert split == COLOCATED and set(scores) == {COLOCATED}
    full = Planner(cluster, WhatIf(cluster, 5, 4.0), hysteresis=0.05, allow_colocated=True, max_candidates=8)
    full.rules = ASYNC   # the mean end's rule, no floor: every candidate is run, each scored by its last end
    full.score = lambda outcome, to_end=False: outcome.completion_s
    whole_split, whole = full.initial(samples, 64)
    assert whole_split == COLOCATED and set(whole) == {COLOCATED, 1, 2, 3}
    assert whole[COLOCATED] == scores[COLOCATED] and full.whatif.events > 3 * bound.whatif.events
    split, scores = bound.initial(samples, 64, present=engines(roles_for(2, 4)))
    assert split == 2 and set(scores) == {2}


def test_step_start_plan_prices_the_switch_from_the_present_roles():
    """Between two sync steps (every engine idle): a candidate the engines reach by resharding starts
    60 s later (cluster.reshard_switch_time_s, every engine moving), so it scores its from-scratch
    time plus 60 s exactly, and the present split is kept unless another beats it by the hysteresis."""
    cluster = cluster_of(HEAVY)
    sampler = future_sampler(LifecycleTracker(), RUN_HEAVY(), 30, 0.0, 0.01)
    new = sampler.new(["synthetic"], [1.0], 64, 0, np.random.default_rng(0))
    planner = Planner(cluster, WhatIf(cluster, 5, 4.0), hysteresis=0.05, allow_colocated=True, max_candidates=8)
    best, scratch = planner.initial([new], 64)
    assert best == 2 and scratch[2] < 0.75 * scratch[COLOCATED]
    split, scores = planner.initial([new], 64, present=engines([Role.COLOCATED] * 4))
    assert scores[COLOCATED] == pytest.approx(scratch[COLOCATED], rel=1e-12)
    for k in (1, 2, 3):
        assert scores[k] == pytest.approx(scratch[k] + cluster.reshard_switch_time_s, rel=1e-9)
    assert split == COLOCATED      # 2P2D's gain (13 s) does not pay a 60 s reload
    split, scores = planner.initial([new], 64, present=engines(roles_for(3, 4)))
    assert scores[3] == pytest.approx(scratch[3], rel=1e-12)
    assert scores[COLOCATED] == pytest.approx(scratch[COLOCATED] + cluster.reshard_switch_time_s, rel=1e-9)
    assert split == 3


def RUN_HEAVY():
    from tests.conftest import load_config
    from harness.experiment import run_info
    from harness.rollout import ModeConfig
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    cfg = load_config(HEAVY)
    return run_info(ModeConfig(**OmegaConf.to_container(cfg.mode, resolve=True)), instantiate(cfg.workload, seed=0))


def engines(roles, decoding=None, waiting=None, target=None):
    from harness.api import EngineState
    n = len(roles)
    decoding, waiting, target = decoding or [0] * n, waiting or [0] * n, target or [None] * n
    return ClusterView(now=0.0, engines=[
        EngineState(engine_id=i, role=r, available=t is None, gpus=4, waiting_requests=0,
                    waiting_prefill_tokens=w, running_requests=d, decoding_requests=d, kv_used_tokens=100 * d,
                    kv_capacity_tokens=10**6, target_role=t)
        for i, (r, d, w, t) in enumerate(zip(roles, decoding, waiting, target))])


class ScriptedWhatIf:
    """A performance model that predicts given scores per number of prefill engines (a test double
    for the planner's decision rule; the simulator-backed model is tested above)."""

    events = 0   # the simulator events its runs took (WhatIf.events)

    def __init__(self, by_split):
        self.by_split = by_split

    def run(self, futures, roles_now, roles, new=(), max_in_flight=0, **bound):
        from harness.prorsa.whatif import Outcome
        split = sum(r == Role.PREFILL for r in roles) or COLOCATED
        score = self.by_split[split]
        return Outcome(score, score, 1.0, [score], np.zeros(5), np.zeros(5))


class MixWhatIf:
    """A performance model whose scores depend on the family of the new trajectories (`table`: family ->
    split -> score): a test double for the planner's hedging rules."""

    events = 0   # the simulator events its runs took (WhatIf.events)

    def __init__(self, table):
        self.table = table

    def run(self, futures, roles_now, roles, new=(), max_in_flight=0, **bound):
        from harness.prorsa.whatif import Outcome
        split = sum(r == Role.PREFILL for r in roles) or COLOCATED
        score = self.table[new[0].family][split]
        return Outcome(score, score, 1.0, [score], np.zeros(5), np.zeros(5))


def one_new(family):
    """A sample of one trajectory of `family` (what MixWhatIf and SampleWhatIf read)."""
    from harness.prorsa.forecast import FutureTrajectory, FutureTurn
    return [FutureTrajectory(0, family, 0.0, [FutureTurn(10, 0, 10, 0.0)])]


def test_planner_takes_the_nearest_of_equally_good_splits():
    """From 2P6D: 3P5D (80) and 6P2D (79) are within 5% of each other, both far better than staying
    (100): the planner moves one engine (3P5D), not four. With staying among the near-best it stays."""
    cluster = cluster_of(HEAVY + ["cluster.num_engines=8"])
    scores = {COLOCATED: 200, 1: 300, 2: 100, 3: 80, 4: 90, 5: 85, 6: 79, 7: 150}
    planner = Planner(cluster, ScriptedWhatIf(scores), hysteresis=0.05, allow_colocated=True, max_candidates=8)
    view = engines([Role.PREFILL] * 2 + [Role.DECODE] * 6)
    d = planner.decide(view, 2, [], [], 8)
    assert d.switch and d.split == 3 and sum(r == Role.PREFILL for r in d.roles.values()) == 3
    planner.whatif = ScriptedWhatIf({**scores, 2: 82})
    assert not planner.decide(view, 2, [], [], 8).switch


class SampleWhatIf:
    """A performance model whose scores depend on the sample (`table`: family of the first future ->
    split -> score): a test double for the sync check's averaging and pairing."""

    events = 0   # the simulator events its runs took (WhatIf.events)

    def __init__(self, table):
        self.table, self.runs = table, []

    def run(self, futures, roles_now, roles, new=(), max_in_flight=0, **bound):
        from harness.prorsa.whatif import Outcome
        split = sum(r == Role.PREFILL for r in roles) or COLOCATED
        self.runs.append((futures[0].family, split))
        score = self.table[futures[0].family][split]
        return Outcome(score, score, 1.0, [score], np.zeros(5), np.zeros(5))


def test_sync_check_averages_staying_and_the_target_over_the_fresh_samples():
    """On sample "a" the switch colocated -> 1P gains 20% (100 -> 80); on "b" it loses 40% (100 -> 140).
    Checked on [a, a, b]: staying 100, 1P (80 + 80 + 140) / 3 = 100, each sample run under both
    allocations; on [a, a, a, b] 1P scores 95, a 5% gain that the hysteresis does not take (Prorsa
    switches only below 95)."""
    from harness.prorsa.planner import Decision
    table = {"a": {COLOCATED: 100.0, 1: 80.0}, "b": {COLOCATED: 100.0, 1: 140.0}}
    whatif = SampleWhatIf(table)
    planner = Planner(cluster_of(HEAVY), whatif, hysteresis=0.05, allow_colocated=True, max_candidates=8)
    view = engines([Role.COLOCATED] * 4)
    d = Decision(1, dict(enumerate(roles_for(1, 4))), True, {}, None)
    assert planner.check(view, d, [(one_new(f), []) for f in "aab"]) == pytest.approx((100.0, 100.0))
    assert sorted(whatif.runs) == sorted([(f, k) for f in "aab" for k in (COLOCATED, 1)])
    stay, move = planner.check(view, d, [(one_new(f), []) for f in "aaab"])
    assert (stay, move) == pytest.approx((100.0, 95.0)) and not move < stay * (1 - planner.hysteresis)


def test_initial_plan_hedges_against_another_mix():
    """Scores by the mix a sample is drawn from (family of its trajectories). For the expected mix "a",
    1P is best (90); for mix "b" 1P is ruinous (400). Without hedges the start is 1P; hedged, it is the
    split whose worst ratio to each mix's best is smallest: 2P (max(95/90, 120/100) = 1.2)."""
    table = {"a": {COLOCATED: 100, 1: 90, 2: 95, 3: 110}, "b": {COLOCATED: 150, 1: 400, 2: 120, 3: 100}}
    planner = Planner(cluster_of(HEAVY), MixWhatIf(table), hysteresis=0.05, allow_colocated=True, max_candidates=8,
                      rules=ASYNC)
    assert planner.initial([one_new("a")], 8)[0] == 1
    assert planner.initial([one_new("a")], 8, hedges=[one_new("a"), one_new("b")])[0] == 2


def test_screened_start_races_its_finalists_against_every_candidates_best():
    """A thinned start plan is a screen (Planner.screen). Hedged regrets on the screen's table (as in
    the test above): colocated max(100/90, 150/100) = 1.5, 1P 4.0, 2P max(95/90, 120/100) = 1.2, 3P
    max(110/90, 100/100) = 1.222; within SCREEN_MARGIN (10%) of 1.2: 2P and 3P. Per mix, the best of
    all over the best finalist: mix a 90/95 (1P is best there), mix b 100/100. The race on the full
    table runs the finalists only; mix a's yardstick stays 1P's: 96 x 90/95 = 90.95, so 2P's worst
    ratio is max(96/90.95, 118/104) = 1.135 and 3P's max(108/90.95, 104/104) = 1.188: 2P. Against the
    finalists' best alone, 3P would win (max(108/96, 1.0) = 1.125 against 1.135)."""
    screen_table = {"a": {COLOCATED: 100, 1: 90, 2: 95, 3: 110}, "b": {COLOCATED: 150, 1: 400, 2: 120, 3: 100}}
    planner = Planner(cluster_of(HEAVY), MixWhatIf(screen_table), hysteresis=0.05, allow_colocated=True,
                      max_candidates=8, rules=ASYNC)
    hedges = [one_new("a"), one_new("b")]
    assert planner.initial([one_new("a")], 8, hedges=hedges)[0] == 2
    screen = planner.screen()
    assert screen.finalists == [2, 3]
    assert screen.edges == pytest.approx([90 / 95, 90 / 95, 1.0])

    class Recorded(MixWhatIf):
        runs: list = []

        def run(self, futures, roles_now, roles, new=(), max_in_flight=0, **bound):
            self.runs.append(sum(r == Role.PREFILL for r in roles) or COLOCATED)
            return super().run(futures, roles_now, roles, new, max_in_flight, **bound)
    planner.whatif = Recorded({"a": {2: 96, 3: 108}, "b": {2: 118, 3: 104}})
    split, scores = planner.initial([one_new("a")], 8, hedges=hedges, screen=screen)
    assert split == 2 and set(scores) == {2, 3} and set(planner.whatif.runs) == {2, 3}


def test_initial_plan_takes_colocation_within_the_tolerance():
    """A split ahead of colocation by less than INITIAL_TOLERANCE (1%) is as good: the start is
    colocated; ahead by more, the split."""
    def start(colocated: float) -> int:
        table = {"a": {COLOCATED: colocated, 1: 100.0, 2: 103.0, 3: 110.0}}
        planner = Planner(cluster_of(HEAVY), MixWhatIf(table), hysteresis=0.05, allow_colocated=True,
                          max_candidates=8, rules=ASYNC)
        return planner.initial([one_new("a")], 8)[0]
    assert start(100.9) == COLOCATED
    assert start(101.1) == 1
    assert start(99.0) == COLOCATED


def test_initial_plan_samples_no_further_the_candidates_out_of_reach():
    """Colocation and 1P are within 1 s of each other on every sample, so the choice stays open to the
    last sample (6). 2P ends 50 s later and 3P 100 s later than colocation on each of the first three:
    their paired intervals lie wholly above the hysteresis (5 s), so they run on those three alone. The
    start is colocation, whose mean is within INITIAL_TOLERANCE (1%) of 1P's: (100+102+98+101+99+100)/6
    = 100 against (100.5+101+99.5+100+100+99.5)/6 = 100.08."""
    noise = [0.0, 2.0, -2.0, 1.0, -1.0, 0.0]
    one_p = [100.5, 101.0, 99.5, 100.0, 100.0, 99.5]
    table = {f"s{i}": {COLOCATED: 100.0 + noise[i], 1: one_p[i], 2: 150.0 + noise[i] / 2, 3: 200.0 - noise[i]}
             for i in range(6)}
    class Recorded(MixWhatIf):
        runs: list = []

        def run(self, futures, roles_now, roles, new=(), max_in_flight=0, **bound):
            self.runs.append((new[0].family, sum(r == Role.PREFILL for r in roles) or COLOCATED))
            return super().run(futures, roles_now, roles, new, max_in_flight, **bound)
    whatif = Recorded(table)
    planner = Planner(cluster_of(HEAVY), whatif, hysteresis=0.05, allow_colocated=True, max_candidates=8,
                      rules=ASYNC)
    drawn = iter(range(3, 6))
    split, scores = planner.initial([one_new(f"s{i}") for i in range(3)], 8, more=lambda: one_new(f"s{next(drawn)}"),
                                    max_samples=6)
    runs = {k: sum(1 for _, s in whatif.runs if s == k) for k in (COLOCATED, 1, 2, 3)}
    assert runs == {COLOCATED: 6, 1: 6, 2: 3, 3: 3}
    assert split == COLOCATED
    assert scores[COLOCATED] == pytest.approx(100.0) and scores[1] == pytest.approx(600.5 / 6)
    assert scores[2] == pytest.approx(150.0) and scores[3] == pytest.approx(200.0)


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


def test_oracle_is_never_behind_the_best_static_allocation(tmp_path):
    """Small heavy-prefill case: the oracle's rollout equals the best of colocation and every split
    (found here by running them all) or beats it."""
    from harness.experiment import run_experiment
    from tests.conftest import load_config
    statics = [["policy=colocate"]] + [["policy=fixed_pd", f"policy.num_prefill={k}"] for k in (1, 2, 3)]
    best = min(simulate(HEAVY + s)[0].rollout_time_s for s in statics)
    summary = run_experiment(load_config(HEAVY + ["policy=oracle_pd", "policy.decision_interval_s=10"]),
                             tmp_path)
    assert summary["rollout_time_s"] <= best + 1e-9
    assert summary["oracle_decisions"][0][0] == 0.0


def test_the_oracle_takes_staying_as_the_time_its_last_decision_predicted(tmp_path, monkeypatch):
    """Between decisions the rollout runs as the fork of the allocation chosen did, so staying's time at a
    decision is the one predicted for it then, and is not simulated again: the same decisions, the same
    predictions and the same rollout as simulating staying at every decision (capture_flip_async scaled
    down: 64 in flight on 8 engines, three switches)."""
    import baselines.oracle_pd as oracle
    from harness.experiment import run_experiment
    from tests.conftest import load_config
    overrides = ["+experiment=capture_flip_async", "policy=oracle_pd", "workload.batch_size=4",
                 "mode.max_in_flight=64", "mode.num_steps=4"]
    reused = run_experiment(load_config(overrides), tmp_path / "reused")
    race = oracle.race
    monkeypatch.setattr(oracle, "race", lambda candidates, run, known=None: race(candidates, run))
    simulated = run_experiment(load_config(overrides), tmp_path / "simulated")
    assert len(reused["oracle_decisions"]) > 2   # switches: staying after one is its predicted time
    assert reused["oracle_predicted_s"] == simulated["oracle_predicted_s"]
    assert reused["oracle_decisions"] == simulated["oracle_decisions"]
    assert reused["rollout_time_s"] == simulated["rollout_time_s"]


@pytest.mark.parametrize("extra", [[], ["mode.num_steps=2"]])
def test_a_run_within_a_limit_is_its_rollout_time_or_none_once_sure_to_exceed_it(extra):
    """A small heavy-prefill run held colocated (one step, and two: the rollout time sums the steps'
    windows): within a limit at or above its rollout time, that time to the bit; within half of it,
    None (what oracle_pd's runs use to drop a candidate that cannot be chosen)."""
    import math
    from baselines.oracle_pd import HoldRoles
    from harness.experiment import build_parts, static_rollout_s
    from harness.routing import Balance, PrefixTracker
    from tests.conftest import load_config
    cfg = load_config(HEAVY + extra + ["policy=colocate"])

    def within(limit_s: float) -> float | None:
        parts = build_parts(cfg)
        return static_rollout_s(cfg, parts.cluster, parts.mode, roles_for(COLOCATED, parts.cluster.num_engines),
                                HoldRoles(PrefixTracker(), Balance.of(parts.cluster)), limit_s)
    full = within(math.inf)
    assert full is not None and full > 0
    assert within(full) == full and within(full / 2) is None


def test_product_limit_known_answer():
    """Ends at 1 and 2, one trajectory known to reach 2 and still running. At 1: 3 at risk, 1 ends,
    S = 2/3; at 2: 2 at risk (the running one counts), 1 ends, S = 1/3; the last third goes to the prior
    above 2 (5 and 7, a sixth each)."""
    from harness.prorsa.forecast import product_limit
    points = product_limit(np.array([1.0, 2.0]), np.array([2.0]), np.array([1.0, 5.0, 7.0]))
    values, counts = np.unique(points, return_counts=True)
    assert list(values) == [1, 2, 5, 7]
    assert counts / counts.sum() == pytest.approx([1 / 3, 1 / 3, 1 / 6, 1 / 6], abs=1e-3)
    # nothing running: the observed values themselves
    assert list(product_limit(np.array([3.0, 1.0]), np.array([]), np.array([9.0]))) == [1, 3]


def test_running_trajectories_remove_the_short_first_bias():
    """500 trajectories of 1-20 turns; the 60 that ended by now are the shortest (1-2 turns). Sampling
    turns from them alone says 1.5; counting the 440 still running (each at turn 3) gives the truth."""
    from harness.prorsa.forecast import product_limit
    rng = np.random.default_rng(0)
    turns = rng.integers(1, 21, 500)
    ended, running = turns[turns <= 2], np.full(int((turns > 2).sum()), 3.0)
    prior = np.sort(rng.integers(1, 21, 2000)).astype(float)
    assert np.mean(ended) < 2
    assert np.mean(product_limit(ended, running, prior)) == pytest.approx(np.mean(turns), rel=0.1)


def test_tracker_reports_what_live_trajectories_have_reached():
    t = LifecycleTracker()
    feed(t, first_turn(1))                                  # in a tool call since 1.0
    feed(t, [E(K.TRAJECTORY_START, 1.8, 2, 0, detail="fam"), E(K.TURN_READY, 1.8, 2, 0, tokens=100),
             E(K.PREFILL_START, 1.8, 2, 0), E(K.PREFILL_END, 1.8, 2, 0), E(K.DECODE_START, 1.8, 2, 0)])
    c = t.censored(now=3.0, tpot=0.01)
    assert sorted(c["turns"]["fam"]) == [1, 1]
    assert c["tool_latency_s"]["fam"] == [pytest.approx(2.0)]
    assert c["output_tokens"]["fam"] == [pytest.approx(120.0)]
    assert t.started == 2 and list(t.start_families) == ["fam", "fam"]


def test_intraclass_correlation_known_answers():
    """Groups [1, 3] and [5, 7]: within mean square 2 (2 df), between mean square 2 * (2^2 + 2^2) = 16,
    n0 = 2, shared variance (16 - 2) / 2 = 7: ICC 7 / 9. Equal means: 0. No spread within: 1."""
    from harness.stats import intraclass_correlation
    assert intraclass_correlation([[1, 3], [5, 7]]) == pytest.approx(7 / 9)
    assert intraclass_correlation([[0, 2], [0, 2]]) == 0.0
    assert intraclass_correlation([[1, 1], [3, 3, 3]]) == 1.0
    assert intraclass_correlation([[1, 2, 3]]) is None and intraclass_correlation([[1], [2]]) is None
    rng = np.random.default_rng(0)   # 2,000 groups of 2-20 values with a known share of 0.4
    groups = [np.sqrt(0.4) * rng.standard_normal() + np.sqrt(0.6) * rng.standard_normal(rng.integers(2, 21))
              for _ in range(2000)]
    assert intraclass_correlation(groups) == pytest.approx(0.4, abs=0.03)


def sampler_with_shared(rho):
    values = np.sort(np.exp(np.random.default_rng(1).normal(np.log(100), 1.0, 4000)))
    one = {"fam": np.array([1.0])}
    from harness.prorsa.forecast import FutureSampler
    return FutureSampler(outputs={"fam": values}, tool_latency=one, tool_outputs=one, turns=one,
                         first_prompts=one, max_context={"fam": 10**9}, output_shared={"fam": rho})


def test_sampled_outputs_keep_the_marginal_and_the_trajectorys_own_level():
    """Outputs lognormal(log 100, 1), half of the log variance shared by a trajectory's turns: across
    trajectories the outputs keep the family's spread, within one the turns correlate at 0.5, and a
    trajectory that wrote 1,000-token answers is predicted to keep writing long ones (posterior mean of
    its level after 4 turns at log 10 above the mean: 4 * 0.5 / (4 * 0.5 + 0.5) * log 10)."""
    from harness.stats import intraclass_correlation
    s, rng = sampler_with_shared(0.5), np.random.default_rng(2)
    logs = []
    for _ in range(3000):
        level = s.output_level("fam", [], rng)
        logs.append(np.log([s.output("fam", level, rng) for _ in range(4)]))
    logs = np.array(logs)
    assert logs.var() == pytest.approx(1.0, rel=0.08)
    assert intraclass_correlation(logs) == pytest.approx(0.5, abs=0.05)
    levels = [s.output_level("fam", [1000] * 4, rng) for _ in range(2000)]
    assert np.mean(levels) == pytest.approx(0.8 * np.log(10), rel=0.1)
    # the rest of a turn already 500 tokens long is drawn above 500, at the trajectory's level
    assert min(s.output("fam", 0.0, rng, above=500) for _ in range(200)) > 500
    # independent turns: no level, and no random numbers used (runs without the effect are unchanged)
    flat, a, b = sampler_with_shared(0.0), np.random.default_rng(3), np.random.default_rng(3)
    assert flat.output_level("fam", [1000] * 4, a) == 0.0
    assert flat.output("fam", 0.0, a) == float(flat.outputs["fam"][b.integers(len(flat.outputs["fam"]))])


def test_size_level_correlation_known_answers():
    """Group means that rise exactly with log group size: correlation 1 (shared variance from the
    ANOVA); the reverse: -1; every group the same size, or no shared variance: the data cannot say.
    Simulated: log size and level with correlation 0.6 (levels shared, own noise 0.5 per member)."""
    from harness.stats import size_level_correlation
    assert size_level_correlation([[0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]) == pytest.approx(1.0)
    assert size_level_correlation([[1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]) == pytest.approx(-1.0)
    assert size_level_correlation([[0.0, 1.0], [2.0, 3.0]]) is None
    assert size_level_correlation([[0.0, 1.0], [1.0, 0.0, 1.0, 0.0]]) is None
    rng = np.random.default_rng(0)
    groups = []
    for _ in range(4000):
        z = rng.standard_normal()
        size = int(np.clip(round(np.exp(1.5 + 0.5 * z)), 1, 60))
        level = 0.8 * (0.6 * (np.log(size) - 1.5) / 0.5 + 0.8 * rng.standard_normal())
        groups.append(level + np.sqrt(0.5) * rng.standard_normal(size))
    assert size_level_correlation(groups) == pytest.approx(0.6, abs=0.06)


def test_sampled_level_follows_the_turn_count_where_the_workload_links_them():
    """Correlation 0.8 between log turn count and the level: a trajectory with the family's mean log
    turn count gets a level around 0, one a deviation above it gets a level around 0.8 x the level's
    deviation (shared variance 0.5 -> 0.8 * sqrt(0.5)), with the rest of its spread (0.5 * (1 - 0.64)).
    Without the link the turn count changes nothing and the random stream is the same."""
    from dataclasses import replace as dc_replace
    values = np.sort(np.exp(np.random.default_rng(1).normal(np.log(100), 1.0, 4000)))
    turns = np.sort(np.exp(np.random.default_rng(2).normal(np.log(8), 0.5, 4000)))
    one = {"fam": np.array([1.0])}
    from harness.prorsa.forecast import FutureSampler
    base = FutureSampler(outputs={"fam": values}, tool_latency=one, tool_outputs=one, turns={"fam": turns},
                         first_prompts=one, max_context={"fam": 10**9}, output_shared={"fam": 0.5})
    linked = dc_replace(base, turns_output_corr={"fam": 0.8})
    mu, sd = np.log(turns).mean(), np.log(turns).std()
    rng = np.random.default_rng(3)
    at_mean = [linked.output_level("fam", [], rng, int(round(np.exp(mu)))) for _ in range(3000)]
    above = [linked.output_level("fam", [], rng, int(round(np.exp(mu + sd)))) for _ in range(3000)]
    assert np.mean(at_mean) == pytest.approx(0.0, abs=0.05)
    assert np.mean(above) - np.mean(at_mean) == pytest.approx(0.8 * np.sqrt(0.5), rel=0.15)
    assert np.var(above) == pytest.approx(0.5 * (1 - 0.64), rel=0.1)
    a, b = np.random.default_rng(4), np.random.default_rng(4)
    assert base.output_level("fam", [300], a, 40) == base.output_level("fam", [300], b, 2)


def test_sampled_groups_share_their_prompt_level_and_turn_counts():
    """A GRPO group of 8: one prompt; with turns_group_corr 1 every sample has the group's turn count,
    with 0 the counts vary within a group; the output level is the group's: the log outputs of two
    samples of one group correlate at the shared share (0.5) across groups, where samples of
    different groups do not."""
    from dataclasses import replace as dc_replace
    from harness.prorsa.forecast import FutureSampler
    values = np.sort(np.exp(np.random.default_rng(1).normal(np.log(100), 1.0, 4000)))
    turns = np.sort(np.exp(np.random.default_rng(2).normal(np.log(6), 0.6, 4000)))
    one = {"fam": np.array([1.0])}
    base = FutureSampler(outputs={"fam": values}, tool_latency=one, tool_outputs=one, turns={"fam": turns},
                         first_prompts={"fam": np.array([100.0, 200.0, 300.0])}, max_context={"fam": 10**9},
                         output_shared={"fam": 0.5})
    rng = np.random.default_rng(5)
    same = dc_replace(base, turns_group_corr={"fam": 1.0}).new(["fam"], [1.0], 80, 0, rng, group_size=8)
    assert len(same) == 80 and len({t.trajectory_id for t in same}) == 80
    for g in range(10):
        members = same[8 * g: 8 * g + 8]
        assert len({m.turns[0].prompt_tokens for m in members}) == 1
        assert len({len(m.turns) for m in members}) == 1
    free = dc_replace(base, turns_group_corr={"fam": 0.0}).new(["fam"], [1.0], 80, 0, rng, group_size=8)
    assert sum(len({len(m.turns) for m in free[8 * g: 8 * g + 8]}) > 1 for g in range(10)) >= 8
    pairs = [base.group("fam", 2, 0, rng) for _ in range(3000)]
    a, b = (np.log([p[i].turns[0].output_tokens for p in pairs]) for i in (0, 1))
    assert np.corrcoef(a, b)[0, 1] == pytest.approx(0.5, abs=0.06)
    assert abs(np.corrcoef(a[1:], b[:-1])[0, 1]) < 0.06


def test_sampled_groups_keep_a_turn_output_link_the_group_cannot_carry():
    """`turns_output_corr` is per trajectory, and a group's shared turn score can carry at most
    sqrt(turns_group_corr) of it. With turn counts independent within a group (0) and a link of -0.8
    (an agent that either answers at once at length or takes many short actions), the link goes
    through each sample's own turn score: its log first output and log turn count correlate at
    -0.8 x sqrt(0.5) (the level's share of a log-output variance of 1), times the correlation of the
    rounded log turn count with its score (~0.97). Where the group can carry the link (0.64 >= 0.8^2)
    the level stays the group's: two samples of a group share it (log outputs correlate at 0.5)."""
    from dataclasses import replace as dc_replace
    from harness.prorsa.forecast import FutureSampler
    values = np.sort(np.exp(np.random.default_rng(1).normal(np.log(100), 1.0, 4000)))
    turns = np.sort(np.exp(np.random.default_rng(2).normal(np.log(6), 0.6, 4000)))
    one = {"fam": np.array([1.0])}
    base = FutureSampler(outputs={"fam": values}, tool_latency=one, tool_outputs=one, turns={"fam": turns},
                         first_prompts=one, max_context={"fam": 10**9}, output_shared={"fam": 0.5})
    rng = np.random.default_rng(6)
    own = dc_replace(base, turns_group_corr={"fam": 0.0}, turns_output_corr={"fam": -0.8})
    drawn = [t for _ in range(800) for t in own.group("fam", 8, 0, rng)]
    n = np.log([len(t.turns) for t in drawn])
    out = np.log([t.turns[0].output_tokens for t in drawn])
    assert np.corrcoef(n, out)[0, 1] == pytest.approx(-0.8 * np.sqrt(0.5) * 0.97, abs=0.05)
    shared = dc_replace(base, turns_group_corr={"fam": 0.64}, turns_output_corr={"fam": 0.8})
    pairs = [shared.group("fam", 2, 0, rng) for _ in range(3000)]
    a, b = (np.log([p[i].turns[0].output_tokens for p in pairs]) for i in (0, 1))
    assert np.corrcoef(a, b)[0, 1] == pytest.approx(0.5, abs=0.06)


def recorded_sampler():
    """A family with two recorded kinds of trajectory, as a triage agent's trace: `answer` (one turn of
    600 tokens) and `chain` (three turns of 80 tokens, 5,000-token tool outputs after 1 s), one group
    of each."""
    from harness.api import ExampleTrajectory
    from harness.prorsa.forecast import FutureSampler
    answer = ExampleTrajectory(1000, (600,), (), ())
    chain = ExampleTrajectory(1000, (80, 80, 80), (5000, 5000), (1.0, 1.0))
    one = {"fam": np.array([1.0])}
    return answer, chain, FutureSampler(
        outputs={"fam": np.array([80.0, 600.0])}, tool_latency={"fam": np.array([1.0])}, tool_outputs=one,
        turns={"fam": np.array([1.0, 3.0])}, first_prompts=one, max_context={"fam": 10**6},
        examples={"fam": ((answer,) * 4, (chain,) * 4)})


def test_new_trajectories_are_recorded_ones_in_their_groups():
    """With recorded trajectories a sampled group is one recorded group's members, turn for turn:
    prompts, answers, tool outputs (the next prompt's new tokens) and latencies, the last turn making
    no tool call; never a mix of the two kinds (the per-quantity draws would give chains of 600-token
    answers)."""
    _, _, sampler = recorded_sampler()
    rng = np.random.default_rng(0)
    groups = [sampler.group("fam", 4, 0, rng) for _ in range(40)]
    kinds = {tuple(len(t.turns) for t in g) for g in groups}
    assert kinds == {(1, 1, 1, 1), (3, 3, 3, 3)}
    chain = next(g[0] for g in groups if len(g[0].turns) == 3)
    assert [(t.prompt_tokens, t.cached_tokens, t.output_tokens, t.tool_latency_s) for t in chain.turns] == [
        (1000, 0, 80, 1.0), (6080, 1080, 80, 1.0), (11160, 6160, 80, 0.0)]
    answer = next(g[0] for g in groups if len(g[0].turns) == 1)
    assert [(t.prompt_tokens, t.output_tokens, t.tool_latency_s) for t in answer.turns] == [(1000, 600, 0.0)]
    one_by_one = sampler.new(["fam"], [1.0], 50, 0, rng)
    assert {tuple(t.output_tokens for t in f.turns) for f in one_by_one} == {(600,), (80, 80, 80)}


def test_live_trajectories_go_on_as_recorded_ones_that_reached_their_point():
    """Trajectory 1 is in its tool call after turn 0: only the chain has a turn after it, so two turns
    of 80 tokens follow, the first on its context (100 + 50) plus the 5,000-token tool output.
    Trajectory 2 decodes turn 0 and has generated 100 tokens: only the answer writes more than that at
    turn 0, so 500 tokens are left and nothing follows. Trajectory 3 is at turn 5, further than any
    recorded one: its rest comes from the distributions (one more turn at least)."""
    from harness.prorsa.tracker import TrajectoryState
    _, _, sampler = recorded_sampler()
    t = LifecycleTracker()
    t.live[1] = TrajectoryState(1, "fam", 0.0, phase=Phase.TOOL, phase_since=1.0, turn=0, context=100, outputs=[50])
    t.live[2] = TrajectoryState(2, "fam", 0.0, phase=Phase.DECODING, phase_since=0.0, turn=0, context=1000)
    t.live[3] = TrajectoryState(3, "fam", 0.0, phase=Phase.TOOL, phase_since=1.0, turn=5, context=100,
                                outputs=[80] * 6)
    t.count_generated(1.5, {2: 100})
    futures = {f.trajectory_id: f for f in sampler.live(1.5, t, PrefixTracker(), 0.01, np.random.default_rng(0))}
    assert [(x.prompt_tokens, x.cached_tokens, x.output_tokens) for x in futures[1].turns] == [
        (5150, 150, 80), (10230, 5230, 80)]
    assert [(x.prompt_tokens, x.output_tokens, x.tool_latency_s) for x in futures[2].turns] == [(1100, 500, 0.0)]
    assert len(futures[3].turns) >= 1


def test_recorded_trajectories_are_weighted_by_their_answers_so_far():
    """Two kinds reach turn 1: long-answer chains (1,000 tokens a turn) and short-answer ones (50).
    A live trajectory that wrote 1,000 tokens at turn 0 goes on as the long ones, nearly always (the
    kernel's bandwidth is Silverman's rule on the two values); before it has written anything, as
    either (uniform)."""
    from harness.api import ExampleTrajectory
    from harness.prorsa.forecast import Recorded
    long, short = ExampleTrajectory(10, (1000, 1000), (5,), (1.0,)), ExampleTrajectory(10, (50, 50), (5,), (1.0,))
    rec = Recorded([long] * 10 + [short] * 10)
    rng = np.random.default_rng(0)
    picks = [rec.pick(2, None, [1000], rng) for _ in range(200)]
    assert sum(p is long for p in picks) >= 198
    picks = [rec.pick(2, (1, 0), [], rng) for _ in range(200)]
    assert 70 <= sum(p is long for p in picks) <= 130
    assert rec.pick(3, None, [], rng) is None


def test_trace_priors_carry_its_trajectories_without_ids_and_may_come_from_another_file(tmp_path):
    """A trace's priors hold its trajectories' shapes in their groups (no ids); with `prior_path` they
    come from that file, while the replay stays the first (a policy judged on trajectories it never
    saw); a prior file without a replayed family is refused, naming the key."""
    import json
    from harness.api import ExampleTrajectory
    from workloads.trace import TraceError, TraceWorkload

    def write(path, outputs, family="fam"):
        lines = [{"group": g, "family": family, "turns": [
            {"new_tokens": 300, "output_tokens": outputs, "tool_latency_s": 0.5, "tool_output_tokens": 70},
            {"new_tokens": 70, "output_tokens": 9, "tool_latency_s": 0.0, "tool_output_tokens": 0}]}
            for g in range(2) for _ in range(2)]
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
        return str(path)
    replay, other = write(tmp_path / "a.jsonl", 40), write(tmp_path / "b.jsonl", 400)
    w = TraceWorkload(replay)
    shape = ExampleTrajectory(300, (40, 9), (70,), (0.5,))
    assert w.priors()["fam"].examples == ((shape, shape), (shape, shape))
    held_out = TraceWorkload(replay, prior_path=other)
    assert held_out.priors()["fam"].examples[0][0].outputs == (400, 9)
    assert [t.output_tokens for t in held_out.batch(0)[0].turns] == [40, 9]
    with pytest.raises(TraceError, match="workload.prior_path"):
        TraceWorkload(replay, prior_path=write(tmp_path / "c.jsonl", 40, family="other"))


def test_run_info_tells_the_group_size_and_workloads_their_turn_group_correlation():
    """RunInfo carries the samples per prompt; a single-mode turn count's score has the group's rho
    (the synthetic workload's 0.25), a mixture's is mixture_group_corr's."""
    from hydra.utils import instantiate
    from harness.experiment import run_info
    from harness.rollout import ModeConfig
    w = instantiate(load_config(["workload.batch_size=4", "workload.group_size=8"]).workload, seed=0)
    assert run_info(ModeConfig(name="sync", num_steps=1), w).group_size == 8
    assert w.priors()["synthetic"].turns_group_corr == pytest.approx(0.25)
    from workloads.base import Mode, mixture_group_corr
    one = (Mode("a", 1.0, 10.0, 0.5),)
    assert mixture_group_corr(one, 0.4, per_group=False) == pytest.approx(0.4)
    # two modes (log medians 0 and 2, sigmas 1): variance 1 + 1 = 2; per sample they share 0.4 * 1^2,
    # per group also the mode: 0.5 * (0 + 4) + 0.4 - 1 = 1.4
    two = (Mode("a", 0.5, 1.0, 1.0), Mode("b", 0.5, float(np.exp(2.0)), 1.0))
    assert mixture_group_corr(two, 0.4, per_group=False) == pytest.approx(0.2)
    assert mixture_group_corr(two, 0.4, per_group=True) == pytest.approx(0.7)
    swe = instantiate(load_config(["workload=swe"]).workload, seed=0)
    assert swe.priors()["swe"].turns_group_corr == pytest.approx(
        mixture_group_corr(swe.turns, swe.group_corr, per_group=False))


def test_shared_output_share_is_learned_from_trajectories():
    """The prior's share until `min_observations` trajectories have two finished turns; then the
    estimate from them (ended and live): here each trajectory repeats its own length, a share of 1.
    Only where a plan scores the last end of a whole step or run (sync; async with `whole_run`): async
    plans that score a mean end draw every turn afresh."""
    from dataclasses import replace
    from harness.prorsa.forecast import output_shared
    run = replace(RUN, priors={"fam": replace(FAM, output_shared=0.3)})
    t = LifecycleTracker()
    assert output_shared(t, run, 3) == {"fam": 0.3}
    for tid in range(4):
        tokens = 10 * (tid + 1)
        t.observe(E(K.TRAJECTORY_START, 0.0, tid, 0, detail="fam"))
        for turn in range(2):
            t.observe(E(K.TURN_READY, turn, tid, turn, tokens=10))
            t.observe(E(K.DECODE_START, turn, tid, turn))
            t.observe(E(K.DECODE_END, turn + 0.5, tid, turn, engine_id=0, tokens=tokens))
        if tid < 2:
            t.observe(E(K.TRAJECTORY_END, 2.0, tid, 1))
    assert sorted(map(tuple, t.output_groups()["fam"])) == [(10, 10), (20, 20), (30, 30), (40, 40)]
    assert output_shared(t, run, 3) == {"fam": 1.0}
    assert future_sampler(t, run, 3, 2.0, 0.01).output_shared == {"fam": 1.0}
    in_async = replace(run, mode="async")
    assert future_sampler(t, in_async, 3, 2.0, 0.01, whole_run=True).output_shared == {"fam": 1.0}
    assert future_sampler(t, in_async, 3, 2.0, 0.01).output_shared == {}


def test_workloads_state_how_much_a_trajectory_shares_its_output_length():
    """Agent families: the group correlation of the output score; the level's correlation with the log
    turn count is the turn score's loading on the output score, c sqrt(rho): synthetic (one difficulty,
    c = 1, rho = 0.25) 0.5; swe (independent scores) 0."""
    from hydra.utils import instantiate
    from workloads.agent import AgentWorkload
    synthetic = instantiate(load_config([]).workload, seed=0).priors()["synthetic"]
    assert synthetic.output_shared == pytest.approx(0.25) and synthetic.turns_output_corr == pytest.approx(0.5)
    w = instantiate(load_config(["workload=swe"]).workload, seed=0)
    assert isinstance(w, AgentWorkload) and w.priors()["swe"].output_shared == w.group_corr
    assert w.priors()["swe"].turns_output_corr == 0.0
    from workloads.base import Mode, mixture_score_corr
    # two modes (log medians 0 and 2, sigmas 1): log spread sqrt(2); a loading of 0.5 on the score
    two = (Mode("a", 0.5, 1.0, 1.0), Mode("b", 0.5, float(np.exp(2.0)), 1.0))
    assert mixture_score_corr(two, 0.5) == pytest.approx(0.5 / np.sqrt(2))


def test_whatif_switch_waits_for_the_turn_running_on_the_engine():
    """A drain takes as long as the engine's running turns: engine 1 decodes a 2,000-token answer when
    the plan swaps the roles of a 1P1D pair (drain, 6-s switch). A new trajectory needs engine 1 as its
    prefill engine, so it cannot end before that answer ends plus the switch time."""
    from harness.api import Route
    from harness.prorsa.forecast import FutureTrajectory, FutureTurn
    cluster = cluster_of(["cluster=dense8_h100", "cluster.num_engines=2", "cluster.switch_mechanism=drain"])
    running = FutureTrajectory(0, "f", 0.0, [FutureTurn(1_000, 999, 2_000, 0.0)], decode_engine=1,
                               prefill_engine=0, in_progress=True, route=Route(0, 1))
    arriving = FutureTrajectory(1, "f", 0.0, [FutureTurn(500, 0, 10, 0.0)])
    now, swapped = [Role.PREFILL, Role.DECODE], [Role.DECODE, Role.PREFILL]
    ends = WhatIf(cluster, 5, 4.0).run([running, arriving], now, swapped).ends
    assert len(ends) == 2 and ends[1] >= ends[0] + cluster.switch_time_s
    # the answer alone takes this long: the drain is its decode, not an instant
    alone = WhatIf(cluster, 5, 4.0).run([running], now, now).ends[0]
    assert ends[0] == pytest.approx(alone, rel=0.01) and alone > 10


def _record_legs(monkeypatch, backend_cls) -> list[tuple[int, str, Route]]:
    """The legs the what-if submits, in order: (trajectory, 'prefill' or 'decode', route)."""
    legs: list[tuple[int, str, Route]] = []
    submit, submit_decode = backend_cls.submit, backend_cls.submit_decode
    monkeypatch.setattr(backend_cls, "submit", lambda self, req, route: (
        legs.append((req.trajectory_id, "prefill", route)), submit(self, req, route))[1])
    monkeypatch.setattr(backend_cls, "submit_decode", lambda self, req, route: (
        legs.append((req.trajectory_id, "decode", route)), submit_decode(self, req, route))[1])
    return legs


def test_whatif_keeps_a_queued_turn_where_the_router_sent_it(monkeypatch):
    """A queued turn (no prefill yet) that the router sent to prefill engine 1 of a 2P1D cluster stays
    there in the what-if, as it does on the engines (kv_both: an engine keeps its queue through a
    switch), even while engine 1 switches to decode; a trajectory with no route is routed as new.
    The live view gives a queued turn its route."""
    from harness.api import Route
    from harness.prorsa.forecast import ROUTED, FutureSampler, FutureTrajectory, FutureTurn
    from harness.sim.backend import SimBackend
    from harness.prorsa.tracker import TrajectoryState
    from harness.routing import PrefixTracker
    one = {"f": np.array([10.0])}
    sampler = FutureSampler(outputs=one, tool_latency=one, tool_outputs=one, turns={"f": np.array([1.0])},
                            first_prompts=one, max_context={"f": 10**6})
    t = LifecycleTracker()
    t.live[0] = TrajectoryState(0, "f", 0.0, phase=Phase.QUEUED, context=3_000, appended=3_000)
    t.live[1] = TrajectoryState(1, "f", 0.0, phase=Phase.QUEUED, context=3_000, appended=3_000)
    live = sampler.live(1.0, t, PrefixTracker(), 0.01, np.random.default_rng(0), routes={0: Route(1, 2)})
    assert {f.trajectory_id: f.route for f in live} == {0: Route(1, 2), 1: None}
    assert Phase.TOOL not in ROUTED
    cluster = cluster_of(["cluster=dense8_h100", "cluster.num_engines=3", "cluster.switch_mechanism=kv_both"])
    legs = _record_legs(monkeypatch, SimBackend)
    queued = FutureTrajectory(0, "f", 0.0, [FutureTurn(3_000, 0, 10, 0.0)], in_progress=True, route=Route(1, 2))
    fresh = FutureTrajectory(1, "f", 0.0, [FutureTurn(3_000, 0, 10, 0.0)], in_progress=True)
    now = [Role.PREFILL, Role.PREFILL, Role.DECODE]
    ends = WhatIf(cluster, 5, 4.0).run([queued, fresh], now, [Role.PREFILL, Role.DECODE, Role.DECODE]).ends
    assert len(ends) == 2
    sent = {t: route for t, _, route in reversed(legs)}   # each trajectory's first leg
    assert sent[0] == Route(1, 2)               # kept on the engine that is switching away
    assert sent[1].prefill_engine == 0          # routed under the new roles


def test_whatif_continues_a_decode_under_way_on_its_decode_engine(monkeypatch):
    """A disaggregated turn that is decoding (prefill done) goes straight to its decode engine in the
    what-if: no prefill leg runs again on the prefill engine (whose cache may no longer hold the
    context); a turn still queued for its prefill runs its prefill leg. The live view marks which."""
    from harness.api import Route
    from harness.prorsa.tracker import TrajectoryState
    from harness.prorsa.forecast import FutureSampler, FutureTrajectory, FutureTurn
    from harness.routing import PrefixTracker
    from harness.sim.backend import SimBackend
    cluster = cluster_of(["cluster=dense8_h100", "cluster.num_engines=2", "cluster.switch_mechanism=kv_both"])
    legs = _record_legs(monkeypatch, SimBackend)
    decoding = FutureTrajectory(0, "f", 0.0, [FutureTurn(20_000, 19_999, 50, 0.0)], decode_engine=1, prefill_engine=0,
                                in_progress=True, route=Route(0, 1), prefilled=True)
    queued = FutureTrajectory(1, "f", 0.0, [FutureTurn(2_000, 0, 50, 0.0)], in_progress=True, route=Route(0, 1))
    roles = [Role.PREFILL, Role.DECODE]
    ends = WhatIf(cluster, 5, 4.0).run([decoding, queued], roles, roles).ends
    assert len(ends) == 2 and sorted((t, kind) for t, kind, _ in legs) == [(0, "decode"), (1, "prefill")]
    one = {"f": np.array([10.0])}
    sampler = FutureSampler(outputs=one, tool_latency=one, tool_outputs=one, turns={"f": np.array([1.0])},
                            first_prompts=one, max_context={"f": 10**6})
    t = LifecycleTracker()
    t.live[0] = TrajectoryState(0, "f", 0.0, phase=Phase.DECODING, context=20_000, appended=100, engine=1)
    t.live[1] = TrajectoryState(1, "f", 0.0, phase=Phase.QUEUED, context=2_000, appended=2_000)
    live = sampler.live(1.0, t, PrefixTracker(), 0.01, np.random.default_rng(0), routes={0: Route(0, 1), 1: Route(0, 1)})
    assert {f.trajectory_id: f.prefilled for f in live} == {0: True, 1: False}


def test_whatif_keeps_a_decode_whose_prefill_engine_kv_both_has_switched(monkeypatch):
    """kv_both: a disaggregated turn whose prefill is done decodes on its decode engine, whatever its
    prefill engine has become since: the what-if continues its decode there and runs no prefill again
    (it used to route such a turn as new once engine 0 had switched to decode)."""
    from harness.prorsa.forecast import FutureTrajectory, FutureTurn
    from harness.sim.backend import SimBackend
    cluster = cluster_of(["cluster=dense8_h100", "cluster.num_engines=3", "cluster.switch_mechanism=kv_both"])
    legs = _record_legs(monkeypatch, SimBackend)
    decoding = FutureTrajectory(0, "f", 0.0, [FutureTurn(20_000, 19_999, 50, 0.0)], decode_engine=1,
                                prefill_engine=0, in_progress=True, route=Route(0, 1), prefilled=True)
    roles = [Role.DECODE, Role.DECODE, Role.PREFILL]    # engine 0 has switched to decode since
    ends = WhatIf(cluster, 5, 4.0).run([decoding], roles, roles).ends
    assert len(ends) == 1 and legs == [(0, "decode", Route(0, 1))]


@pytest.mark.parametrize("migrate, kept", [(False, True), (True, False)])
def test_whatif_keeps_a_colocated_turn_on_an_engine_kv_both_turned_into_a_prefill_engine(monkeypatch, migrate, kept):
    """kv_both drains nothing: a colocated turn under way on an engine that has since become a prefill
    engine stays there and decodes there, in the what-if as on the engines (it used to be routed again
    as new, onto the decode engines). With decode migration its decode would be shipped to a decode
    engine, and the what-if routes the turn again."""
    from harness.prorsa.forecast import FutureTrajectory, FutureTurn
    from harness.sim.backend import SimBackend
    cluster = cluster_of(["cluster=dense8_h100", "cluster.num_engines=2", "cluster.switch_mechanism=kv_both",
                          f"cluster.migrate_decodes_on_switch={str(migrate).lower()}"])
    legs = _record_legs(monkeypatch, SimBackend)
    running = FutureTrajectory(0, "f", 0.0, [FutureTurn(2_000, 0, 50, 0.0)], in_progress=True, route=Route(0, 0))
    roles = [Role.PREFILL, Role.DECODE]
    ends = WhatIf(cluster, 5, 4.0).run([running], roles, roles).ends
    assert len(ends) == 1
    assert (legs[0] == (0, "prefill", Route(0, 0))) is kept
    if not kept:
        assert legs[0][2] == Route(0, 1)     # routed again: prefilled on 0, decoded on the decode engine


@pytest.mark.parametrize("running, learned", [(50, False), (20, True)])
def test_learned_distribution_waits_until_most_observations_have_ended(running, learned):
    """40 outputs of 50 tokens ended (above min_observations=30). While more turns are still decoding
    than have ended, what ended is mostly the short ones and the censored rest says little beyond it:
    the prior stays (on mix_reason_browse at 50 s, 41 ended and 127 decoding reasoning turns gave a
    mean of 1,260 tokens against 1,861 true; the prior 2,264). Once most have ended, the estimate."""
    from collections import deque
    from harness.prorsa.forecast import prior_samples
    from harness.prorsa.tracker import TrajectoryState
    run = RUN_HEAVY()
    family = sorted(run.priors)[0]
    t = LifecycleTracker()
    t.outputs[family] = deque([50] * 40)
    for tid in range(running):
        t.live[tid] = TrajectoryState(tid, family, 0.0, phase=Phase.DECODING, phase_since=0.0)
    outputs = future_sampler(t, run, 30, 1.0, 0.01).outputs[family]
    prior = prior_samples(run.priors[family].output_tokens)
    assert (not learned) == (len(outputs) == len(prior) and np.array_equal(outputs, prior))


def test_switch_must_not_lose_if_the_mix_turns_to_one_family():
    """From 3P1D, for the expected mix "a" 1P3D is best (80 against 100 staying) but were the new
    trajectories all "b" it would end at 300 against staying's 100: no switch there. 2P2D (90 for "a",
    100 for "b") is taken. Without hedges: 1P3D."""
    table = {"a": {COLOCATED: 100, 1: 80, 2: 90, 3: 100}, "b": {COLOCATED: 100, 1: 300, 2: 100, 3: 100}}
    planner = Planner(cluster_of(HEAVY), MixWhatIf(table), hysteresis=0.05, allow_colocated=True, max_candidates=8,
                      rules=ASYNC)
    hedges = [one_new("a"), one_new("b")]
    view = engines([Role.PREFILL] * 3 + [Role.DECODE])
    assert planner.decide(view, 3, [], one_new("a"), 8).split == 1
    d = planner.decide(view, 3, [], one_new("a"), 8, hedges=hedges)
    assert d.switch and d.split == 2


def test_still_open_known_answers():
    """Paired scores of two candidates over samples. Separated: the runner-up is worse in every sample
    (differences 4, 5, 6: mean 5, two standard errors 1.15): closed. Overlapping (differences -6, 1, 8:
    mean 1, two standard errors 8.1, so it may be 7 better, over 1% of 100): open. One sample: open.
    A candidate beyond the hysteresis of the best is not a contender."""
    from harness.prorsa.planner import still_open
    assert not still_open({0: [100, 100, 100], 1: [104, 105, 106]}, [0, 1], 0.05)
    assert still_open({0: [100, 100, 100], 1: [94, 101, 108]}, [0, 1], 0.05)
    assert still_open({0: [100], 1: [104]}, [0, 1], 0.05)
    assert not still_open({0: [100, 100, 100], 1: [94, 111, 128]}, [0, 1], 0.05)   # mean 111: > 5% behind


def test_out_of_reach_known_answers():
    """Against the leader 0 (100 on each sample): differences 8, 10, 12 (mean 10, standard deviation 2,
    t(2) = 4.303: lower end 10 - 4.303 x 2 / sqrt(3) = 5.03 > 5% of 100): out of reach. Differences 7, 10,
    13 (deviation 3: lower end 2.55): in reach. Over the first two samples only, when a candidate still
    sampled has run no more: 8 and 10 (lower end 9 - 12.706 x 1.414 / sqrt(2) < 5): in reach. The
    leader is never out of reach."""
    from harness.prorsa.planner import out_of_reach
    per = {0: [100, 100, 100], 1: [108, 110, 112], 2: [107, 110, 113]}
    assert out_of_reach(per, [0, 1, 2], 1, 0.05) and not out_of_reach(per, [0, 1, 2], 2, 0.05)
    assert not out_of_reach(per, [0, 1, 2], 0, 0.05)
    per[3] = [100, 100]
    assert not out_of_reach(per, [0, 1, 3], 1, 0.05)


def test_still_open_uses_student_t_for_few_samples():
    """Six paired samples (search at 4 prompts per step, moe_h200_sglang, the plan's own draws: 3P5D
    then colocation): differences with mean 0.0333 s and standard error 0.0292 s against a tolerance of
    1% of 2.5403 s. Two standard errors put the lower end at -0.0251 s, above -0.0254 s (closed, 3P5D
    taken; it is 3.6% behind over 120 samples); Student's t with 5 degrees of freedom (2.571) at
    -0.0418 s: still open."""
    from harness.prorsa.planner import still_open
    from harness.stats import t975
    assert t975(5) == 2.571 and t975(1) == 12.706 and t975(30) == 2.042 and t975(31) == 1.960
    per = {3: [4.233, 1.751, 2.014, 2.55, 2.166, 2.528], 0: [4.316, 1.657, 2.015, 2.64, 2.251, 2.563]}
    assert still_open(per, [3, 0], 0.05)
    d = np.subtract(per[0], per[3])
    assert d.mean() - 2 * d.std(ddof=1) / np.sqrt(6) > -0.01 * np.mean(per[3])   # two standard errors: closed


def test_a_switch_needs_confirm_plans_consecutive_plans_each_passing_the_sync_check():
    """A plan that wants a switch is made only when the previous `confirm_plans - 1` plans wanted the
    same target; a plan that wants to stay (or another target) starts the count again, and so does a
    plan whose target fails the sync check (here the fifth: over its fresh samples 0.99 s against
    staying's 1.0 s, inside the 5% hysteresis). Each check gets `check_samples` samples."""
    from harness.prorsa.planner import Decision
    from harness.prorsa.whatif import Outcome
    policy = policy_of("prorsa", confirm_plans=2, check_samples=3, replan_interval_s=1.0, min_dwell_s=0.0,
                       initial="colocated")
    policy.initial_roles(cluster_of(HEAVY), RUN_HEAVY())
    feed(policy.tracker, [E(K.TRAJECTORY_START, 0.0, 1, 0, detail="synthetic"), E(K.TURN_READY, 0.0, 1, 0, tokens=10)])
    policy.tracker.started = policy._starts_seen = 1
    wanted = iter([2, 2, 3, None, 3, 3, 3])
    checked = iter([0.5, 0.5, 0.5, 0.99, 0.5, 0.5])     # the target's mean score; staying's is 1.0
    outcome = Outcome(1.0, 1.0, 1.0, [1.0], np.zeros(5), np.zeros(5))
    samples = []

    def decide(view, current, *args, **kwargs):
        split = next(wanted)
        target = current if split is None else split
        return Decision(target, target_roles(view, target), split is not None, {current: 1.0, target: 1.0}, outcome)

    def check(view, decision, fresh, max_in_flight, to_end):
        samples.append(len(fresh))
        return 1.0, next(checked)
    policy.planner.decide, policy.planner.check = decide, check
    view = engines([Role.COLOCATED] * 4)
    made = []
    for t in range(1, 8):
        view.now = float(t)
        made.append(policy.plan(view) is not None)
    assert made == [False, True, False, False, False, False, True]
    assert samples == [3] * 6


def test_switch_evidence_adds_up_gains_over_plans_by_hand():
    """Planner.weigh with h = 5% and confirm_plans = 2 (a target is ready at 5%): staying scores 100.
    2P: 95 (+5% - 2.5% = 2.5%), 96 (+1.5%: 4.0%), 99 (-1.5%: 2.5%), 90 (clipped to +5%: 5.0%, ready).
    No two consecutive plans beat staying by h, yet the gain persists. 3P at 98 (2%, under h / 2) never
    adds up; 4P cut at its bound (inf) counts -h; a move resets every target's evidence."""
    cluster = cluster_of(HEAVY + ["cluster.num_engines=8"])
    planner = Planner(cluster, None, hysteresis=0.05, allow_colocated=True, max_candidates=8, confirm_plans=2,
                      switch_rule="evidence")
    ready = [planner.weigh(COLOCATED, {COLOCATED: 100.0, 2: two, 3: 98.0, 4: np.inf}) for two in (95, 96, 99, 90)]
    assert ready == [[], [], [], [2]]
    assert planner.evidence[2] == pytest.approx(0.05) and planner.evidence[3] == 0.0 and planner.evidence[4] == 0.0
    assert planner.weigh(2, {2: 90.0, 3: 86.0}) == [] and planner.evidence[3] == pytest.approx(0.0194, abs=1e-4)
    assert 2 not in planner.evidence   # against the new split, the old one's evidence is gone
    planner.reject(3)
    assert 3 not in planner.evidence
    # held at the threshold: one plan that scores 3P worse than staying leaves it not ready
    for _ in range(5):
        ready = planner.weigh(2, {2: 100.0, 3: 90.0})
    assert ready == [3] and planner.evidence[3] == pytest.approx(0.05)
    assert planner.weigh(2, {2: 100.0, 3: 101.0}) == []
    # a candidate cut at a bound below staying's score says nothing (adds 0); above it, its sure loss
    planner.reset()
    planner.weigh(2, {2: 100.0, 3: 90.0})
    planner.weigh(2, {2: 100.0, 3: np.inf}, {3: 95.0})
    assert planner.evidence[3] == pytest.approx(0.0)
    planner.reset()
    planner.weigh(2, {2: 100.0, 3: 90.0}), planner.weigh(2, {2: 100.0, 3: 90.0})
    planner.weigh(2, {2: 100.0, 3: np.inf}, {3: 101.0})
    assert planner.evidence[3] == pytest.approx(0.05 - 0.01 - 0.025)
    single = Planner(cluster, None, hysteresis=0.05, allow_colocated=True, max_candidates=8,
                     switch_rule="evidence")   # confirm_plans=1
    assert single.weigh(COLOCATED, {COLOCATED: 100.0, 2: 95.0}) == [2]      # one plan beating by h is enough
    assert single.weigh(2, {2: 100.0, 3: 96.0}) == [] and single.weigh(2, {2: 100.0, 3: 96.0}) == [3]


def test_a_switch_whose_check_fails_starts_its_evidence_again():
    """`switch_rule: evidence`: a plan that wants a switch makes it only if the target also beats staying
    on `check_samples` fresh samples (sync); where it does not (the first plan: 0.99 s against staying's
    1.0 s, inside the 5% hysteresis), the target's evidence is dropped (Planner.reject) and no switch is
    made; the next plan's wish is made at once (its evidence is the planner's to add up)."""
    from harness.prorsa.planner import Decision
    from harness.prorsa.whatif import Outcome
    policy = policy_of("prorsa", confirm_plans=2, switch_rule="evidence", check_samples=3, replan_interval_s=1.0,
                       min_dwell_s=0.0, initial="colocated")
    policy.initial_roles(cluster_of(HEAVY), RUN_HEAVY())
    feed(policy.tracker, [E(K.TRAJECTORY_START, 0.0, 1, 0, detail="synthetic"), E(K.TURN_READY, 0.0, 1, 0, tokens=10)])
    policy.tracker.started = policy._starts_seen = 1
    checked = iter([0.99, 0.5])     # the target's mean score; staying's is 1.0
    outcome = Outcome(1.0, 1.0, 1.0, [1.0], np.zeros(5), np.zeros(5))
    samples, rejected = [], []

    def decide(view, current, *args, **kwargs):
        return Decision(2, target_roles(view, 2), True, {current: 1.0, 2: 0.5}, outcome)

    def check(view, decision, fresh, max_in_flight, to_end):
        samples.append(len(fresh))
        return 1.0, next(checked)
    policy.planner.decide, policy.planner.check, policy.planner.reject = decide, check, rejected.append
    view = engines([Role.COLOCATED] * 4)
    made = []
    for t in range(1, 3):
        view.now = float(t)
        made.append(policy.plan(view) is not None)
    assert made == [False, True] and rejected == [2] and samples == [3, 3]


@pytest.mark.parametrize("mechanism, checked", [("reshard", True), ("drain", True), ("kv_both", False)])
def test_async_switch_is_checked_on_fresh_samples_when_it_drains_or_reloads(mechanism, checked):
    """Async: a switch that drains or reloads engines is made only if its target also beats staying on
    `check_samples` fresh samples, each with the trajectories still to start (the run's 8, minus the
    4 started: 4); with kv_both (a router update) the plan's own sample decides. Staying scores 1.0 on
    the fresh samples and the target 0.99, inside the 5% hysteresis: no switch where it is checked."""
    from harness.prorsa.planner import Decision
    from harness.prorsa.whatif import Outcome
    policy = policy_of("prorsa", confirm_plans=1, check_samples=3, replan_interval_s=1.0, min_dwell_s=0.0,
                       initial="colocated")
    run = RunInfo(mode="async", trajectories_per_step=4, max_in_flight=4, num_steps=2, priors={"fam": FAM})
    policy.initial_roles(cluster_of(HEAVY + [f"cluster.switch_mechanism={mechanism}"]), run)
    feed(policy.tracker, [E(K.TRAJECTORY_START, 0.0, i, 0, detail="fam") for i in range(4)]
         + [E(K.TURN_READY, 0.0, i, 0, tokens=10) for i in range(4)])
    outcome = Outcome(1.0, 1.0, 1.0, [1.0], np.zeros(5), np.zeros(5))
    seen = []

    def decide(view, current, *args, **kwargs):
        return Decision(2, target_roles(view, 2), True, {current: 1.0, 2: 0.5}, outcome)

    def check(view, decision, fresh, max_in_flight, to_end):
        seen.append([(len(futures), len(new)) for futures, new in fresh])
        return 1.0, 0.99
    policy.planner.decide, policy.planner.check = decide, check
    view = engines([Role.COLOCATED] * 4)
    view.now = 1.0
    switched = policy.plan(view) is not None
    assert switched is not checked
    assert seen == ([[(4, 4)] * 3] if checked else [])


def test_async_start_on_the_whole_run_is_scored_by_its_last_end():
    """Async: 2P ends its trajectories sooner on average (mean end 50 against colocation's 55) and its
    last one later (200 against 180). A start sampled on part of the run takes 2P (the throughput);
    one sampled on the whole run (`to_end`) takes colocation (the run's end)."""
    table = {COLOCATED: (55.0, 180.0), 1: (90.0, 300.0), 2: (50.0, 200.0), 3: (70.0, 260.0)}
    planner = Planner(cluster_of(HEAVY), EndsWhatIf(table), hysteresis=0.05, allow_colocated=True, max_candidates=8,
                      rules=ASYNC)
    assert planner.initial([one_new("a")], 8)[0] == 2
    split, scores = planner.initial([one_new("a")], 8, to_end=True)
    assert split == COLOCATED and scores == {k: last for k, (_, last) in table.items()}


@pytest.mark.parametrize("steps,whole", [(2, True), (8, False)])
def test_async_start_samples_the_whole_run_in_groups_with_output_levels(steps, whole):
    """Async, 4 in flight, groups of 2: a run of 2 steps x 4 (8 trajectories, no more than the start's
    four in-flight sets) is sampled whole, in GRPO groups (a group's samples share their prompt) with
    each trajectory's output level, `initial_max_samples` times from the first, and scored by its last
    end; a run of 32 by `initial_samples` samples of 16 trajectories drawn one by one, scored by their
    mean end."""
    prior = replace(FAM, prompt_tokens=LogNormalPrior(100, 1.0), output_shared=0.5)
    run = RunInfo(mode="async", trajectories_per_step=4, max_in_flight=4, num_steps=steps, priors={"fam": prior},
                  group_size=2)
    policy = policy_of("prorsa", initial_samples=1, initial_max_samples=2)
    seen = {}

    def initial(samples, max_in_flight, hedges, more, max_samples, present, to_end):
        seen.update(to_end=to_end, sample=samples[0], samples=len(samples))
        return COLOCATED, {COLOCATED: 1.0}
    policy.initial = "colocated"
    policy.initial_roles(cluster_of(HEAVY), run)
    policy.planner.initial = initial
    policy._initial_split()
    sample = seen["sample"]
    assert seen["to_end"] is whole and len(sample) == (8 if whole else 16) and seen["samples"] == (2 if whole else 1)
    prompts = [ft.turns[0].prompt_tokens for ft in sample]
    paired = all(prompts[i] == prompts[i + 1] for i in range(0, len(prompts), 2))
    assert paired is whole
    assert bool(policy.future_model(0.0, whole)._levels) is whole


@pytest.mark.parametrize("second,hedged", [({"a": 0.5, "b": 0.5}, False), ({"a": 0.1, "b": 0.9}, True)])
def test_initial_plan_hedges_only_where_the_declared_mix_changes(second, hedged):
    """Two families, 50:50 in step 0: the start is hedged against each family alone (one hedge per
    family) when step 1 declares another mix, and not when it declares the same one (a stationary
    trace, or a schedule of one entry)."""
    run = RunInfo(mode="sync", trajectories_per_step=4, max_in_flight=4, num_steps=2, priors={"a": FAM, "b": FAM},
                  step_weights=[{"a": 0.5, "b": 0.5}, second])
    policy = policy_of("prorsa", initial_samples=1, initial_max_samples=1)
    seen = {}

    def initial(samples, max_in_flight, hedges, more, max_samples, present, to_end):
        seen["hedges"] = len(hedges)
        return COLOCATED, {COLOCATED: 1.0}
    policy.initial = "colocated"
    policy.initial_roles(cluster_of(HEAVY), run)
    policy.planner.initial = initial
    policy._initial_split()
    assert seen["hedges"] == (2 if hedged else 0)


@pytest.mark.parametrize("second,planned", [({"a": 0.5, "b": 0.5}, None), ({"a": 0.0, "b": 1.0}, [0.0, 1.0])])
def test_sync_step_start_is_planned_for_a_declared_mix_change(second, planned):
    """Between two sync steps, in the split the run started in (no switch in the step): the next step is
    planned, for its own declared mix, when that mix differs from the one the start was planned for,
    and starts where the last one did when it is the same."""
    from harness.api import EngineState
    run = RunInfo(mode="sync", trajectories_per_step=4, max_in_flight=4, num_steps=2, priors={"a": FAM, "b": FAM},
                  step_weights=[{"a": 0.5, "b": 0.5}, second])
    policy = policy_of("prorsa")
    policy.initial = "colocated"
    cluster = cluster_of(HEAVY)
    policy.initial_roles(cluster, run)
    seen = []

    def initial_split(present=None, weights=None):
        seen.append(weights)
        return COLOCATED
    policy._initial_split = initial_split
    policy.tracker.started = 4   # the first step's four trajectories have started (and ended)
    view = ClusterView(now=10.0, engines=[EngineState(i, Role.COLOCATED, True, 4, 0, 0, 0, 0, 0, 1_000_000)
                                          for i in range(cluster.num_engines)])
    assert policy._plan_step(view) is None           # colocated either way
    assert seen == ([] if planned is None else [planned])


@pytest.mark.parametrize("second,switching,planned", [({"a": 0.1, "b": 0.9}, True, [[0.5, 0.5]]),
                                                      ({"a": 0.1, "b": 0.9}, False, []),
                                                      ({"a": 0.5, "b": 0.5}, True, [])])
def test_hedged_sync_start_is_the_launch_and_the_first_step_is_planned_for_its_own_mix(second, switching, planned,
                                                                                       monkeypatch):
    """Two families, 50:50 in step 0. Where step 1 declares another mix, the initial plan hedges over
    the mixes; that start is the launch, and before step 0's batch (the driver asks, nothing started)
    step 0 is planned for its own declared mix. Not without switching (the start is kept), and not
    where the mix never changes (the start was planned for it)."""
    from harness.api import EngineState
    from harness.prorsa.planner import Planner
    run = RunInfo(mode="sync", trajectories_per_step=4, max_in_flight=4, num_steps=2, priors={"a": FAM, "b": FAM},
                  step_weights=[{"a": 0.5, "b": 0.5}, second])
    hedges = []

    def initial(self, samples, max_in_flight, hedged, *args, **kwargs):
        hedges.append(len(hedged))
        return COLOCATED, {COLOCATED: 1.0}
    monkeypatch.setattr(Planner, "initial", initial)
    policy = policy_of("prorsa", initial_samples=1, initial_max_samples=1, switching=switching)
    cluster = cluster_of(HEAVY)
    policy.initial_roles(cluster, run)
    assert hedges == [2 if second["a"] != 0.5 else 0]
    seen = []

    def initial_split(present=None, weights=None):
        seen.append(weights)
        return COLOCATED
    policy._initial_split = initial_split
    view = ClusterView(now=0.0, engines=[EngineState(i, Role.COLOCATED, True, 4, 0, 0, 0, 0, 0, 1_000_000)
                                         for i in range(cluster.num_engines)])
    assert policy.plan(view) is None                  # colocated either way
    assert seen == planned


def test_whatif_weight_update_flushes_the_prefix_caches():
    """Async: the trainer updates the weights after every `update_every` completed trajectories, and
    the cluster flushes every prefix cache then. Trajectory 0 ends first (1 s of work); trajectory 1
    returns from a tool at 2 s with a 20,000-token context cached on engine 0. With an update after
    the first end, its turn recomputes the whole context; with none (or when the update would follow
    the run's last trajectory) it prefills its 100 new tokens only."""
    from harness.prorsa.forecast import FutureTrajectory, FutureTurn
    cluster = cluster_of(["cluster=dense8_h100", "cluster.num_engines=1"])
    assert cluster.flush_prefix_cache_on_weight_update
    roles = [Role.COLOCATED]

    def end_of_1(update_every, total):
        first = FutureTrajectory(0, "f", 0.0, [FutureTurn(100, 0, 20, 0.0)])
        back = FutureTrajectory(1, "f", 2.0, [FutureTurn(20_100, 20_000, 10, 0.0)], decode_engine=0, prefill_engine=0)
        w = WhatIf(cluster, 5, 4.0)
        w.update_every, w.total = update_every, total
        ends = w.run([first, back], roles, roles).ends
        assert len(ends) == 2 and ends[0] < 2.0
        return ends[1]
    kept = end_of_1(0, 0)
    assert end_of_1(1, 3) > kept + 0.05          # 20,000 tokens recomputed on one H100
    assert end_of_1(1, 1) == kept                # no update after the run's last trajectory
    assert end_of_1(2, 4) == kept                # the update comes after two ends: none before turn 1


def test_whatif_weight_update_instants_known_answers():
    """Updates every 4 completions, 6 completed so far, 12 in the run: the what-if's 2nd end is the
    8th completion (an update); its 6th end would be the 12th, the run's last (none)."""
    w = WhatIf(cluster_of(["cluster=dense8_h100"]), 5, 4.0)
    w.update_every, w.total = 4, 12
    w.completed = 6
    assert w._weight_updates(10) == {2}
    w.completed = 0
    assert w._weight_updates(12) == {4, 8}
    assert WhatIf(cluster_of(["cluster=dense8_h100"]), 5, 4.0)._weight_updates(12) == frozenset()


def test_remaining_work_priority_known_answer():
    """`priority: remaining_work` with deterministic priors (every trajectory 5 turns of 40 tokens, a
    3-s tool call after each): from turn k a trajectory has 5 - k turns left, each 40 x tpot + 3 s; a
    route's priority is minus that (most work left first)."""
    policy = policy_of("prorsa", priority="remaining_work", initial="colocated")
    policy.initial_roles(cluster_of(["cluster=dense8_h100", "cluster.num_engines=2"]), RUN)
    per_turn = 40 * policy._tpot() + 3.0
    left = policy._work_left["fam"]
    assert left[:5] == pytest.approx([5 * per_turn, 4 * per_turn, 3 * per_turn, 2 * per_turn, per_turn])
    assert left[7] == pytest.approx(per_turn)        # past every sampled length: this turn only
    from harness.experiment import checked
    with pytest.raises(ValueError, match="policy.priority='lpt' is invalid; allowed: fcfs, remaining_work"):
        checked(load_config(["policy=prorsa", "policy.priority=lpt"]).policy, "policy")


@pytest.mark.parametrize("mix_forecast, families", [("schedule", ["a", "a", "b", "b", "b", "b"]),
                                                     ("window", ["a"] * 6)])
def test_new_trajectories_follow_the_declared_mix_of_their_batch(mix_forecast, families):
    """Async, 4 trajectories per batch, batch 0 all family a, batch 1 all b; 2 have started and 6 may
    start next (the run's 8 minus 2). With the declared schedule the next two are a (the rest of batch
    0) and the four after them b; with the window of recent starts (fewer than mix_window yet), the
    step-0 mix: all a."""
    run = RunInfo(mode="async", trajectories_per_step=4, max_in_flight=6, num_steps=2,
                  priors={"a": FAM, "b": FAM}, step_weights=[{"a": 1.0}, {"b": 1.0}])
    policy = policy_of("prorsa", initial="colocated", mix_forecast=mix_forecast)
    policy.initial_roles(cluster_of(["cluster=dense8_h100", "cluster.num_engines=2"]), run)
    policy.tracker.started = 2
    new = policy._new(policy.future_model(0.0), np.random.default_rng(0))
    assert [f.family for f in new] == families
    assert len({f.trajectory_id for f in new}) == 6 and all(f.trajectory_id < 0 for f in new)


def test_next_step_of_the_forecast_is_the_next_batch_in_its_mix():
    """Sync, 4 trajectories per step in groups of 2, step 0 family a, step 1 family b: during step 0 the
    forecast's next step is 4 trajectories of b; during the
    last step, and in async, there is none."""
    run = RunInfo(mode="sync", trajectories_per_step=4, max_in_flight=4, num_steps=2, group_size=2,
                  priors={"a": FAM, "b": FAM}, step_weights=[{"a": 1.0}, {"b": 1.0}])
    policy = policy_of("prorsa", initial="colocated")
    policy.initial_roles(cluster_of(["cluster=dense8_h100", "cluster.num_engines=2"]), run)
    policy.tracker.started = 4
    batch = policy._next_step(policy.future_model(0.0), np.random.default_rng(0))()
    assert [f.family for f in batch] == ["b"] * 4 and all(f.trajectory_id < 0 for f in batch)
    assert len({f.trajectory_id for f in batch}) == 4
    policy.tracker.started = 8
    assert policy._next_step(policy.future_model(0.0), np.random.default_rng(0)) is None
    policy.run = replace(run, mode="async")
    policy.rules = rules_for(policy.run)
    policy.tracker.started = 4
    assert policy._next_step(policy.future_model(0.0), np.random.default_rng(0)) is None


class EndsWhatIf:
    """A performance model with a mean end and a last end per split (`table`: split -> (mean, last))."""

    events = 0   # the simulator events its runs took (WhatIf.events)

    def __init__(self, table):
        self.table = table

    def run(self, futures, roles_now, roles, new=(), max_in_flight=0, **bound):
        from harness.prorsa.whatif import Outcome
        mean, last = self.table[sum(r == Role.PREFILL for r in roles) or COLOCATED]
        return Outcome(last, mean, 1.0, [last], np.zeros(5), np.zeros(5))


def test_async_plan_scores_the_last_end_once_it_covers_the_runs_end():
    """Async from 3P1D (mean end 100, last 300): 1P3D has the best mean end (50) but a last end of 200,
    2P2D the mean 60 and the last 100. While trajectories remain beyond the plan, the mean end decides
    (1P3D); once the plan holds the rest of the run, the run ends with its last trajectory (2P2D)."""
    table = {COLOCATED: (120, 400), 1: (50, 200), 2: (60, 100), 3: (100, 300)}
    planner = Planner(cluster_of(HEAVY), EndsWhatIf(table), hysteresis=0.05, allow_colocated=True, max_candidates=8,
                      rules=ASYNC)
    view = engines([Role.PREFILL] * 3 + [Role.DECODE])
    assert planner.decide(view, 3, [], [], 8).split == 1
    assert planner.decide(view, 3, [], [], 8, to_end=True).split == 2


def test_plan_covers_the_runs_end_once_the_rest_fits_in_flight():
    """8 trajectories in 2 batches, 3 in flight at most: with 5 started, 3 are left (the rest fits in one
    rolling set); with 4 started, 4 are left."""
    run = RunInfo(mode="async", trajectories_per_step=4, max_in_flight=3, num_steps=2, priors={"a": FAM})
    policy = policy_of("prorsa", initial="colocated")
    policy.initial_roles(cluster_of(["cluster=dense8_h100", "cluster.num_engines=2"]), run)
    policy.tracker.started = 4
    assert not policy._to_end()
    policy.tracker.started = 5
    assert policy._to_end()


def test_switcher_moves_engines_by_the_decode_work_they_carry():
    """With the decode work each engine's turns under way still have (tokens): from 2P2D to 1P3D the
    prefill engine still carrying decodes (engine 1: 5,000 tokens left) goes back to decode, not the
    one with less queued prefill; from 1P3D to 2P2D the decode engine with the least work left (engine
    3) becomes a prefill engine; from colocation the two least loaded become the prefill pool. Without
    the work, the old order (queued prefill; running requests)."""
    view = engines([Role.PREFILL, Role.PREFILL, Role.DECODE, Role.DECODE])
    view.engines[0] = replace(view.engines[0], waiting_prefill_tokens=100)
    view.engines[1] = replace(view.engines[1], waiting_prefill_tokens=900)
    left = {1: 5000.0, 2: 800.0, 3: 50.0}
    assert target_roles(view, 1, left)[1] == Role.DECODE and target_roles(view, 1, left)[0] == Role.PREFILL
    assert target_roles(view, 1)[0] == Role.DECODE                     # without: the least queued prefill
    view = engines([Role.PREFILL, Role.DECODE, Role.DECODE, Role.DECODE])
    assert [r for r in target_roles(view, 2, {1: 10.0, 2: 500.0, 3: 5.0}).values()].count(Role.PREFILL) == 2
    assert target_roles(view, 2, {1: 10.0, 2: 500.0, 3: 5.0})[3] == Role.PREFILL
    view = engines([Role.COLOCATED] * 4)
    roles = target_roles(view, 2, {0: 900.0, 1: 10.0, 2: 700.0, 3: 0.0})
    assert sorted(e for e, r in roles.items() if r == Role.PREFILL) == [1, 3]


def test_decode_left_sums_the_rest_of_each_engines_turns():
    from harness.prorsa.planner import decode_left
    from harness.prorsa.forecast import FutureTrajectory, FutureTurn
    fts = [FutureTrajectory(1, "a", 0.0, [FutureTurn(10, 0, 300, 0.0), FutureTurn(20, 10, 99, 0.0)], in_progress=True,
                            route=Route(0, 2)),
           FutureTrajectory(2, "a", 0.0, [FutureTurn(10, 0, 200, 0.0)], in_progress=True, route=Route(1, 2)),
           FutureTrajectory(3, "a", 1.0, [FutureTurn(10, 0, 700, 0.0)])]        # in a tool call: no engine
    assert decode_left(fts) == {2: 500.0}


def test_a_migrated_decode_is_known_where_it_went():
    """DECODE_MIGRATED (cluster.migrate_decodes_on_switch): the tracker's engine of the decoding turn
    and Prorsa's route of the turn under way follow it, so the what-if places it where it now runs."""
    from hydra.utils import instantiate
    t = LifecycleTracker()
    feed(t, [E(K.TRAJECTORY_START, 0.0, 5, 0, detail="fam"), E(K.TURN_READY, 0.0, 5, 0, tokens=100),
             E(K.PREFILL_START, 0.1, 5, 0), E(K.PREFILL_END, 0.2, 5, 0, engine_id=0),
             E(K.DECODE_START, 0.3, 5, 0, engine_id=2), E(K.DECODE_MIGRATED, 1.0, 5, 0, engine_id=3)])
    assert t.live[5].engine == 3 and t.live[5].phase == Phase.DECODING
    policy = instantiate(load_config(["policy=prorsa"]).policy)
    policy.routes[5], policy._routed_turn[5] = Route(0, 2, 1.5), 0     # as Prorsa.route sets them
    policy.observe(E(K.DECODE_MIGRATED, 1.0, 5, 0, engine_id=3, tokens=100, extra_tokens=7))
    assert policy.routes[5] == Route(0, 3, 1.5)


def test_forecast_work_placement_spreads_first_turns_by_forecast_decode_work():
    """`placement: forecast_work`, deterministic priors (every trajectory 5 turns of 40 tokens): a
    turn k counts 40 x (5 - k) tokens on its decode engine. On three idle decode engines (equal KV),
    six first turns go 1, 2, 3, 1, 2, 3 (the shared router's rule sends all six to engine 1); a turn 3
    of another trajectory (80 tokens) then goes to engine 1 (400 tokens, as all are; then lowest id),
    and after trajectory 2 ends (200 tokens off engine 2) the next first turn goes to engine 2. A
    migrated decode takes its work with it."""
    from harness.api import EngineState, TurnRequest
    from harness.prorsa.placement import DecodeWork, turns_left_factor
    assert turns_left_factor(np.full(10, 5.0), 8) == pytest.approx([5, 4, 3, 2, 1, 1, 1, 1])
    roles = [Role.PREFILL, Role.DECODE, Role.DECODE, Role.DECODE]
    view = ClusterView(0.0, [EngineState(i, r, True, 4, 0, 0, 0, 0, 0, 1_000_000) for i, r in enumerate(roles)])

    def turn(tid, k=0):
        return TurnRequest(trajectory_id=tid, group_id=tid, turn=k, family="fam", prompt_tokens=100,
                           appended_tokens=100, max_output_tokens=40, t_ready=0.0)

    def placed(policy, requests):
        return [policy.route(r, view).decode_engine for r in requests]

    shared = policy_of("prorsa", initial="colocated")
    shared.initial_roles(cluster_of(["cluster=dense8_h100", "cluster.num_engines=4"]), RUN)
    assert placed(shared, [turn(t) for t in range(1, 7)]) == [1] * 6
    policy = policy_of("prorsa", initial="colocated", placement="forecast_work", plan_per_engine=None)
    policy.initial_roles(cluster_of(["cluster=dense8_h100", "cluster.num_engines=4"]), RUN)
    assert policy.work.left["fam"][:6] == pytest.approx([200, 160, 120, 80, 40, 40])
    assert placed(policy, [turn(t) for t in range(1, 7)]) == [1, 2, 3, 1, 2, 3]
    assert placed(policy, [turn(7, 3)]) == [1]
    assert dict(policy.work.on) == pytest.approx({1: 480, 2: 400, 3: 400})
    policy.observe(E(K.TRAJECTORY_END, 1.0, 2, 4))
    assert placed(policy, [turn(8)]) == [2]
    policy.observe(E(K.DECODE_MIGRATED, 1.0, 7, 3, engine_id=3, tokens=100))
    assert dict(policy.work.on) == pytest.approx({1: 400, 2: 400, 3: 480})
    copy = policy.work.copy()
    copy.drop(7)
    assert policy.work.on[3] == pytest.approx(480) and copy.on[3] == pytest.approx(400)
    assert isinstance(copy, DecodeWork)
    from harness.experiment import checked
    with pytest.raises(ValueError, match="policy.placement='round_robin' is invalid; allowed: kv_load, forecast_work"):
        checked(load_config(["policy=prorsa", "policy.placement=round_robin"]).policy, "policy")


def test_whatif_places_new_turns_as_the_policy_does(monkeypatch):
    """With the policy's forecast-work placement the what-if routes as the run does: on 1P3D, where
    the policy counts 1,000 forecast tokens on decode engine 1, an arriving first turn decodes on
    engine 2 (without it, on engine 1: the least KV, then the lowest id), and the run leaves the
    policy's own counts as they were (it works on a copy)."""
    from harness.prorsa.placement import DecodeWork
    from harness.prorsa.forecast import FutureTrajectory, FutureTurn
    from harness.sim.backend import SimBackend
    cluster = cluster_of(["cluster=dense8_h100", "cluster.num_engines=4", "cluster.switch_mechanism=kv_both"])
    sent: dict[int, Route] = {}
    submit = SimBackend.submit
    monkeypatch.setattr(SimBackend, "submit", lambda self, req, route: (sent.setdefault(req.trajectory_id, route),
                                                                       submit(self, req, route))[1])
    roles = [Role.PREFILL, Role.DECODE, Role.DECODE, Role.DECODE]

    def decode_engine(placement):
        sent.clear()
        whatif = WhatIf(cluster, 5, 4.0)
        whatif.placement = placement
        ft = FutureTrajectory(-1, "f", 0.5, [FutureTurn(300, 0, 10, 0.0)])
        assert len(whatif.run([ft], roles, roles).ends) == 1
        return sent[-1].decode_engine

    work = DecodeWork({"f": np.array([1_000.0])})
    work.assign(7, 1, "f", 0)
    assert decode_engine(None) == 1
    assert decode_engine(work) == 2
    assert dict(work.on) == {1: 1_000.0} and work.of == {7: (1, 1_000.0)}


def test_a_turn_end_observed_after_the_next_turn_was_routed_keeps_that_route():
    """On real engines the policy's events wait while a plan runs: turn 0's end may reach `observe` after
    turn 1 was routed. The route of the turn under way (turn 1) stays; turn 1's own end removes it."""
    from hydra.utils import instantiate

    from harness.experiment import run_info
    from harness.rollout import ModeConfig
    cfg = load_config(["policy=prorsa", "policy.initial=colocated", "cluster.num_engines=2"])
    policy = instantiate(cfg.policy)
    policy.initial_roles(cluster_of(["cluster.num_engines=2"]), run_info(ModeConfig("sync", 1),
                                                                         instantiate(cfg.workload, seed=0)))
    for e in [E(K.TRAJECTORY_START, 0.0, 7, 0, detail="synthetic"), E(K.TURN_READY, 0.0, 7, 0, tokens=100)]:
        policy.observe(e)
    policy.routes[7], policy._routed_turn[7] = Route(1, 1), 1       # turn 1 routed (Prorsa.route sets both)
    policy.observe(E(K.DECODE_END, 4.0, 7, 0, engine_id=0, tokens=50))    # turn 0's end, held until now
    assert policy.routes[7] == Route(1, 1)
    policy.observe(E(K.DECODE_END, 9.0, 7, 1, engine_id=1, tokens=50))
    assert 7 not in policy.routes


@pytest.mark.parametrize("staleness, held", [(0, True), (1, False), (None, False)])
def test_whatif_holds_new_trajectories_back_as_the_drivers_staleness_does(staleness, held):
    """Async, 2 trajectories per batch, 4 slots: a live trajectory of batch 0 decodes a long answer while
    the rest of batch 0 (one new) and batch 1 (two new) wait to start. With staleness 0 batch 1 starts
    only once batch 0 has completed (the driver's `_fill_async`), so its trajectories end after the long
    answer; with staleness 1, or no rule (sync), they start at once and end long before it."""
    from harness.prorsa.forecast import FutureTrajectory, FutureTurn
    cluster = cluster_of(["cluster=dense8_h100", "cluster.num_engines=2"])
    long = FutureTrajectory(0, "f", 0.0, [FutureTurn(1_000, 0, 3_000, 0.0)])
    new = [FutureTrajectory(-1 - i, "f", 0.0, [FutureTurn(500, 0, 10, 0.0)]) for i in range(3)]
    whatif = WhatIf(cluster, 5, 4.0, staleness=staleness)
    whatif.update_every, whatif.total = 2, 100
    whatif.started, whatif.completed = 1, 0   # the live one started; nothing completed
    ends = sorted(whatif.run([long], [Role.COLOCATED] * 2, [Role.COLOCATED] * 2, new, max_in_flight=4).ends)
    alone = WhatIf(cluster, 5, 4.0).run([long], [Role.COLOCATED] * 2, [Role.COLOCATED] * 2).ends[0]
    assert len(ends) == 4 and alone > 10 and ends[0] < 2      # batch 0's new one never waits
    after_the_long_answer = sum(e >= alone * 0.99 for e in ends)
    assert after_the_long_answer == (3 if held else 1)


def test_async_start_sample_follows_the_declared_schedule():
    """Async, 3 batches of 32 trajectories, the mix declared reasoning-only for batch 0 and browse-only
    from batch 1: the start's sample of the whole run is drawn batch by batch in those mixes (a sample
    in the first batch's mix alone would be all reasoning), as a plan's trajectories to start are."""
    from hydra.utils import instantiate

    from harness.experiment import run_info
    from harness.rollout import ModeConfig
    schedule = "[{step:0,weights:{reasoning:1.0,browse:0.0}},{step:1,weights:{reasoning:0.0,browse:1.0}}]"
    cfg = load_config(["policy=prorsa", "policy.initial=colocated", "workload=mix_reason_browse",
                       "workload.batch_size=2", f"workload.schedule={schedule}"])
    policy = instantiate(cfg.policy)
    run = run_info(ModeConfig("async", 3, max_in_flight=32, staleness=1), instantiate(cfg.workload, seed=0))
    policy.initial_roles(cluster_of([]), run)
    sample = policy._scheduled(policy.future_model(0.0, True), 0, 96, 0, np.random.default_rng(0))
    assert [ft.family for ft in sample] == ["reasoning"] * 32 + ["browse"] * 64
    assert [ft.trajectory_id for ft in sample] == list(range(96))
