"""Regime map: where PD disaggregation and Prorsa pay, over new tokens per turn x output tokens per turn x
DP-attention size x engine semantics x RL mode, at a load typical of RL rollouts (GPUs saturated, tools
fast). Per cell: colocation, fixed splits (a quarter, half and three quarters of the engines as prefill
engines) and Prorsa; the speedup over colocation of the best split and of Prorsa, and the most any
allocation could gain by the lower bound (colocation's rollout time / lower_bound_s; a cell where it
is under 1.05 is marked: no allocation can gain 5% there).

    python scripts/regime_map.py [OUT] [--grid GRID [GRID ...]] [--ray] [--table-only]

GRID: coarse (default), async, async_dp16, async_long, full, smoke; several grids make one map of
their cells (`--grid async async_dp16 async_long`: the whole async map, one CSV and one figure).

Each cell is one Hydra multirun (a rerun skips complete jobs). `--ray` starts one local Ray cluster
(a CPU per job) and runs the cells' multiruns side by side on it (`hydra/launcher=ray`, joining it),
so both cores stay busy while one cell's long Prorsa run goes on. Writes OUT/regime_map.csv and
OUT/regime_map_{sync,async}.{png,pdf}: one heatmap panel per DP size and semantics, rows the new
tokens per turn, columns the output tokens.
The cluster is moe_h200's 32 H200 GPUs (Qwen3-30B-A3B) cut into engines of the DP size: DP1 is 8 TP4
engines, DP4 8 engines of DP4+EP4 (the preset), DP8 4 engines of DP8+EP8 (prefill TP8), DP16 2 engines
of DP16+EP16 (prefill TP8 x DP2); prefill engines keep tensor parallelism as in the preset.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from itertools import product
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.sweep import unnamed  # noqa: E402

log = logging.getLogger("regime_map")

GRIDS = {   # new tokens per turn, output tokens per turn, DP sizes, semantics, modes
    "full": ([100, 1000, 4000, 16000], [50, 500, 2000, 8000], [1, 4, 8, 16], ["vllm", "sglang"], ["sync", "async"]),
    "coarse": ([100, 1000, 4000, 16000], [50, 500, 8000], [1, 4, 8, 16], ["vllm", "sglang"], ["sync"]),
    # async on vLLM semantics alone, without DP16 and 8,000-token answers, to fit an hour here: in sync
    # the semantics differ by under 5% per cell, and an async Prorsa run with 8,000-token answers takes
    # ~25 minutes; DP16 is a grid of its own (below)
    "async": ([100, 1000, 4000, 16000], [50, 500], [1, 4, 8], ["vllm"], ["async"]),
    # the async map's DP16 row (two engines: colocation, 1P1D and Prorsa per cell)
    "async_dp16": ([100, 1000, 4000, 16000], [50, 500], [16], ["vllm"], ["async"]),
    # the async map's 8,000-token answers (largest new tokens first: a Prorsa run takes 5-15 minutes
    # here, so the cells where PD may pay come first)
    "async_long": ([16000, 4000, 1000, 100], [8000], [1, 4, 8, 16], ["vllm"], ["async"]),
    "smoke": ([1000], [50], [4], ["vllm"], ["sync"]),
}
GPUS = 32
# The load: 256 trajectories of 4 turns on 32 GPUs, tools at 0.2 s (the GPUs, not the tools, bound a step).
LOAD = ["workload=synthetic", "workload.batch_size=32", "workload.group_size=8", "workload.turns.0.median=4",
        "workload.prompt.median=1000", "workload.tool_latency.0.median=0.2", "workload.tool_latency.0.sigma=0.5",
        "workload.context_cap=131072", "workload.max_output_tokens=16384"]
# Sync: that batch as one RL step. Async: four such batches with 256 trajectories in flight, so new
# trajectories start as others end (one batch all in flight at once would be a sync step again).
MODES = {"sync": ["mode=sync", "mode.num_steps=1"],
         "async": ["mode=async", "mode.num_steps=4", "mode.max_in_flight=256"]}


def parallelism(dp: int) -> tuple[int, list[str]]:
    """Engines and parallelism overrides for a DP-attention size on the 32 GPUs."""
    if dp == 1:
        engines, gpus = 8, 4
        roles = {"colocated": (4, 1, False), "prefill": (4, 1, False), "decode": (4, 1, False)}
    else:
        gpus = max(dp, 4)
        engines = GPUS // gpus
        ptp = min(gpus, 8)
        roles = {"colocated": (1, dp, True), "prefill": (ptp, gpus // ptp, False), "decode": (1, dp, True)}
    over = [f"cluster.num_engines={engines}", f"cluster.gpus_per_engine={gpus}"]
    for role, (tp, d, ep) in roles.items():
        over.append(f"cluster.parallelism.{role}={{tp:{tp},dp:{d},ep:{str(ep).lower()}}}")
    return engines, over


def splits(engines: int) -> list[int]:
    return sorted({max(1, min(engines - 1, round(engines * f))) for f in (0.25, 0.5, 0.75)})


def cells(*grids: str):
    """The cells of the grids, in order, each once."""
    seen = set()
    for grid in grids:
        new, out, dps, engines, modes = GRIDS[grid]
        for n, o, dp, sem, mode in product(new, out, dps, engines, modes):
            if (n, o, dp, sem, mode) not in seen:
                seen.add((n, o, dp, sem, mode))
                yield {"new_tokens": n, "output_tokens": o, "dp": dp, "engine": sem, "mode": mode}


def cell_name(c: dict) -> str:
    return f"{c['mode']}_{c['engine']}_dp{c['dp']}_new{c['new_tokens']}_out{c['output_tokens']}"


def cell_overrides(c: dict) -> list[str]:
    """A cell's run, but for its policy."""
    _, par = parallelism(c["dp"])
    return [*LOAD, "cluster=moe_h200", f"cluster.engine={c['engine']}", *par, *MODES[c["mode"]],
            f"workload.tool_output.median={c['new_tokens']}", f"workload.output.median={c['output_tokens']}"]


