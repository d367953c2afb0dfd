"""Prorsa's cost at 1,000 trajectories in flight, reported by pytest-benchmark (never asserted against
wall time). Two parts, because they differ by four orders of magnitude:
  - the control tick (every `control_interval_s`, no plan due): observe, forecast bookkeeping;
  - a plan (every `replan_interval_s`, and at each sync step start): sample every live trajectory's
    future and run the simulator forward under each candidate allocation (what-if simulation).
`extra_info` of the plan has its cost spread over the control steps of one replan cycle (add the
tick for the mean control step) and its share of the replan interval (over 1: slower than real time).
"""
import numpy as np
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from harness.api import ClusterView, EngineState
from harness.api import EventKind as K
from harness.api import LifecycleEvent as E
from harness.experiment import run_info
from harness.rollout import ModeConfig
from tests.conftest import cluster_of, load_config

OVERRIDES = ["cluster=moe_h200", "policy=prorsa", "workload=mix"]   # the swe and search families


def policy_with_1000_in_flight():
    return policy_in_flight(1000, 8)


def policy_in_flight(in_flight: int, engines: int, plan_engines: int = 32, plan_per_engine: int | None = None,
                     *more: str):
    """Prorsa with `in_flight` live trajectories on `engines` engines of moe_h200 (4 GPUs each); its plans
    thinned to `plan_per_engine` trajectories per engine where they may be (None: every one)."""
    overrides = [*OVERRIDES, f"cluster.num_engines={engines}", f"policy.plan_engines={plan_engines}",
                 f"policy.plan_per_engine={'null' if plan_per_engine is None else plan_per_engine}", *more]
    cfg = load_config(overrides)
    policy = instantiate(cfg.policy)
    cluster = cluster_of(overrides)
    mode = ModeConfig(**OmegaConf.to_container(cfg.mode, resolve=True))
    roles = policy.initial_roles(cluster, run_info(mode, instantiate(cfg.workload, seed=cfg.seed)))
    rng = np.random.default_rng(0)
    now = 100.0
    for tid in range(in_flight):
        fam = ["swe", "search"][tid // engines % 2]   # every engine holds both families, as a router mixes them
        policy.observe(E(K.TRAJECTORY_START, 0.0, tid, 0, detail=fam))
        t = 0.0
        for turn in range(int(rng.integers(1, 6))):   # past turns give the online models data
            policy.observe(E(K.TURN_READY, t, tid, turn, tokens=int(rng.integers(100, 3000))))
            policy.observe(E(K.PREFILL_START, t, tid, turn))
            policy.observe(E(K.PREFILL_END, t + 0.1, tid, turn, engine_id=tid % engines))
            policy.observe(E(K.DECODE_START, t + 0.1, tid, turn, engine_id=tid % engines))
            policy.observe(E(K.FIRST_TOKEN, t + 0.2, tid, turn, engine_id=tid % engines))
            out = int(rng.integers(50, 800))
            policy.observe(E(K.DECODE_END, t + 0.2 + out * 0.02, tid, turn, engine_id=tid % engines, tokens=out))
            t += 0.2 + out * 0.02 + float(rng.exponential(2.0))
            policy.observe(E(K.TOOL_END, t, tid, turn, tokens=int(rng.integers(50, 2000))))
        phase = tid % 3   # a third each: in a tool call, queued, decoding
        if phase:
            policy.observe(E(K.TURN_READY, now - 1, tid, turn + 1, tokens=500))
        if phase == 2:
            policy.observe(E(K.PREFILL_START, now - 1, tid, turn + 1))
            policy.observe(E(K.DECODE_START, now - 0.5, tid, turn + 1, engine_id=tid % engines))
    engines = [EngineState(engine_id=i, role=r, available=True, gpus=4, waiting_requests=10,
                           waiting_prefill_tokens=20000, running_requests=100, decoding_requests=90,
                           kv_used_tokens=500000, kv_capacity_tokens=2000000) for i, r in enumerate(roles)]
    return policy, ClusterView(now=now, engines=engines)


def test_control_tick_at_1000_trajectories(benchmark):
    policy, view = policy_with_1000_in_flight()
    assert len(policy.tracker.live) == 1000
    policy._next_plan = view.now + policy.replan_interval_s    # no plan due: the tick alone
    assert benchmark(policy.plan, view) is None


def test_plan_at_1000_trajectories(benchmark):
    plan_benchmark(benchmark, *policy_with_1000_in_flight())


# async RL with 1,000 in flight and as many to start: a plan scored by the mean end, which thins
ASYNC = ["mode=async", "mode.max_in_flight=1000", "mode.num_steps=16"]


@pytest.mark.parametrize("plan_per_engine", [None, 8])
def test_async_plan_at_1000_trajectories(benchmark, plan_per_engine):
    """An async plan at 1,000 in flight and 1,000 to start: every trajectory, then thinned (8 per engine
    asks for one in 15; a rank holds mix's longest context 11 times, so one in 11)."""
    plan_benchmark(benchmark, *policy_in_flight(1000, 8, 32, plan_per_engine, *ASYNC), rounds=1)


@pytest.mark.large
@pytest.mark.parametrize("in_flight, engines, plan_engines", [(4000, 32, 32), (4000, 32, 8), (16384, 256, 256),
                                                             (16384, 256, 32), (16384, 256, 8)])
def test_plan_at_scale(benchmark, in_flight, engines, plan_engines):
    """4,000 in flight on 128 GPUs and 16,384 on 1,024 (the per-engine load of the 1,000-in-flight case,
    then half of it): a plan's cost as the cluster grows; beyond `policy.plan_engines` a plan simulates
    a slice of that many engines (harness/prorsa/slice.py)."""
    plan_benchmark(benchmark, *policy_in_flight(in_flight, engines, plan_engines), rounds=1)


@pytest.mark.large
@pytest.mark.parametrize("in_flight, engines, plan_engines, plan_per_engine",
                         [(16384, 256, 32, None), (16384, 256, 32, 8), (16384, 256, 8, 8)])
def test_async_plan_at_scale(benchmark, in_flight, engines, plan_engines, plan_per_engine):
    """An async plan at 16,384 in flight on 1,024 GPUs: on a slice, and thinned too."""
    # 64 steps: the rolling set is not the run's rest, so the plan scores the mean end and thins
    more = ["mode=async", f"mode.max_in_flight={in_flight}", "mode.num_steps=64", "workload.batch_size=256"]
    policy, view = policy_in_flight(in_flight, engines, plan_engines, plan_per_engine, *more)
    plan_benchmark(benchmark, policy, view, rounds=1)
    assert (policy.weight > 1) == (plan_per_engine is not None)


def plan_benchmark(benchmark, policy, view, rounds: int = 3):
    policy._last_switch = -1e9

    def due():
        policy._next_plan = 0.0
        return (view,), {}
    events = policy.planner.whatif.events
    benchmark.pedantic(policy.plan, setup=due, rounds=rounds, iterations=1)
    events = (policy.planner.whatif.events - events) / rounds    # one plan's what-if events
    fc = policy.forecast_log.history[-1]
    assert fc.decode_seqs[0] > 0 and fc.prefill_tokens.sum() > 0
    if benchmark.stats:
        plan = benchmark.stats.stats.mean
        benchmark.extra_info["plan_per_control_step_s"] = plan * policy.control_interval_s / policy.replan_interval_s
        benchmark.extra_info["plan_over_replan_interval"] = plan / policy.replan_interval_s
        # the rate behind `policy.plan_events_per_s` (plan_latency=model)
        benchmark.extra_info["whatif_events_per_s"] = events / plan
        benchmark.extra_info["whatif_events"] = events
        benchmark.extra_info["weight"] = policy.weight   # each simulated trajectory stands for this many
