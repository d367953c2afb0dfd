"""scripts/generalization.py's table on hand-made runs: Prorsa against the best static allocation of its
seed, and the summary file REPRODUCE.md's table is rendered from."""
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import generalization  # noqa: E402


def _run(d: Path, policy: str, seed: int, rollout_s: float, switches: int = 0) -> None:
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"policy": policy, "seed": seed, "workload": "synthetic",
                                                "rollout_time_s": rollout_s, "num_role_switches": switches}))


def test_prorsa_against_the_best_static_allocation_of_its_seed(tmp_path, monkeypatch):
    s = tmp_path / "setting_a"
    _run(s / "policy=colocate,seed=0", "colocate", 0, 100.0)
    _run(s / "policy.num_prefill=2,policy=fixed_pd,seed=0", "fixed_pd", 0, 80.0)
    _run(s / "policy.num_prefill=5,policy=fixed_pd,seed=0", "fixed_pd", 0, 120.0)
    _run(s / "policy=prorsa,seed=0", "prorsa", 0, 76.0, switches=3)
    _run(s / "policy=colocate,seed=1", "colocate", 1, 90.0)   # seed 1 has no Prorsa run: no row
    (row,) = generalization.table(tmp_path)
    assert (row["setting"], row["seed"], row["best"], row["best_s"], row["switches"]) == ("setting_a", 0, "2P", 80.0, 3)
    assert row["prorsa/best"] == pytest.approx(round(80 / 76, 3)) and row["best/colocate"] == 1.25
    monkeypatch.setattr(sys, "argv", ["generalization.py", str(tmp_path), "--table-only"])
    generalization.main()
    written = pd.read_csv(tmp_path / "summary.csv")
    assert written.to_dict("records") == [row]


def test_a_setting_run_without_prorsa_gives_its_statics_only(tmp_path):
    s = tmp_path / "heavy_load"
    _run(s / "policy=colocate,seed=0", "colocate", 0, 100.0)
    _run(s / "policy.num_prefill=3,policy=fixed_pd,seed=0", "fixed_pd", 0, 90.0)
    assert generalization.table(tmp_path) == []   # Prorsa missing from a setting that should have it
    (row,) = generalization.table(tmp_path, statics_only={"heavy_load"})
    assert (row["best"], row["best/colocate"], row["prorsa_s"], row["prorsa/best"]) == ("3P", round(100 / 90, 3), None, None)
