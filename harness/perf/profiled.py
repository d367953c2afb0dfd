"""A step-time model fitted to measured step times of a real engine (a profile file).

The profile is JSON: {"prefill": [{"new_tokens", "cached_tokens", "seconds"}, ...],
"decode": [{"batch", "context", "seconds"}, ...]}, and optionally "host_path_fit" (what the host adds
to a leg before it reaches the engine, by load; harness/calibrate.py `fit_host_path`). Step time is
fitted as DistServe's simulator does (docs/references.md, section 1): prefill a + b*tokens +
c*attention context, decode d + e*batch + f*summed context, every coefficient non-negative
(harness.stats.nnls); a mixed step adds the prefill and decode terms to the larger intercept.
Memory (KV capacity) still follows from the GPU and the model, as in the roofline model.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from harness.perf.cost_model import prefill_attn_ctx
from harness.perf.catalogue import GPUSpec, ModelSpec
from harness.perf.roofline import Parallelism, PerfConstants, RankBatch, RooflineCostModel
from harness.stats import nnls


# The fields of each measured row (profile["prefill"], profile["decode"]) and their upper bounds: tokens and
# sequences within what an engine holds, seconds within a day, so that the fit's products stay finite.
ROW_FIELDS = {"prefill": {"new_tokens": 1e7, "cached_tokens": 1e7, "seconds": 86400.0},
              "decode": {"batch": 1e7, "context": 1e7, "seconds": 86400.0}}


@dataclass(frozen=True)
class Profile:
    """A profile file, read, checked and fitted once (load_profile): the cost models of every engine and
    Prorsa's planning model use its coefficients without reading the file again."""
    path: str
    fit: Mapping[str, float]
    # Host-path samples by load ("idle", "other server", "own server", "both servers"): seconds a leg
    # waits between the client and the engine beyond what the steps model (empty: not measured).
    host_path: Mapping[str, tuple[float, ...]] = field(default_factory=dict)


