"""Reports from result files alone: `python -m harness.report DIR [DIR...] [--out OUT]`.

Finds every run under the directories (a directory with summary.json, error.json or .hydra/), and writes
into OUT (default: the first DIR):
- speedup.csv / speedup.md / speedup.tex: one row per workload x mode x cluster (x any other setting that
  varies inside it), one column per policy: rollout-time speedup over colocate on the same row and seed
  (mean and std over seeds), and efficiency against lower_bound_s;
- serve.csv (and a table in speedup.md): per serving-benchmark run (mode=serve), request and token
  throughput and TTFT, TPOT and ITL p50/p90/p99;
- why.csv (and a line per row in speedup.md and on the console): per row and policy, the shares of the
  critical path in tool calls, queueing, prefill, KV transfer and decode, and the most any allocation could
  gain by the lower bound (harness/critical_path.py);
- prorsa.csv (and a table in speedup.md): per Prorsa run and seed, its row's name (the experiment), its
  time against colocation's and the best static allocation's of the same seed, which allocation that
  was, its role switches, and its wall time and colocation's;
- figures/, each as PNG and PDF at a printable width (harness/figure_style.py: one policy order and colour
  map for all of them): per row, demand vs engines per role (demand_*), CDF of trajectory completion time
  (completion_cdf_*), makespan vs the P:D split of fixed_pd runs (makespan_vs_pd_*) and, per prorsa
  policy, its decisions and forecast over time (prorsa_timeline_*); over all rows, speedup bars
  (speedup_bars).
A failed, partial or broken run (a file of it that cannot be read: truncated, not JSON, a NaN time, a
parquet row group that does not decode) is listed in a "failed runs" section, naming its directory and what
is wrong, and never enters a table or figure.
The report is written all or nothing: its files are written into a temporary directory in OUT and moved
into place once all are written, so a report that cannot be written (a full disk) leaves OUT as it was and
names the file in one line. The directory of a report that was killed is removed by the next report into
OUT (its name says which process wrote it; never one whose process still runs).
With `--wandb [PROJECT]` the report is also one W&B run (job type "report", offline unless WANDB_MODE
says otherwise, under OUT/wandb): speedup.csv as a W&B table and every PNG figure as an image.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import socket
import tempfile
import textwrap
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from harness import cli, rundir
from harness.critical_path import LIFECYCLE_COLUMNS, why_table
from harness.figure_style import COLORS, LOOKS, PAGE_IN, ROLE_COLORS, policy_label, policy_look, policy_order, rc, save
from harness.wandb_logger import PROJECT

SUMMARY_ROWS = [("policy", "{}"), ("workload", "{}"), ("mode", "{}"), ("cluster", "{}"),
                ("completed_trajectories", "{}"), ("rollout_time_s", "{:.2f}"), ("lower_bound_s", "{:.2f}"),
                ("efficiency_vs_lower_bound", "{:.2f}"), ("throughput_traj_per_s", "{:.3f}"),
                ("turn_latency_p50_s", "{:.2f}"), ("turn_latency_p99_s", "{:.2f}"), ("num_role_switches", "{}"),
                ("preemptions", "{}"), ("wall_time_s", "{:.2f}")]
# A serving benchmark's headline numbers (mode=serve, harness/serve.py), printed after the rows above.
SERVE_ROWS = [("request_throughput_per_s", "{:.3f}"), ("input_tokens_per_s", "{:.1f}"),
              ("output_tokens_per_s", "{:.1f}"), ("total_tokens_per_s_per_gpu", "{:.1f}"),
              ("ttft_p50_s", "{:.4f}"), ("ttft_p99_s", "{:.4f}"), ("tpot_p50_s", "{:.4f}"),
              ("tpot_p99_s", "{:.4f}"), ("itl_p50_s", "{:.4f}"), ("itl_p99_s", "{:.4f}")]
# The serving table (serve.csv and speedup.md): per serve run, throughput and latency percentiles in ms.
SERVE_COLUMNS = [("request_throughput_per_s", "req/s", 1, 3), ("input_tokens_per_s", "in tok/s", 1, 0),
                 ("output_tokens_per_s", "out tok/s", 1, 0), ("total_tokens_per_s_per_gpu", "tok/s/GPU", 1, 0),
                 *[(f"{m}_p{p}_s", f"{m.upper()} p{p} ms", 1000, 1) for m in ("ttft", "tpot", "itl") for p in (50, 90, 99)]]
log = logging.getLogger(__name__)

BASELINE = "colocate"
ROW_KEYS = ["workload", "mode", "cluster", "setting"]
# Config keys that never distinguish two runs' results (or are reported as their own column).
IGNORED_KEYS = ("seed", "logger", "progress_interval_s", "sample_interval_s")


def print_summary(summary: dict) -> None:
    """The run's headline numbers, one per line, to the log (the terminal and Hydra's run.log)."""
    rows = SUMMARY_ROWS + (SERVE_ROWS if summary.get("mode") == "serve" else [])
    width = max(len(k) for k, _ in rows)
    lines = [f"{key:<{width}}  {fmt.format(summary[key])}" for key, fmt in rows]
    if summary.get("prorsa_decisions"):
        lines.append(f"{'prorsa_decisions':<{width}}  {decisions_text(summary['prorsa_decisions'])}")
    log.info("\n".join(lines))


def decisions_text(decisions: list, most: int = 8) -> str:
    """Prorsa's allocations over time, `t s: kP` (k prefill engines; 0P is colocation): the first `most`
    and how many more."""
    shown = ", ".join(f"{t:g} s: {'colocated' if k == 0 else f'{k}P'}" for t, k in decisions[:most])
    return shown + (f" (+{len(decisions) - most} more)" if len(decisions) > most else "")


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

    @property
    def experiment(self) -> str:
        """The run's `+experiment=NAME` ("" without one): experiment configs are `@package _global_`,
        so only the overrides name them."""
        for override in self.overrides:
            key, _, value = override.partition("=")
            if key.lstrip("+~") == "experiment":
                return value
        return ""


def _flatten(d: dict, prefix: str = "") -> dict:
    flat = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(_flatten(v, key + "."))
        else:
            flat[key] = json.dumps(v) if isinstance(v, list) else v
    return flat


# What a run's files must hold for the report to read them: .hydra/config.yaml's top-level keys,
# summary.json's keys (numbers finite), and the columns of the parquet files the figures and the why lines
# read.
CONFIG_KEYS = ("policy", "workload", "mode", "cluster", "seed")
SUMMARY_TEXT = ("policy", "workload", "mode", "cluster")
SUMMARY_NUMBERS = ("seed", "num_trajectories", "completed_trajectories", "rollout_time_s", "lower_bound_s",
                   "efficiency_vs_lower_bound")
PARQUET_COLUMNS = {"lifecycle.parquet": tuple(LIFECYCLE_COLUMNS),
                   "timeseries.parquet": ("t_s", "prefill_demand_tokens", "decode_requests"),
                   "forecast.parquet": ("t", "bin", "prefill_forecast", "prefill_actual")}


class Broken(Exception):
    """A run's file the report cannot read as it needs it; the message names the file and what is wrong."""


