"""The report from hand-made result files: known speedups, failed runs named and left out, figures written."""
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from harness.report import find_runs, main, runs_frame, speedup_table


def make_run(root: Path, name: str, policy: str, rollout: float, seed: int = 0, workload: str = "search",
             mode: str = "sync", completed: int = 4, num_prefill: int | None = None, timeseries: bool = True) -> Path:
    """A run directory as run.py leaves it: .hydra/config.yaml, summary.json and the parquet files."""
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    policy_cfg = {"_target_": f"baselines.{policy}.X", **({"num_prefill": num_prefill} if num_prefill else {})}
    cfg = {"policy": policy_cfg, "workload": {"name": workload}, "mode": {"name": mode},
           "cluster": {"name": "dense_h100", "num_engines": 8}, "seed": seed}
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"policy={policy}", f"seed={seed}"]))
    summary = {"policy": policy, "workload": workload, "mode": mode, "cluster": "dense_h100", "seed": seed,
               "num_trajectories": 4, "completed_trajectories": completed, "rollout_time_s": rollout,
               "lower_bound_s": 50.0, "efficiency_vs_lower_bound": 50.0 / rollout}
    (d / "summary.json").write_text(json.dumps(summary))
    pd.DataFrame({"trajectory_id": [0, 0, 1], "t_ready": [0.0, 5.0, 0.0],
                  "t_decode_end": [3.0, rollout, rollout / 2]}).to_parquet(d / "lifecycle.parquet")
    if timeseries:
        pd.DataFrame({"t_s": [0.0, 1.0, 2.0], "prefill_demand_tokens": [100, 50, 0], "decode_requests": [0, 2, 1],
                      "engines_prefill": [0, 0, 0], "engines_decode": [0, 0, 0], "engines_colocated": [8, 8, 8],
                      "engines_switching": [0, 0, 0]}).to_parquet(d / "timeseries.parquet")
    return d


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    for seed, base in [(0, 100.0), (1, 120.0)]:
        make_run(root, f"colocate_s{seed}", "colocate", base, seed)
        make_run(root, f"pd2_s{seed}", "fixed_pd", base / 2, seed, num_prefill=2)    # speedup 2.0 on both seeds
        make_run(root, f"pd4_s{seed}", "fixed_pd", base / 4, seed, num_prefill=4)    # speedup 4.0
    make_run(root, "colocate_async", "colocate", 90.0, mode="async")
    make_run(root, "pd2_async", "fixed_pd", 60.0, mode="async", num_prefill=2)        # speedup 1.5
    # Not to be averaged in: an incomplete run (a speedup of 100 would show), a crashed one, a failed one.
    make_run(root, "pd2_partial", "fixed_pd", 1.0, seed=2, completed=3, num_prefill=2)
    (root / "crashed" / ".hydra").mkdir(parents=True)
    (root / "crashed" / ".hydra" / "overrides.yaml").write_text("- policy=fixed_pd\n- seed=7\n")
    failed = root / "failed"
    failed.mkdir()
    (failed / "error.json").write_text(json.dumps({"overrides": ["policy.num_prefill=0"], "error": "ValueError",
                                                   "message": "policy.num_prefill=0 is invalid"}))
    return root


def test_known_speedups_per_policy_and_mode(sweep):
    table = speedup_table(runs_frame(find_runs([sweep]))).set_index(["mode", "policy"])
    assert table.loc[("sync", "fixed_pd[num_prefill=2]"), "speedup"] == pytest.approx(2.0)
    assert table.loc[("sync", "fixed_pd[num_prefill=2]"), "speedup_std"] == pytest.approx(0.0)
    assert table.loc[("sync", "fixed_pd[num_prefill=2]"), "seeds"] == 2
    assert table.loc[("sync", "fixed_pd[num_prefill=4]"), "speedup"] == pytest.approx(4.0)
    assert table.loc[("async", "fixed_pd[num_prefill=2]"), "speedup"] == pytest.approx(1.5)
    assert table.loc[("sync", "colocate"), "speedup"] == pytest.approx(1.0)
    assert table.loc[("sync", "best_fixed"), "speedup"] == pytest.approx(4.0)    # best split in hindsight
    assert table.loc[("sync", "hindsight_best"), "speedup"] == pytest.approx(4.0)  # best static, colocate included
    # efficiency = lower_bound / rollout time, averaged over seeds: (50/50 + 50/60) / 2
    assert table.loc[("sync", "fixed_pd[num_prefill=2]"), "efficiency"] == pytest.approx((1 + 50 / 60) / 2)


