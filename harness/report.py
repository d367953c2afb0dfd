"""Reports from result files alone: `python -m harness.report DIR [DIR...] [--out OUT]`.

Finds every run under the directories (a directory with summary.json, error.json or .hydra/), and writes
into OUT (default: the first DIR):
- speedup.csv / speedup.md / speedup.tex: one row per workload x mode x cluster (x any other setting that
  varies inside it), one column per policy: rollout-time speedup over colocate on the same row and seed
  (mean and std over seeds), and efficiency against lower_bound_s;
- figures/*.png and *.pdf: demand vs engines per role over time, CDF of trajectory completion time,
  speedup bars, makespan vs the P:D split of fixed_pd runs.
A failed or partial run is listed in a "failed runs" section and never enters a mean.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

SUMMARY_ROWS = [("policy", "{}"), ("workload", "{}"), ("mode", "{}"), ("cluster", "{}"),
                ("completed_trajectories", "{}"), ("rollout_time_s", "{:.2f}"), ("lower_bound_s", "{:.2f}"),
                ("efficiency_vs_lower_bound", "{:.2f}"), ("throughput_traj_per_s", "{:.3f}"),
                ("turn_latency_p50_s", "{:.2f}"), ("turn_latency_p99_s", "{:.2f}"), ("num_role_switches", "{}"),
                ("preemptions", "{}"), ("wall_time_s", "{:.2f}")]
log = logging.getLogger(__name__)

BASELINE = "colocate"
ROW_KEYS = ["workload", "mode", "cluster", "setting"]
# Config keys that never distinguish two runs' results (or are reported as their own column).
IGNORED_KEYS = ("seed", "logger", "progress_interval_s", "sample_interval_s")


def print_summary(summary: dict) -> None:
    width = max(len(k) for k, _ in SUMMARY_ROWS)
    for key, fmt in SUMMARY_ROWS:
        print(f"{key:<{width}}  {fmt.format(summary[key])}")


# --- finding runs ---------------------------------------------------------------------------------
@dataclass
class Run:
    path: Path
    summary: dict | None
    config: dict                    # flattened .hydra/config.yaml ({} for a run without one)
    overrides: list[str]
    problem: str = ""               # why the run is not complete; "" when it is

    @property
    def complete(self) -> bool:
        return not self.problem


def _flatten(d: dict, prefix: str = "") -> dict:
    flat = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(_flatten(v, key + "."))
        else:
            flat[key] = json.dumps(v) if isinstance(v, list) else v
    return flat


def load_run(path: Path) -> Run:
    hydra_dir = path / ".hydra"
    config = yaml.safe_load((hydra_dir / "config.yaml").read_text()) if (hydra_dir / "config.yaml").exists() else {}
    overrides = yaml.safe_load((hydra_dir / "overrides.yaml").read_text()) if (hydra_dir / "overrides.yaml").exists() else []
    run = Run(path, None, _flatten(config or {}), list(overrides or []))
    if (path / "error.json").exists():
        error = json.loads((path / "error.json").read_text())
        run.problem = "failed: " + error["message"]
        run.overrides = run.overrides or error.get("overrides", [])
    elif not (path / "summary.json").exists():
        run.problem = "partial: no summary.json (crashed, killed or still running)"
    else:
        run.summary = json.loads((path / "summary.json").read_text())
        done, total = run.summary["completed_trajectories"], run.summary["num_trajectories"]
        if done < total:
            run.problem = f"partial: {done} of {total} trajectories completed"
    return run


def find_runs(dirs: list[Path]) -> list[Run]:
    paths = set()
    for d in dirs:
        for marker in ("summary.json", "error.json", ".hydra"):
            for p in d.rglob(marker):
                if "wandb" not in p.parent.relative_to(d).parts:
                    paths.add(p.parent)
    return [load_run(p) for p in sorted(paths)]


# --- tables ---------------------------------------------------------------------------------------
def _varying(configs: list[dict], keep) -> list[str]:
    keys = sorted({k for c in configs for k in c if keep(k)})
    return [k for k in keys if len({repr(c.get(k)) for c in configs}) > 1]


def _label(config: dict, keys: list[str], strip: str = "") -> str:
    return ",".join(f"{k.removeprefix(strip)}={config.get(k)}" for k in keys)


def runs_frame(runs: list[Run]) -> pd.DataFrame:
    """One row per complete run. A policy whose own settings vary (fixed_pd's num_prefill) is one
    column per setting; any other setting that varies within a workload x mode x cluster is a row."""
    done = [r for r in runs if r.complete]
    rows = []
    for r in done:
        s = r.summary
        rows.append({"path": str(r.path), "policy_name": s["policy"], "workload": s["workload"], "mode": s["mode"],
                     "cluster": s["cluster"], "seed": s["seed"], "rollout_time_s": s["rollout_time_s"],
                     "lower_bound_s": s["lower_bound_s"], "efficiency": s["efficiency_vs_lower_bound"],
                     "num_prefill": r.config.get("policy.num_prefill"),
                     "num_engines": r.config.get("cluster.num_engines")})
    df = pd.DataFrame(rows, columns=["path", "policy_name", "workload", "mode", "cluster", "seed", "rollout_time_s",
                                     "lower_bound_s", "efficiency", "num_prefill", "num_engines"])
    df["policy"], df["setting"] = df["policy_name"], ""
    for name, idx in df.groupby("policy_name").groups.items():
        configs = [done[i].config for i in idx]
        keys = _varying(configs, lambda k: k.startswith("policy.") and k != "policy._target_")
        if keys:
            df.loc[idx, "policy"] = [f"{name}[{_label(c, keys, 'policy.')}]" for c in configs]
    for _, idx in df.groupby(["workload", "mode", "cluster"]).groups.items():
        configs = [done[i].config for i in idx]
        keys = _varying(configs, lambda k: not k.startswith("policy.") and k.split(".")[0] not in IGNORED_KEYS)
        df.loc[idx, "setting"] = [_label(c, keys) for c in configs]
    return df


def _policy_order(policies) -> list[str]:
    return sorted(set(policies), key=lambda p: (p != BASELINE, p))


def best_fixed(per_seed: pd.DataFrame) -> pd.DataFrame:
    """The `best_fixed` baseline: of all fixed P:D splits run on the same row and seed, the fastest,
    chosen in hindsight (needs fixed_pd run with more than one num_prefill)."""
    fixed = per_seed["policy"].str.startswith("fixed_pd[")
    return _fastest(per_seed[fixed], "best_fixed")


def hindsight_best(per_seed: pd.DataFrame) -> pd.DataFrame:
    """The `hindsight_best` row: the fastest static allocation (colocation or any fixed split) on the
    same row and seed, chosen in hindsight; what an allocator that never switches could reach at best."""
    fixed = per_seed["policy"].str.startswith("fixed_pd[")
    if not fixed.any():
        return per_seed.iloc[:0]
    return _fastest(per_seed[fixed | (per_seed["policy"] == BASELINE)], "hindsight_best")


def _fastest(runs: pd.DataFrame, policy: str) -> pd.DataFrame:
    """Of `runs`, the fastest on each row and seed, named `policy`."""
    if runs.empty:
        return runs
    return runs.loc[runs.groupby(ROW_KEYS + ["seed"])["rollout_time_s"].idxmin()].assign(policy=policy)


def oracle_below_hindsight(table: pd.DataFrame) -> list[str]:
    """Settings where oracle_pd is slower than the best static allocation (an oracle never should be)."""
    wide = table.pivot(index=ROW_KEYS, columns="policy", values="rollout_time_s")
    if not {"oracle_pd", "hindsight_best"} <= set(wide.columns):
        return []
    below = wide[wide["oracle_pd"] > wide["hindsight_best"] * (1 + 1e-9)]
    return [f"{' '.join(str(k) for k in key if k)}: oracle_pd {r.oracle_pd:.2f} s > hindsight_best "
            f"{r.hindsight_best:.2f} s" for key, r in below.iterrows()]


def speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Per run: speedup over colocate with the same row keys and seed (NaN where there is none)."""
    per_seed = df.groupby(ROW_KEYS + ["policy", "seed"], as_index=False)[["rollout_time_s", "efficiency"]].mean()
    per_seed = pd.concat([per_seed, best_fixed(per_seed), hindsight_best(per_seed)], ignore_index=True)
    base = per_seed[per_seed["policy"] == BASELINE][ROW_KEYS + ["seed", "rollout_time_s"]]
    merged = per_seed.merge(base, on=ROW_KEYS + ["seed"], how="left", suffixes=("", "_base"))
    merged["speedup"] = merged["rollout_time_s_base"] / merged["rollout_time_s"]
    return merged


def speedup_table(df: pd.DataFrame) -> pd.DataFrame:
    """Long form: one row per (row keys, policy) with mean/std of speedup and efficiency over seeds."""
    s = speedups(df)
    g = s.groupby(ROW_KEYS + ["policy"], as_index=False)
    return g.agg(speedup=("speedup", "mean"), speedup_std=("speedup", "std"), seeds=("seed", "count"),
                 efficiency=("efficiency", "mean"), efficiency_std=("efficiency", "std"),
                 rollout_time_s=("rollout_time_s", "mean"))


def _wide(table: pd.DataFrame) -> pd.DataFrame:
    wide = table.pivot(index=ROW_KEYS, columns="policy",
                       values=["speedup", "speedup_std", "efficiency", "seeds"])
    policies = _policy_order(table["policy"])
    cols = [(v, p) for p in policies for v in ("speedup", "speedup_std", "efficiency", "seeds")]
    wide = wide.reindex(columns=pd.MultiIndex.from_tuples(cols))
    wide.columns = [f"{v}[{p}]" for v, p in wide.columns]
    seeds = [c for c in wide.columns if c.startswith("seeds[")]
    wide[seeds] = wide[seeds].fillna(0).astype(int)
    return wide.reset_index()


def _cell(mean: float, std: float, n: int) -> str:
    if isinstance(mean, float) and math.isnan(mean):
        return "-"
    spread = f" ± {std:.2f}" if n > 1 and not math.isnan(std) else ""
    return f"{mean:.2f}{spread} (n={n})" if n > 1 else f"{mean:.2f}"


def _display(table: pd.DataFrame, value: str) -> pd.DataFrame:
    rows = []
    for key, grp in table.groupby(ROW_KEYS, sort=True):
        row = dict(zip(ROW_KEYS, key))
        for _, r in grp.iterrows():
            row[r["policy"]] = _cell(r[value], r[f"{value}_std"], int(r["seeds"]))
        rows.append(row)
    out = pd.DataFrame(rows)
    policies = _policy_order(table["policy"])
    out = out.reindex(columns=ROW_KEYS + policies).fillna("-")
    return out if (out["setting"] != "").any() else out.drop(columns="setting")


def _md_table(df: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "|".join("---" for _ in df.columns) + "|"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def _tex_escape(text: str) -> str:
    return re.sub(r"([&%_#$])", r"\\\1", str(text)).replace("±", r"$\pm$")


def _tex_table(df: pd.DataFrame, caption: str) -> str:
    head = " & ".join(_tex_escape(c) for c in df.columns) + r" \\"
    body = [" & ".join(_tex_escape(v) for v in row) + r" \\" for row in df.itertuples(index=False)]
    return "\n".join([r"\begin{table}[h]", r"\centering", rf"\caption{{{_tex_escape(caption)}}}",
                      r"\begin{tabular}{" + "l" * len(df.columns) + "}", r"\toprule", head, r"\midrule",
                      *body, r"\bottomrule", r"\end{tabular}", r"\end{table}"])


def _failed_lines(runs: list[Run]) -> list[str]:
    return [f"{r.path} ({' '.join(r.overrides) or 'no overrides'}): {r.problem}" for r in runs if not r.complete]


SPEEDUP_CAPTION = "Rollout-time speedup over colocate (same workload, mode, cluster and seed; mean ± std over seeds)"
EFFICIENCY_CAPTION = "Efficiency: lower_bound_s / rollout_time_s (1.0 is the bound)"


def write_tables(runs: list[Run], out: Path) -> pd.DataFrame:
    df = runs_frame(runs)
    table = speedup_table(df)
    _wide(table).to_csv(out / "speedup.csv", index=False)
    failed = _failed_lines(runs)
    speed, eff = _display(table, "speedup"), _display(table, "efficiency")
    md = [f"# Speedup report\n\n{len(df)} complete runs, {len(failed)} failed or partial.\n",
          f"## {SPEEDUP_CAPTION}\n", _md_table(speed), f"\n## {EFFICIENCY_CAPTION}\n", _md_table(eff),
          "\n## Failed runs\n", *([f"- {line}" for line in failed] or ["None."])]
    below = oracle_below_hindsight(table)
    if below:
        md += ["\n## oracle_pd below hindsight_best (an oracle never should be)\n", *[f"- {x}" for x in below]]
        log.warning("oracle_pd is below hindsight_best in %d setting(s): %s", len(below), "; ".join(below))
    (out / "speedup.md").write_text("\n".join(md) + "\n")
    tex = [_tex_table(speed, SPEEDUP_CAPTION), _tex_table(eff, EFFICIENCY_CAPTION), r"\paragraph{Failed runs}"]
    tex += [r"\begin{itemize}", *[rf"\item \texttt{{{_tex_escape(line)}}}" for line in failed], r"\end{itemize}"] \
        if failed else ["None."]
    (out / "speedup.tex").write_text("\n".join(tex) + "\n")
    return df


# --- figures --------------------------------------------------------------------------------------
@dataclass
class Figures:
    """Seaborn figures from the runs frame and the per-run parquet files, PNG and PDF each."""

    df: pd.DataFrame
    out: Path
    written: list[Path] = field(default_factory=list)

    def save(self, fig, name: str) -> None:
        import matplotlib.pyplot as plt
        for ext in ("png", "pdf"):
            path = self.out / f"{name}.{ext}"
            fig.savefig(path, bbox_inches="tight", dpi=120)
            self.written.append(path)
        plt.close(fig)

    def groups(self):
        for key, grp in self.df.groupby(ROW_KEYS, sort=True):
            title = " / ".join(k for k in key if k)
            slug = re.sub(r"[^A-Za-z0-9_.=-]+", "_", "_".join(k for k in key if k))
            yield title, slug, grp

    def all(self) -> list[Path]:
        import matplotlib
        matplotlib.use("Agg")
        import seaborn as sns
        sns.set_theme(style="whitegrid", context="paper")
        if self.df.empty:
            return self.written
        self.out.mkdir(parents=True, exist_ok=True)
        for title, slug, grp in self.groups():
            self.demand(title, slug, grp)
            self.completion_cdf(title, slug, grp)
            self.pd_split(title, slug, grp)
        self.speedup_bars()
        return self.written

    def demand(self, title: str, slug: str, grp: pd.DataFrame) -> None:
        """Prefill and decode demand against engines per role, one column per policy (its first seed)."""
        import matplotlib.pyplot as plt
        firsts = [g.sort_values("seed").iloc[0] for _, g in grp.groupby("policy")]
        firsts = [r for r in firsts if (Path(r["path"]) / "timeseries.parquet").exists()]
        if not firsts:
            return
        firsts.sort(key=lambda r: _policy_order(grp["policy"]).index(r["policy"]))
        fig, axes = plt.subplots(2, len(firsts), figsize=(5 * len(firsts), 5), sharex="col", squeeze=False,
                                 layout="constrained")
        for col, r in enumerate(firsts):
            ts = pd.read_parquet(Path(r["path"]) / "timeseries.parquet")
            top, bottom = axes[0][col], axes[1][col]
            top.plot(ts["t_s"], ts["prefill_demand_tokens"], color="C0", label="prefill: waiting tokens")
            if col == 0:
                top.set_ylabel("prefill: waiting tokens", color="C0")
                bottom.set_ylabel("engines")
            twin = top.twinx()
            twin.plot(ts["t_s"], ts["decode_requests"], color="C1", label="decode: requests decoding")
            if col == len(firsts) - 1:
                twin.set_ylabel("decode: requests decoding", color="C1")
            twin.grid(False)
            top.set_title(f"{r['policy']} (seed {r['seed']})")
            roles = ["engines_prefill", "engines_decode", "engines_colocated", "engines_switching"]
            bottom.stackplot(ts["t_s"], *[ts[c] for c in roles], labels=[c.removeprefix("engines_") for c in roles],
                             colors=["C0", "C1", "C2", "0.6"], step="post")
            bottom.set_xlabel("simulated time (s)")
        axes[1][-1].legend(loc="upper right", fontsize="small")
        fig.suptitle(f"Demand vs engines per role: {title}")
        self.save(fig, f"demand_{slug}")

    def completion_cdf(self, title: str, slug: str, grp: pd.DataFrame) -> None:
        """Trajectory completion time: its last token minus the moment its first prompt was ready."""
        import matplotlib.pyplot as plt
        import seaborn as sns
        frames = []
        for _, r in grp.iterrows():
            lc = pd.read_parquet(Path(r["path"]) / "lifecycle.parquet", columns=["trajectory_id", "t_ready",
                                                                                 "t_decode_end"])
            per = lc.groupby("trajectory_id").agg(start=("t_ready", "min"), end=("t_decode_end", "max"))
            frames.append(pd.DataFrame({"completion_s": per["end"] - per["start"], "policy": r["policy"]}))
        data = pd.concat(frames, ignore_index=True)
        fig, ax = plt.subplots(figsize=(5, 3.5))
        sns.ecdfplot(data=data, x="completion_s", hue="policy", hue_order=_policy_order(data["policy"]), ax=ax)
        ax.set_xlabel("trajectory completion time (s)")
        ax.set_title(f"Trajectory completion: {title}")
        self.save(fig, f"completion_cdf_{slug}")

    def pd_split(self, title: str, slug: str, grp: pd.DataFrame) -> None:
        """Makespan of each fixed P:D split, with a horizontal line for every other policy present."""
        import matplotlib.pyplot as plt
        import seaborn as sns
        fixed = grp[(grp["policy_name"] == "fixed_pd") & grp["num_prefill"].notna()].copy()
        if fixed.empty:
            return
        fixed["num_prefill"] = fixed["num_prefill"].astype(int)
        fig, ax = plt.subplots(figsize=(5, 3.5))
        sns.lineplot(data=fixed, x="num_prefill", y="rollout_time_s", marker="o", errorbar="sd", ax=ax,
                     label="fixed_pd")
        others = grp[grp["policy_name"] != "fixed_pd"].groupby("policy")["rollout_time_s"].mean()
        for i, (policy, t) in enumerate(others.items()):
            ax.axhline(t, linestyle="--", color=f"C{i + 1}", label=policy)
        ticks = sorted(fixed["num_prefill"].unique())
        engines = fixed["num_engines"].dropna()
        ax.set_xticks(ticks)
        if not engines.empty:
            ax.set_xticklabels([f"{p}:{int(engines.iloc[0]) - p}" for p in ticks])
        ax.set_xlabel("P:D split (prefill engines : decode engines)")
        ax.set_ylabel("rollout time (s)")
        ax.set_title(f"Makespan vs P:D split: {title}")
        ax.legend(fontsize="small")
        self.save(fig, f"makespan_vs_pd_{slug}")

    def speedup_bars(self) -> None:
        import matplotlib.pyplot as plt
        import seaborn as sns
        s = speedups(self.df).dropna(subset=["speedup"])
        if s.empty:
            return
        s["row"] = s[ROW_KEYS].apply(lambda r: "\n".join(v for v in r if v), axis=1)
        fig, ax = plt.subplots(figsize=(max(5, 1.5 * s["row"].nunique() + 2), 3.5))
        sns.barplot(data=s, x="row", y="speedup", hue="policy", hue_order=_policy_order(s["policy"]),
                    errorbar="sd", ax=ax)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel("")
        ax.set_ylabel("speedup over colocate")
        ax.set_title("Rollout-time speedup per workload and mode")
        self.save(fig, "speedup_bars")


def report(dirs: list[Path], out: Path) -> tuple[list[Run], list[Path]]:
    runs = find_runs(dirs)
    out.mkdir(parents=True, exist_ok=True)
    df = write_tables(runs, out)
    return runs, Figures(df, out / "figures").all()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="sweep or run directories")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: the first DIR)")
    args = parser.parse_args(argv)
    missing = [d for d in args.dirs if not d.is_dir()]
    if missing:
        parser.error(f"not a directory: {', '.join(map(str, missing))}")
    out = args.out or args.dirs[0]
    runs, figures = report(args.dirs, out)
    failed = [r for r in runs if not r.complete]
    print(f"{len(runs) - len(failed)} complete runs, {len(failed)} failed or partial; wrote {out}/speedup.csv, "
          f".md, .tex and {len(figures)} figure files in {out}/figures")
    for line in _failed_lines(runs):
        print(f"  not included: {line}")


if __name__ == "__main__":
    main()
