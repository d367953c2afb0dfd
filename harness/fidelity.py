"""Fidelity: the simulator's error against real runs of the same workload, seed and policy.

Why: a simulator is only worth its error (issue 7; Vidur, Frontier and LLMServingSim each report theirs).
For each policy this runs the rollout twice, on a real backend and on the simulator with the calibrated
profile (harness/calibrate.py), through the same `run_experiment` so both write the usual result
files, then compares them:

    python -m harness.fidelity --profile results/calibration/vllm_cpu.json \
        --policies colocate,fixed_pd:num_prefill=1,prorsa:control_interval_s=1:min_dwell_s=5 \
        --out results/fidelity/cpu +experiment=vllm_cpu_search backend.python=.venv-engines/bin/python
    python -m harness.fidelity --compare results/fidelity/cpu      # recompute errors + figure from files
    .venv-engines/bin/python -m harness.fidelity --calibrate quick --out DIR +experiment=vllm_cpu_fidelity

With --calibrate it profiles the engines first, alone and contended, and the simulator models the two
servers sharing this host (cluster.contended_profile) and the way of each leg to its engine
(cluster.host_path; docs/calibration.md, section 4). With --repeats N each policy runs N times on the
real backend, and the simulated run is judged against their mean and spread (fidelity_repeats.json).
Both sides run with the calibrated model in the cluster, so a policy that plans plans by the same model
in each.

Errors are signed relative errors (sim - real) / real of: rollout time; per-turn latency p50/p90/p99
(prompt ready to last token, harness.metrics); the per-turn latency of the same (trajectory, turn) in
both runs (median absolute error); and of the role timeline: the fraction of the rollout (on a time axis
normalised by each run's rollout time) in which an engine's role differs, averaged over engines, and the
difference in the number of role switches.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from harness import cli
from harness.rundir import check_writable

log = logging.getLogger("harness.fidelity")

# The default comparison: the fidelity experiments run two servers, so the one split is 1P1D.
POLICIES = ("colocate", "fixed_pd:num_prefill=1", "prorsa")
TIMELINE_POINTS = 1000   # samples of the normalised time axis for the role comparison


@dataclass(frozen=True)
class FidelityErrors:
    policy: str
    rollout_time_real_s: float
    rollout_time_sim_s: float
    rollout_time_err: float
    p50_err: float
    p90_err: float
    p99_err: float
    p50_real_s: float
    p50_sim_s: float
    turn_median_abs_err: float      # median over turns of |sim - real| / real, same (trajectory, turn)
    turn_mean_signed_err: float
    role_mismatch: float            # fraction of normalised rollout time with a different role, engine mean
    switches_real: int
    switches_sim: int
    turns_matched: int
    # Where the error comes from: medians over turns of each phase, and the prefill work done.
    ttft_p50_err: float             # prompt ready -> first token (queue + prefill + KV transfer)
    decode_p50_err: float           # first token -> last token
    ttft_p50_real_s: float
    decode_p50_real_s: float
    prefill_tokens_err: float       # computed prompt tokens (prefix-cache hits differ: block granularity)
    # The first phases apart, medians over turns: queue (prompt ready -> its prefill's step starts) and
    # prefill (that step's start -> the prefill's end; for a real turn the server's time to first token).
    queue_p50_real_s: float = float("nan")
    queue_p50_sim_s: float = float("nan")
    prefill_p50_real_s: float = float("nan")
    prefill_p50_sim_s: float = float("nan")
    # Per leg, the client's time minus the server's, median over the legs, and legs per turn (a
    # disaggregated turn has two); from the real backend's `overhead()`, which summary.json keeps as
    # `harness_overhead`. NaN without it. It holds HTTP, the API server and the harness's loop, which the
    # simulator does not model, and also the wait for the step the engine is running, which it does:
    # vLLM timestamps a request QUEUED when its engine core adds it, between two steps
    # (vllm/v1/core/sched/scheduler.py add_request), and the server's time starts there.
    host_gap_p50_real_s: float = float("nan")
    legs_per_turn_real: float = float("nan")
    repeat: int = 0                 # which real run of the policy (`--repeats`: real, real1, real2, ...)


# The fidelity target against repeated real runs (issue 52): |sim - real mean| / real mean within the
# larger of these and the repeats' own spread, (max - min) / mean.
ROLLOUT_TOLERANCE, P50_TOLERANCE = 0.05, 0.10


@dataclass(frozen=True)
class RepeatSummary:
    """One policy's simulated run against the mean of its repeated real runs."""
    policy: str
    repeats: int
    rollout_real_mean_s: float
    rollout_real_spread: float      # (max - min) / mean over the real runs
    rollout_sim_s: float
    rollout_err: float              # (sim - real mean) / real mean
    p50_real_mean_s: float
    p50_real_spread: float
    p50_sim_s: float
    p50_err: float
    rollout_within: bool            # |rollout_err| <= max(ROLLOUT_TOLERANCE, rollout_real_spread)
    p50_within: bool


