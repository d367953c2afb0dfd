"""Engine step semantics (vLLM decode-first vs SGLang prefill-first), CUDA-graph limits, the
weight-update prefix flush and forks: known answers computed by hand on a unit cost model.

UnitCost: a rank's step takes 1 s if it decodes (any batch) plus 1 ms per prefill token; the engine's
step is its slowest rank's (DP attention: every rank waits for the others); an eager (no CUDA graph)
decode step adds 0.5 s.

The case (one engine, two DP ranks): A (prompt 100, 5 output tokens) and C (prompt 50, 5 tokens)
arrive at t=0 and land on ranks 0 and 1; B (prompt 2000, 2 tokens) arrives at t=0.05 and lands on
rank 1 (less KV there). Step 1 prefills A and C (0.1 s); from t=0.1:
  vLLM:   step 2 = rank 1 decodes C and prefills B: 1 + 2 = 3 s (rank 0's decode of A waits for it);
          then 1 s decode steps: B ends at 4.1 (its 2nd token), A and C at 6.1.
  SGLang: step 2 = rank 1 prefills B alone (2 s; C pauses), rank 0 decodes A in the stretched step;
          B ends at 3.1, A at 5.1, C (one step behind) at 6.1.
  SGLang --enable-mixed-chunk, chunked_prefill_size 1001: B is prefilled in two 1000-token chunks
          alongside C's decode (2 s each): B ends at 5.1, A and C at 6.1.
  SGLang, cuda_graph_max_bs=1: step 3 (rank 1 decodes C and B) is eager: +0.5 s; B ends at 3.6,
          A at 5.6, C at 6.6.
"""
from __future__ import annotations

import numpy as np
import pytest

from harness.api import EventKind, Role, Route, TurnRequest
from harness.perf.roofline import RankBatch
from harness.sim.backend import SimBackend
from tests.conftest import cluster_of

TWO_RANKS = ["cluster=moe_h200", "cluster.num_engines=1", "cluster.gpus_per_engine=2",
             "cluster.parallelism.colocated={tp:1,dp:2,ep:true}", "cluster.parallelism.prefill={tp:2,dp:1,ep:false}",
             "cluster.parallelism.decode={tp:1,dp:2,ep:true}"]


class UnitCost:
    def kv_capacity_tokens(self, memory_fraction, activation_reserve_bytes) -> int:
        return 100_000

    @staticmethod
    def _rank(b: RankBatch) -> float:
        return (1.0 if b.decode_seqs else 0.0) + 1e-3 * b.prefill_tokens

    def step_time(self, ranks: list[RankBatch], graph: bool = True) -> float:
        eager = not graph and not any(r.prefill_tokens for r in ranks)   # a prefill step is eager anyway
        return max(self._rank(r) for r in ranks) + (0.5 if eager else 0.0)

    def decode_step_times(self, seqs, ctx, steps: int, graph: bool = True) -> np.ndarray:
        return np.full(steps, (1.0 if seqs.max() > 0 else 0.0) + (0.0 if graph else 0.5))

    # the list forms of the CostModel interface (harness/perf/cost_model.py), from the two above
    def mixed_step_time(self, seqs, ctx, prefill, graph: bool = True) -> float:
        batches = [RankBatch(decode_seqs=n, decode_ctx=c, requests=n) for n, c in zip(seqs, ctx)]
        for rank, tokens, _, _, _ in prefill:
            batches[rank].prefill_tokens = tokens
        return self.step_time(batches, graph)

    def decode_step_time(self, seqs, ctx, graph: bool = True) -> float:
        return float(self.decode_step_times(np.array(seqs), np.array(ctx), 1, graph)[0])

    def decode_span_ends(self, seqs, ctx, steps: int, graph: bool, start: float) -> list[float]:
        return (start + np.cumsum(self.decode_step_times(np.array(seqs), np.array(ctx), steps, graph))).tolist()


class UnitBackend(SimBackend):
    def cost_model(self, par):
        return UnitCost()


def request(tid: int, prompt: int, output: int) -> TurnRequest:
    return TurnRequest(trajectory_id=tid, group_id=tid, turn=0, family="f", prompt_tokens=prompt,
                       appended_tokens=prompt, max_output_tokens=output, output_tokens=output)


