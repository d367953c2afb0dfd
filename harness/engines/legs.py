"""The per-leg log of a real-engine run (legs.parquet) and the harness's overhead read from it: for each
HTTP request, the client's times, the tokens, the server's own metrics, and how long the harness took
to send it and to handle its answer (docs/engines.md)."""
from __future__ import annotations

import math

import numpy as np


class LegLog:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def record(self, trajectory_id: int, turn: int, attempt: int, leg) -> None:
        """One leg that ended (engines/base.py Leg), of attempt `attempt` at the turn."""
        s = leg.server
        server_ms = None
        if s.get("time_to_first_token_ms") is not None:
            server_ms = (s.get("queue_time_ms") or 0) + s["time_to_first_token_ms"] + (s.get("generation_time_ms") or 0)
        client_ms = 1000 * (leg.t_done - leg.t_submit)
        self.rows.append({
            "trajectory_id": trajectory_id, "turn": turn, "attempt": attempt,
            "kind": leg.kind, "engine_id": leg.engine_id, "status": leg.status,
            "prompt_tokens": leg.prompt_tokens, "output_tokens": leg.generated, "cached_tokens": leg.cached_tokens,
            "t_ready": leg.t_ready, "t_submit": leg.t_submit, "t_first": leg.t_first, "t_done": leg.t_done,
            "client_ms": client_ms, "server_ms": server_ms,
            "http_gap_ms": None if server_ms is None else client_ms - server_ms,
            "dispatch_ms": 1000 * (leg.t_submit - leg.t_ready), "handler_ms": 1000 * leg.handler_s,
            **{f"server_{k}": v for k, v in s.items() if isinstance(v, (int, float)) or v is None},
        })

    def frame(self):
        """One row per leg (legs.parquet), a pandas DataFrame."""
        import pandas as pd
        return pd.DataFrame(self.rows)

    def overhead(self, run_cpu_s: float, run_wall_s: float) -> dict:
        """The harness's own time per leg against the server's time, over the legs that succeeded."""
        legs = [g for g in self.rows if g["status"] == "ok"]
        if not legs:
            return {}

        def med(key):
            vals = [g[key] for g in legs if g.get(key) is not None and not math.isnan(g[key])]
            return float(np.median(vals)) if vals else math.nan
        return {"legs": len(legs), "dispatch_ms_p50": med("dispatch_ms"), "handler_ms_p50": med("handler_ms"),
                "client_ms_p50": med("client_ms"), "server_ms_p50": med("server_ms"),
                "http_gap_ms_p50": med("http_gap_ms"),
                "harness_cpu_s": run_cpu_s, "run_wall_s": run_wall_s,
                "harness_cpu_ms_per_leg": 1000 * run_cpu_s / len(legs)}