def summarize_repeats(errs: list[FidelityErrors]) -> RepeatSummary:
    """`errs`: one policy's comparisons, one per real run (the simulated run is the same in each)."""
    def stats(real: list[float], sim: float) -> tuple[float, float, float]:
        mean = float(np.mean(real))
        return mean, (max(real) - min(real)) / mean, _rel(sim, mean)
    t_mean, t_spread, t_err = stats([e.rollout_time_real_s for e in errs], errs[0].rollout_time_sim_s)
    p_mean, p_spread, p_err = stats([e.p50_real_s for e in errs], errs[0].p50_sim_s)
    return RepeatSummary(errs[0].policy, len(errs), t_mean, t_spread, errs[0].rollout_time_sim_s, t_err,
                         p_mean, p_spread, errs[0].p50_sim_s, p_err,
                         abs(t_err) <= max(ROLLOUT_TOLERANCE, t_spread), abs(p_err) <= max(P50_TOLERANCE, p_spread))


def _rel(sim: float, real: float) -> float:
    return (sim - real) / real if real else float("nan")


def turn_latencies(lifecycle: pd.DataFrame) -> pd.Series:
    """Per-turn latency (prompt ready -> last token), indexed by (trajectory_id, turn)."""
    done = lifecycle.dropna(subset=["t_decode_end"])
    return (done["t_decode_end"] - done["t_ready"]).set_axis(pd.MultiIndex.from_frame(done[["trajectory_id", "turn"]]))


def role_at(engines: pd.DataFrame, engine_id: int, t: np.ndarray) -> np.ndarray:
    """The role of one engine at times t (the role of the interval that holds t; the last one past the end)."""
    e = engines[engines["engine_id"] == engine_id].sort_values("t_start")
    if e.empty:   # an engine the other run does not have
        return np.full(len(t), "absent", dtype=object)
    idx = np.searchsorted(e["t_start"].to_numpy(), t, side="right") - 1
    return e["role"].to_numpy()[np.clip(idx, 0, len(e) - 1)]


def switches(engines: pd.DataFrame) -> int:
    n = 0
    for _, e in engines.sort_values("t_start").groupby("engine_id"):
        roles = e["role"].to_numpy()
        n += int((roles[1:] != roles[:-1]).sum())
    return n


def role_mismatch(real: pd.DataFrame, sim: pd.DataFrame, t_real: float, t_sim: float) -> float:
    u = (np.arange(TIMELINE_POINTS) + 0.5) / TIMELINE_POINTS
    ids = sorted(set(real["engine_id"]) | set(sim["engine_id"]))
    return float(np.mean([np.mean(role_at(real, i, u * t_real) != role_at(sim, i, u * t_sim)) for i in ids]))