def run_case(overrides: list[str], fast_forward: bool = True) -> dict[int, float]:
    """Decode end time of A (0), B (1), C (2)."""
    cluster = cluster_of(TWO_RANKS + overrides)
    backend = UnitBackend(cluster, [Role.COLOCATED], fast_forward=fast_forward)
    ends: dict[int, float] = {}

    def on_event(e):
        if e.kind == EventKind.DECODE_END:
            ends[e.trajectory_id] = e.t
    backend.set_listener(on_event, lambda r: None)
    backend.submit(request(0, 100, 5), Route(0, 0))
    backend.submit(request(2, 50, 5), Route(0, 0))
    backend.loop.at(0.05, lambda: backend.submit(request(1, 2000, 2), Route(0, 0)))
    backend.run()
    return ends


@pytest.mark.parametrize("fast_forward", [True, False])
def test_vllm_decode_first(fast_forward):
    ends = run_case([], fast_forward)
    assert ends == pytest.approx({0: 6.1, 1: 4.1, 2: 6.1})


@pytest.mark.parametrize("fast_forward", [True, False])
def test_sglang_prefill_first_stalls_the_ranks_decodes(fast_forward):
    ends = run_case(["cluster.engine=sglang"], fast_forward)
    assert ends == pytest.approx({0: 5.1, 1: 3.1, 2: 6.1})


def test_sglang_mixed_chunk():
    ends = run_case(["cluster.engine=sglang", "cluster.enable_mixed_chunk=true", "cluster.chunked_prefill_size=1001"])
    assert ends == pytest.approx({0: 6.1, 1: 5.1, 2: 6.1})


def test_sglang_cuda_graph_limit():
    ends = run_case(["cluster.engine=sglang", "cluster.cuda_graph_max_bs=1"])
    assert ends == pytest.approx({0: 5.6, 1: 3.6, 2: 6.6})


@pytest.mark.parametrize("override,allowed", [
    ("cluster.engine=tgi", "vllm, sglang"),
    ("cluster.chunked_prefill_size=0", "an integer >= 1"),
    ("++cluster.prefix_cache_block_tokens=0", "an integer >= 1"),
    ("cluster.switch_mechanism=teleport", "kv_both, drain, reshard"),
    ("cluster.cuda_graph_max_bs=-1", "an integer >= 0"),
])
def test_bad_engine_options(override, allowed):
    with pytest.raises(ValueError) as err:
        cluster_of([override])
    key = override.split("=")[0].lstrip("+")
    assert key in str(err.value) and allowed in str(err.value)


# --- forks ----------------------------------------------------------------------------------------
FORK_CASES = [
    ["policy=fixed_pd", "mode=sync"],
    ["policy=prorsa", "mode=async", "cluster=moe_h200", "mode.max_in_flight=12"],
    ["policy=colocate", "mode=async", "mode.max_in_flight=12", "cluster.engine=sglang"],
]


@pytest.mark.parametrize("overrides", FORK_CASES)
def test_fork_continues_exactly_as_the_original(overrides):
    """A fork taken mid-run and run to the end gives the original's lifecycle, and running it leaves
    the original untouched (the original then finishes with the same lifecycle too)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from harness.cluster import cluster_from_config
    from harness.experiment import build_backend, lifecycle_frame
    from harness.rollout import ModeConfig, RolloutDriver
    from harness.timeseries import ClusterSampler
    from harness.experiment import run_info
    from tests.conftest import SMALL, load_config

    def build():
        cfg = load_config(SMALL + overrides)
        cluster = cluster_from_config(OmegaConf.to_container(cfg.cluster, resolve=True))
        mode = ModeConfig(**OmegaConf.to_container(cfg.mode, resolve=True))
        workload = instantiate(cfg.workload, seed=cfg.seed)
        policy = instantiate(cfg.policy)
        backend = build_backend(cfg, cluster, policy.initial_roles(cluster, run_info(mode, workload)))
        driver = RolloutDriver(workload, policy, backend, mode)
        sampler = ClusterSampler(backend, lambda: (driver.completed, driver.total), 1.0, listeners=[lambda s: None])   # an observer: stays behind
        sampler.start()
        return driver, backend

    driver, _ = build()
    whole = lifecycle_frame(driver.run())
    t_mid = float(whole["t_decode_end"].median())
    driver, backend = build()
    forks = []
    backend.loop.at(t_mid, lambda: forks.append(driver.fork()))
    original = lifecycle_frame(driver.run())
    (fork,) = forks
    assert fork.backend is not backend and fork.policy is not driver.policy
    continued = lifecycle_frame(fork.resume())
    import pandas as pd
    pd.testing.assert_frame_equal(continued, whole, check_exact=True)
    pd.testing.assert_frame_equal(original, whole, check_exact=True)
    with pytest.raises(ValueError, match="backend.fork"):
        driver.fork()


def second_turn_cached(overrides: list[str], update: bool = False) -> list[int]:
    """Cached tokens at each turn's prefill: turn 0 (prompt 100, 2 tokens) leaves 101 tokens of KV
    cached (the last sampled token has none), turn 1 (prompt 152) follows, after a weight update if
    `update`."""
    backend = UnitBackend(cluster_of(TWO_RANKS + overrides), [Role.COLOCATED])
    hits = []
    backend.set_listener(lambda e: hits.append(e.tokens) if e.kind == EventKind.PREFILL_START else None,
                         lambda r: None)
    backend.submit(request(0, 100, 2), Route(0, 0))
    backend.run()
    if update:
        backend.update_weights()
    backend.submit(TurnRequest(trajectory_id=0, group_id=0, turn=1, family="f", prompt_tokens=152,
                               appended_tokens=52, max_output_tokens=2, output_tokens=2), Route(0, 0))
    backend.run()
    return hits


@pytest.mark.parametrize("flush,update,cached", [(True, False, 101), (True, True, 0), (False, True, 101)])
def test_weight_update_flushes_the_prefix_cache(flush, update, cached):
    """Turn 1 reuses turn 0's 101 tokens unless a weight update flushed the cache in between."""
    flag = f"cluster.flush_prefix_cache_on_weight_update={str(flush).lower()}"
    assert second_turn_cached([flag], update) == [0, cached]


