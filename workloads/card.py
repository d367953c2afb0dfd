"""A workload's card: its generated statistics beside the published ones, and a figure.

    python -m workloads.card workload=swe [KEY=VALUE ...] [--samples N] [--out DIR]
                             [--export FILE --steps S]     (or prorsa-card)

Draws RL steps until at least N trajectories (default 4000), prints one row per published figure
in the YAML's `targets` (generated, published, tolerance, ok; tolerances in workloads/stats.py) and
the generated percentiles of every metric, then writes DIR/<name>.md and DIR/<name>.png (default
results/cards). `--export FILE` also writes the first S steps (default 1) as a JSONL trace.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

from harness import cli
from harness.rundir import check_writable
from harness.trajectory import TrajectoryScript
from workloads.stats import METRICS, compare, metric_values, statistic
from workloads.trace import export_trace

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
SUMMARY_STATS = ("mean", "p10", "p50", "p90", "p99")


def build(overrides: list[str]):
    """The workload that `python run.py <overrides>` would build, its keys checked as run.py checks them."""
    from harness.experiment import instantiate_checked
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    return instantiate_checked(cfg.workload, "workload", seed=cfg.seed)


def draw(workload, samples: int) -> list[tuple[TrajectoryScript, str]]:
    """Trajectories of steps 0, 1, ... until `samples`, each labelled with its turn mode ('all' if none)."""
    out, step = [], 0
    while len(out) < samples:
        out += workload.sample(step) if hasattr(workload, "sample") else [(s, "all") for s in workload.batch(step)]
        step += 1
    return out


def fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"


def tables(labelled: list[tuple[TrajectoryScript, str]], targets: dict) -> str:
    scripts = [s for s, _ in labelled]
    lines = [f"{len(scripts)} trajectories, {sum(len(s.turns) for s in scripts)} turns", "",
             "| population | metric | stat | generated | published | tolerance | ok |",
             "|---|---|---|---|---|---|---|"]
    for r in compare(labelled, targets):
        lines.append(f"| {r['population']} | {r['metric']} | {r['stat']} | {fmt(r['generated'])} | "
                     f"{fmt(r['published'])} | {r['tolerance']} | {'yes' if r['ok'] else 'NO'} |")
    lines += ["", "| metric | " + " | ".join(SUMMARY_STATS) + " |", "|---" * (len(SUMMARY_STATS) + 1) + "|"]
    for metric in METRICS:
        values = metric_values(scripts, metric)
        lines.append(f"| {metric} | " + " | ".join(fmt(statistic(values, s)) for s in SUMMARY_STATS) + " |")
    return "\n".join(lines)


# Each metric's axes: the unit of one value (x, log scale) and what is counted (y).
AXES = {"turns": ("turns per trajectory", "trajectories"),
        "prompt_tokens": ("tokens (first prompt)", "trajectories"),
        "output_tokens": ("tokens per turn", "turns"),
        "tool_output_tokens": ("tokens per turn", "turns"),
        "tool_latency_s": ("seconds per call", "tool calls"),
        "generated_tokens": ("tokens per trajectory", "trajectories"),
        "total_tokens": ("tokens per trajectory", "trajectories")}


def figure(labelled: list[tuple[TrajectoryScript, str]], name: str, path: Path) -> None:
    """Histograms (log x) of every metric, in the report's style (harness/figure_style.py); matplotlib is
    imported here so that drawing trajectories does not need it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    from harness.figure_style import PAGE_IN, rc
    scripts = [s for s, _ in labelled]
    with plt.rc_context(rc()):
        fig, axes = plt.subplots(2, 4, figsize=(PAGE_IN, 3.8), layout="constrained")
        for ax, metric in zip(axes.flat, METRICS):
            values = metric_values(scripts, metric)
            values = values[values > 0]
            if len(values):
                bins = np.geomspace(values.min(), values.max() * 1.001, 30) if values.max() > values.min() else 10
                ax.hist(values, bins=bins, color="#4C72B0")
                ax.set_xscale("log")
                ax.xaxis.set_minor_formatter(NullFormatter())   # 2x10^3 beside 3x10^3 collides
            ax.set_title(metric)
            ax.set_xlabel(AXES[metric][0])
            ax.set_ylabel(AXES[metric][1])
        axes.flat[-1].axis("off")
        fig.suptitle(f"Workload card: {name}\n{len(scripts)} trajectories, {sum(len(s.turns) for s in scripts)} turns")
        fig.savefig(path)
        plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = cli.parser("workloads.card", __doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=4000, help="trajectories drawn at least (default: %(default)s)")
    p.add_argument("--out", default="results/cards", metavar="DIR", help="default: %(default)s")
    p.add_argument("--export", default=None, metavar="FILE", help="also write the first --steps steps as a JSONL trace")
    p.add_argument("--steps", type=int, default=1, help="default: %(default)s")
    p.add_argument("--no-figure", action="store_true")
    cli.run_tool(p, _main, argv)


def _main(args) -> None:
    if args.samples < 1 or args.steps < 1:
        raise ValueError(f"--samples={args.samples} --steps={args.steps} is invalid; allowed: integers >= 1")
    check_writable("--out", args.out)
    if args.export:
        check_writable("--export", args.export, file=True)
    workload = build(args.overrides)
    labelled = draw(workload, args.samples)
    text = f"# Workload card: {workload.name}\n\n" + tables(labelled, getattr(workload, "targets", {}))
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{workload.name}.md").write_text(text + "\n")
    if not args.no_figure:
        figure(labelled, workload.name, out / f"{workload.name}.png")
    print(f"\nwrote {out / workload.name}.md" + ("" if args.no_figure else f" and {out / workload.name}.png"))
    if args.export:
        n = export_trace(workload, args.steps, args.export)
        print(f"exported {n} trajectories ({args.steps} steps) to {args.export}")


if __name__ == "__main__":
    main()
