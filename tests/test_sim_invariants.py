"""Simulator invariants: nothing lost, tokens conserved, causality, determinism, fast-forward exactness."""
import io

import numpy as np
import pandas as pd
import pytest

from tests.conftest import batches_of, scripts_of, simulate

POLICIES = [["policy=colocate"], ["policy=fixed_pd", "policy.num_prefill=3"]]
# A cluster squeezed for memory so that preemption and recomputation happen.
TIGHT = ["cluster.num_engines=3", "cluster.memory_fraction=0.25", "workload.context_cap=10000", "workload.prompt.high=8000",
         "workload.output.median=600"]


def check_invariants(scripts: list, df, rollout_time_s: float):
    """`scripts`: those the run replayed (tests.conftest.scripts_of); `df`: its lifecycle."""
    scripts = {s.trajectory_id: s for s in scripts}
    # No trajectory lost, each turn exactly once.
    assert set(scripts) == set(df["trajectory_id"])
    assert len(df) == sum(len(s.turns) for s in scripts.values())
    assert not df.duplicated(["trajectory_id", "turn"]).any()
    for row in df.itertuples():
        s = scripts[row.trajectory_id]
        # Tokens: each output token decoded once; each prompt token prefilled, cached or recomputed.
        assert row.output_tokens == s.turns[row.turn].output_tokens
        assert row.prompt_tokens == s.prompt_tokens(row.turn)
        assert row.new_tokens + row.cached_tokens - row.recomputed_tokens == row.prompt_tokens
        assert row.recomputed_tokens == 0 or row.preemptions > 0
    # Causality along each turn and across turns.
    order = ["t_ready", "t_prefill_start", "t_prefill_end", "t_transfer_end", "t_decode_start",
             "t_first_token", "t_decode_end", "t_tool_end"]
    times = df[order].to_numpy()
    assert not np.isnan(times).any()
    assert (np.diff(times, axis=1) >= -1e-12).all()
    df = df.sort_values(["trajectory_id", "turn"])
    nxt = df.groupby("trajectory_id")["t_ready"].shift(-1)
    has_next = nxt.notna()
    assert np.allclose(df.loc[has_next, "t_tool_end"], nxt[has_next])
    # The rollout ends with the last turn.
    assert rollout_time_s == pytest.approx(df["t_decode_end"].max())


@pytest.mark.parametrize("policy", POLICIES)
def test_invariants(small, policy):
    result, df, _ = simulate(small + policy)
    check_invariants(scripts_of(small + policy), df, result.rollout_time_s)
    pd_rows = df[df.engine_prefill != df.engine_decode]
    if "policy=fixed_pd" in policy:
        assert len(pd_rows) == len(df)
        assert (pd_rows.transferred_tokens <= pd_rows.prompt_tokens).all()
        assert (pd_rows.t_transfer_end >= pd_rows.t_prefill_end).all()   # equal: nothing to load
        moved = pd_rows[pd_rows.transferred_tokens > 0]
        assert len(moved) and (moved.t_transfer_end > moved.t_prefill_end).all()


@pytest.mark.parametrize("policy", [["policy=colocate"], ["policy=fixed_pd", "policy.num_prefill=1"],
                                    # whole-block KV transfers: a decode leg is preempted while it prefills the rest of its prompt
                                    ["policy=fixed_pd", "policy.num_prefill=1", "+cluster.kv_transfer_block_tokens=1024"]])
def test_invariants_under_preemption(small, policy):
    result, df, _ = simulate(small + policy + TIGHT)
    assert df.preemptions.sum() > 0, "the tight cluster is meant to force preemptions"
    check_invariants(scripts_of(small + policy + TIGHT), df, result.rollout_time_s)


def parquet_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def test_same_seed_same_bytes_other_seed_differs(small):
    a = parquet_bytes(simulate(small + ["policy=fixed_pd"])[1])
    b = parquet_bytes(simulate(small + ["policy=fixed_pd"])[1])
    c = parquet_bytes(simulate(small + ["policy=fixed_pd", "seed=1"])[1])
    assert a == b
    assert a != c