def _read(path: Path, parse):
    """`parse` of the file's text, or Broken naming it (relative to the run directory) and why."""
    name = path.name if path.parent.name != ".hydra" else f".hydra/{path.name}"
    try:
        return parse(path.read_bytes().decode())
    except UnicodeDecodeError as exc:
        raise Broken(f"{name}: not UTF-8 (byte {exc.object[exc.start]:#04x} at offset {exc.start})") from None
    except (OSError, ValueError, yaml.YAMLError) as exc:   # JSONDecodeError is a ValueError
        raise Broken(f"{name}: cannot be read ({' '.join(str(exc).split())})") from None


def _check_summary(summary) -> None:
    if not isinstance(summary, dict):
        raise Broken(f"summary.json: a JSON {type(summary).__name__}, not an object")
    for key in SUMMARY_TEXT:
        if not isinstance(summary.get(key), str):
            raise Broken(f"summary.json: {key}={summary.get(key)!r}, not a string")
    for key in SUMMARY_NUMBERS:
        v = summary.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise Broken(f"summary.json: {key}={v!r}, not a finite number")
    if summary["rollout_time_s"] <= 0:
        raise Broken(f"summary.json: rollout_time_s={summary['rollout_time_s']!r}, not > 0")


def _check_parquet(path: Path) -> None:
    """The file's footer, the columns the figures read, and every row group decoded (a truncated file has
    no footer; a damaged page or a row group cut short has one, and fails only when its rows are read).
    One row group at a time, so a large file costs the memory of one."""
    import pyarrow.parquet as pq
    try:
        file = pq.ParquetFile(path)
        names = set(file.schema_arrow.names)
    except Exception as exc:   # noqa: BLE001 - pyarrow's errors for a damaged file have no common base
        raise Broken(f"{path.name}: not a readable parquet file ({' '.join(str(exc).split())})") from None
    with file:
        missing = [c for c in PARQUET_COLUMNS[path.name] if c not in names]
        if missing:
            raise Broken(f"{path.name}: no column {', '.join(missing)}")
        for i in range(file.num_row_groups):
            try:
                file.read_row_group(i)
            except Exception as exc:   # noqa: BLE001 - as above
                raise Broken(f"{path.name}: row group {i + 1} of {file.num_row_groups} cannot be read "
                             f"({' '.join(str(exc).split())})") from None


def _fill(run: Run) -> None:
    """Reads the run's files into `run`; raises Broken for one that cannot be read."""
    path, hydra_dir = run.path, run.path / ".hydra"
    if (hydra_dir / "config.yaml").exists():
        config = _read(hydra_dir / "config.yaml", yaml.safe_load)
        missing = [k for k in CONFIG_KEYS if not isinstance(config, dict) or k not in config]
        if missing:
            raise Broken(f".hydra/config.yaml: no {', '.join(missing)} (truncated, or not a run's config)")
        run.config = _flatten(config)
    if (hydra_dir / "overrides.yaml").exists():
        overrides = _read(hydra_dir / "overrides.yaml", yaml.safe_load) or []
        if not (isinstance(overrides, list) and all(isinstance(o, str) for o in overrides)):
            raise Broken(".hydra/overrides.yaml: not a list of overrides")
        run.overrides = overrides
    if (path / "error.json").exists():
        error = _read(path / "error.json", json.loads)
        if not (isinstance(error, dict) and isinstance(error.get("message"), str)):
            raise Broken("error.json: not an object with a message")
        run.problem = "failed: " + error["message"]
        run.overrides = run.overrides or list(error.get("overrides") or [])
    elif not (path / "summary.json").exists():
        run.problem = "partial: no summary.json (crashed, killed or still running)"
    else:
        summary = _read(path / "summary.json", json.loads)
        _check_summary(summary)
        done, total = summary["completed_trajectories"], summary["num_trajectories"]
        if done < total:
            run.problem = f"partial: {done} of {total} trajectories completed"
            return
        if not (path / "lifecycle.parquet").exists():
            raise Broken("lifecycle.parquet: missing")
        for name in PARQUET_COLUMNS:
            if (path / name).exists():
                _check_parquet(path / name)
        run.summary = summary


def load_run(path: Path) -> Run:
    """A run directory's files as the report reads them. A file that cannot be read (truncated, not
    JSON, a NaN time) makes the run broken: listed with the file and what is wrong, left out of every
    table and figure, so that the report never stops half-written."""
    run = Run(path, None, {}, [])
    try:
        _fill(run)
    except Broken as exc:
        run.summary, run.problem = None, f"broken: {exc}"
    return run


def find_runs(dirs: list[Path]) -> list[Run]:
    """Every run directory under `dirs` (one holding summary.json, error.json or .hydra), following
    symbolic links, so a report can gather runs of several sweeps linked into one directory. A directory
    is visited once whatever the paths to it: a link loop ends, a run linked twice counts once."""
    paths, seen = [], set()
    for d in dirs:
        for root, subdirs, files in os.walk(d, followlinks=True):
            real = os.path.realpath(root)
            if real in seen:
                subdirs.clear()
                continue
            seen.add(real)
            here = Path(root)
            if "wandb" in here.relative_to(d).parts:
                continue
            if {"summary.json", "error.json"} & set(files) or ".hydra" in subdirs:
                paths.append(here)
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
        rows.append({"path": str(r.path), "policy_name": s["policy"], "experiment": r.experiment or s["workload"],
                     "workload": s["workload"], "mode": s["mode"],
                     "cluster": s["cluster"], "seed": s["seed"], "rollout_time_s": s["rollout_time_s"],
                     "lower_bound_s": s["lower_bound_s"], "efficiency": s["efficiency_vs_lower_bound"],
                     "num_prefill": r.config.get("policy.num_prefill"),
                     "num_engines": r.config.get("cluster.num_engines"),
                     "num_role_switches": s.get("num_role_switches", 0), "wall_time_s": s.get("wall_time_s")})
    df = pd.DataFrame(rows, columns=["path", "policy_name", "experiment", "workload", "mode", "cluster", "seed",
                                     "rollout_time_s", "lower_bound_s", "efficiency", "num_prefill", "num_engines",
                                     "num_role_switches", "wall_time_s"])
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


