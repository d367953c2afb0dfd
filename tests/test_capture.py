"""scripts/capture.py's table on hand-made summaries: the best static per seed, the oracle's gain and the
share of it Prorsa captures, by hand."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_capture():
    spec = importlib.util.spec_from_file_location("capture", ROOT / "scripts" / "capture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def summary(where: Path, job: str, policy: str, seconds: float, switches: int = 0, wape=None) -> None:
    (where / job).mkdir(parents=True)
    s = {"seed": 0, "policy": policy, "rollout_time_s": seconds, "num_role_switches": switches,
         "wall_time_s": 1.0}
    if wape is not None:
        s["forecast_wape_prefill"], s["forecast_wape_decode"] = wape
    (where / job / "summary.json").write_text(json.dumps(s))


def test_capture_table_known_answer(tmp_path):
    """Statics: colocation 120 s, splits 1P-7P at 110 s and up, so 1P (110 s) is the best; the oracle
    ends at 100 s (a 9.1% gain, 10 s) and Prorsa at 104 s: it captures (110 - 104) / (110 - 100) = 0.6; with
the evidence rule at 102 s, 0.8."""
    capture = load_capture()
    setting = tmp_path / capture.SETTINGS[0]
    summary(setting / "statics", "policy=colocate,seed=0", "colocate", 120.0)
    for k in range(1, 8):
        summary(setting / "statics", f"policy.num_prefill={k},policy=fixed_pd,seed=0", "fixed_pd", 109.0 + k)
    summary(setting / "oracle", "policy=oracle_pd,seed=0", "oracle_pd", 100.0, 7)
    summary(setting / "prorsa", "policy=prorsa,seed=0", "prorsa", 104.0, 3, ([0.2, 0.4], [0.1, 0.3]))
    summary(setting / "prorsa_evidence", "policy.switch_rule=evidence,policy=prorsa,seed=0", "prorsa", 102.0, 5)
    row = capture.table(tmp_path).iloc[0]
    assert row.evidence_captured == pytest.approx(0.8) and row.evidence_switches == 5
    assert row.best_static == "1P" and row.hindsight_best_s == 110.0
    assert row.oracle_gain == pytest.approx(10 / 110) and row.captured == pytest.approx(0.6)
    assert row.prorsa_vs_best == pytest.approx(110 / 104) and (row.oracle_switches, row.prorsa_switches) == (7, 3)
    assert (row.wape_prefill, row.wape_decode) == pytest.approx((0.3, 0.2))
    assert "| 0.60 |" in (tmp_path / "capture.md").read_text()
