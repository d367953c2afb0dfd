"""The committed reference results still hold at head: for every experiment of REPRODUCE.md's sections 4
and 5 (results/reference/prorsa.csv and shift_prorsa.csv), colocation and the best static split of seed
0 rerun through run.py at their full size, and two of Prorsa's runs. A change that moves any of them
must regenerate the committed results in the same submission (`PUBLISH=1 bash scripts/reproduce.sh`).
The tolerance allows the last bits that numpy's vectorised kernels may differ in between CPUs; a
changed step or decision moves a run by far more."""
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results" / "reference"
ASYNC = ["mode=async", "mode.num_steps=2", "mode.max_in_flight=256"]   # section 4's async rows (reproduce.sh)
# (file, experiment, its overrides, the file's rows: workload, mode, cluster)
EXPERIMENTS = [("prorsa.csv", exp, extra, (workload, mode, cluster)) for exp, workload, cluster in (
    ("search", "search", "dense8_h100"), ("swe", "swe", "dense_h100"), ("tooluse", "tooluse", "moe_h200"))
    for mode, extra in (("sync", []), ("async", ASYNC))] + [
    ("prorsa.csv", "drift", [], ("mix", "sync", "moe_h200")),
    ("prorsa.csv", "heavy_prefill", [], ("synthetic", "sync", "moe_h200")),
    # a static allocation never switches: the curricula of one cluster and mode share their statics
    ("shift_prorsa.csv", "shift_reason_browse_kvboth", [], ("mix_reason_browse", "async", "moe_h200")),
    ("shift_prorsa.csv", "shift_reason_browse_dense8", [], ("mix_reason_browse", "async", "dense8_h100")),
    ("shift_prorsa.csv", "shift_reason_browse_sync", [], ("mix_reason_browse", "sync", "moe_h200"))]


def seed0(file: str, key: tuple[str, str, str]) -> pd.Series:
    ref = pd.read_csv(REFERENCE / file)
    workload, mode, cluster = key
    rows = ref[(ref.workload == workload) & (ref["mode"] == mode) & (ref.cluster == cluster) & (ref.seed == 0)]
    assert len(rows), f"{file}: no row for {workload} {mode} {cluster} at seed 0"
    return rows.iloc[0]   # colocate_s, best_static_s and best_static are the same on every policy's row


def rollout_s(tmp_path: Path, *overrides: str) -> float:
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "run.py", *overrides, "seed=0", "logger=none", f"hydra.run.dir={out}"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((out / "summary.json").read_text())["rollout_time_s"]


@pytest.mark.parametrize("file, experiment, extra, key", EXPERIMENTS, ids=[f"{e}-{k[1]}" for _, e, _, k in EXPERIMENTS])
@pytest.mark.parametrize("static", ["colocate", "best"])
def test_a_committed_static_run_reproduces_at_head(tmp_path, file, experiment, extra, key, static):
    row = seed0(file, key)
    if static == "colocate":
        policy, expected = ["policy=colocate"], row.colocate_s
    elif row.best_static == "colocate":
        pytest.skip("colocation is the best static allocation here")
    else:
        policy, expected = ["policy=fixed_pd", f"policy.num_prefill={int(row.best_static.split('P')[0])}"], row.best_static_s
    assert rollout_s(tmp_path, f"+experiment={experiment}", *extra, *policy) == pytest.approx(float(expected), rel=1e-6)


@pytest.mark.parametrize("experiment, workload", [("heavy_prefill", "synthetic"), ("search", "search")])
def test_a_committed_prorsa_run_reproduces_at_head(tmp_path, experiment, workload):
    ref = pd.read_csv(REFERENCE / "prorsa.csv")
    row = ref[(ref.workload == workload) & (ref["mode"] == "sync") & (ref.seed == 0) & (ref.policy == "prorsa")]
    assert len(row) == 1, f"prorsa.csv: no single Prorsa row for {workload} sync seed 0"
    assert rollout_s(tmp_path, f"+experiment={experiment}", "policy=prorsa") == \
        pytest.approx(float(row.rollout_time_s.iloc[0]), rel=1e-6)