@pytest.mark.parametrize("block,cached", [(1, 101), (16, 96), (128, 0)])
def test_prefix_cache_hits_whole_blocks(block, cached):
    """Turn 1 hits turn 0's 101 cached tokens in whole blocks, as vLLM does (16-token blocks: 96;
    128-token blocks, vLLM's CPU size: none)."""
    assert second_turn_cached([f"++cluster.prefix_cache_block_tokens={block}"]) == [0, cached]


@pytest.mark.parametrize("mechanism,end", [("kv_both", 0.05 + 0.25), ("drain", 4.1 + 6.0), ("reshard", 4.1 + 60.0)])
def test_switch_mechanisms_price(mechanism, end):
    """Engine 0 decodes A (prompt 100, 5 tokens: prefill 0.1 s, then 1-s steps: done at 4.1 s) when it is
    asked at t=0.05 to become a prefill engine. kv_both: the router update (0.25 s here, from 0.05 s), A runs on;
    drain: A finishes, then the switch time (6 s); reshard: the parallelism changes (60 s)."""
    cluster = cluster_of(TWO_RANKS + ["cluster.num_engines=2", f"cluster.switch_mechanism={mechanism}",
                                      "cluster.router_update_s=0.25"])
    backend = UnitBackend(cluster, [Role.DECODE, Role.DECODE])
    switched, ends = [], {}
    backend.set_listener(lambda e: switched.append(e.t) if e.kind == EventKind.ROLE_SWITCH_END else
                         ends.update({e.trajectory_id: e.t}) if e.kind == EventKind.DECODE_END else None,
                         lambda r: None)
    backend.submit(request(0, 100, 5), Route(0, 0))
    backend.loop.at(0.05, lambda: backend.switch_role(0, Role.PREFILL))
    backend.run()
    assert switched == [pytest.approx(end)] and ends == {0: pytest.approx(4.1)}
    assert backend.engines[0].role == Role.PREFILL
    assert backend.engines[0].par == cluster.parallelism[Role.PREFILL if mechanism == "reshard" else Role.DECODE]
    # the view says which parallelism it runs with, and a backend built from the present roles and that
    # (a what-if) gets the same engine
    launched = backend.view().engines[0].launched_as
    assert launched == (Role.PREFILL if mechanism == "reshard" else Role.DECODE)
    again = UnitBackend(cluster, [Role.PREFILL, Role.DECODE], launched_as=[launched, Role.DECODE])
    assert again.engines[0].par == backend.engines[0].par and again.engines[0].role == Role.PREFILL


