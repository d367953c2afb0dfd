"""The report from hand-made result files: known speedups, failed runs named and left out, figures written
(fixed policy colours and order, PNG and PDF at a printable width)."""
import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from PIL import Image

from harness.figure_style import COLORS, LOOKS, MAX_WIDTH_IN, MUTED, ROLE_COLORS, policy_color, policy_order
from harness.report import Figures, _host, find_runs, main, runs_frame, speedup_table, speedups


def make_run(root: Path, name: str, policy: str, rollout: float, seed: int = 0, workload: str = "search",
             mode: str = "sync", completed: int = 4, num_prefill: int | None = None, timeseries: bool = True,
             experiment: str | None = None, cluster: dict | None = None) -> Path:
    """A run directory as run.py leaves it: .hydra/config.yaml, summary.json and the parquet files (a prorsa
    run: its decisions in summary.json and forecast.parquet too)."""
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    policy_cfg = {"_target_": f"baselines.{policy}.X", **({"num_prefill": num_prefill} if num_prefill else {})}
    cfg = {"policy": policy_cfg, "workload": {"name": workload}, "mode": {"name": mode},
           "cluster": {"name": "dense_h100", "num_engines": 8, **(cluster or {})}, "seed": seed}
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    overrides = ([f"+experiment={experiment}"] if experiment else []) + [f"policy={policy}", f"seed={seed}"]
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    summary = {"policy": policy, "workload": workload, "mode": mode, "cluster": "dense_h100", "seed": seed,
               "num_trajectories": 4, "completed_trajectories": completed, "rollout_time_s": rollout,
               "lower_bound_s": 50.0, "efficiency_vs_lower_bound": 50.0 / rollout,
               "wall_time_s": rollout / (1 if policy == "prorsa" else 100)}   # Prorsa's plans cost wall time
    if policy == "prorsa":
        summary |= {"prorsa_decisions": [[0.0, 0], [1.0, 2]], "num_role_switches": 2}
        pd.DataFrame({"t": [0.0, 0.0, 1.0], "bin": [0, 1, 0], "t_mid": [0.5, 1.5, 1.5],
                      "prefill_forecast": [90.0, 40.0, 45.0], "prefill_actual": [100.0, 50.0, 50.0],
                      "decode_forecast": [1.0, 2.0, 2.0], "decode_actual": [0.0, 2.0, 2.0]}).to_parquet(
            d / "forecast.parquet")
    (d / "summary.json").write_text(json.dumps(summary))
    # Two trajectories of one step, each turn 1 s of prefill then decode; trajectory 0 waits 2 s on a tool.
    ready, end = pd.Series([0.0, 5.0, 0.0]), pd.Series([3.0, rollout, rollout / 2])
    pd.DataFrame({"trajectory_id": [0, 0, 1], "step": 0, "turn": [0, 1, 0], "t_ready": ready,
                  "t_prefill_start": ready, "t_prefill_end": ready + 1, "t_transfer_end": ready + 1,
                  "t_decode_start": ready + 1, "t_decode_end": end,
                  "t_tool_end": [5.0, rollout, rollout / 2]}).to_parquet(d / "lifecycle.parquet")
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
    table = speedup_table(speedups(runs_frame(find_runs([sweep])))).set_index(["mode", "policy"])
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
    assert "3 failed, partial or broken" in capsys.readouterr().out


def test_hindsight_best_includes_colocation_and_an_oracle_below_it_is_flagged(tmp_path, caplog):
    """Colocation (100 s) beats both splits (120, 150 s): hindsight_best is colocation (1.00), best_fixed
    the 120-s split (0.83). An oracle at 110 s is below hindsight_best and the report says so."""
    make_run(tmp_path, "colocate", "colocate", 100.0)
    make_run(tmp_path, "pd2", "fixed_pd", 120.0, num_prefill=2)
    make_run(tmp_path, "pd4", "fixed_pd", 150.0, num_prefill=4)
    make_run(tmp_path, "oracle", "oracle_pd", 110.0)
    table = speedup_table(speedups(runs_frame(find_runs([tmp_path])))).set_index("policy")
    assert table.loc["hindsight_best", "speedup"] == pytest.approx(1.0)
    assert table.loc["best_fixed", "speedup"] == pytest.approx(100 / 120)
    main([str(tmp_path)])
    md = (tmp_path / "speedup.md").read_text()
    assert "seed 0: oracle_pd 110.00 s > hindsight_best 100.00 s" in md.split("## oracle_pd below hindsight_best")[1]
    assert "oracle_pd is below hindsight_best" in caplog.text


def test_oracle_is_checked_against_the_best_static_allocation_of_its_own_seed(tmp_path):
    """Statics at seeds 0 and 1 (colocation 100 and 80 s, the best at each), the oracle at seed 0 only
    (95 s): above the seeds' mean hindsight_best (90 s), below its own seed's (100 s), so not flagged;
    at 105 s it is."""
    from harness.report import oracle_below_hindsight
    for seed, t in ((0, 100.0), (1, 80.0)):
        make_run(tmp_path, f"colocate{seed}", "colocate", t, seed=seed)
        make_run(tmp_path, f"pd2_{seed}", "fixed_pd", t + 20, seed=seed, num_prefill=2)
        make_run(tmp_path, f"pd4_{seed}", "fixed_pd", t + 40, seed=seed, num_prefill=4)
    make_run(tmp_path, "oracle", "oracle_pd", 95.0)
    assert oracle_below_hindsight(speedups(runs_frame(find_runs([tmp_path])))) == []
    make_run(tmp_path, "oracle_slow", "oracle_pd", 105.0, seed=1)
    assert oracle_below_hindsight(speedups(runs_frame(find_runs([tmp_path])))) == [
        "search sync dense_h100 seed 1: oracle_pd 105.00 s > hindsight_best 80.00 s"]