def test_report_files_name_failed_runs_and_figures_exist(sweep, capsys):
    main([str(sweep)])
    csv = pd.read_csv(sweep / "speedup.csv").set_index("mode")
    assert csv.loc["sync", "speedup[fixed_pd[num_prefill=2]]"] == pytest.approx(2.0)
    assert csv.loc["sync", "seeds[fixed_pd[num_prefill=2]]"] == 2       # the partial seed-2 run is not counted
    md = (sweep / "speedup.md").read_text()
    # columns: colocate, best_fixed (the fastest split in hindsight: 4P), fixed_pd[2], fixed_pd[4], hindsight_best
    row = ("| search | sync | dense_h100 | 1.00 ± 0.00 (n=2) | 4.00 ± 0.00 (n=2) | 2.00 ± 0.00 (n=2) | 4.00 ± 0.00 (n=2)"
           " | 4.00 ± 0.00 (n=2)")
    assert "| synthetic" not in md and row in md
    failed_section = md.split("## Failed runs")[1]
    for name, why in [("pd2_partial", "3 of 4 trajectories"), ("crashed", "no summary.json"),
                      ("failed", "policy.num_prefill=0 is invalid")]:
        assert any(name in line and why in line for line in failed_section.splitlines()), (name, failed_section)
    assert "policy=fixed_pd seed=7" in failed_section          # a crashed run is named by its overrides
    tex = (sweep / "speedup.tex").read_text()
    assert r"\begin{tabular}" in tex and r"2.00 $\pm$ 0.00" in tex and "pd2\\_partial" in tex
    figures = sweep / "figures"
    for stem in ["demand_search_sync_dense_h100", "demand_search_async_dense_h100",
                 "completion_cdf_search_sync_dense_h100", "makespan_vs_pd_search_sync_dense_h100", "speedup_bars"]:
        for ext in ("png", "pdf"):
            assert (figures / f"{stem}.{ext}").stat().st_size > 1000, stem
    assert "3 failed or partial" in capsys.readouterr().out


def test_hindsight_best_includes_colocation_and_an_oracle_below_it_is_flagged(tmp_path, caplog):
    """Colocation (100 s) beats both splits (120, 150 s): hindsight_best is colocation (1.00), best_fixed
    the 120-s split (0.83). An oracle at 110 s is below hindsight_best and the report says so."""
    make_run(tmp_path, "colocate", "colocate", 100.0)
    make_run(tmp_path, "pd2", "fixed_pd", 120.0, num_prefill=2)
    make_run(tmp_path, "pd4", "fixed_pd", 150.0, num_prefill=4)
    make_run(tmp_path, "oracle", "oracle_pd", 110.0)
    table = speedup_table(runs_frame(find_runs([tmp_path]))).set_index("policy")
    assert table.loc["hindsight_best", "speedup"] == pytest.approx(1.0)
    assert table.loc["best_fixed", "speedup"] == pytest.approx(100 / 120)
    main([str(tmp_path)])
    md = (tmp_path / "speedup.md").read_text()
    assert "oracle_pd 110.00 s > hindsight_best 100.00 s" in md.split("## oracle_pd below hindsight_best")[1]
    assert "oracle_pd is below hindsight_best" in caplog.text


def test_runs_without_timeseries_or_baseline_still_report(tmp_path):
    """A row without colocate has no speedup ('-'), and a run without timeseries.parquet has no demand figure."""
    make_run(tmp_path, "pd", "fixed_pd", 50.0, num_prefill=2, timeseries=False)
    main([str(tmp_path), "--out", str(tmp_path / "report")])
    md = (tmp_path / "report" / "speedup.md").read_text()
    assert "| search | sync | dense_h100 | - |" in md
    assert not list((tmp_path / "report" / "figures").glob("demand_*"))
    assert (tmp_path / "report" / "figures" / "makespan_vs_pd_search_sync_dense_h100.png").stat().st_size > 0