@pytest.mark.parametrize("fast_forward", [True, False])
def test_generated_tokens_as_a_streaming_client_counts_them(fast_forward):
    """A (prompt 100, 50 tokens) alone: its prefill step ends at 0.1 s with its first token, then one
    1 s decode step per token (one span when fast-forwarding). The view counts what has been generated
    at any instant, inside a span too: 1 + 10 tokens at 10.6 s, 1 + 48 at 48.6 s; nothing once it ends."""
    backend = UnitBackend(cluster_of(TWO_RANKS), [Role.COLOCATED], fast_forward=fast_forward)
    backend.set_listener(lambda e: None, lambda r: None)
    backend.submit(request(0, 100, 50), Route(0, 0))
    seen = {}
    for t in (0.05, 10.6, 48.6, 60.0):
        backend.loop.at(t, lambda t=t: seen.__setitem__(t, backend.view().generated_tokens()), observer=True)
    backend.run()
    assert seen == {0.05: {}, 10.6: {0: 11}, 48.6: {0: 49}, 60.0: {}}


@pytest.mark.parametrize("fast_forward", [True, False])
@pytest.mark.parametrize("migrate", [False, True])
def test_a_decode_moves_off_an_engine_turned_prefill_engine(migrate, fast_forward):
    """kv_both, engines 0 and 1 decode engines. A (prompt 100, 5 tokens) runs colocated on engine 0:
    prefill to 0.1 s (first token), then 1-s decode steps. At 1.5 s engine 0 is asked to become a prefill
    engine; the router update takes 0.25 s. Without migration A ends on engine 0 at 4.1 s. With it, the
    step under way ends at 2.1 s (3 tokens); A leaves with its 102 tokens of KV (prompt + 3 - 1: the last
    sampled token has none), which reach engine 1 after setup + 102 x KV bytes / NIC rate, T; there its
    two last tokens take a step each: it ends at 4.1 + T on engine 1, with 5 output tokens, and engine 0
    holds none of its KV."""
    cluster = cluster_of(TWO_RANKS + ["cluster.num_engines=2", "cluster.switch_mechanism=kv_both",
                                      "cluster.router_update_s=0.25",
                                      f"cluster.migrate_decodes_on_switch={str(migrate).lower()}"])
    backend = UnitBackend(cluster, [Role.DECODE, Role.DECODE], fast_forward=fast_forward)
    events = []
    backend.set_listener(events.append, lambda r: None)
    backend.submit(request(0, 100, 5), Route(0, 0))
    backend.loop.at(1.5, lambda: backend.switch_role(0, Role.PREFILL))
    backend.run()
    end = next(e for e in events if e.kind == EventKind.DECODE_END)
    moved = [e for e in events if e.kind == EventKind.DECODE_MIGRATED]
    assert end.tokens == 5
    assert sum(e.kind == EventKind.FIRST_TOKEN for e in events) == 1
    if not migrate:
        assert (end.t, end.engine_id, moved) == (pytest.approx(4.1), 0, [])
        return
    t = cluster.kv_transfer_setup_s + 102 * cluster.model.kv_bytes_per_token / backend.links.bw
    assert [(e.t, e.engine_id, e.tokens, e.extra_tokens) for e in moved] == [(pytest.approx(2.1), 1, 102, 3)]
    assert (end.t, end.engine_id) == (pytest.approx(4.1 + t), 1)
    assert backend.engines[0].scheduler.totals()[4] == 0     # no KV in use on engine 0
    assert not any(e.kind == EventKind.TRANSFER_END for e in events)   # the move is reported as such


def test_a_decode_leg_bound_for_an_engine_turned_prefill_engine_goes_to_a_decode_engine():
    """Engine 0 prefills B (prompt 2000: 2 s) for engine 1; at 0.5 s engine 1 becomes a prefill engine
    (kv_both, instant), engine 2 stays a decode engine. With migration B's decode leg goes to engine 2
    when the prefill ends, and pulls its 2,000 KV tokens from engine 0 (TRANSFER_END on engine 2)."""
    cluster = cluster_of(TWO_RANKS + ["cluster.num_engines=3", "cluster.switch_mechanism=kv_both",
                                      "cluster.router_update_s=0", "cluster.migrate_decodes_on_switch=true"])
    backend = UnitBackend(cluster, [Role.PREFILL, Role.DECODE, Role.DECODE])
    events = []
    backend.set_listener(events.append, lambda r: None)
    backend.submit(request(1, 2000, 3), Route(0, 1))
    backend.loop.at(0.5, lambda: backend.switch_role(1, Role.PREFILL))
    backend.run()
    kinds = {e.kind: e for e in events}
    assert (kinds[EventKind.DECODE_MIGRATED].engine_id, kinds[EventKind.DECODE_MIGRATED].tokens) == (2, 0)
    assert (kinds[EventKind.TRANSFER_END].engine_id, kinds[EventKind.TRANSFER_END].tokens) == (2, 2000)
    assert (kinds[EventKind.DECODE_END].engine_id, kinds[EventKind.DECODE_END].tokens) == (2, 3)