def test_prorsa_is_compared_seed_by_seed_with_the_best_static_allocation(tmp_path):
    """Seed 0: colocation 100 s is the best static (splits 120 and 150 s), Prorsa 95 s: 1.053x of it.
    Seed 1: 2P6D 70 s is the best (colocation 80 s), Prorsa 72 s: 0.972x of it, 1.111x of colocation."""
    from harness.report import prorsa_display, prorsa_seeds
    for seed, (colo, pd2, pd4, prorsa) in enumerate([(100.0, 120.0, 150.0, 95.0), (80.0, 70.0, 90.0, 72.0)]):
        make_run(tmp_path, f"colocate{seed}", "colocate", colo, seed=seed)
        make_run(tmp_path, f"pd2_{seed}", "fixed_pd", pd2, seed=seed, num_prefill=2)
        make_run(tmp_path, f"pd4_{seed}", "fixed_pd", pd4, seed=seed, num_prefill=4)
        make_run(tmp_path, f"prorsa{seed}", "prorsa", prorsa, seed=seed)
    seeds = prorsa_seeds(runs_frame(find_runs([tmp_path]))).set_index("seed")
    assert list(seeds["best_static"]) == ["colocate", "2P6D"]
    assert list(seeds["vs_best_static"]) == pytest.approx([100 / 95, 70 / 72])
    assert list(seeds["vs_colocate"]) == pytest.approx([100 / 95, 80 / 72])
    assert list(seeds["num_role_switches"]) == [2, 2]
    assert list(seeds["wall_time_s"]) == [95.0, 72.0] and list(seeds["colocate_wall_time_s"]) == [1.0, 0.8]
    line = prorsa_display(seeds.reset_index()).iloc[0]
    assert line["prorsa / best static"] == "1.012 (0.972-1.053)"
    assert line["best static per seed"] == "colocate, 2P6D"
    main([str(tmp_path)])
    row = "| search | sync | dense_h100 | prorsa | 2 | 1.08 (1.05-1.11) | 1.012 (0.972-1.053) | colocate, 2P6D | 2, 2 |"
    assert row in (tmp_path / "speedup.md").read_text()
    assert pd.read_csv(tmp_path / "prorsa.csv")["best_static_s"].tolist() == [100.0, 70.0]


def test_prorsa_under_another_switch_mechanism_meets_the_same_statics(tmp_path):
    """Statics ran under reshard (colocation 100 s, 2P6D 80 s); Prorsa under reshard 82 s and under drain
    78 s. A static allocation never switches, so both Prorsa runs are compared with the same 80-s 2P6D."""
    from harness.report import prorsa_seeds
    reshard, drain = {"switch_mechanism": "reshard"}, {"switch_mechanism": "drain"}
    make_run(tmp_path, "colocate", "colocate", 100.0, cluster=reshard)
    make_run(tmp_path, "pd2", "fixed_pd", 80.0, num_prefill=2, cluster=reshard)
    make_run(tmp_path, "prorsa_reshard", "prorsa", 82.0, cluster=reshard)
    make_run(tmp_path, "prorsa_drain", "prorsa", 78.0, cluster=drain)
    seeds = prorsa_seeds(runs_frame(find_runs([tmp_path]))).set_index("setting")
    assert seeds.loc["cluster.switch_mechanism=drain", "vs_best_static"] == pytest.approx(80 / 78)
    assert seeds.loc["cluster.switch_mechanism=reshard", "vs_best_static"] == pytest.approx(80 / 82)
    assert list(seeds["best_static"]) == ["2P6D", "2P6D"] and list(seeds["colocate_s"]) == [100.0, 100.0]


def test_a_prorsa_seed_without_splits_has_no_best_static(tmp_path):
    """Splits ran at seed 0 only; colocation and Prorsa at seeds 0 and 1. Seed 1 has no best static
    allocation (not colocation by default) and the mean over seeds is seed 0's alone."""
    from harness.report import prorsa_display, prorsa_seeds
    for seed in (0, 1):
        make_run(tmp_path, f"colocate{seed}", "colocate", 100.0, seed=seed)
        make_run(tmp_path, f"prorsa{seed}", "prorsa", 90.0, seed=seed)
    make_run(tmp_path, "pd2", "fixed_pd", 95.0, num_prefill=2)
    seeds = prorsa_seeds(runs_frame(find_runs([tmp_path])))
    assert list(seeds["best_static"]) == ["2P6D", "-"]
    assert seeds["vs_best_static"].isna().tolist() == [False, True]
    line = prorsa_display(seeds).iloc[0]
    assert line["prorsa / best static"] == f"{95 / 90:.3f}" and line["prorsa / colocate"] == "1.11 (1.11-1.11)"


def test_runs_without_timeseries_or_baseline_still_report(tmp_path):
    """A row without colocate has no speedup ('-'), and a run without timeseries.parquet has no demand figure."""
    make_run(tmp_path, "pd", "fixed_pd", 50.0, num_prefill=2, timeseries=False)
    main([str(tmp_path), "--out", str(tmp_path / "report")])
    md = (tmp_path / "report" / "speedup.md").read_text()
    assert "| search | sync | dense_h100 | - |" in md
    assert not list((tmp_path / "report" / "figures").glob("demand_*"))
    assert (tmp_path / "report" / "figures" / "makespan_vs_pd_search_sync_dense_h100.png").stat().st_size > 0


# --- figures ---------------------------------------------------------------------------------------
def record_figures(monkeypatch) -> dict:
    """What each figure the report saves shows, by file name: its axes, text (titles, tick labels), title
    lines, legend entries, each line's colour and style (by label), and the window extents of every axis's
    tick labels (drawn)."""
    figures = {}
    save = Figures.save

    def record(self, fig, name):
        fig.canvas.draw()
        titles = [fig.get_suptitle()] + [a.get_title() for a in fig.axes]
        ticks = [t for a in fig.axes for t in [*a.get_xticklabels(), *a.get_yticklabels()]]
        lines = [line for a in fig.axes for line in a.get_lines() if not line.get_label().startswith("_")]
        figures[name] = {"axes": fig.axes, "text": " ".join([*titles, *map(str, ticks)]),
                         "titles": [t for t in titles if t],
                         "legend": [t.get_text() for lg in fig.legends for t in lg.get_texts()],
                         "colors": {line.get_label(): line.get_color() for line in lines},
                         "markers": {line.get_label(): line.get_marker() for line in lines},
                         "tick_boxes": [[t.get_window_extent() for t in [*a.get_xticklabels(), *a.get_yticklabels()]
                                         if t.get_text()] for a in fig.axes],
                         "rotations": {t.get_rotation() for t in ticks if t.get_text()}}
        save(self, fig, name)

    monkeypatch.setattr(Figures, "save", record)
    return figures