def oracle_below_hindsight(per_seed: pd.DataFrame) -> list[str]:
    """Settings and seeds where oracle_pd is slower than the best static allocation of the same seed (an
    oracle never should be). Seed by seed: an oracle run at one seed against the mean of the statics'
    seeds compares two draws (shift_reason_browse_sync: oracle_pd 1,181.2 s at seed 0, above the
    three seeds' mean hindsight_best of 1,169.7 s and below seed 0's 1,192.3 s). `per_seed`: speedups()."""
    wide = per_seed.pivot_table(index=ROW_KEYS + ["seed"], columns="policy", values="rollout_time_s")
    if not {"oracle_pd", "hindsight_best"} <= set(wide.columns):
        return []
    below = wide[wide["oracle_pd"] > wide["hindsight_best"] * (1 + 1e-9)]
    return [f"{' '.join(str(k) for k in key[:-1] if k)} seed {key[-1]}: oracle_pd {r.oracle_pd:.2f} s > "
            f"hindsight_best {r.hindsight_best:.2f} s" for key, r in below.iterrows()]


def static_name(policy_name: str, num_prefill, num_engines) -> str:
    """`kPmD` for a fixed split of k prefill engines out of k + m, else the policy's name."""
    if policy_name != "fixed_pd" or pd.isna(num_prefill) or pd.isna(num_engines):
        return policy_name
    return f"{int(num_prefill)}P{int(num_engines) - int(num_prefill)}D"


PRORSA_SEED_COLUMNS = ROW_KEYS + ["experiment", "policy", "seed", "rollout_time_s", "colocate_s", "best_static_s", "best_static",
                                  "vs_colocate", "vs_best_static", "num_role_switches", "wall_time_s",
                                  "colocate_wall_time_s"]


# Settings of the role-switch mechanism: a static allocation never switches, so they never change its run.
SWITCH_KEYS = ("cluster.switch_mechanism", "cluster.switch_time_s", "cluster.reshard_switch_time_s",
               "cluster.migrate_decodes_on_switch")
STATIC_KEYS = ["workload", "mode", "cluster", "static_setting", "seed"]


def _static_setting(setting: str) -> str:
    """A row's setting without the switch mechanism's keys: the setting its static allocations ran in."""
    return ",".join(kv for kv in setting.split(",") if kv and kv.split("=")[0] not in SWITCH_KEYS)


def prorsa_seeds(df: pd.DataFrame) -> pd.DataFrame:
    """Per Prorsa run (each of its settings): its rollout time, colocation's and the best static
    allocation's at the same seed (colocation or a split, which one; NaN and "-" where no split ran at
    that seed), its speedup over both, and its role switches. Seed by seed, as `oracle_below_hindsight`
    and for the same reason: the best static allocation differs from seed to seed. A Prorsa run under
    another switch mechanism (drain, decode migration, other switch times) is compared with the statics
    of the same setting otherwise, which that mechanism cannot change. With each, its row's name
    (row_names) and Prorsa's and colocation's wall time (the simulation's process time, Prorsa's plans
    included). `df`: runs_frame()."""
    runs = df.groupby(ROW_KEYS + ["policy_name", "policy", "seed"], as_index=False, dropna=False).agg(
        rollout_time_s=("rollout_time_s", "mean"), num_role_switches=("num_role_switches", "mean"),
        num_prefill=("num_prefill", "first"), num_engines=("num_engines", "first"), wall_time_s=("wall_time_s", "mean"))
    runs["static_setting"] = runs["setting"].map(_static_setting)
    fixed_seeds = runs.loc[runs["policy_name"] == "fixed_pd", STATIC_KEYS].drop_duplicates()
    statics = runs[(runs["policy_name"] == "fixed_pd") | (runs["policy"] == BASELINE)].merge(fixed_seeds,
                                                                                              on=STATIC_KEYS)
    prorsa = runs[runs["policy_name"] == "prorsa"]
    if prorsa.empty:
        return pd.DataFrame(columns=PRORSA_SEED_COLUMNS)
    names = row_names(df)
    prorsa = prorsa.assign(experiment=[names[tuple(k)] for k in prorsa[ROW_KEYS].itertuples(index=False)])
    best = statics.loc[statics.groupby(STATIC_KEYS)["rollout_time_s"].idxmin()]
    best = best.assign(best_static=[static_name(*r) for r in
                                    zip(best["policy_name"], best["num_prefill"], best["num_engines"])])
    best = best[STATIC_KEYS + ["rollout_time_s", "best_static"]].rename(columns={"rollout_time_s": "best_static_s"})
    colocate = runs[runs["policy"] == BASELINE].groupby(STATIC_KEYS, as_index=False).agg(
        colocate_s=("rollout_time_s", "min"), colocate_wall_time_s=("wall_time_s", "mean"))
    out = prorsa.merge(best, on=STATIC_KEYS, how="left").merge(colocate, on=STATIC_KEYS, how="left")
    out["best_static"] = out["best_static"].astype(object).fillna("-")
    out["vs_colocate"] = out["colocate_s"] / out["rollout_time_s"]
    out["vs_best_static"] = out["best_static_s"] / out["rollout_time_s"]
    out["num_role_switches"] = out["num_role_switches"].fillna(0).round().astype(int)
    return out.sort_values(ROW_KEYS + ["policy", "seed"])[PRORSA_SEED_COLUMNS].reset_index(drop=True)


def spread(values: pd.Series, digits: int, count: bool = False) -> str:
    """`mean (min-max)` over the seeds that have a value (`mean (min-max, n=N)` with `count`); the value
    alone for one seed."""
    values = values.dropna()
    if values.empty:
        return "-"
    mean = f"{values.mean():.{digits}f}"
    n = f", n={len(values)}" if count else ""
    return mean if len(values) == 1 else f"{mean} ({values.min():.{digits}f}-{values.max():.{digits}f}{n})"


PRORSA_CAPTION = ("Prorsa against colocation and the best static allocation of the same seed (mean (min-max) "
                  "over seeds; per seed in prorsa.csv)")


def prorsa_display(seeds: pd.DataFrame, names: dict[tuple, str] | None = None) -> pd.DataFrame:
    """One line per row and Prorsa setting (`seeds`: prorsa_seeds(); `names`: row_names())."""
    rows = []
    for key, grp in seeds.groupby(ROW_KEYS + ["policy"], sort=True):
        rows.append({**dict(zip(ROW_KEYS + ["policy"], key)), "seeds": len(grp),
                     "prorsa / colocate": spread(grp["vs_colocate"], 2),
                     "prorsa / best static": spread(grp["vs_best_static"], 3),
                     "best static per seed": ", ".join(grp["best_static"]),
                     "role switches per seed": ", ".join(str(n) for n in grp["num_role_switches"])})
    out = pd.DataFrame(rows, columns=ROW_KEYS + ["policy", "seeds", "prorsa / colocate", "prorsa / best static",
                                                 "best static per seed", "role switches per seed"])
    out = _named(out, names)
    return out if (out["setting"] != "").any() else out.drop(columns="setting")


def speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Per run: speedup over colocate with the same row keys and seed (NaN where there is none)."""
    per_seed = df.groupby(ROW_KEYS + ["policy", "seed"], as_index=False)[["rollout_time_s", "efficiency"]].mean()
    per_seed = pd.concat([per_seed, best_fixed(per_seed), hindsight_best(per_seed)], ignore_index=True)
    base = per_seed[per_seed["policy"] == BASELINE][ROW_KEYS + ["seed", "rollout_time_s"]]
    merged = per_seed.merge(base, on=ROW_KEYS + ["seed"], how="left", suffixes=("", "_base"))
    merged["speedup"] = merged["rollout_time_s_base"] / merged["rollout_time_s"]
    return merged


def speedup_table(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Long form: one row per (row keys, policy) with mean/std of speedup and efficiency over seeds
    (`per_seed`: speedups())."""
    g = per_seed.groupby(ROW_KEYS + ["policy"], as_index=False)
    return g.agg(speedup=("speedup", "mean"), speedup_std=("speedup", "std"), seeds=("seed", "count"),
                 efficiency=("efficiency", "mean"), efficiency_std=("efficiency", "std"),
                 rollout_time_s=("rollout_time_s", "mean"))


def _wide(table: pd.DataFrame) -> pd.DataFrame:
    wide = table.pivot(index=ROW_KEYS, columns="policy",
                       values=["speedup", "speedup_std", "efficiency", "seeds"])
    policies = policy_order(table["policy"])
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


def row_names(df: pd.DataFrame) -> dict[tuple, str]:
    """Each row's name in every table and figure: the experiment its runs name (`+experiment=NAME`), else
    its workload (`df`: runs_frame())."""
    return {key: ", ".join(sorted(set(grp["experiment"]))) for key, grp in df.groupby(ROW_KEYS, sort=True)}


def _named(out: pd.DataFrame, names: dict[tuple, str] | None) -> pd.DataFrame:
    """The workload column of a table by ROW_KEYS, in the rows' names (row_names)."""
    if names:
        out["workload"] = [names.get(tuple(r), w) for r, w in zip(out[ROW_KEYS].itertuples(index=False),
                                                                   out["workload"])]
    return out.sort_values(ROW_KEYS, kind="stable").reset_index(drop=True)


def _display(table: pd.DataFrame, value: str, names: dict[tuple, str] | None = None) -> pd.DataFrame:
    rows = []
    for key, grp in table.groupby(ROW_KEYS, sort=True):
        row = dict(zip(ROW_KEYS, key))
        for _, r in grp.iterrows():
            row[r["policy"]] = _cell(r[value], r[f"{value}_std"], int(r["seeds"]))
        rows.append(row)
    out = pd.DataFrame(rows)
    policies = policy_order(table["policy"])
    out = _named(out.reindex(columns=ROW_KEYS + policies).fillna("-"), names)
    return out if (out["setting"] != "").any() else out.drop(columns="setting")


def md_table(df: pd.DataFrame) -> str:
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


SERVE_CAPTION = ("Serving benchmark (mode=serve): throughput and latency percentiles, one row per run "
                 "(TTFT, TPOT and ITL as vllm bench serve defines them; harness/serve.py)")


def serve_table(runs: list[Run], df: pd.DataFrame) -> pd.DataFrame:
    """One row per complete serve run: its row keys, policy, seed and the SERVE_COLUMNS (`df`: runs_frame())."""
    summaries = {str(r.path): r.summary for r in runs if r.complete}
    serve = df[df["mode"] == "serve"]
    rows = []
    for _, r in serve.sort_values(ROW_KEYS + ["policy", "seed"]).iterrows():
        s = summaries[r["path"]]
        rows.append({**{k: r[k] for k in ROW_KEYS + ["policy", "seed"]},
                     **{label: round(s.get(key, math.nan) * scale, digits) for key, label, scale, digits in SERVE_COLUMNS}})
    out = pd.DataFrame(rows, columns=ROW_KEYS + ["policy", "seed"] + [c[1] for c in SERVE_COLUMNS])
    return out if (out["setting"] != "").any() else out.drop(columns="setting")


SPEEDUP_CAPTION = "Rollout-time speedup over colocate (same workload, mode, cluster and seed; mean ± std over seeds)"
EFFICIENCY_CAPTION = "Efficiency: lower_bound_s / rollout_time_s (1.0 is the bound)"
WHY_CAPTION = ("Why: where each row's critical path goes (sync: each step's last trajectory; async: the mean "
               "trajectory) and what the lower bound leaves to gain (harness/critical_path.py)")


@dataclass
class Tables:
    runs: pd.DataFrame          # runs_frame()
    speedup: pd.DataFrame       # as speedup.md shows them
    efficiency: pd.DataFrame
    why: list[str]              # why_lines()


def why_lines(why: pd.DataFrame, names: dict[tuple, str]) -> list[str]:
    """One line per row: the why of its colocate runs (else of its first policy in the fixed order), as
    `name · mode · cluster[ · setting]: why`, in the tables' order (`why`: why_table(); `names`: row_names())."""
    lines = []
    for key, grp in sorted(why.groupby(ROW_KEYS), key=lambda kv: (names[kv[0]], *kv[0][1:])):
        first = grp.set_index("policy").loc[policy_order(grp["policy"])[0]]
        lines.append(f"{' · '.join(x for x in (names[key], *key[1:]) if x)}: {first['why']}")
    return lines


def write_tables(runs: list[Run], out: Path) -> Tables:
    df = runs_frame(runs)
    per_seed = speedups(df)
    table = speedup_table(per_seed)
    _write(out / "speedup.csv", partial(_wide(table).to_csv, index=False))
    failed = _failed_lines(runs)
    names = row_names(df)
    speed, eff = _display(table, "speedup", names), _display(table, "efficiency", names)
    why = why_table(df, ROW_KEYS)
    _write(out / "why.csv", partial(why.to_csv, index=False))
    lines = why_lines(why, names)
    md = [f"# Speedup report\n\n{len(df)} complete runs, {len(failed)} failed, partial or broken.\n",
          f"## {SPEEDUP_CAPTION}\n", md_table(speed), f"\n## {EFFICIENCY_CAPTION}\n", md_table(eff),
          f"\n## {WHY_CAPTION}\n", *[f"- {line}" for line in lines],
          "\n## Failed runs\n", *([f"- {line}" for line in failed] or ["None."])]
    decided = [r for r in runs if r.complete and r.summary.get("prorsa_decisions")]
    if decided:
        md += ["\n## Prorsa's decisions (the start, then each switch; kP = k prefill engines)\n",
               *[f"- {' '.join(r.overrides) or r.path.name}: {r.summary.get('num_role_switches', 0)} engine role "
                 f"switches; {decisions_text(r.summary['prorsa_decisions'])}" for r in decided]]
    served = serve_table(runs, df)
    if not served.empty:
        _write(out / "serve.csv", partial(served.to_csv, index=False))
        md += [f"\n## {SERVE_CAPTION}\n", md_table(served)]
    seeds = prorsa_seeds(df)
    _write(out / "prorsa.csv", partial(seeds.to_csv, index=False))
    if not seeds.empty:
        md += [f"\n## {PRORSA_CAPTION}\n", md_table(prorsa_display(seeds, names))]
    below = oracle_below_hindsight(per_seed)
    if below:
        md += ["\n## oracle_pd below hindsight_best (an oracle never should be)\n", *[f"- {x}" for x in below]]
        log.warning("oracle_pd is below hindsight_best in %d setting(s): %s", len(below), "; ".join(below))
    _write(out / "speedup.md", lambda p: p.write_text("\n".join(md) + "\n"))
    tex = [_tex_table(speed, SPEEDUP_CAPTION), _tex_table(eff, EFFICIENCY_CAPTION), r"\paragraph{Failed runs}"]
    tex += [r"\begin{itemize}", *[rf"\item \texttt{{{_tex_escape(line)}}}" for line in failed], r"\end{itemize}"] \
        if failed else ["None."]
    _write(out / "speedup.tex", lambda p: p.write_text("\n".join(tex) + "\n"))
    return Tables(df, speed, eff, lines)