def test_migration_needs_kv_both():
    with pytest.raises(ValueError, match="migrate_decodes_on_switch.*kv_both"):
        cluster_of(TWO_RANKS + ["cluster.switch_mechanism=drain", "cluster.migrate_decodes_on_switch=true"])


# --- engines sharing a host (cluster.contended_profile) ----------------------------------------------
def _profile(path, prefill_s: float, decode_s: float) -> str:
    """A profile file, written as calibration writes one, whose fit is a constant step time: `prefill_s`
    for a step with prefill, `decode_s` for a decode step (harness/perf/profiled.py: the intercepts;
    every slope fits to 0)."""
    from harness.calibrate import StepMeasurement, profile_from_measurements, write_profile
    ms = [StepMeasurement(prefill_s, prefill_new=n, prefill_cached=c) for n in (64, 256, 1024) for c in (0, 512)]
    ms += [StepMeasurement(decode_s, decode_batch=b, decode_context=x) for b in (1, 4) for x in (128, 1024)]
    write_profile(path, profile_from_measurements(ms))
    return str(path)


@pytest.mark.parametrize("b_at,ends", [
    # B arrives while A prefills: A's prefill (started alone) keeps 0.1 s, B's takes 0.2 (A runs); A's
    # 10 decode steps run beside B: 0.02 each, A ends at 0.30. B decodes from 0.25 at 0.02 a step until
    # A stops: its step under way then ends at 0.31, the other 7 at 0.01: 0.38.
    (0.05, {0: 0.30, 1: 0.38}),
    # B arrives at 0.125, during A's third decode step (0.12-0.13): A's span ends there, its 7 other
    # steps take 0.02 (B prefills, 0.2 s, to 0.325): A ends at 0.27; B then decodes alone: 0.425.
    (0.125, {0: 0.27, 1: 0.425}),
])
def test_engines_sharing_a_host_slow_each_other(tmp_path, b_at, ends):
    """Two colocated engines on one host; alone a prefill step takes 0.1 s and a decode step 0.01 s,
    while the other engine runs a step 0.2 and 0.02 s. A (prompt 100, 11 tokens: a prefill, then 10
    decode steps) on engine 0 at t=0, B (the same) on engine 1 at `b_at`. Without the contended
    profile, A ends at 0.2 and B at b_at + 0.2."""
    alone = _profile(tmp_path / "alone.json", 0.1, 0.01)
    both = _profile(tmp_path / "both.json", 0.2, 0.02)
    base = ["cluster=cpu_small", "cluster.cost_model=profiled", f"cluster.profile={alone}"]
    for overrides, expected in ((base, {0: 0.2, 1: b_at + 0.2}),
                                (base + [f"++cluster.contended_profile={both}"], ends)):
        backend = SimBackend(cluster_of(overrides), [Role.COLOCATED, Role.COLOCATED])
        got: dict[int, float] = {}
        backend.set_listener(lambda e: got.update({e.trajectory_id: e.t}) if e.kind == EventKind.DECODE_END else None,
                             lambda r: None)
        backend.submit(request(0, 100, 11), Route(0, 0))
        backend.loop.at(b_at, lambda: backend.submit(request(1, 100, 11), Route(1, 1)))
        backend.run()
        assert got == pytest.approx(expected)


@pytest.mark.parametrize("overrides,allowed", [
    (["++cluster.contended_profile=results/calibration/vllm_cpu_contended.json"], "cluster.cost_model=profiled"),
    (["cluster.cost_model=profiled", "cluster.profile=results/calibration/vllm_cpu_stream.json",
      "++cluster.contended_profile=missing.json"], "an existing profile file"),
])
def test_bad_contended_profile(overrides, allowed):
    with pytest.raises(ValueError) as err:
        cluster_of(["cluster=cpu_small", *overrides])
    assert "cluster.contended_profile" in str(err.value) and allowed in str(err.value)


# --- the host path (cluster.host_path) ---------------------------------------------------------------
HOST = {"idle": [0.5], "other server": [0.25], "own server": [0.125], "both servers": [0.0625]}


def _host_profile(path, host: dict | None = HOST) -> str:
    """`_profile`'s constant steps (prefill 0.1 s, decode 0.01 s) with host-path samples `host`."""
    import json
    _profile(path, 0.1, 0.01)
    p = json.loads(path.read_text())
    if host is not None:
        p["host_path_fit"] = host
    path.write_text(json.dumps(p))
    return str(path)