@pytest.fixture(scope="module")
def six(tmp_path_factory) -> tuple[Path, dict]:
    """A report on two seeds of colocate, two fixed splits (4P4D the faster), prorsa, oracle_pd and pearl."""
    root = tmp_path_factory.mktemp("six")
    for seed in (0, 1):
        for name, policy, rollout, split in [("colocate", "colocate", 100.0, None), ("pd2", "fixed_pd", 90.0, 2),
                                             ("pd4", "fixed_pd", 80.0, 4), ("prorsa", "prorsa", 70.0 + 5 * seed, None),
                                             ("oracle", "oracle_pd", 60.0, None), ("pearl", "pearl", 95.0, None)]:
            make_run(root, f"{name}_s{seed}", policy, rollout, seed, num_prefill=split, experiment="search_exp")
    with pytest.MonkeyPatch.context() as monkeypatch:
        drawn = record_figures(monkeypatch)
        main([str(root)])
    return root, drawn


def test_policy_order_and_colours_are_fixed(tmp_path, six, monkeypatch):
    mixed = ["pearl", "prorsa[switching=False]", "fixed_pd[num_prefill=10]", "oracle_pd", "my_policy", "prorsa",
             "fixed_pd[num_prefill=2]", "hindsight_best", "best_fixed", "colocate"]
    assert policy_order(mixed) == ["colocate", "best_fixed", "fixed_pd[num_prefill=2]", "fixed_pd[num_prefill=10]",
                                   "hindsight_best", "prorsa", "oracle_pd", "pearl", "prorsa[switching=False]",
                                   "my_policy"]
    assert policy_order(mixed) == policy_order(reversed(mixed))
    assert [policy_color(p) for p in mixed] == [policy_color(p) for p in mixed]
    assert len({policy_color(p) for p in ["colocate", "best_fixed", "prorsa", "oracle_pd"]}) == 4
    assert policy_color("my_policy") in MUTED
    # An unknown name's colour does not depend on Python's per-process string hashing.
    code = "from harness.figure_style import policy_color; print(policy_color('my_policy'))"
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert outs == {policy_color("my_policy") + "\n"}
    # The same policy has the same colour in two reports with different sets of policies.
    make_run(tmp_path, "prorsa", "prorsa", 70.0, experiment="search_exp")
    make_run(tmp_path, "colocate", "colocate", 100.0, experiment="search_exp")
    drawn = record_figures(monkeypatch)
    main([str(tmp_path)])
    two = drawn["completion_cdf_search_exp_sync_dense_h100"]["colors"]
    six_colors = six[1]["completion_cdf_search_exp_sync_dense_h100"]["colors"]
    assert six_colors["prorsa"] == two["prorsa"] == policy_color("prorsa")
    assert six_colors["colocate"] == two["colocate"] == policy_color("colocate")
    assert six_colors["fixed_pd[num_prefill=4] (best split)"] == policy_color("best_fixed")   # the best split highlighted
    # The table's columns follow the same order.
    header = (six[0] / "speedup.md").read_text().split("## Rollout-time speedup")[1].splitlines()[2]
    assert header.index("| colocate |") < header.index("| best_fixed |") < header.index("| prorsa |") \
        < header.index("| oracle_pd |") < header.index("| pearl |")


def test_every_figure_is_png_and_pdf_at_a_printable_width(six):
    root, drawn = six
    figures = root / "figures"
    written = sorted(p.name for p in figures.iterdir())
    assert written == sorted(f"{stem}.{ext}" for stem in drawn for ext in ("png", "pdf"))
    assert set(drawn) == {"demand_search_exp_sync_dense_h100", "completion_cdf_search_exp_sync_dense_h100",
                          "makespan_vs_pd_search_exp_sync_dense_h100", "prorsa_timeline_search_exp_sync_dense_h100",
                          "speedup_bars"}
    for stem in drawn:
        with Image.open(figures / f"{stem}.png") as image:
            assert image.size[0] / image.info["dpi"][0] <= MAX_WIDTH_IN, stem
        media_box = re.search(rb"/MediaBox \[\s*0 0 ([\d.]+)", (figures / f"{stem}.pdf").read_bytes())
        assert float(media_box[1]) / 72 <= MAX_WIDTH_IN, stem
        assert b"/CreationDate" not in (figures / f"{stem}.pdf").read_bytes(), stem   # redrawn: the same file
    for name, fig in drawn.items():
        assert "search_exp" in fig["text"] and "n=2 seeds" in fig["text"], name    # experiment and seeds named
    bars = drawn["speedup_bars"]["axes"][0].containers
    prorsa = next(b for b in bars if b.get_label() == "prorsa")
    assert len(prorsa.errorbar.lines[2][0].get_segments()) == 1                    # spread over seeds drawn


def test_demand_figure_has_at_most_four_rows_on_shared_axes(six):
    """Six policies ran; the demand figure shows colocate, the best split, prorsa and oracle_pd."""
    axes = six[1]["demand_search_exp_sync_dense_h100"]["axes"]
    assert axes[0].get_gridspec().nrows == 4 and len(axes) == 4 * 3
    assert [a.get_ylabel().split("\n")[0] for a in axes[::3]] == ["colocate", "fixed_pd", "prorsa", "oracle_pd"]
    assert "num_prefill=4" in axes[3].get_ylabel() and "(best split)" in axes[3].get_ylabel()
    assert all(axes[0].get_shared_x_axes().joined(axes[0], a) for a in axes)
    assert all(axes[col].get_shared_y_axes().joined(axes[col], axes[col + 9]) for col in range(3))


