"""The regime map script on its one-cell smoke grid: every policy of the cell runs, the CSV holds the
speedups and the lower bound's limit, and the heatmap is written as PNG and PDF; on one local Ray
cluster (`--ray`) the same cell gives the same row."""
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


def regime_map(out: Path, *args: str) -> pd.DataFrame:
    res = subprocess.run([sys.executable, "scripts/regime_map.py", str(out), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return pd.read_csv(out / "regime_map.csv")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    """The smoke cell mapped one job at a time (run once for both tests)."""
    out = tmp_path_factory.mktemp("smoke")
    return out, regime_map(out, "--grid", "smoke")


def test_regime_map_smoke_cell(smoke):
    tmp_path, df = smoke
    assert len(df) == 1
    r = df.iloc[0]
    assert (r["new_tokens"], r["output_tokens"], r["dp"], r["engine"], r["mode"]) == (1000, 50, 4, "vllm", "sync")
    assert r["best_split"] in ("2P", "4P", "6P") and r["best_fixed_speedup"] > 0 and r["prorsa_speedup"] > 0
    assert r["max_gain_by_bound"] >= max(r["best_fixed_speedup"], r["prorsa_speedup"])   # nothing beats the bound
    jobs = sorted(p.name for p in (tmp_path / "sync_vllm_dp4_new1000_out50").iterdir() if p.is_dir())
    assert jobs == ["policy.num_prefill=2,policy=fixed_pd", "policy.num_prefill=4,policy=fixed_pd",
                    "policy.num_prefill=6,policy=fixed_pd", "policy=colocate", "policy=prorsa"]
    for ext in ("png", "pdf"):
        assert (tmp_path / f"regime_map_sync.{ext}").stat().st_size > 1000


def test_a_cell_on_the_maps_own_ray_cluster_gives_the_same_row(smoke, tmp_path):
    """`--ray`: the cell's multiruns join the Ray cluster the script starts; the same row as without."""
    pd.testing.assert_frame_equal(regime_map(tmp_path, "--grid", "smoke", "--ray"), smoke[1])


def test_the_load_axes_set_the_batch_the_trajectories_in_flight_and_the_tools():
    """A load-grid cell by hand: 32 trajectories per GPU on 32 GPUs is 1,024 trajectories, 128 prompts of
    8; async keeps one batch in flight; a cell at the default load keeps its name and overrides."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import regime_map as m
    c = {"new_tokens": 4000, "output_tokens": 500, "dp": 8, "engine": "vllm", "mode": "async", "load": 32, "tool_s": 20.0}
    over = m.cell_overrides(c)
    assert {"workload.batch_size=128", "mode.max_in_flight=1024", "workload.tool_latency.0.median=20",
            "cluster.num_engines=4", "workload.tool_output.median=4000"} <= set(over)
    assert m.cell_name(c) == "async_vllm_dp8_new4000_out500_load32_tool20"
    assert not m.with_prorsa(c) and m.with_prorsa({**c, "mode": "sync"}) and m.with_prorsa({**c, "load": 8})
    default = {**c, "load": 8, "tool_s": 0.2}
    assert m.cell_name(default) == "async_vllm_dp8_new4000_out500"
    assert {"workload.batch_size=32", "mode.max_in_flight=256", "workload.tool_latency.0.median=0.2"} <= set(m.cell_overrides(default))
    assert len(list(m.cells("load"))) == 72


def test_grids_whose_figure_would_hold_two_values_of_an_undrawn_axis_are_refused(tmp_path):
    """The load figure draws one output length and one engine: load (500 output tokens) with load_smoke
    (50) is refused before anything runs or is written, naming the axis."""
    out = tmp_path / "map"
    res = subprocess.run([sys.executable, "scripts/regime_map.py", str(out), "--grid", "load", "load_smoke"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "output_tokens" in res.stderr and "Traceback" not in res.stderr
    assert not out.exists()
