"""The committed reference results still hold at head: a few of results/reference/prorsa.csv's runs
(section 4 of REPRODUCE.md), rerun through run.py. A change that moves them must regenerate the
committed results in the same submission. The tolerance allows the last bits that numpy's vectorised
kernels may differ in between CPUs (REPRODUCE.md); a changed decision moves a run by far more."""
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results" / "reference" / "prorsa.csv"


@pytest.mark.parametrize("experiment, workload, policy, column", [
    ("heavy_prefill", "synthetic", "colocate", "colocate_s"),
    ("heavy_prefill", "synthetic", "prorsa", "rollout_time_s"),
    ("search", "search", "prorsa", "rollout_time_s"),
])
def test_a_committed_reference_run_reproduces_at_head(tmp_path, experiment, workload, policy, column):
    ref = pd.read_csv(REFERENCE)
    row = ref[(ref.workload == workload) & (ref["mode"] == "sync") & (ref.seed == 0) & (ref.policy == "prorsa")]
    assert len(row) == 1, f"{REFERENCE.name}: no single row for {workload} sync seed 0"
    out = tmp_path / "run"
    subprocess.run([sys.executable, "run.py", f"+experiment={experiment}", f"policy={policy}", "seed=0", "logger=none",
                    f"hydra.run.dir={out}"], cwd=ROOT, check=True, capture_output=True)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rollout_time_s"] == pytest.approx(float(row[column].iloc[0]), rel=1e-6)