# Two attention ranks per engine, little KV memory and a second step: a leg arriving during a decode span
# picks its rank by the ranks' memory and prefix caches, which must be as stepping would leave them.
DP2 = ["cluster=cpu_small", "policy=fixed_pd", "policy.num_prefill=1", "workload.batch_size=2", "mode.num_steps=2",
       "workload.tool_output.median=40", "workload.context_cap=5000", "workload.prompt.high=3000",
       "cluster.memory_fraction=0.08", "cluster.gpus_per_engine=2", "cluster.parallelism.decode.dp=2",
       "cluster.parallelism.prefill.dp=2", "cluster.parallelism.colocated.dp=2", "cluster.max_num_batched_tokens=64"]


@pytest.mark.parametrize("extra", [["policy=colocate"], ["policy=fixed_pd"], ["policy=colocate", *TIGHT],
                                   ["policy=colocate", "cluster=moe_h200"],
                                   ["policy=fixed_pd", "+cluster.kv_transfer_block_tokens=128"], DP2])
def test_fast_forward_gives_the_same_lifecycle_as_token_by_token(small, extra):
    small = small + ["workload.batch_size=3", "mode.num_steps=1"]
    fast, df_fast, be_fast = simulate(small + extra + ["backend.fast_forward=true"])
    slow, df_slow, be_slow = simulate(small + extra + ["backend.fast_forward=false"])
    pd.testing.assert_frame_equal(df_fast, df_slow, check_exact=True)
    # ...and it is faster: fewer events for the same result.
    assert be_fast.loop.events_processed < be_slow.loop.events_processed


def test_sync_steps_and_async_bounds(small):
    result, df, _ = simulate(small + ["mode=sync"], keep_events=True)
    ends = df.groupby("step")["t_decode_end"].max()
    starts = df[df.turn == 0].groupby("step")["t_ready"].min()
    # Step k+1 is released when step k's last trajectory ends.
    assert starts[1] == pytest.approx(ends[0])
    assert result.rollout_time_s == pytest.approx((ends - starts).sum())

    result, df, _ = simulate(small + ["mode=async", "mode.max_in_flight=10", "mode.staleness=0"],
                             keep_events=True)
    batch = 6 * 4
    in_flight = completed = 0
    for e in result.events:
        if e.kind.value == "trajectory_start":
            in_flight += 1
            assert in_flight <= 10
            assert e.trajectory_id // batch <= completed // batch  # staleness 0
        elif e.kind.value == "trajectory_end":
            in_flight -= 1
            completed += 1
    assert completed == 2 * batch


@pytest.mark.parametrize("extra", [["policy=colocate"], ["policy=fixed_pd"], ["policy=prorsa"], ["policy=ppd"],
                                   ["policy=colocate", "mode=async", "mode.max_in_flight=8"],
                                   ["policy=fixed_pd", "cluster=moe_h200", "workload=search"],
                                   ["policy=colocate", "workload=tooluse", "workload.batch_size=4"],
                                   ["policy=fixed_pd", "cluster=moe_h200_sglang", "cluster.chunked_prefill_size=4096"]])
def test_no_run_beats_the_lower_bound(small, extra):
    from harness.metrics import lower_bound_s
    from tests.conftest import cluster_of
    overrides = small + extra
    result, _, _ = simulate(overrides)
    in_flight = 8 if "mode=async" in extra else 0
    bound = lower_bound_s(cluster_of(overrides), batches_of(overrides), "async" if in_flight else "sync", in_flight)
    assert 0 < bound <= result.rollout_time_s * (1 + 1e-9)


def test_the_bounds_prefill_rate_follows_the_engines_prefill_budget():
    """Under engine=sglang a rank prefills at most chunked_prefill_size tokens a step; vLLM's token budget
    (max_num_batched_tokens) is not read."""
    from harness.metrics import LowerBound
    from tests.conftest import cluster_of
    sglang = ["cluster=moe_h200_sglang", "cluster.chunked_prefill_size=4096"]
    rate = LowerBound(cluster_of(sglang)).prefill_rate
    assert LowerBound(cluster_of(sglang + ["cluster.max_num_batched_tokens=2048"])).prefill_rate == rate
    assert LowerBound(cluster_of(sglang[:1] + ["cluster.chunked_prefill_size=8192"])).prefill_rate != rate