def compare(policy: str, real_life: pd.DataFrame, sim_life: pd.DataFrame, real_eng: pd.DataFrame,
            sim_eng: pd.DataFrame, t_real: float, t_sim: float, real_overhead: dict | None = None) -> FidelityErrors:
    """The errors of one policy's simulated run against its real run (module docstring)."""
    lr, ls = turn_latencies(real_life), turn_latencies(sim_life)
    pr, ps = np.percentile(lr, [50, 90, 99]), np.percentile(ls, [50, 90, 99])
    both = lr.index.intersection(ls.index)
    per_turn = (ls[both] - lr[both]) / lr[both]
    return FidelityErrors(
        policy=policy, rollout_time_real_s=t_real, rollout_time_sim_s=t_sim, rollout_time_err=_rel(t_sim, t_real),
        p50_err=_rel(ps[0], pr[0]), p90_err=_rel(ps[1], pr[1]), p99_err=_rel(ps[2], pr[2]),
        p50_real_s=float(pr[0]), p50_sim_s=float(ps[0]),
        turn_median_abs_err=float(np.median(np.abs(per_turn))) if len(both) else float("nan"),
        turn_mean_signed_err=float(np.mean(per_turn)) if len(both) else float("nan"),
        role_mismatch=role_mismatch(real_eng, sim_eng, t_real, t_sim),
        switches_real=switches(real_eng), switches_sim=switches(sim_eng), turns_matched=len(both),
        **phase_errors(real_life, sim_life), **host_gap(real_overhead, len(lr)))


def host_gap(overhead: dict | None, turns: int) -> dict[str, float]:
    if not overhead or not turns:
        return {}
    return {"host_gap_p50_real_s": overhead["http_gap_ms_p50"] / 1000, "legs_per_turn_real": overhead["legs"] / turns}


def phase_errors(real: pd.DataFrame, sim: pd.DataFrame) -> dict[str, float]:
    def med(df: pd.DataFrame, a: str, b: str) -> float:
        if a not in df or b not in df:
            return float("nan")
        d = (df[b] - df[a]).dropna()
        return float(d.median()) if len(d) else float("nan")
    tr, ts = med(real, "t_ready", "t_first_token"), med(sim, "t_ready", "t_first_token")
    dr, ds = med(real, "t_first_token", "t_decode_end"), med(sim, "t_first_token", "t_decode_end")
    pr = float(real["new_tokens"].sum()) if "new_tokens" in real else float("nan")
    ps = float(sim["new_tokens"].sum()) if "new_tokens" in sim else float("nan")
    return {"ttft_p50_err": _rel(ts, tr), "decode_p50_err": _rel(ds, dr), "ttft_p50_real_s": tr,
            "decode_p50_real_s": dr, "prefill_tokens_err": _rel(ps, pr),
            "queue_p50_real_s": med(real, "t_ready", "t_prefill_start"),
            "queue_p50_sim_s": med(sim, "t_ready", "t_prefill_start"),
            "prefill_p50_real_s": med(real, "t_prefill_start", "t_prefill_end"),
            "prefill_p50_sim_s": med(sim, "t_prefill_start", "t_prefill_end")}


def compare_dirs(policy: str, real_dir: Path, sim_dir: Path, repeat: int = 0) -> FidelityErrors:
    real, sim = (json.loads((d / "summary.json").read_text()) for d in (real_dir, sim_dir))
    e = compare(policy, pd.read_parquet(real_dir / "lifecycle.parquet"), pd.read_parquet(sim_dir / "lifecycle.parquet"),
                pd.read_parquet(real_dir / "engines.parquet"), pd.read_parquet(sim_dir / "engines.parquet"),
                real["rollout_time_s"], sim["rollout_time_s"], real.get("harness_overhead"))
    return replace(e, repeat=repeat)


def real_dir(policy_dir: Path, repeat: int) -> Path:
    """Where repeat `repeat` of a policy's real run is: real, real1, real2, ..."""
    return policy_dir / ("real" if repeat == 0 else f"real{repeat}")


def real_repeats(policy_dir: Path) -> int:
    """How many real runs of the policy are complete, counted from the first."""
    n = 0
    while (real_dir(policy_dir, n) / "summary.json").exists():
        n += 1
    return n


