"""Trace replay and export: the JSONL format round-trips; malformed lines are named precisely."""
from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from harness.api import LogNormalPrior
from workloads.base import fit_lognormal
from workloads.llmservingsim import import_sessions
from workloads.trace import TraceError, TraceWorkload, export_trace, read_trace

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def build(name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="config", overrides=[f"workload={name}", *overrides])
    return instantiate(cfg.workload, seed=cfg.seed)


GOOD = {"group": 0, "family": "swe", "turns": [
    {"new_tokens": 100, "output_tokens": 20, "tool_latency_s": 1.5, "tool_output_tokens": 30},
    {"new_tokens": 30, "output_tokens": 10, "tool_latency_s": 0.0, "tool_output_tokens": 0}]}


def write_lines(path: Path, lines: list) -> Path:
    path.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines))
    return path


@pytest.mark.parametrize("name", ["swe", "tooluse", "mix"])
def test_export_then_replay_round_trips(tmp_path, name):
    w = build(name)
    path = tmp_path / "t.jsonl"
    assert export_trace(w, 2, path) == 2 * w.batch_size * w.group_size
    replay = build("trace", f"workload.path={path}", f"workload.batch_size={w.batch_size}")
    assert replay.group_size == w.group_size
    for step in range(2):
        assert replay.batch(step) == w.batch(step)


def test_replay_wraps_around_with_unique_ids(tmp_path):
    lines = [dict(GOOD, group=g) for g in ("a", "a", "b", "b", "c", "c")]
    w = TraceWorkload(path=str(write_lines(tmp_path / "t.jsonl", lines)), batch_size=2)
    assert (w.batch_size, w.group_size) == (2, 2)
    scripts = [s for step in range(4) for s in w.batch(step)]
    assert len({s.trajectory_id for s in scripts}) == 16 and len({s.group_id for s in scripts}) == 8
    whole = TraceWorkload(path=str(tmp_path / "t.jsonl"))
    assert whole.batch_size == 3


def test_last_turn_tool_fields_are_ignored(tmp_path):
    w = TraceWorkload(path=str(write_lines(tmp_path / "t.jsonl", [GOOD])))
    assert w.batch(0)[0].turns[-1].tool_latency_s == 0.0


def bad(turn1: dict | None = None, **top) -> dict:
    line = json.loads(json.dumps(GOOD))
    line.update(top)
    if turn1 is not None:
        line["turns"][1] = turn1
    return line


def drop(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


T1 = GOOD["turns"][1]


@pytest.mark.parametrize("line, field", [
    (drop(GOOD, "family"), "family"),                                   # missing field
    (drop(GOOD, "group"), "group"),
    (bad(drop(T1, "output_tokens")), "turns[1].output_tokens"),
    (bad(dict(T1, output_tokens=-5)), "turns[1].output_tokens"),        # negative length
    (bad(dict(T1, tool_output_tokens=-1)), "turns[1].tool_output_tokens"),
    (bad(dict(T1, tool_latency_s=-0.1)), "turns[1].tool_latency_s"),
    (bad(dict(T1, output_tokens="10")), "turns[1].output_tokens"),      # wrong type
    (bad(dict(T1, output_tokens=1.5)), "turns[1].output_tokens"),
    (bad(dict(T1, new_tokens=True)), "turns[1].new_tokens"),
    (bad(group=[1]), "group"),
    (bad(turns=[]), "turns"),
    (bad(dict(T1, new_tokens=31)), "turns[1].new_tokens"),             # not the previous tool output
    (bad(dict(T1, new_token=30)), "turns[1].new_token"),               # misspelt (unknown) field
    (bad(famly="x"), "famly"),
])
def test_malformed_line_names_file_line_and_field(tmp_path, line, field):
    path = write_lines(tmp_path / "bad.jsonl", [GOOD, dict(GOOD, group=1), "", line])
    with pytest.raises(TraceError) as e:
        TraceWorkload(path=str(path))
    msg = str(e.value)
    assert f"{path}:4:" in msg and f"'{field}'" in msg, msg


def test_invalid_json_and_unequal_groups_are_rejected_before_replay(tmp_path):
    path = write_lines(tmp_path / "bad.jsonl", [GOOD, "{not json"])
    with pytest.raises(TraceError, match=f"{path}:2: not valid JSON"):
        read_trace(path)
    path = write_lines(tmp_path / "groups.jsonl", [GOOD, GOOD, dict(GOOD, group=1)])
    with pytest.raises(TraceError, match=f"{path}:3: field 'group'"):
        read_trace(path)
    with pytest.raises(TraceError, match="no such trace file"):
        read_trace(tmp_path / "missing.jsonl")


def test_run_rejects_a_malformed_trace_before_simulating(tmp_path):
    from harness.experiment import run_experiment
    path = write_lines(tmp_path / "bad.jsonl", [GOOD, bad(dict(T1, output_tokens=0))])
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="config", overrides=["workload=trace", f"workload.path={path}"])
    with pytest.raises(InstantiationException, match=f"{path}:2: field 'turns\\[1\\].output_tokens'"):
        run_experiment(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "summary.json").exists()