def test_prorsa_timeline_marks_switches_and_forecast(six):
    timeline = six[1]["prorsa_timeline_search_exp_sync_dense_h100"]
    assert len(timeline["axes"]) == 3                    # engines, prefill and decode forecast vs actual
    assert {"actual", "forecast (next bin)"} <= set(timeline["colors"])
    switches = [line for line in timeline["axes"][0].get_lines() if list(line.get_xdata()) == [1.0, 1.0]]
    assert len(switches) == 1                           # the decision at t=1 s; the one at 0 is the start
    assert "2 engine role switches" in timeline["text"]
    assert timeline["legend"].count("role switch") == 1 and "(dotted)" not in timeline["text"]


def test_report_logs_its_table_and_figures_to_wandb(sweep, monkeypatch):
    """`--wandb`: one offline W&B run under OUT/wandb holding speedup.csv as a table (same rows) and
    every PNG figure as an image; checked in the run's .wandb file."""
    from tests.test_wandb import finished_records
    monkeypatch.delenv("WANDB_MODE", raising=False)
    main([str(sweep), "--wandb"])
    [run_file] = list(sweep.glob("wandb/offline-run-*/run-*.wandb"))
    records = finished_records(run_file)
    history = {item.key or "/".join(item.nested_key): item.value_json for r in records if r.HasField("history")
               for item in r.history.item}
    assert int(history["speedup/nrows"]) == len(pd.read_csv(sweep / "speedup.csv"))
    pngs = {p.stem for p in (sweep / "figures").glob("*.png")}
    assert pngs and {f"figures/{stem}/_type" for stem in pngs} <= set(history)
    [run] = [r.run for r in records if r.HasField("run")]
    assert run.job_type == "report"


def test_report_survives_a_wandb_failure(sweep, monkeypatch, caplog):
    """W&B failing (its directory not writable) costs the report nothing: one warning, files written."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    (sweep / "wandb").write_text("not a directory")
    main([str(sweep), "--wandb"])
    assert (sweep / "speedup.csv").exists() and (sweep / "figures" / "speedup_bars.png").exists()
    assert any("W&B: the report was not logged" in r.message for r in caplog.records)


def test_speedup_md_lists_prorsas_decisions(six):
    """Each Prorsa run's start and switches (make_run: colocated at 0 s, 2 prefill engines at 1 s)."""
    root, _ = six
    section = (root / "speedup.md").read_text().split("## Prorsa's decisions")[1].split("\n## ")[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("- ")]
    assert len(lines) == 2 and all("2 engine role switches; 0 s: colocated, 1 s: 2P" in ln for ln in lines), section


def test_printed_summary_names_prorsas_decisions(caplog):
    from harness.report import SUMMARY_ROWS, print_summary
    summary = {k: 1.0 for k, _ in SUMMARY_ROWS} | {"policy": "prorsa", "workload": "w", "mode": "sync",
                                                   "cluster": "c", "prorsa_decisions": [[0.0, 4], [30.0, 0]]}
    with caplog.at_level("INFO", logger="harness.report"):
        print_summary(summary)
    assert "prorsa_decisions" in caplog.text and "0 s: 4P, 30 s: colocated" in caplog.text


def test_runs_linked_into_one_directory_are_found_and_an_empty_one_is_named(sweep, tmp_path, capsys):
    """A report over runs of several sweeps linked into one directory finds each linked run; a directory
    with no run stops with a one-line error naming it (exit 2, no traceback)."""
    linked = tmp_path / "linked"
    linked.mkdir()
    runs = find_runs([sweep])
    for i, run in enumerate(runs):
        (linked / f"run{i}").symlink_to(run.path.resolve(), target_is_directory=True)
    assert len(find_runs([linked])) == len(runs) > 0
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit) as stop:
        main([str(empty)])
    assert stop.value.code == 2
    assert f"no runs (summary.json, error.json or .hydra) under {empty}" in capsys.readouterr().err


def test_claims_script_computes_coexistence_and_fixed_splits_per_seed(tmp_path):
    """scripts/claims.py on hand-made runs: make_run's timeseries has prefill queued in 2 of 3 samples
    and decodes in 2, both in 1 (share 1/3); on search-sync 2P6D is 2x colocation and 4P4D 0.5x at both
    seeds. What was not run shows as "-"."""
    sweep = tmp_path / "search-sync"
    for seed, colocate in ((0, 100.0), (1, 80.0)):
        tail = f",seed={seed}" if seed else ""
        make_run(sweep, f"+experiment=search,policy=colocate{tail}", "colocate", colocate, seed=seed)
        make_run(sweep, f"+experiment=search,policy.num_prefill=2,policy=fixed_pd{tail}", "fixed_pd", colocate / 2,
                 seed=seed, num_prefill=2)
        make_run(sweep, f"+experiment=search,policy.num_prefill=4,policy=fixed_pd{tail}", "fixed_pd", colocate * 2,
                 seed=seed, num_prefill=4)
    out = subprocess.run([sys.executable, "scripts/claims.py", str(tmp_path)], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], check=True).stdout
    assert "| 0.33 (0.33-0.33, n=2) | - | - | - |" in out
    assert "| best fixed split per seed | 2P6D, 2P6D | - |" in out
    assert "| best fixed / colocate | 2.00 (2.00-2.00, n=2) | - |" in out
    assert "| worst fixed / colocate | 0.50 (0.50-0.50, n=2) | - |" in out
    subprocess.run([sys.executable, "scripts/claims.py", str(tmp_path), str(tmp_path / "claims.md")],
                   cwd=Path(__file__).resolve().parents[1], check=True)
    assert (tmp_path / "claims.md").read_text() == out
    values = json.loads((tmp_path / "claims.json").read_text())   # what REPRODUCE.md's claims table reads
    assert values["splits"]["search-sync"] == {"best": ["2P6D", "2P6D"], "best_speedup": [2.0, 2.0],
                                               "worst_speedup": [0.5, 0.5]}
    assert values["coexist"]["search"] == pytest.approx([1 / 3, 1 / 3])
    missing = subprocess.run([sys.executable, "scripts/claims.py", str(tmp_path / "nothing")], capture_output=True,
                             text=True, cwd=Path(__file__).resolve().parents[1])
    assert missing.returncode != 0 and "no such directory" in missing.stderr and "Traceback" not in missing.stderr



