"""Short-horizon forecast of prefill and decode demand from the trajectories' lifecycles.

For a horizon split into `bins` of `bin_s` seconds, the forecaster gives, per bin:
  - prefill_tokens: expected tokens whose prompts become ready in the bin: trajectories in a tool
    call return with probability P(L in bin | L > elapsed) (L: tool latency), bringing their last
    output plus the expected tool output; trajectories decoding now return after their expected
    remaining decode and a tool call, if their turn count says they continue; in async mode new
    trajectories start at the recent start rate with the mean first prompt;
  - decode_tokens: expected output tokens still to generate, by the bin the sequence starts (or,
    decoding now, bin 0): E[O - g | O > g] for sequences decoding now, E[O] for the others;
  - decode_seqs / decode_kv_tokens: expected sequences decoding at the bin's midpoint and their KV:
    sequences decoding now survive with P(O > g + t/tpot | O > g) (O: output length, g: tokens
    generated so far, estimated from elapsed time and the observed time per output token), sequences
    queued for prefill start now, and returning trajectories start when they return.
Distributions are learned online per workload family from the lifecycle events (the empirical
samples); until `min_observations` exist, the workload's lognormal prior for that family
(RunInfo.priors) stands in, as evenly spaced quantiles.
Every forecast is kept, so its error against what happened can be reported per bin.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import pandas as pd

from harness.api import FamilyPriors, LogNormalPrior
from harness.prorsa.tracker import LifecycleTracker, Phase

PRIOR_POINTS = 199
_Z = np.array([NormalDist().inv_cdf((i + 1) / (PRIOR_POINTS + 1)) for i in range(PRIOR_POINTS)])


def prior_samples(prior: LogNormalPrior) -> np.ndarray:
    """The prior as PRIOR_POINTS evenly spaced quantiles: a deterministic stand-in sample."""
    return prior.median * np.exp(prior.sigma * _Z)


class Distribution:
    """A sorted sample: survival function, bin probabilities, mean excess."""

    def __init__(self, values: np.ndarray):
        self.v = np.sort(np.asarray(values, dtype=float))
        self.n = len(self.v)
        self._suffix = np.concatenate((np.cumsum(self.v[::-1])[::-1], [0.0]))

    def surv(self, x) -> np.ndarray:
        """P(X > x)."""
        return 1.0 - np.searchsorted(self.v, x, side="right") / self.n

    def cdf(self, x) -> np.ndarray:
        return 1.0 - self.surv(x)

    def mean(self) -> float:
        return float(self.v.mean())

    def mean_excess(self, g) -> np.ndarray:
        """E[X - g | X > g]; where no sample exceeds g, one more unit (the event is imminent)."""
        i = np.searchsorted(self.v, g, side="right")
        count = self.n - i
        with np.errstate(invalid="ignore", divide="ignore"):
            excess = self._suffix[i] / count - g
        return np.where(count > 0, excess, 1.0)


@dataclass
class Forecast:
    t: float
    bin_s: float
    prefill_tokens: np.ndarray
    decode_seqs: np.ndarray
    decode_kv_tokens: np.ndarray
    decode_tokens: np.ndarray          # output tokens still to generate, by the bin their decode starts

    @property
    def bins(self) -> int:
        return len(self.prefill_tokens)


class FamilyModel:
    """The learned (or prior) distributions of one workload family."""

    def __init__(self, tracker: LifecycleTracker, family: str, priors: FamilyPriors, min_obs: int):
        def pick(observed, prior):
            return Distribution(observed if len(observed) >= min_obs else prior_samples(prior))
        self.latency = pick(tracker.tool_latencies.get(family, []), priors.tool_latency_s)
        self.output = pick(tracker.outputs.get(family, []), priors.output_tokens)
        self.tool_output_mean = pick(tracker.tool_outputs.get(family, []), priors.tool_output_tokens).mean()
        self.turns = pick(tracker.finished_turns.get(family, []), priors.turns)
        self.first_prompt_mean = pick(tracker.first_prompts.get(family, []), priors.prompt_tokens).mean()

    def continues(self, turn: np.ndarray) -> np.ndarray:
        """P(another turn | this is turn `turn`, 0-based): P(T > turn+1 | T > turn)."""
        alive = self.turns.surv(turn)
        with np.errstate(invalid="ignore", divide="ignore"):
            p = self.turns.surv(turn + 1) / alive
        return np.where(alive > 0, p, 0.0)


class Forecaster:
    def __init__(self, horizon_s: float, bins: int, priors: dict[str, FamilyPriors], min_observations: int,
                 mode: str, default_tpot_s: float):
        self.bin_s = horizon_s / bins
        self.bins = bins
        self.priors = priors
        self.min_obs = min_observations
        self.mode = mode
        self.default_tpot_s = default_tpot_s
        self.history: list[Forecast] = []
        self.actual_decode: list[tuple[float, int, int]] = []   # (t, decoding sequences, their KV)
        self.arrivals: list[tuple[float, int]] = []               # (t, prompt tokens that became ready)

    def observe_arrival(self, t: float, tokens: int) -> None:
        self.arrivals.append((t, tokens))

    def tpot(self, tracker: LifecycleTracker) -> float:
        seen = list(tracker.tpot.values())
        return float(np.median(seen)) if seen else self.default_tpot_s

    def forecast(self, now: float, tracker: LifecycleTracker) -> Forecast:
        B, w = self.bins, self.bin_s
        edges = np.arange(B + 1) * w
        mids = (edges[:-1] + edges[1:]) / 2
        pf, dseq, dkv, dtok = np.zeros(B), np.zeros(B), np.zeros(B), np.zeros(B)
        tpot = self.tpot(tracker)
        by_family: dict[str, list] = {}
        decoding_now = kv_now = 0
        for s in tracker.live.values():
            by_family.setdefault(s.family, []).append(s)
            if s.phase == Phase.DECODING:
                decoding_now += 1
                kv_now += s.context + int((now - s.phase_since) / tpot)
        self.actual_decode.append((now, decoding_now, kv_now))
        for family, states in by_family.items():
            if family not in self.priors:
                raise ValueError(f"trajectory family {family!r} has no prior; the workload's priors() cover "
                                 f"{sorted(self.priors)}")
            m = FamilyModel(tracker, family, self.priors[family], self.min_obs)
            # decoding at mids[b] of a sequence that starts decoding at mids[j] (j <= b)
            gap = (mids[None, :] - mids[:, None]) / tpot
            after = np.where(gap >= 0, m.output.surv(np.maximum(gap, 0)), 0.0)
            out_mean = m.output.mean()
            tool = [s for s in states if s.phase == Phase.TOOL]
            if tool:
                elapsed = np.array([now - s.phase_since for s in tool])
                alive = np.maximum(m.latency.surv(elapsed), 1e-12)
                cdf = m.latency.cdf(elapsed[:, None] + edges[None, :])
                p = np.diff(cdf, axis=1) / alive[:, None]
                p[m.latency.surv(elapsed) <= 0, 0] = 1.0   # overdue: returns now
                tokens = np.array([s.outputs[-1] for s in tool]) + m.tool_output_mean
                context = np.array([s.context + s.outputs[-1] for s in tool]) + m.tool_output_mean
                pf += p.T @ tokens
                dtok += p.sum(axis=0) * out_mean
                starts = p @ after
                dseq += starts.sum(axis=0)
                dkv += (starts * (context[:, None] + out_mean / 2)).sum(axis=0)
            running = [s for s in states if s.phase != Phase.TOOL]
            if running:
                decoding = np.array([s.phase == Phase.DECODING for s in running])
                g = np.where(decoding, [(now - s.phase_since) / tpot for s in running], 0.0)
                context = np.array([s.context for s in running], dtype=float)
                alive = m.output.surv(g)
                surv = m.output.surv(g[:, None] + mids[None, :] / tpot)
                with np.errstate(invalid="ignore", divide="ignore"):
                    share = np.where(alive[:, None] > 0, surv / alive[:, None], 0.0)
                share[alive <= 0, 0] = 1.0  # past every observed length: ends within the first bin
                dseq += share.sum(axis=0)
                dkv += (share * (context[:, None] + g[:, None] + mids[None, :] / tpot)).sum(axis=0)
                # their next turn: after the expected remaining decode and a tool call
                remaining = m.output.mean_excess(g)
                dtok[0] += float(remaining.sum())
                cont = m.continues(np.array([s.turn for s in running]))
                lag = remaining * tpot
                cdf = m.latency.cdf(np.maximum(edges[None, :] - lag[:, None], -1.0))
                cdf[:, 0] = 0.0
                p = np.diff(cdf, axis=1) * cont[:, None]
                pf += p.T @ (g + remaining + m.tool_output_mean)
                dtok += p.sum(axis=0) * out_mean
            if self.mode == "async":
                recent = [t for t in tracker.starts if t > now - B * w]
                rate = len(recent) / (B * w) * len(states) / max(len(tracker.live), 1)
                pf += rate * w * m.first_prompt_mean
                dtok += rate * w * out_mean
        fc = Forecast(now, w, pf, dseq, dkv, dtok)
        self.history.append(fc)
        return fc

    def frame(self) -> pd.DataFrame:
        """Forecast against what happened, one row per forecast and bin, for every forecast whose
        horizon has fully passed: prefill tokens arriving in the bin, sequences decoding at its middle."""
        cols = ["t", "bin", "t_mid", "prefill_forecast", "prefill_actual", "decode_forecast", "decode_actual"]
        if not self.actual_decode or not self.history:
            return pd.DataFrame(columns=cols)
        t_end = self.actual_decode[-1][0]
        ts = np.array([a[0] for a in self.actual_decode])
        seqs = np.array([a[1] for a in self.actual_decode], dtype=float)
        at = np.array([a[0] for a in self.arrivals])
        cum = np.concatenate(([0.0], np.cumsum([a[1] for a in self.arrivals])))
        parts = []
        for fc in self.history:
            edges = fc.t + np.arange(fc.bins + 1) * fc.bin_s
            if edges[-1] > t_end:
                continue
            mids = (edges[:-1] + edges[1:]) / 2
            # arrivals in (edges[b], edges[b+1]]: the forecast at t counts prompts not yet ready at t
            actual_p = np.diff(cum[np.searchsorted(at, edges, side="right")])
            parts.append(pd.DataFrame({"t": fc.t, "bin": np.arange(fc.bins), "t_mid": mids,
                                       "prefill_forecast": fc.prefill_tokens, "prefill_actual": actual_p,
                                       "decode_forecast": fc.decode_seqs,
                                       "decode_actual": np.interp(mids, ts, seqs)}))
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)

    def errors(self) -> dict[str, list[float]]:
        """Weighted absolute percentage error per bin: sum |forecast - actual| / sum actual."""
        df = self.frame()
        out = {}
        for what in ("prefill", "decode"):
            wape = []
            for b in range(self.bins):
                rows = df[df["bin"] == b]
                total = float(rows[f"{what}_actual"].sum())
                err = float((rows[f"{what}_forecast"] - rows[f"{what}_actual"]).abs().sum())
                wape.append(round(err / total, 4) if total > 0 else float("nan"))
            out[f"forecast_wape_{what}"] = wape
        return out