def test_llmservingsim_sessions_import(tmp_path):
    sessions = [
        {"session_id": "s0", "arrival_time_ns": 0, "sub_requests": [
            {"input_toks": 100, "output_toks": 10, "tool_duration_ns": 2_000_000_000},
            {"input_toks": 150, "output_toks": 5, "tool_duration_ns": 0}]},
        {"session_id": "s1", "arrival_time_ns": 5, "sub_requests": [
            {"input_toks": 80, "output_toks": 8, "tool_duration_ns": 0}]},
    ]
    src, dst = write_lines(tmp_path / "s.jsonl", sessions), tmp_path / "t.jsonl"
    assert import_sessions(src, dst, family="agentic") == 2
    w = TraceWorkload(path=str(dst))
    a, b = w.batch(0)
    assert [(t.new_tokens, t.output_tokens, t.tool_latency_s) for t in a.turns] == [(100, 10, 2.0), (40, 5, 0.0)]
    assert b.turns[0].new_tokens == 80 and a.family == "agentic" and w.group_size == 1
    shrink = dict(sessions[0], sub_requests=[sessions[0]["sub_requests"][0], {"input_toks": 90, "output_toks": 1}])
    write_lines(src, [sessions[1], shrink])
    with pytest.raises(TraceError, match=r"s\.jsonl:2: field 'sub_requests\[1\]\.input_toks'"):
        import_sessions(src, tmp_path / "never.jsonl")
    assert not (tmp_path / "never.jsonl").exists()


def test_trace_priors_measure_how_much_a_trajectory_shares_its_output_length(tmp_path):
    """Each trajectory repeats its own output length (20 and 20, 80 and 80): all of the spread is the
    trajectory's own. A trace exported from swe keeps roughly its group correlation (0.5)."""
    same = [{"group": 0, "family": "swe", "turns": [dict(t, output_tokens=n) for t in GOOD["turns"]]} for n in (20, 80)]
    w = TraceWorkload(path=str(write_lines(tmp_path / "same.jsonl", same)))
    assert w.priors()["swe"].output_shared == pytest.approx(1.0)
    swe = build("swe", "workload.batch_size=64")
    export_trace(swe, 1, tmp_path / "swe.jsonl")
    assert build("trace", f"workload.path={tmp_path / 'swe.jsonl'}").priors()["swe"].output_shared == \
        pytest.approx(swe.group_corr, abs=0.1)


def test_trace_priors_measure_how_a_trajectorys_turn_count_goes_with_its_answers(tmp_path):
    """A trace exported from the synthetic workload, whose one difficulty per prompt goes with turn
    count and answers together, gives back the generator's correlation, 0.5; one from swe, whose turn
    and output scores are independent, about 0."""
    synthetic = build("synthetic", "workload.batch_size=64", "workload.group_size=8")
    export_trace(synthetic, 4, tmp_path / "synthetic.jsonl")
    got = TraceWorkload(path=str(tmp_path / "synthetic.jsonl")).priors()["synthetic"].turns_output_corr
    assert got == pytest.approx(synthetic.priors()["synthetic"].turns_output_corr, abs=0.1)
    swe = build("swe", "workload.batch_size=64")
    export_trace(swe, 2, tmp_path / "swe.jsonl")
    swe_trace = build("trace", f"workload.path={tmp_path / 'swe.jsonl'}").priors()["swe"]
    assert abs(swe_trace.turns_output_corr) < 0.15
    # the samples of one prompt share part of their turn count: the trace gives back about swe's (its
    # turn modes, picked per sample, leave 0.1 of rho 0.5)
    assert swe_trace.turns_group_corr == pytest.approx(swe.priors()["swe"].turns_group_corr, abs=0.1)


def test_trace_priors_keep_the_modes_of_bimodal_values():
    """Quantile points of a 70:30 mixture of lognormals (medians 60 and 900 tokens, log sigma 0.4 and
    0.5) come back as its two parts, weights and medians within a few percent; the one lognormal
    through them has their median but half their mean, the parts give the mean back."""
    z = [NormalDist().inv_cdf((i + 0.5) / 700) for i in range(700)]
    y = [NormalDist().inv_cdf((i + 0.5) / 300) for i in range(300)]
    values = [60 * math.exp(0.4 * a) for a in z] + [900 * math.exp(0.5 * b) for b in y]
    prior = fit_lognormal(values)
    (w_low, low), (w_high, high) = prior.parts
    assert w_low == pytest.approx(0.7, abs=0.02) and w_high == pytest.approx(0.3, abs=0.02)
    assert low.median == pytest.approx(60, rel=0.05) and high.median == pytest.approx(900, rel=0.05)
    assert low.sigma == pytest.approx(0.4, abs=0.03) and high.sigma == pytest.approx(0.5, abs=0.03)
    assert prior.median == pytest.approx(float(np.median(values)))   # the data's own, as before
    true_mean = float(np.mean(values))
    one = LogNormalPrior(prior.median, prior.sigma)
    assert np.mean(one.quantiles(999)) < 0.6 * true_mean
    assert np.mean(prior.quantiles(999)) == pytest.approx(true_mean, rel=0.05)


def test_trace_priors_stay_one_lognormal_where_one_fits():
    """Lognormal values, values with a zero (no log) and too few values give no parts."""
    lognormal = [500 * math.exp(0.7 * NormalDist().inv_cdf((i + 0.5) / 1000)) for i in range(1000)]
    assert fit_lognormal(lognormal).parts == ()
    bimodal = [60.0] * 100 + [900.0] * 100
    assert fit_lognormal(bimodal).parts != ()
    assert fit_lognormal([0.0] + bimodal).parts == ()
    assert fit_lognormal(bimodal[::5]).parts == ()   # 40 values: too few to tell