def test_serve_runs_get_their_own_table_in_ms(tmp_path):
    root = tmp_path / "serve"
    for policy, ttft in (("colocate", 0.25), ("fixed_pd", 0.5)):
        d = make_run(root, policy, policy, 10.0, mode="serve", timeseries=False)
        summary = json.loads((d / "summary.json").read_text())
        summary |= {"request_throughput_per_s": 4.0, "input_tokens_per_s": 4000.0, "output_tokens_per_s": 400.0,
                    "total_tokens_per_s_per_gpu": 137.5, "ttft_p50_s": ttft, "ttft_p90_s": ttft, "ttft_p99_s": 1.0,
                    **{f"{m}_p{p}_s": 0.02 for m in ("tpot", "itl") for p in (50, 90, 99)}}
        (d / "summary.json").write_text(json.dumps(summary))
    main([str(root)])
    table = pd.read_csv(root / "serve.csv")
    assert list(table["policy"]) == ["colocate", "fixed_pd"]
    assert list(table["TTFT p50 ms"]) == [250.0, 500.0] and (table["ITL p99 ms"] == 20.0).all()
    assert (table["req/s"] == 4.0).all() and (table["tok/s/GPU"] == 138.0).all()
    assert "## Serving benchmark" in (root / "speedup.md").read_text()


def test_sync_runs_write_no_serve_table(sweep):
    main([str(sweep)])
    assert not (sweep / "serve.csv").exists()
    assert "Serving benchmark" not in (sweep / "speedup.md").read_text()


def test_report_prints_its_speedup_table(sweep, capsys):
    main([str(sweep)])
    out = capsys.readouterr().out
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("Rollout-time speedup over colocate"))
    columns = lines[head + 1].split()
    assert columns[:3] == ["workload", "mode", "cluster"] and "best_fixed" in columns and "hindsight_best" in columns
    sync = next(line for line in lines[head + 2:] if " sync " in line)
    assert sync.split()[:3] == ["search", "sync", "dense_h100"] and "4.00 ± 0.00 (n=2)" in sync
    assert any(line.startswith("Efficiency: lower_bound_s / rollout_time_s") for line in lines)


def test_report_prints_and_writes_why_each_row_lands_where_it_does(sweep, capsys):
    """colocate's critical path in the sync row: trajectory 0 (it ends last), 1 s prefill and 2 s tool per
    100 or 120 s seed; colocate at 50/100 and 50/120 of the bound, which leaves 100% and 140% to gain."""
    main([str(sweep)])
    line = ("search · sync · dense_h100: decode-bound: 96% of colocate's critical path in decode (tool 2%, queue 0%, "
            "prefill 2%, transfer 0%); colocate is at 0.46 of the lower bound: no allocation can beat it by more "
            "than 120.0%")
    out = capsys.readouterr().out.splitlines()
    assert out[out.index(line) - 2].startswith("Why: where each row's critical path goes")   # after the async row's
    assert f"- {line}" in (sweep / "speedup.md").read_text()
    why = pd.read_csv(sweep / "why.csv").set_index(["mode", "policy"])
    assert why.loc[("sync", "colocate"), "tool"] == pytest.approx((2 / 100 + 2 / 120) / 2)
    assert why.loc[("sync", "colocate"), "seeds"] == 2
    assert why.loc[("async", "colocate"), "decode"] == pytest.approx(130 / 135)   # the mean trajectory: 88 + 42 s


def test_a_row_has_one_name_in_the_table_and_the_figures(tmp_path, monkeypatch):
    """A row whose runs name an experiment is called by it in speedup.md as in the figures' titles."""
    make_run(tmp_path, "colocate", "colocate", 100.0, workload="synthetic", experiment="heavy_prefill")
    make_run(tmp_path, "prorsa", "prorsa", 60.0, workload="synthetic", experiment="heavy_prefill")
    drawn = record_figures(monkeypatch)
    main([str(tmp_path)])
    md = (tmp_path / "speedup.md").read_text()
    assert "| heavy_prefill | sync |" in md and "| synthetic |" not in md
    for name, fig in drawn.items():
        assert "heavy_prefill" in fig["text"] and "synthetic" not in fig["text"], name


# --- figure flaws a reader meets: greyscale, palettes, legends, labels, titles --------------------
def test_policies_stay_apart_in_greyscale_and_where_curves_coincide(six):
    """Each policy's curve has its own marker and line style, each bar its own hatch."""
    markers = six[1]["completion_cdf_search_exp_sync_dense_h100"]["markers"]
    assert len(markers) == 6 and len(set(markers.values())) == len(markers), markers
    from matplotlib.container import BarContainer
    hatches = [c.patches[0].get_hatch() for c in six[1]["speedup_bars"]["axes"][0].containers
               if isinstance(c, BarContainer)]
    assert len(hatches) >= 4 and all(hatches) and len(set(hatches)) == len(hatches), hatches
    looks = [(str(look.linestyle), look.marker, look.hatch) for look in LOOKS.values()]
    assert all(len({x[i] for x in looks}) == len(looks) for i in range(3)), looks