def run_cell(out: Path, c: dict, launcher: list[str]) -> None:
    engines, _ = parallelism(c["dp"])
    over = [*cell_overrides(c), "logger=none"]
    # job directories named by the policy overrides only (the cell's directory says the rest)
    cmd = [sys.executable, "run.py", "-m", f"hydra.sweep.dir={out / cell_name(c)}", *over, unnamed(over), *launcher]
    for policy in (["policy=colocate,prorsa"], ["policy=fixed_pd", f"policy.num_prefill={','.join(map(str, splits(engines)))}"]):
        rc = subprocess.run(cmd + policy, cwd=ROOT).returncode
        if rc != 0:
            log.warning("%s: a job failed (exit %d); the others are kept", cell_name(c), rc)


def run_cells(out: Path, grid: list[dict], ray: bool) -> None:
    """Each cell in turn, or with `ray` all of them on one local Ray cluster: a cell's multirun waits
    on its jobs, so twice as many cells as cores are kept going for Ray to always have jobs queued
    (in grid order: the slowest cells first where a grid says so)."""
    if not ray:
        for c in grid:
            run_cell(out, c, [])
        return
    import ray as ray_api
    cpus = os.cpu_count() or 1
    # the object store at the Ray launcher's own default size (hydra_ray_launcher/_core.py)
    ray_api.init(num_cpus=cpus, include_dashboard=False, object_store_memory=78643200)
    # each multirun joins this cluster by its address (the launcher's default object store size is
    # refused when joining)
    launcher = ["hydra/launcher=ray", f"hydra.launcher.ray.init.address={ray_api.get_runtime_context().gcs_address}",
                "+hydra.launcher.ray.init.object_store_memory=null"]
    try:
        with ThreadPoolExecutor(2 * cpus) as pool:
            list(pool.map(lambda c: run_cell(out, c, launcher), grid))
    finally:
        ray_api.shutdown()


def row(out: Path, c: dict) -> dict | None:
    runs = {}
    for s in (out / cell_name(c)).glob("*/summary.json"):
        r = json.loads(s.read_text())
        m = re.search(r"policy\.num_prefill=(\d+)", s.parent.name)
        runs[f"{m.group(1)}P" if m else r["policy"]] = r
    if "colocate" not in runs:
        return None
    colo = runs["colocate"]["rollout_time_s"]
    fixed = {k: v["rollout_time_s"] for k, v in runs.items() if k.endswith("P")}
    best = min(fixed, key=fixed.get) if fixed else None
    return {**c, "colocate_s": round(colo, 2),
            "best_split": best, "best_fixed_speedup": round(colo / fixed[best], 3) if best else None,
            "prorsa_speedup": round(colo / runs["prorsa"]["rollout_time_s"], 3) if "prorsa" in runs else None,
            "prorsa_switches": runs["prorsa"].get("num_role_switches") if "prorsa" in runs else None,
            "max_gain_by_bound": round(colo / runs["colocate"]["lower_bound_s"], 3)}