def test_async_bound_counts_the_in_flight_slots(small):
    """One trajectory in flight at a time: the run is at least the sum of the trajectories' critical
    paths (each runs alone); with every trajectory in flight, the slot bound adds nothing."""
    from harness.metrics import LowerBound, lower_bound_s
    from tests.conftest import cluster_of
    overrides = small + ["policy=colocate", "mode=async", "mode.max_in_flight=1"]
    result, _, _ = simulate(overrides)
    cluster = cluster_of(overrides)
    batches = batches_of(overrides)
    paths = [LowerBound(cluster).critical_path(s) for batch in batches for s in batch]
    bound = lower_bound_s(cluster, batches, "async", 1)
    assert bound >= sum(paths) * (1 - 1e-12) and bound <= result.rollout_time_s * (1 + 1e-9)
    assert lower_bound_s(cluster, batches, "async", len(paths)) == lower_bound_s(cluster, batches, "async")


def test_turn_table_gives_the_records_in_trajectory_order_across_chunks(monkeypatch):
    """Trajectories end out of id order and fill several chunks: the table's columns are the records
    sorted by trajectory, turns in order, and write the same lifecycle bytes as the records would."""
    from operator import attrgetter

    from harness.trajectory import TURN_COLUMNS, TurnRecord, TurnTable
    monkeypatch.setattr(TurnTable, "CHUNK", 4)
    ended = {tid: [TurnRecord(tid, tid // 2, 1, f"family{tid % 2}", k, engine_prefill=k, t_ready=tid + k / 3,
                              t_decode_end=tid + k / 7, prompt_tokens=2**40 + k) for k in range(tid % 3 + 1)]
             for tid in (4, 0, 3, 1, 2)}
    table = TurnTable()
    for records in ended.values():
        table.append(records)
    assert len(table) == 9
    expected = pd.DataFrame([attrgetter(*TURN_COLUMNS)(r) for tid in sorted(ended) for r in ended[tid]],
                            columns=TURN_COLUMNS)
    got = pd.DataFrame(table.columns(), columns=TURN_COLUMNS)
    pd.testing.assert_frame_equal(got, expected)
    assert got.to_parquet(index=False) == expected.to_parquet(index=False)
    assert len(TurnTable().columns()["trajectory_id"]) == 0


def test_the_driver_drops_each_ended_trajectory_but_its_turns(small):
    """Memory stays flat over a long run: an ended trajectory's script and records leave the driver,
    its turns stay in the table (every scripted turn, once)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from harness.experiment import build_backend, mode_from_config, run_info
    from harness.rollout import RolloutDriver
    from tests.conftest import cluster_of, load_config
    overrides = small + ["policy=colocate", "mode=async", "mode.max_in_flight=8"]
    cfg = load_config(overrides)
    cluster, mode = cluster_of(overrides), mode_from_config(OmegaConf.to_container(cfg.mode, resolve=True))
    workload, policy = instantiate(cfg.workload, seed=cfg.seed), instantiate(cfg.policy)
    backend = build_backend(cfg, cluster, policy.initial_roles(cluster, run_info(mode, workload)))
    driver = RolloutDriver(workload, policy, backend, mode)
    in_flight = []
    backend.call_later(2.0, lambda: in_flight.append((len(driver.records), len(driver.scripts),
                                                      driver.started - driver.completed)))
    result = driver.run()
    assert in_flight and 0 < in_flight[0][0] == in_flight[0][1] == in_flight[0][2] <= 8
    assert driver.records == {} and driver.scripts == {} and driver.context == {}
    assert len(result.turns) == sum(len(s.turns) for s in scripts_of(overrides)) and result.trajectories == 48
