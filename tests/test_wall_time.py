"""scripts/wall_time.py on a real sweep: colocation's and Prorsa's default runs side by side, a variant
(a `policy.` key set) left out."""
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wall_time_pairs_the_default_policies_and_skips_variants(tmp_path):
    sweep = tmp_path / "search-sync"
    common = [sys.executable, "run.py", "-m", f"hydra.sweep.dir={sweep}", "workload=search", "workload.batch_size=2",
              "logger=none"]
    subprocess.run([*common, "policy=colocate,prorsa"], cwd=ROOT, check=True, capture_output=True)
    subprocess.run([*common, "policy=prorsa", "policy.forecast=false"], cwd=ROOT, check=True, capture_output=True)
    spec = importlib.util.spec_from_file_location("wall_time", ROOT / "scripts" / "wall_time.py")
    wall_time = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wall_time)
    df = wall_time.runs(tmp_path)
    assert sorted(df.policy) == ["colocate", "prorsa"] and set(df.experiment) == {"search-sync"}
    rows = [line for line in wall_time.table(tmp_path).splitlines() if line.startswith("| search-sync")]
    assert len(rows) == 1 and rows[0].split("|")[2].strip() == "0"