def figures(df, out: Path) -> list[Path]:
    """Per mode: one panel per (semantics, DP size); colour the best split's speedup over colocation,
    text the best split's and Prorsa's speedups; `x` where the lower bound leaves under 5% to gain."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from harness.figure_style import save
    from matplotlib.colors import TwoSlopeNorm

    written = []
    for mode, d in df.groupby("mode"):
        panels = sorted({(e, p) for e, p in zip(d["engine"], d["dp"])})
        cols = sorted({p for _, p in panels})
        rows = sorted({e for e, _ in panels})
        fig, axes = plt.subplots(len(rows), len(cols), figsize=(7.0, 1.9 * len(rows) + 1.1), squeeze=False, layout="constrained",
                                 sharex=True, sharey=True)
        news, outs = sorted(d["new_tokens"].unique()), sorted(d["output_tokens"].unique())
        norm = TwoSlopeNorm(vmin=0.5, vcenter=1.0, vmax=2.0)
        image = None
        for i, e in enumerate(rows):
            for j, p in enumerate(cols):
                ax = axes[i][j]
                cell = d[(d["engine"] == e) & (d["dp"] == p)].set_index(["new_tokens", "output_tokens"])
                grid = [[cell["best_fixed_speedup"].get((n, o), float("nan")) for o in outs] for n in news]
                image = ax.imshow(grid, cmap="RdBu", norm=norm, origin="lower", aspect="auto")
                for a, n in enumerate(news):
                    for b, o in enumerate(outs):
                        if (n, o) not in cell.index:
                            continue
                        r = cell.loc[(n, o)]
                        text = f"{r['best_fixed_speedup']:.2f}\nP {r['prorsa_speedup']:.2f}" \
                            if r["prorsa_speedup"] == r["prorsa_speedup"] else f"{r['best_fixed_speedup']:.2f}"
                        if r["max_gain_by_bound"] < 1.05:
                            text += " x"
                        dark = abs(norm(r["best_fixed_speedup"]) - 0.5) > 0.3   # white text on deep colours
                        ax.text(b, a, text, ha="center", va="center", fontsize=6, color="white" if dark else "black")
                ax.set_title(f"{e}, DP{p}", fontsize=8)
                ax.set_xticks(range(len(outs)), [str(o) for o in outs], fontsize=7)
                ax.set_yticks(range(len(news)), [str(n) for n in news], fontsize=7)
                if i == len(rows) - 1:
                    ax.set_xlabel("output tokens / turn", fontsize=7)
                if j == 0:
                    ax.set_ylabel("new tokens / turn", fontsize=7)
        fig.suptitle(f"Best fixed split (colour, top) and Prorsa (P) speedup over colocation, {mode} RL, "
                     "32 H200, Qwen3-30B-A3B\nx: the lower bound leaves < 5% to gain", fontsize=8)
        fig.colorbar(image, ax=axes, shrink=0.8, label="best fixed / colocation")
        for ext in ("png", "pdf"):
            path = out / f"regime_map_{mode}.{ext}"
            save(fig, path, dpi=150)
            written.append(path)
        plt.close(fig)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="results/regime_map")
    ap.add_argument("--grid", choices=list(GRIDS), nargs="+", default=["coarse"])
    ap.add_argument("--ray", action="store_true")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    grid = list(cells(*args.grid))
    if not args.table_only:
        run_cells(out, grid, args.ray)
    import pandas as pd
    df = pd.DataFrame([r for r in (row(out, c) for c in grid) if r is not None])
    if df.empty:
        log.warning("no complete cell in %s", out)
        return
    df.to_csv(out / "regime_map.csv", index=False)
    figures(df, out)
    log.info("%s", df.to_string(index=False))


if __name__ == "__main__":
    main()