def console_text(tables: Tables) -> str:
    """The speedup and efficiency tables and the why lines as the terminal shows them: best_fixed stands for
    the fixed splits, each of which speedup.md lists."""
    if tables.speedup.empty:
        return "no complete runs: no speedup table"
    shown = [(caption, t.drop(columns=[c for c in t.columns if c.startswith("fixed_pd[")]))
             for caption, t in [(SPEEDUP_CAPTION, tables.speedup), (EFFICIENCY_CAPTION, tables.efficiency)]]
    tables_text = [f"{caption}\n{table.to_string(index=False)}" for caption, table in shown]
    return "\n\n".join([*tables_text, "\n".join([WHY_CAPTION, *tables.why])])


# --- figures ---------------------------------------------------------------------------------------
def _slug(text: str) -> str:
    """A file name; a long one (a row with many varying settings) is cut and keeps a hash of the rest,
    under the file systems' 255 bytes."""
    slug = re.sub(r"[^A-Za-z0-9_.=-]+", "_", text)
    return slug if len(slug) <= 120 else f"{slug[:100]}_{zlib.crc32(slug.encode()):08x}"


def _best_split(grp: pd.DataFrame) -> str | None:
    """The fixed_pd split with the shortest mean rollout time in `grp`; None unless two or more splits ran
    (a single split is not the best of anything)."""
    fixed = grp[grp["policy_name"] == "fixed_pd"]
    if fixed["policy"].nunique() < 2:
        return None
    return fixed.groupby("policy")["rollout_time_s"].mean().idxmin()


def _seeds(counts: pd.Series, spread: str) -> str:
    """`n=` for a title, from the number of seeds behind each line or bar, and what shows their spread
    (nothing to show with one seed)."""
    lo, hi = int(counts.min()), int(counts.max())
    if hi == 1:
        return "n=1 seed"
    return (f"n={hi} seeds" if lo == hi else f"n={lo}-{hi} seeds") + f"; {spread}"


def _demand_policies(grp: pd.DataFrame, best_split: str | None) -> list[str]:
    """colocate, the best fixed split, prorsa and oracle_pd (the next in the fixed order for one that is
    missing): the four a reader compares; more rows would not print."""
    others = set(grp.loc[grp["policy_name"] == "fixed_pd", "policy"]) - {best_split}
    if best_split is None and others:   # one split: it stands for the splits
        others -= {min(others)}
    return [p for p in policy_order(grp["policy"]) if p not in others][:4]


def _fit(title: str, width: int = 100) -> str:
    """Wrap a label to a width (in characters of 8-pt text): a policy's settings can run long."""
    return "\n".join(textwrap.fill(re.sub(r",(?=\S)", ", ", line), width, break_long_words=False)
                     for line in title.split("\n"))


def _title(head: str, details: list[str], width: int = 100) -> str:
    """At most two lines: what the figure shows and for which row, then its details (the row's setting,
    seeds), each cut to the figure's width (in characters of 8-pt text); the table has every setting."""
    detail = "; ".join(re.sub(r",(?=\S)", ", ", d) for d in details if d)
    lines = [textwrap.shorten(line, width, placeholder=" ...") for line in (head, detail) if line]
    return "\n".join(lines)


def _ink(color: str) -> str:
    """A hatch colour that shows on `color`: white on a dark fill, dark grey on a light one."""
    from matplotlib.colors import to_rgb
    r, g, b = to_rgb(color)
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "0.25"


def _engines(ax, ts: pd.DataFrame) -> set[str]:
    """Engines per role over time, stacked: only the roles some engine held; the roles drawn."""
    from matplotlib.ticker import MaxNLocator
    ax.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
    roles = [role for role in ROLE_COLORS if (ts[f"engines_{role}"] > 0).any()]
    ax.stackplot(ts["t_s"], *[ts[f"engines_{role}"] for role in roles], labels=roles,
                 colors=[ROLE_COLORS[r] for r in roles], step="post")
    return set(roles)


def _role_handles(roles: set[str]) -> list:
    from matplotlib.patches import Patch
    return [Patch(color=color, label=role) for role, color in ROLE_COLORS.items() if role in roles]


def _completion_times(path: str) -> np.ndarray:
    """Each trajectory's completion time: its last token minus the moment its first prompt was ready."""
    lc = pd.read_parquet(Path(path) / "lifecycle.parquet", columns=["trajectory_id", "t_ready", "t_decode_end"])
    per = lc.groupby("trajectory_id").agg(start=("t_ready", "min"), end=("t_decode_end", "max"))
    return np.sort((per["end"] - per["start"]).to_numpy())


