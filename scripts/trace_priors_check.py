"""Does Prorsa's what-if see a trace's step as it runs? For colocation and every P:D split, the what-if's
step time on the trace's first step (its true scripts) against its mean over steps sampled before the
run, from the per-quantity distributions alone and from recorded trajectories (of `--prior`, another
trace of the same agents, or of the trace itself). A sampled plan picks right when its best allocation
is the true scripts' best; the ratio is the true step time of the best over that of the pick.

    python scripts/trace_priors_check.py TRACE [--prior OTHER] [--samples 6] [override ...]
    python scripts/trace_priors_check.py --probes OUT [override ...]

`--probes OUT` writes four agent families whose trajectories' turns go together in ways per-quantity
distributions lose, each twice (two independent draws, 128 prompts x 8), and checks each on its first
draw with the priors from the second. Overrides are Hydra's (default: cluster=moe_h200,
workload.batch_size=64, sync).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from hydra.utils import instantiate
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.cluster import cluster_from_config  # noqa: E402
from harness.experiment import run_info  # noqa: E402
from harness.prorsa.forecast import FutureTrajectory, FutureTurn, future_sampler  # noqa: E402
from harness.prorsa.policy import split_name  # noqa: E402
from harness.allocation import COLOCATED, roles_for  # noqa: E402
from harness.prorsa.tracker import LifecycleTracker  # noqa: E402
from harness.prorsa.whatif import WhatIf  # noqa: E402
from harness.rollout import ModeConfig  # noqa: E402
from tests.conftest import load_config  # noqa: E402

log = logging.getLogger("trace_priors_check")
DEFAULTS = ["cluster=moe_h200", "workload.batch_size=64", "mode=sync"]


def true_futures(scripts) -> list[FutureTrajectory]:
    """A step's scripts as the what-if's futures (what the run will do)."""
    out = []
    for s in scripts:
        context, turns = 0, []
        for k, t in enumerate(s.turns):
            prompt = context + t.new_tokens
            turns.append(FutureTurn(prompt, context, t.output_tokens, 0.0 if k == len(s.turns) - 1 else t.tool_latency_s))
            context = prompt + t.output_tokens
        out.append(FutureTrajectory(s.trajectory_id, s.family, 0.0, turns))
    return out


def check(trace: str, prior: str | None, overrides: list[str], samples: int) -> list[str]:
    """The markdown table for one trace."""
    cfg = load_config(["workload=trace", f"workload.path={trace}", f"workload.prior_path={prior or 'null'}",
                       *DEFAULTS, *overrides])
    cluster = cluster_from_config(OmegaConf.to_container(cfg.cluster, resolve=True))
    workload = instantiate(cfg.workload, seed=cfg.seed)
    run = run_info(ModeConfig(**OmegaConf.to_container(cfg.mode, resolve=True)), workload)
    recorded = future_sampler(LifecycleTracker(), run, 1, 0.0, 0.01)   # priors only: nothing observed yet
    samplers = {"distributions": replace(recorded, examples={}), "recorded": recorded}
    families = sorted(run.priors)
    weights = [run.weights.get(f, 0.0) or 1e-9 for f in families]
    step = true_futures(workload.batch(0))
    drawn = {}   # every allocation runs on the same sampled steps (as a plan's candidates do)
    for name, sampler in samplers.items():
        rng = np.random.default_rng(0)
        drawn[name] = [sampler.new(families, weights, len(step), 0, rng, run.group_size) for _ in range(samples)]
    whatif, n = WhatIf(cluster, 5, 4.0), cluster.num_engines
    rows = {}
    for k in [COLOCATED, *range(1, n)]:
        roles = roles_for(k, n)
        rows[k] = {"true scripts": whatif.run([], roles, roles, step, len(step)).completion_s}
        for name, steps in drawn.items():
            rows[k][name] = float(np.mean([whatif.run([], roles, roles, d, len(d)).completion_s for d in steps]))
    cols = ["true scripts", *samplers]
    lines = [f"{trace} (priors from {prior or 'itself'}), step time (s):", "",
             "| allocation | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    lines += [f"| {split_name(k, n)} | " + " | ".join(f"{r[c]:.1f}" for c in cols) + " |" for k, r in rows.items()]
    best = min(rows, key=lambda k: rows[k]["true scripts"])
    for name in samplers:
        pick = min(rows, key=lambda k: rows[k][name])
        lines.append(f"- {name}: picks {split_name(pick, n)}, {rows[best]['true scripts'] / rows[pick]['true scripts']:.3f} "
                     f"of the best ({split_name(best, n)}); largest step-time error "
                     f"{max(abs(r[name] / r['true scripts'] - 1) for r in rows.values()):.0%}")
    return lines


def write_probes(out: Path, seed: int) -> list[str]:
    """Four agent families, 128 prompts x 8 samples each (illustrative shapes, not fitted to anything):
    - planner: a ~2k-token plan, ~100-token actions on ~3k-token tool outputs, a ~1k-token answer;
    - reader: half the trajectories read 15k-token documents in 2-3 turns, half take 10-15 turns with
      ~500-token tool outputs;
    - growing: tool outputs that grow with the turn (~400 tokens x the turn's number);
    - hard_prompts: a quarter of the prompts are hard for all their samples (12-19 turns of
      ~1.2k-token answers), the rest easy (2-4 turns of ~150)."""
    rng = np.random.default_rng(seed)

    def ln(median, sigma, low, high):
        return int(np.clip(median * np.exp(sigma * rng.standard_normal()), low, high))

    def chain(group, family, prompt, outputs, tools, latencies):
        turns, new = [], prompt
        for o, t, latency in zip(outputs, tools, latencies):
            turns.append({"new_tokens": new, "output_tokens": o, "tool_output_tokens": t,
                          "tool_latency_s": round(float(latency), 3)})
            new = t
        turns[-1]["tool_output_tokens"] = 0
        return {"group": group, "family": family, "turns": turns}

    def waits(n, mean=1.0):
        return [rng.exponential(mean) for _ in range(n)]

    def planner(g, prompt):
        n = int(rng.integers(4, 11))
        outputs = [ln(2000, 0.3, 200, 8000)] + [ln(100, 0.5, 10, 1000) for _ in range(n - 2)] + [ln(1000, 0.4, 100, 4000)]
        return chain(g, "planner", prompt, outputs, [ln(3000, 0.5, 100, 12000) for _ in range(n)], waits(n))

    def reader(g, prompt):
        long_docs = rng.random() < 0.5
        n = int(rng.integers(2, 4)) if long_docs else int(rng.integers(10, 16))
        tools = [ln(15000, 0.3, 2000, 30000) if long_docs else ln(500, 0.5, 20, 3000) for _ in range(n)]
        return chain(g, "reader", prompt, [ln(200, 0.5, 10, 2000) for _ in range(n)], tools, waits(n))

    def growing(g, prompt):
        n = int(rng.integers(3, 13))
        return chain(g, "growing", prompt, [ln(250, 0.5, 10, 2000) for _ in range(n)],
                     [ln(400 * (k + 1), 0.3, 20, 20000) for k in range(n)], waits(n))

    def hard_prompts(g, prompt):
        hard = g % 4 == 0
        n = int(rng.integers(12, 20)) if hard else int(rng.integers(2, 5))
        return chain(g, "hard_prompts", prompt, [ln(1200 if hard else 150, 0.4, 10, 6000) for _ in range(n)],
                     [ln(1500, 0.5, 50, 8000) for _ in range(n)], waits(n, 1.5))

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, make in (("planner", planner), ("reader", reader), ("growing", growing), ("hard_prompts", hard_prompts)):
        rows = []
        for g in range(128):
            prompt = ln(1500, 0.3, 200, 6000)
            rows += [make(g, prompt) for _ in range(8)]
        path = out / f"{name}_{seed}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(str(path))
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", nargs="?")
    ap.add_argument("--prior", default=None)
    ap.add_argument("--probes", type=Path, default=None)
    ap.add_argument("--samples", type=int, default=6)
    args, overrides = ap.parse_known_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.probes is not None:
        pairs = zip(write_probes(args.probes, 0), write_probes(args.probes, 1))
    elif args.trace:
        pairs = [(args.trace, args.prior)]
    else:
        ap.error("a TRACE or --probes OUT")
    for trace, prior in pairs:
        log.info("%s\n", "\n".join(check(trace, prior, overrides, args.samples)))


if __name__ == "__main__":
    main()
