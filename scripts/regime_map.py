"""Regime map: where PD disaggregation and Prorsa pay. The turn-shape grids vary new tokens per turn x
output tokens per turn x DP-attention size x engine semantics x RL mode, at a load typical of RL
rollouts (GPUs saturated, tools fast); the load grid varies the load and the tool latency. Per cell:
colocation, fixed splits (a quarter, half and three quarters of the engines as prefill engines) and
Prorsa (see `with_prorsa`); the speedup over colocation of the best split and of Prorsa, and the most any
allocation could gain by the lower bound (colocation's rollout time / lower_bound_s; a cell where it
is under 1.05 is marked: no allocation can gain 5% there).

    python scripts/regime_map.py [OUT] [--grid GRID [GRID ...]] [--ray] [--table-only]

GRID: coarse (default), async, async_dp16, async_long, full, load, smoke, load_smoke; several grids make
one map of their cells (`--grid async async_dp16 async_long`: the whole async map, one CSV and one
figure). The load grid varies the load (trajectories per GPU) and the tool latency instead of the turn
shape; its figures are OUT/regime_map_load_{sync,async}.{png,pdf}, one panel per turn shape and DP size.

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
from dataclasses import dataclass
from itertools import product
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.sweep import unnamed  # noqa: E402

log = logging.getLogger("regime_map")

GPUS = 32
GROUP = 8       # trajectories per prompt (GRPO group)
# The default load: 8 trajectories per GPU (256 of 4 turns on the 32 GPUs), tools at 0.2 s: the GPUs, not
# the tools, bound a step.
LOAD_PER_GPU = 8
TOOL_S = 0.2


@dataclass(frozen=True)
class Grid:
    """A grid's axes: new tokens per turn, output tokens per turn, DP sizes, semantics, modes, loads
    (trajectories per GPU) and median tool latencies (s)."""
    new: list[int]
    out: list[int]
    dp: list[int]
    engine: list[str]
    mode: list[str]
    load: tuple[int, ...] = (LOAD_PER_GPU,)
    tool_s: tuple[float, ...] = (TOOL_S,)
    layout: str = "shape"   # how its figure is drawn (LAYOUTS)


# A cell's coordinates, in the order of Grid's fields.
AXES = ("new_tokens", "output_tokens", "dp", "engine", "mode", "load", "tool_s")
GRIDS = {
    "full": Grid([100, 1000, 4000, 16000], [50, 500, 2000, 8000], [1, 4, 8, 16], ["vllm", "sglang"], ["sync", "async"]),
    "coarse": Grid([100, 1000, 4000, 16000], [50, 500, 8000], [1, 4, 8, 16], ["vllm", "sglang"], ["sync"]),
    # async on vLLM semantics alone, without DP16 and 8,000-token answers, to fit an hour here: in sync
    # the semantics differ by under 5% per cell, and an async Prorsa run with 8,000-token answers takes
    # ~25 minutes; DP16 is a grid of its own (below)
    "async": Grid([100, 1000, 4000, 16000], [50, 500], [1, 4, 8], ["vllm"], ["async"]),
    # the async map's DP16 row (two engines: colocation, 1P1D and Prorsa per cell)
    "async_dp16": Grid([100, 1000, 4000, 16000], [50, 500], [16], ["vllm"], ["async"]),
    # the async map's 8,000-token answers (largest new tokens first: a Prorsa run takes 5-15 minutes
    # here, so the cells where PD may pay come first)
    "async_long": Grid([16000, 4000, 1000, 100], [8000], [1, 4, 8, 16], ["vllm"], ["async"]),
    # the load and tool-latency axes: 2, 8 and 32 trajectories per GPU, tools at 0.2, 2 and 20 s, on
    # DP4 and DP8, sync and async, at two turn shapes: 1,000 new tokens (near where PD starts to pay at
    # the default load) and 4,000 (where it pays), 500 output tokens each
    "load": Grid([1000, 4000], [500], [4, 8], ["vllm"], ["sync", "async"], (2, 8, 32), (0.2, 2.0, 20.0), "load"),
    "smoke": Grid([1000], [50], [4], ["vllm"], ["sync"]),
    "load_smoke": Grid([1000], [50], [4], ["vllm"], ["async"], (2,), (20.0,), "load"),
}
ASYNC_PRORSA_MAX_IN_FLIGHT = 256
# The workload of every cell but its load and tool latency: GRPO groups of 8, 4 turns, 1,000-token prompts.
WORKLOAD = ["workload=synthetic", f"workload.group_size={GROUP}", "workload.turns.0.median=4",
            "workload.prompt.median=1000", "workload.tool_latency.0.sigma=0.5",
            "workload.context_cap=131072", "workload.max_output_tokens=16384"]
# Sync: the batch as one RL step. Async: four such batches with one batch's trajectories in flight, so new
# trajectories start as others end (one batch all in flight at once would be a sync step again).
MODES = {"sync": ["mode=sync", "mode.num_steps=1"],
         "async": ["mode=async", "mode.num_steps=4"]}


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
    for name in grids:
        g = GRIDS[name]
        for key in product(g.new, g.out, g.dp, g.engine, g.mode, g.load, g.tool_s):
            if key not in seen:
                seen.add(key)
                yield dict(zip(AXES, key))


def cell_name(c: dict) -> str:
    """The cell's directory; a cell at the default load and tool latency keeps the name it had before
    those axes."""
    name = f"{c['mode']}_{c['engine']}_dp{c['dp']}_new{c['new_tokens']}_out{c['output_tokens']}"
    load, tool = c.get("load", LOAD_PER_GPU), c.get("tool_s", TOOL_S)
    return name if (load, tool) == (LOAD_PER_GPU, TOOL_S) else f"{name}_load{load}_tool{tool:g}"


def cell_overrides(c: dict) -> list[str]:
    """A cell's run, but for its policy. The load sets the batch (trajectories per GPU x GPUs) and, in
    async, the trajectories in flight (one batch)."""
    _, par = parallelism(c["dp"])
    trajectories = c.get("load", LOAD_PER_GPU) * GPUS
    mode = [*MODES[c["mode"]], *([f"mode.max_in_flight={trajectories}"] if c["mode"] == "async" else [])]
    return [*WORKLOAD, f"workload.batch_size={trajectories // GROUP}",
            f"workload.tool_latency.0.median={c.get('tool_s', TOOL_S):g}", "cluster=moe_h200",
            f"cluster.engine={c['engine']}", *par, *mode,
            f"workload.tool_output.median={c['new_tokens']}", f"workload.output.median={c['output_tokens']}"]


def with_prorsa(c: dict) -> bool:
    """Prorsa runs in every cell but the async ones with more than 256 trajectories in flight, where a
    plan costs several CPU seconds (benchmarks/test_prorsa_overhead.py) and one run of 1,024 in flight
    took over eight minutes here."""
    return c["mode"] == "sync" or c.get("load", LOAD_PER_GPU) * GPUS <= ASYNC_PRORSA_MAX_IN_FLIGHT


def run_cell(out: Path, c: dict, launcher: list[str]) -> None:
    engines, _ = parallelism(c["dp"])
    over = [*cell_overrides(c), "logger=none"]
    # job directories named by the policy overrides only (the cell's directory says the rest)
    cmd = [sys.executable, "run.py", "-m", f"hydra.sweep.dir={out / cell_name(c)}", *over, unnamed(over), *launcher]
    first = "policy=colocate,prorsa" if with_prorsa(c) else "policy=colocate"
    for policy in ([first], ["policy=fixed_pd", f"policy.num_prefill={','.join(map(str, splits(engines)))}"]):
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


@dataclass(frozen=True)
class Layout:
    """How a map is drawn: one panel per value of `panel`, inside it `y` by `x`."""
    panel: tuple[str, str]
    y: str
    x: str
    ylabel: str
    xlabel: str
    panel_title: str      # formatted with the panel's two values
    title: str            # formatted with the mode and the output tokens per turn
    file: str             # formatted with the mode


SPEEDUPS = "Best fixed split (colour, top) and Prorsa (P) speedup over colocation"
BOUND = "x: the lower bound leaves < 5% to gain"
LAYOUTS = {
    "shape": Layout(("engine", "dp"), "new_tokens", "output_tokens", "new tokens / turn", "output tokens / turn",
                    "{0}, DP{1}", f"{SPEEDUPS}, {{mode}} RL, 32 H200, Qwen3-30B-A3B\n{BOUND}", "regime_map_{mode}"),
    "load": Layout(("new_tokens", "dp"), "tool_s", "load", "tool latency (s)", "trajectories / GPU",
                   "{0} new tokens, DP{1}",
                   f"{SPEEDUPS}, {{mode}} RL\n32 H200, Qwen3-30B-A3B, vLLM, {{out}} output tokens / turn; {BOUND}",
                   "regime_map_load_{mode}"),
}


def figures(df, out: Path, lay: Layout) -> list[Path]:
    """Per mode: one heatmap panel per layout panel; colour the best split's speedup over colocation,
    text the best split's and Prorsa's speedups; `x` where the lower bound leaves under 5% to gain."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from harness.figure_style import save
    from matplotlib.colors import TwoSlopeNorm

    written = []
    for mode, d in df.groupby("mode"):
        panels = sorted({tuple(v) for v in d[list(lay.panel)].itertuples(index=False)})
        rows = sorted({a for a, _ in panels})
        cols = sorted({b for _, b in panels})
        fig, axes = plt.subplots(len(rows), len(cols), figsize=(7.0, 1.9 * len(rows) + 1.1), squeeze=False, layout="constrained",
                                 sharex=True, sharey=True)
        ys, xs = sorted(d[lay.y].unique()), sorted(d[lay.x].unique())
        norm = TwoSlopeNorm(vmin=0.5, vcenter=1.0, vmax=2.0)
        image = None
        for i, a in enumerate(rows):
            for j, b in enumerate(cols):
                ax = axes[i][j]
                cell = d[(d[lay.panel[0]] == a) & (d[lay.panel[1]] == b)].set_index([lay.y, lay.x])
                grid = [[cell["best_fixed_speedup"].get((y, x), float("nan")) for x in xs] for y in ys]
                image = ax.imshow(grid, cmap="RdBu", norm=norm, origin="lower", aspect="auto")
                for u, y in enumerate(ys):
                    for v, x in enumerate(xs):
                        if (y, x) not in cell.index:
                            continue
                        r = cell.loc[(y, x)]
                        text = f"{r['best_fixed_speedup']:.2f}\nP {r['prorsa_speedup']:.2f}" \
                            if r["prorsa_speedup"] == r["prorsa_speedup"] else f"{r['best_fixed_speedup']:.2f}"
                        if r["max_gain_by_bound"] < 1.05:
                            text += " x"
                        dark = abs(norm(r["best_fixed_speedup"]) - 0.5) > 0.3   # white text on deep colours
                        ax.text(v, u, text, ha="center", va="center", fontsize=6, color="white" if dark else "black")
                ax.set_title(lay.panel_title.format(a, b), fontsize=8)
                ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs], fontsize=7)
                ax.set_yticks(range(len(ys)), [f"{y:g}" for y in ys], fontsize=7)
                if i == len(rows) - 1:
                    ax.set_xlabel(lay.xlabel, fontsize=7)
                if j == 0:
                    ax.set_ylabel(lay.ylabel, fontsize=7)
        out_tokens = "/".join(map(str, sorted(d.output_tokens.unique())))
        fig.suptitle(lay.title.format(mode=mode, out=out_tokens), fontsize=8)
        fig.colorbar(image, ax=axes, shrink=0.8, label="best fixed / colocation")
        for ext in ("png", "pdf"):
            path = out / f"{lay.file.format(mode=mode)}.{ext}"
            save(fig, path, dpi=150)
            written.append(path)
        plt.close(fig)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description="Regime map: where PD disaggregation and Prorsa pay.")
    ap.add_argument("out", nargs="?", default="results/regime_map")
    ap.add_argument("--grid", choices=list(GRIDS), nargs="+", default=["coarse"],
                    help="grids of one layout, drawn as one map (default: coarse)")
    ap.add_argument("--ray", action="store_true")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    layouts = {GRIDS[g].layout for g in args.grid}
    if len(layouts) > 1:
        ap.error(f"--grid {' '.join(args.grid)}: one map draws grids of one layout (shape or load), not both")
    grid = list(cells(*args.grid))
    name = next(iter(layouts))
    lay = LAYOUTS[name]
    # a figure per mode; every other axis is drawn, or must hold one value
    held = [k for k in AXES if k not in (*lay.panel, lay.x, lay.y, "mode") and len({c[k] for c in grid}) > 1]
    if held:
        ap.error(f"--grid {' '.join(args.grid)}: the {name} layout's figure draws one value of "
                 f"{', '.join(held)}; these grids hold several")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        run_cells(out, grid, args.ray)
    import pandas as pd
    df = pd.DataFrame([r for r in (row(out, c) for c in grid) if r is not None])
    if df.empty:
        log.warning("no complete cell in %s", out)
        return
    df.to_csv(out / "regime_map.csv", index=False)
    figures(df, out, lay)
    log.info("%s", df.to_string(index=False))


if __name__ == "__main__":
    main()