def test_role_colours_are_no_policy_colours_and_the_two_bests_differ():
    from matplotlib.colors import to_rgb
    assert not set(ROLE_COLORS.values()) & {look.color for look in LOOKS.values()}
    assert COLORS["best_fixed"] != COLORS["hindsight_best"]
    grey = {name: sum(w * c for w, c in zip((0.299, 0.587, 0.114), to_rgb(color))) for name, color in ROLE_COLORS.items()}
    assert abs(grey["prefill"] - grey["decode"]) > 0.3        # prefill and decode apart in greyscale too


def test_legends_name_only_what_is_drawn(six):
    """Every hand-made run is colocated throughout: no prefill, decode or switching entry."""
    assert six[1]["demand_search_exp_sync_dense_h100"]["legend"] == ["colocated"]
    assert six[1]["prorsa_timeline_search_exp_sync_dense_h100"]["legend"] == [
        "colocated", "role switch", "actual", "forecast (next bin)"]


def test_best_split_only_for_the_best_of_two_or_more(six, tmp_path, monkeypatch):
    assert "best split (4:4)" in six[1]["makespan_vs_pd_search_exp_sync_dense_h100"]["legend"]
    make_run(tmp_path, "colocate", "colocate", 100.0)
    make_run(tmp_path, "pd2", "fixed_pd", 120.0, num_prefill=2)      # the only split, slower than colocation
    make_run(tmp_path, "prorsa", "prorsa", 90.0)
    drawn = record_figures(monkeypatch)
    main([str(tmp_path)])
    for name, fig in drawn.items():
        shown = fig["text"] + " ".join(fig["legend"]) + " ".join(a.get_ylabel() for a in fig["axes"])
        assert "best" not in shown.replace("best_fixed", ""), (name, shown)


def test_titles_have_at_most_two_lines_even_with_a_long_setting(tmp_path, monkeypatch):
    for seed in (0, 1):
        for name, policy, rollout in [("colocate", "colocate", 100.0), ("prorsa", "prorsa", 80.0)]:
            for i, mechanism in enumerate(["kv_both", "drain"]):
                make_run(tmp_path, f"{name}_{i}_s{seed}", policy, rollout + i, seed,
                         cluster={"switch_mechanism": mechanism, "switch_time_s": 10.0 + i,
                                  "kv_transfer_setup_s": 0.001 * i, "router_balance_rel": 1.0 + i})
    drawn = record_figures(monkeypatch)
    main([str(tmp_path)])
    assert len(drawn) >= 5
    for name, fig in drawn.items():
        assert all(title.count("\n") <= 1 for title in fig["titles"]), (name, fig["titles"])


def test_tick_labels_never_collide_with_many_rows(tmp_path, monkeypatch):
    """The speedup bars of sixteen rows (the committed ones had eight, rotated and overprinting)."""
    import matplotlib.pyplot as plt
    from harness.figure_style import rc
    workloads = ["search", "search_long", "swe", "tooluse", "browse", "reasoning", "mix_reason_browse", "synthetic"]
    for w in workloads:
        for mode in ("sync", "async"):
            make_run(tmp_path, f"colocate_{w}_{mode}", "colocate", 100.0, workload=w, mode=mode, timeseries=False)
            make_run(tmp_path, f"prorsa_{w}_{mode}", "prorsa", 90.0, workload=w, mode=mode, timeseries=False)
    drawn = record_figures(monkeypatch)
    figures = Figures(runs_frame(find_runs([tmp_path])), tmp_path / "figures")
    figures.out.mkdir()
    with plt.rc_context(rc()):
        figures.speedup_bars()
    bars = drawn["speedup_bars"]
    assert bars["rotations"] == {0.0}
    for boxes in bars["tick_boxes"]:
        for i, a in enumerate(boxes):
            assert not any(a.overlaps(b) for b in boxes[i + 1:]), "tick labels overlap"
    assert len(bars["tick_boxes"][0]) >= 2 * len(workloads)


# --- broken inputs -----------------------------------------------------------------------------------
# A run whose file cannot be read (case id, how it is damaged, what the report must say of it): listed as
# broken with its directory and the file, left out of every table and figure; the report still completes.
def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


def damage_row_group(path: Path, group: int, column: str, how: str) -> None:
    """Rewrites the file in row groups of one row, then damages row group `group` (from 0) where `column`'s
    chunk starts: its page header overwritten ("garbage") or 32 bytes cut out there, shifting the rest
    ("cut"). The footer stays readable either way."""
    import pyarrow.parquet as pq
    pd.read_parquet(path).to_parquet(path, row_group_size=1)
    meta = pq.ParquetFile(path).metadata
    chunk = meta.row_group(group).column(meta.schema.names.index(column))
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    if how == "garbage":
        data[start:start + 16] = b"\xff" * 16
    else:
        del data[start:start + 32]
    path.write_bytes(bytes(data))


def set_summary(d: Path, **keys) -> None:
    (d / "summary.json").write_text(json.dumps({**json.loads((d / "summary.json").read_text()), **keys}))