def _decode_ends(overrides: list[str], roles: list[Role], legs: list[tuple[float, int, Route]]) -> dict[int, float]:
    backend = SimBackend(cluster_of(overrides), roles)
    got: dict[int, float] = {}
    backend.set_listener(lambda e: got.update({e.trajectory_id: e.t}) if e.kind == EventKind.DECODE_END else None,
                         lambda r: None)
    for at, tid, route in legs:
        backend.loop.at(at, lambda tid=tid, route=route: backend.submit(request(tid, 100, 11), route))
    backend.run()
    return got


def test_the_host_path_delays_each_leg_by_the_load_it_meets(tmp_path):
    """Colocated: A on engine 0 at 0 meets an idle host (0.5 s), then a prefill (0.1) and 10 decode
    steps (0.01 each): 0.7. B on engine 1 at 0.55 meets A's engine running (0.25): it reaches its engine at
    0.8 and ends at 1.0. Without the host path: 0.2 and 0.75."""
    base = ["cluster=cpu_small", "cluster.cost_model=profiled", f"cluster.profile={_host_profile(tmp_path / 'p.json')}"]
    legs = [(0.0, 0, Route(0, 0)), (0.55, 1, Route(1, 1))]
    assert _decode_ends(base, [Role.COLOCATED] * 2, legs) == pytest.approx({0: 0.2, 1: 0.75})
    assert _decode_ends(base + ["++cluster.host_path=true"], [Role.COLOCATED] * 2, legs) == pytest.approx({0: 0.7, 1: 1.0})


def test_a_disaggregated_turn_pays_the_host_path_on_both_legs(tmp_path):
    """1P1D: the prefill leg meets an idle host (0.5 s); the decode leg is handed off as the prefill engine
    ends its step (still running it: "other server", 0.25 s). Every other time is the same with and
    without the host path, so the turn ends 0.75 s later."""
    base = ["cluster=cpu_small", "cluster.cost_model=profiled", f"cluster.profile={_host_profile(tmp_path / 'p.json')}"]
    roles, legs = [Role.PREFILL, Role.DECODE], [(0.0, 0, Route(0, 1))]
    without = _decode_ends(base, roles, legs)[0]
    assert _decode_ends(base + ["++cluster.host_path=true"], roles, legs)[0] == pytest.approx(without + 0.75)


def test_the_host_path_fit_takes_off_what_the_simulator_charges():
    """Each probe's gap less the API server's idle time and, where server 0 decodes, half its streams'
    inter-token time; never below 0."""
    from harness.calibrate import fit_host_path
    rows = [{"load": "idle", "gaps_s": [0.004, 0.006], "stream_itl_p50_s": None},
            {"load": "other server", "gaps_s": [0.02], "stream_itl_p50_s": 0.02},
            {"load": "own server", "gaps_s": [0.02, 0.1], "stream_itl_p50_s": 0.02},
            {"load": "both servers", "gaps_s": [0.03], "stream_itl_p50_s": 0.04}]
    fit = fit_host_path(rows, 0.005)
    assert fit == {"idle": pytest.approx([0.0, 0.001]), "other server": pytest.approx([0.015]),
                   "own server": pytest.approx([0.005, 0.085]), "both servers": pytest.approx([0.005])}
    assert fit_host_path([{k: v for k, v in r.items() if k != "gaps_s"} for r in rows], 0.005) is None


@pytest.mark.parametrize("host,more,allowed", [
    (HOST, [], None),
    (HOST, ["cluster.cost_model=roofline"], "cluster.cost_model=profiled"),
    (None, [], "host-path samples"),
    ({"idle": [0.1]}, [], "host_path_fit maps each of idle, other server, own server, both servers"),
    ({**HOST, "idle": [-1.0]}, [], "a non-empty list of seconds"),
])
def test_bad_host_path(tmp_path, host, more, allowed):
    overrides = ["cluster=cpu_small", "cluster.cost_model=profiled",
                 f"cluster.profile={_host_profile(tmp_path / 'p.json', host)}", "++cluster.host_path=true", *more]
    if allowed is None:
        assert cluster_of(overrides).host_path
        return
    with pytest.raises(ValueError) as err:
        cluster_of(overrides)
    assert allowed in str(err.value) and ("cluster.host_path" in str(err.value) or "cluster.profile" in str(err.value))