@dataclass
class Figures:
    """Matplotlib figures from the runs frame and the per-run parquet files, PNG and PDF each, at print
    widths (figure_style)."""

    df: pd.DataFrame
    out: Path
    written: list[Path] = field(default_factory=list)

    def save(self, fig, name: str) -> None:
        """Constrained layout keeps legends inside the figure, so the file is exactly the figure's size."""
        import matplotlib.pyplot as plt
        for ext in ("png", "pdf"):
            path = self.out / f"{_slug(name)}.{ext}"
            _write(path, lambda p: save(fig, p))
            self.written.append(path)
        plt.close(fig)

    def groups(self):
        """One report row at a time, named as the tables name it (row_names); its varying setting apart."""
        names = row_names(self.df)
        for key, grp in self.df.groupby(ROW_KEYS, sort=True):
            _, mode, cluster, setting = key
            yield f"{names[key]} · {mode} · {cluster}", setting, "_".join(k for k in (names[key], *key[1:]) if k), grp

    def all(self) -> list[Path]:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        if self.df.empty:
            return self.written
        self.out.mkdir(parents=True, exist_ok=True)
        with plt.rc_context(rc()):
            for title, setting, slug, grp in self.groups():
                self.demand(title, setting, slug, grp)
                self.completion_cdf(title, setting, slug, grp)
                self.pd_split(title, setting, slug, grp)
                self.prorsa_timelines(title, setting, slug, grp)
            self.speedup_bars()
        return self.written

    def demand(self, title: str, setting: str, slug: str, grp: pd.DataFrame) -> None:
        """Prefill and decode demand against engines per role: one row per policy (its first seed), at most
        four, every panel of a column on the same axes."""
        import matplotlib.pyplot as plt
        from matplotlib.ticker import EngFormatter
        with_ts = grp[[(Path(p) / "timeseries.parquet").exists() for p in grp["path"]]]
        best = _best_split(grp)
        policies = _demand_policies(with_ts, best)
        if not policies:
            return
        fig, axes = plt.subplots(len(policies), 3, figsize=(PAGE_IN, 1.1 + 1.2 * len(policies)), sharex=True,
                                 sharey="col", squeeze=False, layout="constrained")
        roles = set()
        for row, policy in zip(axes, policies):
            r = with_ts[with_ts["policy"] == policy].sort_values("seed").iloc[0]
            ts = pd.read_parquet(Path(r["path"]) / "timeseries.parquet")
            look = policy_look(policy, best)
            row[0].plot(ts["t_s"], ts["prefill_demand_tokens"], color=look.color, linestyle=look.linestyle)
            row[1].plot(ts["t_s"], ts["decode_requests"], color=look.color, linestyle=look.linestyle)
            roles |= _engines(row[2], ts)
            label = policy_label(policy, best).replace("[", "\n[").replace(" (best split)", "\n(best split)")
            row[0].set_ylabel(_fit(f"{label}\nseed {r['seed']}", 24),
                              color=look.color)
        axes[0][0].yaxis.set_major_formatter(EngFormatter())
        for ax, heading in zip(axes[0], ["prefill: waiting tokens", "decode: requests decoding", "engines per role"]):
            ax.set_title(heading)
        for ax in axes[-1]:
            ax.set_xlabel("simulated time (s)")
        fig.legend(handles=_role_handles(roles), loc="outside lower center", ncols=len(roles))
        seeds = _seeds(grp.groupby("policy")["seed"].nunique(), "other seeds not shown")
        fig.suptitle(_title(f"Demand vs engines per role: {title}", [setting, f"first seed of each policy ({seeds})"]))
        self.save(fig, f"demand_{slug}")

    def completion_cdf(self, title: str, setting: str, slug: str, grp: pd.DataFrame) -> None:
        """CDF of trajectory completion time, a policy's seeds pooled; the band spans the seeds' own CDFs.
        Each policy's line style and markers keep coinciding curves apart."""
        import matplotlib.pyplot as plt
        best = _best_split(grp)
        policies = policy_order(grp["policy"])
        fig, ax = plt.subplots(figsize=(PAGE_IN, 2.6), layout="constrained")
        for i, policy in enumerate(policies):
            per_seed = [_completion_times(p) for p in grp.loc[grp["policy"] == policy, "path"]]
            x = np.sort(np.concatenate(per_seed))
            look, z = policy_look(policy, best), 2 + len(policies) - i    # the methods compared on top
            ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", color=look.color, zorder=z,
                    linestyle=look.linestyle, marker=look.marker, markersize=3.5, markevery=(i, max(len(x) // 6, 1)),
                    label=policy_label(policy, best))
            if len(per_seed) > 1:
                cdfs = [np.searchsorted(s, x, side="right") / len(s) for s in per_seed]
                ax.fill_between(x, np.min(cdfs, axis=0), np.max(cdfs, axis=0), step="post", color=look.color,
                                alpha=0.2, linewidth=0, zorder=z)
        ax.set_xlabel("trajectory completion time (s)")
        ax.set_ylabel("fraction of trajectories")
        seeds = _seeds(grp.groupby("policy")["seed"].nunique(), "seeds pooled, band: range over seeds")
        ax.set_title(_title(f"Trajectory completion: {title}", [setting, seeds]))
        fig.legend(loc="outside right upper")
        self.save(fig, f"completion_cdf_{slug}")

    def pd_split(self, title: str, setting: str, slug: str, grp: pd.DataFrame) -> None:
        """Makespan of each fixed P:D split (mean, error bars: std over seeds), the best of two or more
        marked, with a horizontal line (band: std over seeds) for every other policy present."""
        import matplotlib.pyplot as plt
        fixed = grp[(grp["policy_name"] == "fixed_pd") & grp["num_prefill"].notna()]
        if fixed.empty:
            return
        stats = fixed.groupby(fixed["num_prefill"].astype(int))["rollout_time_s"].agg(["mean", "std", "count"])
        fig, ax = plt.subplots(figsize=(PAGE_IN, 2.6), layout="constrained")
        split = LOOKS["fixed_pd"]
        handles = [ax.errorbar(stats.index, stats["mean"], yerr=stats["std"], color=split.color, marker="o",
                               markersize=3, capsize=2, label="fixed_pd" if len(stats) > 1 else "fixed_pd (one split)")]
        engines = fixed["num_engines"].dropna()
        names = {p: f"{p}:{int(engines.iloc[0]) - p}" if not engines.empty else str(p) for p in stats.index}
        if len(stats) > 1:
            best = stats["mean"].idxmin()
            handles += ax.plot([best], [stats.loc[best, "mean"]], marker=LOOKS["best_fixed"].marker, markersize=6,
                               linestyle="none", color=COLORS["best_fixed"], label=f"best split ({names[best]})",
                               zorder=3)
        others = grp[grp["policy_name"] != "fixed_pd"].groupby("policy")["rollout_time_s"].agg(["mean", "std", "count"])
        for policy in policy_order(others.index):
            mean, std, n = others.loc[policy]
            look = policy_look(policy)
            handles.append(ax.axhline(mean, linestyle=look.linestyle, color=look.color, label=policy))
            if n > 1:
                ax.axhspan(mean - std, mean + std, color=look.color, alpha=0.15, linewidth=0)
        ax.set_xticks(list(stats.index), [names[p] for p in stats.index])
        ax.set_xlabel("P:D split (prefill engines : decode engines)")
        ax.set_ylabel("rollout time (s)")
        counts = pd.concat([stats["count"], others["count"]])
        ax.set_title(_title(f"Makespan vs P:D split: {title}",
                            [setting, _seeds(counts, "error bars and bands: std over seeds")]))
        fig.legend(handles=handles, loc="outside right upper")
        self.save(fig, f"makespan_vs_pd_{slug}")

    def prorsa_timelines(self, title: str, setting: str, slug: str, grp: pd.DataFrame) -> None:
        """For each prorsa policy (its first seed): engines per role with Prorsa's decisions marked, and its
        forecast for the next bin against what happened (forecast.parquet, when forecasting is on)."""
        import matplotlib.pyplot as plt
        from matplotlib.ticker import EngFormatter
        prorsa = LOOKS["prorsa"]
        for policy in policy_order(grp.loc[grp["policy_name"] == "prorsa", "policy"]):
            runs = grp[grp["policy"] == policy]
            r = runs.sort_values("seed").iloc[0]
            path = Path(r["path"])
            if not (path / "timeseries.parquet").exists():
                continue
            ts = pd.read_parquet(path / "timeseries.parquet")
            summary = json.loads((path / "summary.json").read_text())
            fc = pd.read_parquet(path / "forecast.parquet") if (path / "forecast.parquet").exists() else None
            fc = fc[fc["bin"] == 0] if fc is not None and not fc.empty else None
            panels = 1 if fc is None else 3
            fig, axes = plt.subplots(panels, 1, figsize=(PAGE_IN, 1.2 + 1.3 * panels), sharex=True, squeeze=False,
                                     layout="constrained")
            axes = axes[:, 0]
            handles = _role_handles(_engines(axes[0], ts))
            axes[0].set_ylabel("engines")
            n = int(r["num_engines"]) if pd.notna(r["num_engines"]) else int(ts.filter(like="engines_").iloc[0].sum())
            decisions = summary.get("prorsa_decisions", [])
            span = max(float(ts["t_s"].max()), max((t for t, _ in decisions), default=0.0), 1e-9)
            labelled_at = None
            for i, (t, split) in enumerate(decisions):
                name = "colocated" if split == 0 else f"{split}P{n - split}D"
                if i:   # the first decision is the start, every later one a switch
                    lines = [ax.axvline(t, color=prorsa.color, linestyle=":", linewidth=0.8) for ax in axes]
                    if i == 1:
                        lines[0].set_label("role switch")
                        handles.append(lines[0])
                if labelled_at is None or t - labelled_at > 0.04 * span:   # labels never overprint
                    axes[0].text(t, 0.98, name if i else f"start {name}", transform=axes[0].get_xaxis_transform(),
                                 rotation=90, va="top", ha="right", fontsize=6)
                    labelled_at = t
            if fc is not None:
                for ax, what, unit in zip(axes[1:], ("prefill", "decode"), ("prompt tokens\nper bin", "sequences")):
                    drawn = ax.plot(fc["t_mid"], fc[f"{what}_actual"], color="0.3", label="actual")
                    drawn += ax.plot(fc["t_mid"], fc[f"{what}_forecast"], color=prorsa.color,
                                     linestyle=prorsa.linestyle, label="forecast (next bin)")
                    ax.set_ylabel(f"{what}\n({unit})")
                axes[1].yaxis.set_major_formatter(EngFormatter())
                handles += drawn
            axes[-1].set_xlabel("simulated time (s)")
            fig.align_ylabels(axes)
            fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 5))
            seeds = _seeds(pd.Series([runs["seed"].nunique()]), "the first shown")
            switches = summary.get("num_role_switches", 0)
            fig.suptitle(_title(f"Prorsa decisions: {title}", [setting, f"{policy}, seed {r['seed']} ({seeds})",
                                                                f"{switches} engine role switch{'es' * (switches != 1)}"]))
            self.save(fig, f"prorsa_timeline_{slug}" + ("" if policy == "prorsa" else f"_{policy}"))

    def speedup_bars(self) -> None:
        """Speedup over colocate per row (mean, error bars: std over seeds), as horizontal bars: a row's name
        reads on one line beside its bars however many rows there are. colocate is the line at 1 and
        best_fixed stands for the fixed splits (makespan_vs_pd shows each); each policy's hatch keeps it
        apart in greyscale."""
        import matplotlib.pyplot as plt
        s = speedups(self.df).dropna(subset=["speedup"])
        s = s[(s["policy"] != BASELINE) & ~s["policy"].str.startswith("fixed_pd[")]
        if s.empty:
            return
        stats = s.groupby(ROW_KEYS + ["policy"])["speedup"].agg(["mean", "std", "count"])
        names = row_names(self.df)
        rows = sorted(s.groupby(ROW_KEYS).groups, key=lambda row: (names[row], *row[1:]))
        policies = policy_order(s["policy"])
        varying = [i for i, k in enumerate(ROW_KEYS[1:], 1) if s[k].nunique() > 1]
        ticks = [" · ".join([names[row], *[_fit(row[i], 40) for i in varying]]) for row in rows]
        height = 0.12 * len(policies) + 0.1
        fig, ax = plt.subplots(figsize=(PAGE_IN, 1.0 + height * len(rows)), layout="constrained")
        for j, policy in enumerate(policies):
            present = [(y, stats.loc[(*row, policy)]) for y, row in enumerate(rows) if (*row, policy) in stats.index]
            ys = np.array([y for y, _ in present]) * height + (j - (len(policies) - 1) / 2) * 0.12   # 1st on top
            look = policy_look(policy)
            ax.barh(ys, [st["mean"] for _, st in present], 0.11, xerr=[st["std"] for _, st in present],   # NaN: one seed
                    color=look.color, hatch=look.hatch, hatchcolor=_ink(look.color), edgecolor=look.color,
                    label=policy, error_kw={"linewidth": 0.8, "capsize": 1.5})
        ax.axvline(1.0, color=COLORS[BASELINE], linewidth=0.8, label=f"{BASELINE} (1.0)")
        ax.set_yticks(np.arange(len(rows)) * height, ticks)
        ax.invert_yaxis()     # the first row on top, as in the table
        ax.set_xlabel("speedup over colocate")
        ax.grid(axis="y", visible=False)
        ax.set_title(_title("Rollout-time speedup over colocate", [_seeds(stats["count"], "error bars: std over seeds")]))
        fig.legend(loc="outside right upper")
        self.save(fig, "speedup_bars")