BROKEN = [
    ("summary_truncated", lambda d: truncate(d / "summary.json"), "summary.json: cannot be read ("),
    ("summary_empty", lambda d: (d / "summary.json").write_text(""), "summary.json: cannot be read (Expecting value"),
    ("summary_not_utf8", lambda d: (d / "summary.json").write_bytes(b'{"policy": "\xff"}'),
     "summary.json: not UTF-8 (byte 0xff at offset 12)"),
    ("summary_a_list", lambda d: (d / "summary.json").write_text("[]"), "summary.json: a JSON list, not an object"),
    ("summary_rollout_nan", lambda d: set_summary(d, rollout_time_s=float("nan")),
     "summary.json: rollout_time_s=nan, not a finite number"),
    ("summary_rollout_zero", lambda d: set_summary(d, rollout_time_s=0), "summary.json: rollout_time_s=0, not > 0"),
    ("summary_lower_bound_inf", lambda d: set_summary(d, lower_bound_s=float("inf")),
     "summary.json: lower_bound_s=inf, not a finite number"),
    ("summary_policy_missing", lambda d: set_summary(d, policy=None), "summary.json: policy=None, not a string"),
    ("error_truncated", lambda d: (d / "error.json").write_text('{"message": "poli'),
     "error.json: cannot be read (Unterminated string"),
    ("error_no_message", lambda d: (d / "error.json").write_text('{"error": "ValueError"}'),
     "error.json: not an object with a message"),
    ("config_truncated_in_a_value", lambda d: (d / ".hydra" / "config.yaml").write_text("policy: {_target_: [\n"),
     ".hydra/config.yaml: cannot be read (while parsing"),
    ("config_truncated_at_a_line", lambda d: (d / ".hydra" / "config.yaml").write_text("policy:\n  _target_: x\n"),
     ".hydra/config.yaml: no workload, mode, cluster, seed (truncated, or not a run's config)"),
    ("overrides_not_a_list", lambda d: (d / ".hydra" / "overrides.yaml").write_text("policy: x\n"),
     ".hydra/overrides.yaml: not a list of overrides"),
    ("lifecycle_truncated", lambda d: truncate(d / "lifecycle.parquet"), "lifecycle.parquet: not a readable parquet file"),
    ("lifecycle_missing", lambda d: (d / "lifecycle.parquet").unlink(), "lifecycle.parquet: missing"),
    ("lifecycle_no_column", lambda d: pd.DataFrame({"trajectory_id": [0]}).to_parquet(d / "lifecycle.parquet"),
     "lifecycle.parquet: no column step, t_ready, t_prefill_start, t_prefill_end, t_transfer_end, t_decode_start, "
     "t_decode_end, t_tool_end"),
    ("lifecycle_row_group_garbage", lambda d: damage_row_group(d / "lifecycle.parquet", 2, "turn", "garbage"),
     "lifecycle.parquet: row group 3 of 3 cannot be read (Couldn't deserialize thrift"),
    ("lifecycle_row_group_cut", lambda d: damage_row_group(d / "lifecycle.parquet", 1, "trajectory_id", "cut"),
     "lifecycle.parquet: row group 2 of 3 cannot be read ("),
    ("timeseries_row_group_garbage", lambda d: damage_row_group(d / "timeseries.parquet", 0, "t_s", "garbage"),
     "timeseries.parquet: row group 1 of 3 cannot be read (Couldn't deserialize thrift"),
    ("timeseries_truncated", lambda d: truncate(d / "timeseries.parquet", 0.9), "timeseries.parquet: not a readable parquet"),
    ("forecast_truncated", lambda d: truncate(d / "forecast.parquet"), "forecast.parquet: not a readable parquet file"),
]


def snapshot(d: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(d)): (p.lstat().st_mtime_ns, p.lstat().st_size) for p in d.rglob("*")}


@pytest.mark.parametrize("cid,damage,expected", BROKEN, ids=[c[0] for c in BROKEN])
def test_a_broken_run_is_listed_and_left_out(tmp_path, capsys, cid, damage, expected):
    root = tmp_path / "sweep"
    make_run(root, "colocate", "colocate", 100.0)
    make_run(root, "pd2", "fixed_pd", 50.0, num_prefill=2)
    broken = make_run(root, "broken", "prorsa", 25.0)          # were it read, a speedup of 4.0 would show
    damage(broken)
    before = snapshot(root)
    main([str(root), "--out", str(tmp_path / "out")])
    shown = capsys.readouterr()
    assert f"not included: {broken} (policy=prorsa seed=0): broken: {expected}" in shown.out \
        or f"not included: {broken} (no overrides): broken: {expected}" in shown.out, shown.out
    assert "Traceback" not in shown.out + shown.err
    assert "2 complete runs, 1 failed, partial or broken" in shown.out
    md = (tmp_path / "out" / "speedup.md").read_text()
    assert "prorsa" not in md.split("## Failed runs")[0] and "4.00" not in md
    assert (tmp_path / "out" / "figures" / "speedup_bars.png").is_file()
    assert snapshot(root) == before                            # the runs' own files untouched


