"""oracle_pd: Prorsa's allocator fed the true future demand. AN ORACLE: it reads the workload's scripts
(every turn's output length, tool latency and tool output), which no real system can. It bounds how
much better forecasting could make Prorsa; it is not a policy one could deploy.

What stays estimated: queueing (when a queued prefill will start) and the decode speed (the observed
time per output token), since those depend on the allocation being chosen.
"""
from __future__ import annotations

import numpy as np

from harness.api import Role, RunInfo
from harness.cluster import ClusterConfig
from harness.prorsa.forecaster import Forecast, Forecaster
from harness.prorsa.policy import Prorsa
from harness.prorsa.tracker import LifecycleTracker, Phase
from harness.trajectory import TrajectoryScript


class OracleForecaster(Forecaster):
    def __init__(self, scripts: dict[int, TrajectoryScript], **kw):
        super().__init__(**kw)
        self.scripts = scripts

    def forecast(self, now: float, tracker: LifecycleTracker) -> Forecast:
        B, w = self.bins, self.bin_s
        mids = (np.arange(B) + 0.5) * w
        pf, dseq, dkv, dtok = np.zeros(B), np.zeros(B), np.zeros(B), np.zeros(B)
        tpot = self.tpot(tracker)
        decoding_now = kv_now = 0

        def decode(start, tokens, context):
            b = int(start // w)
            if 0 <= b < B:
                dtok[b] += tokens
            on = (mids >= start) & (mids < start + tokens * tpot)
            dseq[on] += 1
            dkv[on] += context + (mids[on] - start) / tpot

        def arrive(at, tokens):
            b = int(at // w)
            if 0 <= b < B:
                pf[b] += tokens

        for s in tracker.live.values():
            script = self.scripts[s.trajectory_id]
            k = s.turn
            turn = script.turns[k]
            last = k + 1 == len(script.turns)
            nxt = 0 if last else script.turns[k + 1].new_tokens
            if s.phase == Phase.TOOL:
                back = s.phase_since + turn.tool_latency_s - now
                arrive(max(back, 0.0), turn.output_tokens + nxt)
                if not last:
                    decode(max(back, 0.0), script.turns[k + 1].output_tokens, s.context + turn.output_tokens + nxt)
                continue
            g = (now - s.phase_since) / tpot if s.phase == Phase.DECODING else 0.0
            if s.phase == Phase.DECODING:
                decoding_now += 1
                kv_now += s.context + int(g)
            left = max(turn.output_tokens - g, 1.0) * tpot
            decode(0.0, left / tpot, s.context + g)
            if not last:
                arrive(left + turn.tool_latency_s, turn.output_tokens + nxt)
        self.actual_decode.append((now, decoding_now, kv_now))
        fc = Forecast(now, w, pf, dseq, dkv, dtok)
        self.history.append(fc)
        return fc


class OraclePD(Prorsa):
    """Prorsa with the OracleForecaster; the driver reveals each script when its trajectory starts."""

    oracle = True

    def __init__(self, **kw):
        kw.setdefault("name", "oracle_pd")
        super().__init__(**kw)
        self.scripts: dict[int, TrajectoryScript] = {}

    def reveal(self, script: TrajectoryScript) -> None:
        self.scripts[script.trajectory_id] = script

    def initial_roles(self, cluster: ClusterConfig, run: RunInfo) -> list[Role]:
        roles = super().initial_roles(cluster, run)
        f = self.forecaster
        self.forecaster = OracleForecaster(self.scripts, horizon_s=self.horizon_s, bins=self.bins, priors=run.priors,
                                           min_observations=self.min_obs, mode=run.mode,
                                           default_tpot_s=f.default_tpot_s)
        return roles
