"""Forecast log: what Prorsa predicted for each bin of its horizon, against what happened.

A forecast (made by the what-if run under the present allocation, whatif.py) gives per bin of
`horizon_s / bins` seconds: the prompt tokens that become ready (TURN_READY tokens: what each turn
appends to its context, the last output with the tool's, from every trajectory, whatever turn it is
on; in sync also the next step's first prompts) and the sequences decoding at the bin's middle.
The actual series come from the lifecycle events and the control ticks, so the error per bin (WAPE:
sum |forecast - actual| / sum actual) can be reported for every horizon that has passed.
Memory stays bounded by the horizon: a forecast's actual prefill series is taken once its horizon has
passed (with a margin of one more horizon for events that reach the policy late), and arrivals no pending
forecast can count are dropped.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

COLUMNS = ["t", "bin", "t_mid", "prefill_forecast", "prefill_actual", "decode_forecast", "decode_actual"]


@dataclass
class Forecast:
    t: float
    bin_s: float
    prefill_tokens: np.ndarray
    decode_seqs: np.ndarray

    @property
    def bins(self) -> int:
        return len(self.prefill_tokens)


class ForecastLog:
    """The forecasts made so far and what happened in their horizons."""

    def __init__(self, horizon_s: float, bins: int):
        self.horizon_s = horizon_s
        self.bin_s = horizon_s / bins
        self.bins = bins
        self.history: list[Forecast] = []
        self.actual_decode: list[tuple[float, int]] = []   # (t, sequences decoding)
        self.arrivals: list[tuple[float, int]] = []         # (t, prompt tokens that became ready), since `done`'s end
        self.prefill_actual: list[np.ndarray] = []          # per forecast in history order, once its horizon passed

    def observe_arrival(self, t: float, tokens: int) -> None:
        self.arrivals.append((t, tokens))

    def observe_decoding(self, t: float, sequences: int) -> None:
        self.actual_decode.append((t, sequences))
        self._settle(t - self.horizon_s)

    def _settle(self, before: float) -> None:
        """Takes the actual prefill series of each forecast whose horizon ended before `before`, then drops
        the arrivals no other forecast counts (those at or before the start of the first one still open,
        or `before` when none is)."""
        done = len(self.prefill_actual)
        while done < len(self.history) and self._edges(self.history[done])[-1] < before:
            self.prefill_actual.append(self._prefill_actual(self.history[done]))
            done += 1
        start = self.history[done].t if done < len(self.history) else before
        keep = next((i for i, (t, _) in enumerate(self.arrivals) if t > start), len(self.arrivals))
        del self.arrivals[:keep]

    @staticmethod
    def _edges(fc: Forecast) -> np.ndarray:
        return fc.t + np.arange(fc.bins + 1) * fc.bin_s

    def _prefill_actual(self, fc: Forecast) -> np.ndarray:
        """Prompt tokens that became ready in each bin, arrivals in (edges[b], edges[b+1]]: the forecast at
        t counts prompts not yet ready at t."""
        at = np.array([a[0] for a in self.arrivals])
        cum = np.concatenate(([0.0], np.cumsum([a[1] for a in self.arrivals])))
        return np.diff(cum[np.searchsorted(at, self._edges(fc), side="right")])

    def frame(self) -> pd.DataFrame:
        """Forecast against what happened, one row per forecast and bin, for every forecast whose
        horizon has fully passed."""
        if not self.actual_decode or not self.history:
            return pd.DataFrame(columns=COLUMNS)
        t_end = self.actual_decode[-1][0]
        ts = np.array([a[0] for a in self.actual_decode])
        seqs = np.array([a[1] for a in self.actual_decode], dtype=float)
        parts = []
        for i, fc in enumerate(self.history):
            edges = self._edges(fc)
            if edges[-1] > t_end:
                continue
            mids = (edges[:-1] + edges[1:]) / 2
            actual_p = self.prefill_actual[i] if i < len(self.prefill_actual) else self._prefill_actual(fc)
            parts.append(pd.DataFrame({"t": fc.t, "bin": np.arange(fc.bins), "t_mid": mids,
                                       "prefill_forecast": fc.prefill_tokens, "prefill_actual": actual_p,
                                       "decode_forecast": fc.decode_seqs,
                                       "decode_actual": np.interp(mids, ts, seqs)}))
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COLUMNS)

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