def log_to_wandb(out: Path, figures: list[Path], project: str) -> bool:
    """The written report in one W&B run: speedup.csv as a table, each PNG figure as an image. A W&B
    failure is one warning and False: the report's files are already written."""
    try:
        import wandb
        run = wandb.init(project=project, dir=str(out), mode=os.environ.get("WANDB_MODE", "offline"),
                         job_type="report", name=f"report {out.resolve().name}")
        run.log({"speedup": wandb.Table(dataframe=pd.read_csv(out / "speedup.csv"))})
        run.log({f"figures/{p.stem}": wandb.Image(str(p)) for p in figures if p.suffix == ".png"})
        run.finish()
        return True
    except Exception as exc:   # noqa: BLE001 - logging must never cost the report
        log.warning("W&B: the report was not logged (%s: %s); its files are in %s", type(exc).__name__, exc, out)
        return False


# --- writing ---------------------------------------------------------------------------------------
def _write(path: Path, write: Callable[[Path], object]) -> None:
    """`write(path)`; an OSError (a full disk) is raised again naming the file, which a write that fails
    after opening it does not."""
    try:
        write(path)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc


# A report's staging directory in OUT: `.report-<pid>@<host>-<mkdtemp's 8 characters>`, its writer's process.
STAGE_PREFIX = ".report-"
STAGE_NAME = re.compile(r"\.report-(\d+)@([A-Za-z0-9._-]+)-[a-z0-9_]{8}")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "_"