def test_a_broken_run_through_the_console_script_prints_no_traceback(tmp_path):
    root = tmp_path / "sweep"
    make_run(root, "colocate", "colocate", 100.0)
    truncate(make_run(root, "broken", "fixed_pd", 50.0, num_prefill=2) / "lifecycle.parquet")
    before = snapshot(root)
    res = subprocess.run([sys.executable, "-m", "harness.report", str(root), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"{root / 'broken'} (policy=fixed_pd seed=0): broken: lifecycle.parquet: not a readable parquet" in res.stdout
    assert "Traceback" not in res.stdout + res.stderr
    assert snapshot(root) == before


@pytest.mark.parametrize("under,expected", [
    ("a_file", "--out='{out}' is invalid; allowed: a directory that can be written ({out} is not a directory)"),
    ("a_file/report", "--out='{out}' is invalid; allowed: a directory that can be written ({parent} is not a directory)"),
], ids=["out_is_a_file", "out_under_a_file"])
def test_out_that_cannot_be_a_directory_is_refused(sweep, tmp_path, capsys, under, expected):
    (tmp_path / "a_file").write_text("mine")
    out = tmp_path / under
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main([str(sweep), "--out", str(out)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and expected.format(out=out, parent=out.parent) in err, err
    assert "Traceback" not in err and snapshot(tmp_path) == before and (tmp_path / "a_file").read_text() == "mine"


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only tmpfs needs root")
def test_a_read_only_out_is_refused(sweep, tmp_path):
    from tests.test_run_dir_faults import tmpfs
    before = snapshot(sweep)
    with tmpfs(tmp_path / "ro", ",ro") as ro:
        for args in ([str(sweep), "--out", str(ro / "report")], [str(ro)]):
            res = subprocess.run([sys.executable, "-m", "harness.report", *args], capture_output=True, text=True,
                                 timeout=300, cwd=Path(__file__).resolve().parents[1])
            assert res.returncode == 2, res.stderr[-3000:]
            assert f"({ro} is read-only)" in res.stderr, res.stderr[-3000:]
            assert "Traceback" not in res.stdout + res.stderr
    assert snapshot(sweep) == before


def test_a_link_loop_is_walked_once_and_a_run_linked_twice_counts_once(sweep, tmp_path):
    (sweep / "loop").symlink_to(sweep, target_is_directory=True)
    (sweep / "pd2_s0" / "back").symlink_to(sweep, target_is_directory=True)
    (sweep / "again").symlink_to(sweep / "colocate_s0", target_is_directory=True)
    found = find_runs([sweep, sweep / "pd2_s0"])
    assert len(found) == len({r.path.resolve() for r in found}) == 11, [str(r.path) for r in found]


# --- a report that cannot be written ------------------------------------------------------------------
def full_disk(monkeypatch, when) -> None:
    """Writes of the report's files whose path `when` picks fail as on a full disk; the others go on."""
    import matplotlib.figure
    write_text, savefig = Path.write_text, matplotlib.figure.Figure.savefig

    def check(path) -> None:
        if when(Path(path)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(Path, "write_text", lambda path, *a, **k: check(path) or write_text(path, *a, **k))
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, path, *a, **k: check(path) or savefig(fig, path, *a, **k))


def failed_move(monkeypatch, when) -> None:
    """Moving a staged file into the report directory fails where `when` picks its destination."""
    replace = os.replace

    def moving(src, dst):
        if ".report-" in str(src) and "replaced-" not in str(src) and when(Path(dst)):
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(src), None, str(dst))
        replace(src, dst)
    monkeypatch.setattr(os, "replace", moving)


def tree(d: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(d)): None if p.is_dir() else p.read_bytes() for p in d.rglob("*")} if d.exists() else {}


@pytest.mark.parametrize("out_exists,inject,failed,reason", [
    (True, lambda mp: full_disk(mp, lambda p: p.name == "speedup.md"), "speedup.md",
     "No space left on device"),
    (True, lambda mp: full_disk(mp, lambda p: p.name == "speedup_bars.pdf"), "figures/speedup_bars.pdf",
     "No space left on device"),
    (False, lambda mp: full_disk(mp, lambda p: p.name == "speedup_bars.pdf"), "figures/speedup_bars.pdf",
     "No space left on device"),
    (True, lambda mp: failed_move(mp, lambda p: p.name == "speedup.tex"), "speedup.tex", "Input/output error"),
], ids=["table_into_an_old_report", "figure_into_an_old_report", "figure_into_a_new_out", "a_move_into_place"])
def test_a_report_that_cannot_be_written_leaves_out_as_it_was(sweep, tmp_path, capsys, monkeypatch, out_exists,
                                                               inject, failed, reason):
    """A write that fails midway (the tables or figures before it written) or a move into place that fails:
    OUT holds what it held before, file for file (an earlier report and a user's own file; nothing if it
    did not exist), and the error is one line naming the file."""
    out = tmp_path / "out"
    if out_exists:
        main([str(sweep), "--out", str(out)])
        assert (out / "speedup.md").is_file() and not list(out.glob(".report-*"))   # nothing staged left
        (out / "mine.txt").write_text("mine")
    before = tree(out)
    make_run(sweep, "pd6_s0", "fixed_pd", 20.0, num_prefill=6)   # the new report would differ
    capsys.readouterr()
    inject(monkeypatch)
    with pytest.raises(SystemExit) as stop:
        main([str(sweep), "--out", str(out)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    assert [line for line in err.splitlines() if "error:" in line] == \
        [f"python -m harness.report: error: cannot write {out / failed}: {reason}; {out} is as it was"], err
    assert tree(out) == before and out.exists() == out_exists


def test_a_killed_report_leaves_no_staging_directory_behind_the_next_one(sweep, tmp_path):
    """A report killed mid-write (here: exiting inside its staging block, with no clean-up) leaves its
    staging directory in OUT; the next report removes it, as it does every one whose writer has ended, and
    keeps a concurrent report's (this process's id), another machine's, one without a process id (as
    earlier versions named them) and anything else whose name is not exactly a staging directory's."""
    out = tmp_path / "out"
    code = ("import os, sys; from pathlib import Path; from harness.report import staged\n"
            "with staged(Path(sys.argv[1])) as stage:\n"
            "    (stage / 'speedup.md').write_text('half')\n"
            "    print(stage.name, flush=True)\n"
            "    os._exit(9)\n")
    killed = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=300,
                            cwd=Path(__file__).resolve().parents[1])
    assert killed.returncode == 9, killed.stderr[-3000:]
    left, host = out / killed.stdout.strip(), _host()
    assert re.fullmatch(rf"\.report-\d+@{re.escape(host)}-[a-z0-9_]{{8}}", left.name), left.name
    assert (left / "speedup.md").is_file()
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                           check=True)
    dead = int(ended.stdout)   # a process that has exited
    stale = out / f".report-{dead}@{host}-abcd_123"
    kept = [out / f".report-{os.getpid()}@{host}-efgh_456",   # a live writer: a concurrent report
            out / f".report-{dead}@another.host-abcd_123",     # another machine's, on a shared disk
            out / ".report-abcd_123",                          # no process id
            out / ".report-notes",                             # not a staging directory's name
            out / f".report-{dead}@{host}-abcd_123.bak"]
    for d in [stale, *kept]:
        d.mkdir()
        (d / "mine.txt").write_text("mine")
    (out / ".report-notes.txt").write_text("notes")
    (out / f".report-{dead}@{host}-file_123").write_text("a file, not a directory")

    main([str(sweep), "--out", str(out)])
    assert not left.exists() and not stale.exists()
    assert all((d / "mine.txt").read_text() == "mine" for d in kept)
    assert (out / ".report-notes.txt").read_text() == "notes"
    assert (out / f".report-{dead}@{host}-file_123").is_file()
    assert (out / "speedup.md").read_text() != "half"
    assert sorted(p.name for p in out.glob(".report-*")) == sorted(
        [d.name for d in kept] + [".report-notes.txt", f".report-{dead}@{host}-file_123"])   # its own removed too