def plot(out: Path, policies: list[str], real: Path | None = None) -> Path | None:
    """Simulated against measured per-turn latency, one panel per policy (y = x is a perfect simulator)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from harness.figure_style import save
    except ImportError:
        log.warning("matplotlib missing: no figure (run `python -m harness.fidelity --compare DIR` where it is)")
        return None
    fig, axes = plt.subplots(1, len(policies), figsize=(4.2 * len(policies), 4), squeeze=False)
    for ax, p in zip(axes[0], policies):
        lr = turn_latencies(pd.read_parquet((real or out) / p / "real" / "lifecycle.parquet"))
        ls = turn_latencies(pd.read_parquet(out / p / "sim" / "lifecycle.parquet"))
        both = lr.index.intersection(ls.index)
        ax.scatter(lr[both], ls[both], s=12, alpha=0.7, label="turns")
        qr, qs = np.percentile(lr, [50, 90, 99]), np.percentile(ls, [50, 90, 99])
        ax.scatter(qr, qs, marker="x", s=60, color="red", label="p50/p90/p99")
        lim = [0, 1.05 * max(lr.max(), ls.max())]
        ax.plot(lim, lim, "k--", lw=1)
        ax.set(xlim=lim, ylim=lim, xlabel="measured turn latency (s)", ylabel="simulated turn latency (s)", title=p)
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path = out / "fidelity_turn_latency.png"
    save(fig, path, dpi=120)
    return path


def report(out: Path, policies: list[str], real_from: Path | None = None) -> list[FidelityErrors]:
    real = real_from or out
    errs = [compare_dirs(p, real_dir(real / p, r), out / p / "sim", r) for p in policies
            if (out / p / "sim" / "summary.json").exists() for r in range(real_repeats(real / p))]
    (out / "fidelity.json").write_text(json.dumps([asdict(e) for e in errs], indent=1) + "\n")
    log.info(f"{'policy':10s} {'T_real':>8s} {'T_sim':>8s} {'T err':>7s} {'p50 err':>8s} {'p90 err':>8s} "
          f"{'p99 err':>8s} {'turn |e|':>8s} {'roles':>6s} {'sw r/s':>7s} {'ttft e':>7s} {'dec e':>7s} {'pf tok':>7s} "
          f"{'queue ms r/s':>13s} {'prefill ms r/s':>15s} {'gap ms':>7s} {'legs':>5s}")
    for e in errs:
        log.info(f"{e.policy:10s} {e.rollout_time_real_s:8.2f} {e.rollout_time_sim_s:8.2f} {e.rollout_time_err:+7.1%} "
              f"{e.p50_err:+8.1%} {e.p90_err:+8.1%} {e.p99_err:+8.1%} {e.turn_median_abs_err:8.1%} "
              f"{e.role_mismatch:6.1%} {e.switches_real:3d}/{e.switches_sim:<3d} {e.ttft_p50_err:+7.1%} "
              f"{e.decode_p50_err:+7.1%} {e.prefill_tokens_err:+7.1%} "
              f"{1000 * e.queue_p50_real_s:6.0f}/{1000 * e.queue_p50_sim_s:<6.0f} "
              f"{1000 * e.prefill_p50_real_s:7.0f}/{1000 * e.prefill_p50_sim_s:<7.0f} {1000 * e.host_gap_p50_real_s:7.0f} "
              f"{e.legs_per_turn_real:5.2f}")
    summaries = [summarize_repeats([e for e in errs if e.policy == p]) for p in policies
                 if sum(e.policy == p for e in errs) > 1]
    if summaries:
        (out / "fidelity_repeats.json").write_text(json.dumps([asdict(s) for s in summaries], indent=1) + "\n")
        log.info("against the mean of the real repeats (target: within max(%.0f%%, spread) for rollout time, "
                 "max(%.0f%%, spread) for p50 turn latency)", 100 * ROLLOUT_TOLERANCE, 100 * P50_TOLERANCE)
        for s in summaries:
            log.info(f"{s.policy:10s} repeats {s.repeats}: rollout {s.rollout_real_mean_s:.2f} s real (spread "
                     f"{s.rollout_real_spread:.1%}), {s.rollout_sim_s:.2f} s sim, {s.rollout_err:+.1%} "
                     f"{'ok' if s.rollout_within else 'MISS'}; p50 {s.p50_real_mean_s:.3f} s real (spread "
                     f"{s.p50_real_spread:.1%}), {s.p50_sim_s:.3f} s sim, {s.p50_err:+.1%} "
                     f"{'ok' if s.p50_within else 'MISS'}")
    plot(out, list(dict.fromkeys(e.policy for e in errs)), real)
    return errs


def model_overrides(profile_path: str, contended: str | None = None) -> list[str]:
    """The calibrated model of the engines: the profile and KV-transfer constants, and with `contended`
    the profile measured while the other server works (the engines share this host). The simulator
    times steps by it; a policy that plans (Prorsa's what-if) plans by it on both sides, so a real and a
    simulated run differ by the simulator's error, not by what the policy was told."""
    prof = json.loads(Path(profile_path).read_text())
    over = {**prof.get("cluster_overrides", {}), "cluster.cost_model": "profiled", "cluster.profile": profile_path}
    host = [f"++cluster.contended_profile={contended}"] if contended else []
    return [*(f"{k}={v}" for k, v in over.items()), *host]


def policy_overrides(spec: str) -> tuple[str, list[str]]:
    """`fixed_pd:num_prefill=1:...` -> ("fixed_pd", ["policy=fixed_pd", "policy.num_prefill=1", ...])."""
    name, *kv = spec.split(":")
    return name, [f"policy={name}", *(f"policy.{x}" for x in kv)]


def run(profile: str, policies: list[str], out: Path, overrides: list[str], seed: int = 0,
        real_from: Path | None = None, contended: str | None = None, repeats: int = 1) -> list[FidelityErrors]:
    """Real and simulated run of each policy (a run whose summary.json exists is kept), then `report`.
    `real_from`: take the real runs from another fidelity directory (e.g. to compare a second profile).
    `contended`: a contended profile, for the simulator's model of servers sharing this host.
    `repeats`: real runs per policy (the simulator is deterministic: one run)."""
    from harness.experiment import run_experiment
    from harness.calibrate import compose_config, machine_mismatch
    from harness.perf.profiled import read_profile
    mismatch = machine_mismatch(read_profile(profile, "--profile"))
    if mismatch:
        log.warning("profile %s may not hold on this machine: %s; calibrate here first "
                    "(--calibrate quick or --calibrate full)", profile, mismatch)
    names = []
    for spec in policies:
        p, pol = policy_overrides(spec)
        names.append(p)
        base = [*overrides, *pol, f"seed={seed}"]
        # The simulator's side drops the real backend's own keys (backend.python, ...): backend=sim has none.
        sim_base = [o for o in base if not o.lstrip("+").startswith("backend.")]
        model = model_overrides(profile, contended)
        sides = [(real_dir((real_from or out) / p, r), [*base, *model]) for r in range(repeats)]
        for d, over in [*sides, (out / p / "sim", [*sim_base, "backend=sim", *model])]:
            if (d / "summary.json").exists():
                log.info("%s/%s: done before, kept (%s)", p, d.name, d)
                continue
            cfg = compose_config(over)
            log.info("%s/%s: backend=%s", p, d.name, cfg.backend.name)
            run_experiment(cfg, d, run_name=f"fidelity-{p}-{d.name}")
    return report(out, names, real_from)


EXAMPLES = """examples:
  %(prog)s --profile results/calibration/vllm_cpu.json --out results/fidelity/cpu \\
      +experiment=vllm_cpu_search backend.python=.venv-engines/bin/python
  %(prog)s --compare results/fidelity/cpu          the errors and figure again, from the files
  %(prog)s --calibrate quick --out DIR +experiment=vllm_cpu_fidelity
  %(prog)s --calibrate full --repeats 3 --out DIR +experiment=vllm_cpu_fidelity   against three real runs each

With --calibrate it first profiles the engines on this machine, alone and while the other one works
(harness.calibrate, written to OUT/profile.json and OUT/profile_contended.json), and the simulator
times each step by the one that holds when it starts (cluster.contended_profile); --contended FILE does
the same with a given profile (module docstring: harness/fidelity.py)."""


def main(argv: list[str] | None = None) -> None:
    from harness.calibrate import GRIDS
    p = cli.parser("harness.fidelity", "Runs each policy on the real backend and on the simulator with the "
                   "calibrated profile, then compares them.")
    p.epilog = EXAMPLES
    p.add_argument("--profile", metavar="FILE", help="the calibrated profile (python -m harness.calibrate)")
    p.add_argument("--calibrate", choices=sorted(GRIDS), help="measure the profiles here first, on this grid")
    p.add_argument("--contended", metavar="FILE", help="the profile measured while the other engine works")
    p.add_argument("--policies", default=",".join(POLICIES), metavar="P,P,...",
                   help="policies, each with its keys as NAME:KEY=VALUE:... (default: %(default)s)")
    p.add_argument("--out", default="results/fidelity/run", metavar="DIR", help="default: %(default)s")
    p.add_argument("--seed", type=int, default=0, help="default: %(default)s")
    p.add_argument("--compare", metavar="DIR", help="recompute the errors and figure of DIR's runs (no runs)")
    p.add_argument("--real-from", metavar="DIR", help="the real runs of DIR instead of new ones")
    p.add_argument("--repeats", type=int, default=1,
                   help="real runs per policy, compared with the simulator by their mean and spread (default: %(default)s)")
    cli.run_tool(p, _main, argv)


def _main(args) -> None:
    real_from = Path(args.real_from) if args.real_from else None
    if args.compare:
        check_writable("--compare", args.compare)
        d = Path(args.compare)
        report(d, [p for p in (policy_overrides(s)[0] for s in args.policies.split(",")) if (d / p).exists()],
               real_from)
        return
    from harness.calibrate import GRIDS, calibrate
    if args.calibrate and args.profile:
        raise ValueError(f"--profile={args.profile!r} is invalid with --calibrate: the comparison uses the "
                         "profile measured here; give one of them")
    if not args.profile and not args.calibrate:
        raise ValueError("--profile FILE or --calibrate GRID is required (python -m harness.calibrate "
                         f"writes a profile; --calibrate measures one here first; allowed grids: {', '.join(GRIDS)})")
    if args.seed < 0:
        raise ValueError(f"--seed={args.seed} is invalid; allowed: an integer >= 0")
    if args.repeats < 1:
        raise ValueError(f"--repeats={args.repeats} is invalid; allowed: an integer >= 1")
    if args.calibrate and args.contended:
        raise ValueError(f"--contended={args.contended!r} is invalid with --calibrate: the contended profile is "
                         "measured here too; give one of them")
    if args.contended and not Path(args.contended).is_file():
        raise ValueError(f"--contended={args.contended!r} is invalid; allowed: an existing profile file "
                         "(python -m harness.calibrate --contended writes one)")
    check_writable("--out", args.out)   # before the engines run: their results would be lost
    profile, contended = args.profile, args.contended or None
    if args.calibrate:
        profile = str(Path(args.out) / "profile.json")
        contended = str(Path(args.out) / "profile_contended.json")
        if Path(profile).exists() and Path(contended).exists():
            log.info("%s: measured before, kept", profile)
        else:
            calibrate(args.overrides, profile, GRIDS[args.calibrate], contended=True)
    run(profile, args.policies.split(","), Path(args.out), args.overrides, args.seed, real_from, contended,
        args.repeats)


if __name__ == "__main__":
    main()