def read_profile(path: str, key: str) -> dict:
    """The profile file at `path` (the value of the config key or option `key`) as JSON, its prefill and
    decode rows checked, or a ValueError naming the key, the file and what is wrong with it."""
    def bad(allowed: str) -> ValueError:
        return ValueError(f"{key}={path!r} is invalid; allowed: {allowed}")

    rows = "a profile file with prefill and decode rows (python -m harness.calibrate writes one)"
    try:
        with open(path, "rb") as f:
            profile = json.loads(f.read().decode())
    except OSError as exc:
        raise bad(f"an existing profile file (python -m harness.calibrate writes one): {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise bad(f"{rows}: not UTF-8 (byte {exc.object[exc.start]:#04x} at offset {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise bad(f"{rows}: not JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise bad(f"{rows}: nested too deeply") from None
    if not isinstance(profile, dict):
        raise bad(f"{rows}: it holds a JSON {type(profile).__name__}, not an object")
    for part, names in ROW_FIELDS.items():
        measured = profile.get(part)
        if not isinstance(measured, list) or not measured:
            got = "missing" if part not in profile else f"{measured!r:.40}"
            raise bad(f"{rows}: key {part!r} is {got}, not a non-empty list")
        for i, row in enumerate(measured):
            if not isinstance(row, dict):
                raise bad(f"{rows}: {part}[{i}]={row!r:.40} is not an object with keys {', '.join(names)}")
            for name, high in names.items():
                v = row.get(name)
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= high:
                    what = "missing" if name not in row else f"{v!r:.40}"
                    raise bad(f"{rows}: {part}[{i}].{name} is {what}, not a number >= 0 and <= {high:g}")
    return profile


def load_profile(path: str, key: str) -> Profile:
    """The profile file at `path` read, checked (read_profile) and fitted: the one way a profile is loaded."""
    profile = read_profile(path, key)
    return Profile(path, fit_profile(profile), read_host_path(profile, path, key))


HOST_LOADS = ("idle", "other server", "own server", "both servers")


def read_host_path(profile: dict, path: str, key: str) -> dict[str, tuple[float, ...]]:
    """The profile's `host_path_fit` (load -> samples in seconds), checked; {} where it has none."""
    fit = profile.get("host_path_fit")
    if fit is None:
        return {}
    ok = (isinstance(fit, dict) and set(fit) == set(HOST_LOADS)
          and all(isinstance(v, list) and v and all(isinstance(x, (int, float)) and 0 <= x < 3600 for x in v)
                  for v in fit.values()))
    if not ok:
        raise ValueError(f"{key}={path!r} is invalid; allowed: a profile whose host_path_fit maps each of "
                         f"{', '.join(HOST_LOADS)} to a non-empty list of seconds in [0, 3600) "
                         "(python -m harness.calibrate writes it)")
    return {k: tuple(float(x) for x in v) for k, v in fit.items()}


def fit_profile(profile: dict) -> dict[str, float]:
    pf = profile["prefill"]
    x = np.array([[1.0, r["new_tokens"], prefill_attn_ctx(r["new_tokens"], r["cached_tokens"])]
                  for r in pf])
    a, b, c = nnls(x, np.array([r["seconds"] for r in pf]))
    dc = profile["decode"]
    x = np.array([[1.0, r["batch"], r["batch"] * r["context"]] for r in dc])
    d, e, f = nnls(x, np.array([r["seconds"] for r in dc]))
    return {"prefill_base_s": a, "prefill_s_per_token": b, "prefill_s_per_attn_ctx": c,
            "decode_base_s": d, "decode_s_per_seq": e, "decode_s_per_ctx": f}


class ProfiledCostModel(RooflineCostModel):
    def __init__(self, coefficients: Mapping[str, float], model: ModelSpec, gpu: GPUSpec, perf: PerfConstants,
                 par: Parallelism):
        super().__init__(model, gpu, perf, par)
        self.k = coefficients

    def rank_time(self, b: RankBatch) -> float:
        k = self.k
        base = max(k["prefill_base_s"], k["decode_base_s"]) if b.prefill_tokens else k["decode_base_s"]
        return (base + k["prefill_s_per_token"] * b.prefill_tokens + k["prefill_s_per_attn_ctx"] * b.prefill_attn_ctx
                + k["decode_s_per_seq"] * b.decode_seqs + k["decode_s_per_ctx"] * b.decode_ctx)

    def step_time(self, ranks: list[RankBatch], graph: bool = True) -> float:
        """The profile measured the engine as it ran (graph or not): `graph` does not apply."""
        return max(self.rank_time(r) for r in ranks)

    def decode_step_times(self, seqs: np.ndarray, ctx: np.ndarray, steps: int, graph: bool = True) -> np.ndarray:
        k = self.k
        j = np.arange(steps, dtype=np.float64)[:, None]
        c = ctx[None, :].astype(np.float64) + j * seqs[None, :]
        t = k["decode_base_s"] + k["decode_s_per_seq"] * seqs[None, :] + k["decode_s_per_ctx"] * c
        return t.max(axis=1)

    def mixed_step_time(self, seqs: list[int], ctx: list[int], prefill: list[tuple], graph: bool = True) -> float:
        batches = [RankBatch(n, c, 0, 0.0, 0, n) for n, c in zip(seqs, ctx)]
        for r, tokens, attn_ctx, kv_read, requests in prefill:
            b = batches[r]
            b.prefill_tokens, b.prefill_attn_ctx, b.prefill_kv_read, b.requests = tokens, attn_ctx, kv_read, requests
        return self.step_time(batches, graph)

    def decode_step_time(self, seqs: list[int], ctx: list[int], graph: bool = True) -> float:
        """`decode_step_times(seqs, ctx, 1)[0]` for lists of ints, without numpy (the same bits)."""
        k = self.k
        return max(k["decode_base_s"] + k["decode_s_per_seq"] * float(n) + k["decode_s_per_ctx"] * float(c)
                   for n, c in zip(seqs, ctx))

    def decode_span_ends(self, seqs: list[int], ctx: list[int], steps: int, graph: bool, start: float) -> list[float]:
        times = self.decode_step_times(np.array(seqs), np.array(ctx), steps, graph)
        return np.cumsum(np.concatenate(([start], times)))[1:].tolist()