def _stage_prefix() -> str:
    return f"{STAGE_PREFIX}{os.getpid()}@{_host()}-"


def _alive(pid: int) -> bool:
    """Whether process `pid` runs on this machine (True where that cannot be told: never a false 'no')."""
    if pid <= 0:
        return True   # 0 and below name process groups, not a writer
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OverflowError, OSError):
        return True   # another user's process (PermissionError), or a number no process has: not provably gone
    return True


def remove_abandoned_stages(out: Path) -> list[Path]:
    """Remove the staging directories in `out` whose writer is provably gone: the name is exactly a stage
    name (STAGE_NAME), it is a directory (not a link), written on this machine, by a process that no longer
    exists (a report killed mid-write). A concurrent report's stays, and so does anything else (a name
    without a process, as earlier versions wrote, another machine's on a shared disk). Returns those removed.
    A process id reused since is a live process: its stage stays, to be removed by a later report."""
    removed = []
    host = _host()
    try:
        entries = list(os.scandir(out))
    except OSError:
        return removed
    for entry in entries:
        m = STAGE_NAME.fullmatch(entry.name)
        if m is None or m.group(2) != host or not entry.is_dir(follow_symlinks=False) or _alive(int(m.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        log.info("removed %s, left by a report that was stopped before it finished", entry.path)
        removed.append(Path(entry.path))
    return removed


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A temporary directory in `out` to write the report into; once the block ends, its files are moved
    to the same names in `out`. A failure (a full disk) leaves `out` as it was: the staged files are
    removed, the files they replaced put back, and `out` itself removed if this made it. The OSError
    names the file under `out`. The directory's name carries this process's id, so that a report killed
    before it could remove it has its directory removed by the next one (remove_abandoned_stages)."""
    made = [p for p in (out, *out.parents) if not p.exists()]
    out.mkdir(parents=True, exist_ok=True)
    remove_abandoned_stages(out)
    stage = Path(tempfile.mkdtemp(prefix=_stage_prefix(), dir=out))
    try:
        yield stage
        _move_in(stage, out)
    except BaseException as exc:
        if made:
            shutil.rmtree(made[-1], ignore_errors=True)
        if not isinstance(exc, OSError):
            raise
        name = Path(exc.filename) if exc.filename else out
        if name.is_relative_to(stage):
            name = out / name.relative_to(stage)
        raise OSError(exc.errno, exc.strerror or str(exc), str(name)) from exc
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _move_in(stage: Path, out: Path) -> None:
    """Each file under `stage` to its place under `out`, the file there kept in `stage` until every one
    is in; a move that fails puts back what the moves before it changed, and is raised naming its place."""
    kept = Path(tempfile.mkdtemp(prefix="replaced-", dir=stage))
    moved: list[tuple[Path, Path | None]] = []   # a file moved in, and where the one it replaced is kept
    made: list[Path] = []                        # directories made under `out`
    target = out
    try:
        for new in sorted(p for p in stage.rglob("*") if p.is_file() and not p.is_relative_to(kept)):
            rel = new.relative_to(stage)
            target = out / rel
            made += [d for d in reversed(target.parents) if d.is_relative_to(out) and not d.exists()]
            target.parent.mkdir(parents=True, exist_ok=True)
            old = None
            if target.exists():
                old = kept / rel
                old.parent.mkdir(parents=True, exist_ok=True)
                os.replace(target, old)
            moved.append((target, old))
            os.replace(new, target)
    except OSError as exc:
        for placed, old in reversed(moved):
            if old is None:
                placed.unlink(missing_ok=True)
            else:
                os.replace(old, placed)
        for d in reversed(made):
            d.rmdir()
        raise OSError(exc.errno, exc.strerror or str(exc), str(target)) from exc


def report(runs: list[Run], out: Path) -> tuple[Tables, list[Path]]:
    """The tables and figures of `runs` in `out`: the tables, and the figure files written. All or
    nothing (`staged`): a report that cannot be written leaves `out` as it was."""
    with staged(out) as stage:
        tables = write_tables(runs, stage)
        figures = Figures(tables.runs, stage / "figures").all()
    return tables, [out / p.relative_to(stage) for p in figures]


def main(argv: list[str] | None = None) -> None:
    parser = cli.parser("harness.report", "The speedup tables (printed, and written as speedup.csv, .md and .tex) "
                        "and the figures of every run under the DIRs, from their result files alone.", overrides=False)
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="sweep or run directories")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: the first DIR)")
    parser.add_argument("--wandb", nargs="?", const=PROJECT, default=None, metavar="PROJECT",
                        help=f"also log the table and figures as a W&B run (project default {PROJECT})")
    cli.run_tool(parser, partial(_main, parser), argv, catch=())   # a file it cannot read: its traceback names it


def _main(parser, args) -> None:
    missing = [d for d in args.dirs if not d.is_dir()]
    if missing:
        parser.error(f"not a directory: {', '.join(map(str, missing))}")
    out = args.out or args.dirs[0]
    try:   # before anything is read: a read-only directory or a file there ends the report at once
        rundir.check_writable("--out", str(out))
    except rundir.BadRunDir as exc:
        parser.error(str(exc))
    runs = find_runs(args.dirs)
    if not runs:
        parser.error(f"no runs (summary.json, error.json or .hydra) under {', '.join(map(str, args.dirs))}")
    try:
        tables, figures = report(runs, out)
    except OSError as exc:   # a full disk: nothing written (report); the message names the file
        parser.error(f"cannot write {exc.filename}: {exc.strerror}; {out} is as it was")
    failed = [r for r in runs if not r.complete]
    print(console_text(tables) + "\n")
    print(f"{len(runs) - len(failed)} complete runs, {len(failed)} failed, partial or broken; wrote {out}/speedup.csv, "
          f".md, .tex and {len(figures)} figure files in {out}/figures")
    for line in _failed_lines(runs):
        print(f"  not included: {line}")
    if args.wandb and log_to_wandb(out, figures, args.wandb):
        print(f"logged the table and {sum(p.suffix == '.png' for p in figures)} figures to W&B under {out}/wandb")


if __name__ == "__main__":
    main()
