"""Forecast bookkeeping: what Prorsa predicted for each bin of its horizon, against what happened.

A forecast (made by the what-if run under the present allocation, whatif.py) gives per bin of
`horizon_s / bins` seconds: the prompt tokens that become ready (TURN_READY tokens: what each turn
appends to its context, the last output with the tool's, from every trajectory, whatever turn it is
on; in sync also the next step's first prompts) and the sequences decoding at the bin's middle.
The actual series come from the lifecycle events and the control ticks, so the error per bin (WAPE:
sum |forecast - actual| / sum actual) can be reported for every horizon that has passed.
Memory stays bounded: arrivals are kept as a running total with their times, once each.
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


class Forecaster:
    def __init__(self, horizon_s: float, bins: int):
        self.bin_s = horizon_s / bins
        self.bins = bins
        self.history: list[Forecast] = []
        self.actual_decode: list[tuple[float, int]] = []   # (t, sequences decoding)
        self.arrivals: list[tuple[float, int]] = []         # (t, prompt tokens that became ready)

    def observe_arrival(self, t: float, tokens: int) -> None:
        self.arrivals.append((t, tokens))

    def observe_decoding(self, t: float, sequences: int) -> None:
        self.actual_decode.append((t, sequences))

    def frame(self) -> pd.DataFrame:
        """Forecast against what happened, one row per forecast and bin, for every forecast whose
        horizon has fully passed."""
        if not self.actual_decode or not self.history:
            return pd.DataFrame(columns=COLUMNS)
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
