"""Roofline step-time model (after Vidur, BLIS and DistServe's simulator).

One engine iteration is one forward pass over a batch that may mix prefill chunks and decode
tokens. Per data-parallel attention rank:
    t_rank = max(compute, memory) + TP all-reduces
    compute = 2*P_dense*tokens/(tp*peak*gemm_mfu) + 4*L*H*d*ctx_tokens/(tp*peak*attn_mfu)
    memory  = (dense weights/tp + KV bytes read/tp_kv) / (hbm_bw*mem_efficiency)
and for the whole engine (all ranks step together, "DP attention"):
    T_step = max_r t_rank + T_moe(all tokens) + T_all2all + fixed overheads
so one rank's prefill slows every rank's decode. Decode-only steps run as CUDA graphs and skip the
per-layer launch overhead; a step with any prefill pays it (the "no-CUDA-graph penalty"). MLA models
prefill un-absorbed (d from catalogue.py prefill_attn_head_dim); EP across nodes prices a step that
prefills as DeepEP's node-forwarding kernels, a decode-only step as its low-latency ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mypy_extensions import mypyc_attr

from harness.perf.catalogue import BYTES_PER_PARAM, GPUSpec, ModelSpec

# GPUs on one NVLink domain: 8 in the HGX/DGX H100, H200 and H800 nodes of every cluster here (DGX H100
# datasheet: 8 GPUs, NVLink 4 switches). Expert parallelism over more GPUs crosses the RDMA NICs.
GPUS_PER_NODE = 8


@mypyc_attr(native_class=False)
@dataclass(frozen=True)
class Parallelism:
    """tp: tensor parallel size inside one attention rank; dp: attention data-parallel ranks;
    ep: experts spread over all tp*dp GPUs (MoE only)."""

    tp: int = 1
    dp: int = 1
    ep: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.dp


@mypyc_attr(native_class=False)
@dataclass(frozen=True)
class PerfConstants:
    gemm_mfu: float
    attn_mfu: float
    mem_efficiency: float
    overhead_per_layer_s: float
    overhead_per_step_s: float
    overhead_per_request_s: float
    collective_latency_s: float
    nic_efficiency: float


@mypyc_attr(serializable=True, allow_interpreted_subclasses=True)
@dataclass(slots=True)
class RankBatch:
    """The work one attention rank does in one step."""

    decode_seqs: int = 0
    decode_ctx: int = 0            # sum of the decoding sequences' context lengths
    prefill_tokens: int = 0
    prefill_attn_ctx: float = 0.0  # sum over chunks of c * (prefix + (c-1)/2)
    prefill_kv_read: int = 0       # sum over chunks of prefix + c (KV read once per chunk)
    requests: int = 0

    @property
    def tokens(self) -> int:
        return self.decode_seqs + self.prefill_tokens


@mypyc_attr(serializable=True, allow_interpreted_subclasses=True)
class RooflineCostModel:
    def __init__(self, model: ModelSpec, gpu: GPUSpec, perf: PerfConstants, par: Parallelism):
        self.model, self.gpu, self.perf, self.par = model, gpu, perf, par
        tp = par.tp
        peak = gpu.peak_flops
        # FP8 weights (model.weight_dtype, catalogue.WEIGHT_BYTES): GEMMs at the FP8 peak and 1 byte per
        # weight, but the LM head, attention's core and the KV cache stay BF16. BF16: the formulas as they were.
        self._fp8 = model.weight_dtype == "fp8"
        self._gemm_peak = gpu.fp8_peak_flops if self._fp8 else peak
        self._mem_s_per_byte = 1.0 / (gpu.hbm_bw * perf.mem_efficiency)
        if self._fp8:
            head = model.head_params
            self._gemm_s_per_token = (2 * (model.dense_gemm_params - head) / (tp * self._gemm_peak * perf.gemm_mfu)
                                      + 2 * head / (tp * peak * perf.gemm_mfu))
            self._weight_bytes_rank = ((model.dense_gemm_params - head) * model.weight_bytes
                                       + head * BYTES_PER_PARAM) / tp
        else:
            self._gemm_s_per_token = 2 * model.dense_gemm_params / (tp * peak * perf.gemm_mfu)
            self._weight_bytes_rank = model.dense_gemm_params * BYTES_PER_PARAM / tp
        head_dim = model.attn_head_dim or model.head_dim
        self._attn_s_per_ctx = 4 * model.layers * model.heads * head_dim / (tp * peak * perf.attn_mfu)
        # Prefill attention per context token is the decode one times this (1.0 but for MLA, which prefills
        # un-absorbed: catalogue.py prefill_attn_head_dim), plus MLA's K/V up-projection of each chunk's
        # cached prefix, a GEMM (0 for other models).
        self._prefill_attn_ratio = model.prefill_attn_head_dim / head_dim
        self._prefix_s_per_token = 2 * model.mla_up_proj_params / (tp * self._gemm_peak * perf.gemm_mfu)
        # KV heads are split over TP ranks up to kv_heads, then replicated (MLA: always replicated).
        self.kv_bytes_per_token_gpu = model.kv_bytes_per_token / min(tp, model.kv_heads)
        if tp > 1:  # two all-reduces per layer of tokens*hidden*2 bytes
            self._tp_fixed = 2 * model.layers * perf.collective_latency_s
            self._tp_s_per_token = (2 * model.layers * 2 * (tp - 1) / tp * model.hidden
                                    * BYTES_PER_PARAM / gpu.scaleup_bw)
        else:
            self._tp_fixed = self._tp_s_per_token = 0.0
        self._moe_gpus = par.gpus if par.ep else tp
        # Memory minus compute time changes with context at kv * ms - attn per token: where a span's
        # steps are closest to compute-bound (0: its first step, 1: its last).
        grow, attn = self.kv_bytes_per_token_gpu * self._mem_s_per_byte, self._attn_s_per_ctx
        self._binding = (0,) if grow > attn * (1 + 1e-6) else (1,) if attn > grow * (1 + 1e-6) else (0, 1)
        self._moe_memo: dict[tuple[int, bool], float] = {}
        self._decode_memo: dict[tuple[int, bool], float] = {}

    # --- memory -------------------------------------------------------------------------------
    def weight_bytes_per_gpu(self) -> float:
        if self._fp8:   # the embedding and the LM head in BF16, every other weight in FP8
            m, head = self.model, self.model.head_params
            expert = m.expert_params * m.weight_bytes / self._moe_gpus
            return ((m.dense_params - 2 * head) * m.weight_bytes + 2 * head * BYTES_PER_PARAM) / self.par.tp + expert
        expert = self.model.expert_params * BYTES_PER_PARAM / self._moe_gpus
        return self.model.dense_params * BYTES_PER_PARAM / self.par.tp + expert

    def kv_capacity_tokens(self, memory_fraction: float, activation_reserve_bytes: float) -> int:
        """Tokens of KV one attention rank can hold."""
        free = self.gpu.hbm_bytes * memory_fraction - self.weight_bytes_per_gpu() - activation_reserve_bytes
        return int(free // self.kv_bytes_per_token_gpu) if free > 0 else 0

    # --- time ---------------------------------------------------------------------------------
    def gemm_time(self, params: float, tokens: int, tp: int = 1) -> float:
        """One GEMM over `tokens` rows of a `params`-parameter weight (used by the golden test)."""
        flops = 2 * params * tokens / (tp * self._gemm_peak * self.perf.gemm_mfu)
        bytes_ = (params * self.model.weight_bytes / tp + 2 * tokens * self.model.hidden * BYTES_PER_PARAM)
        return max(flops, bytes_ * self._mem_s_per_byte)

    def rank_time(self, b: RankBatch) -> float:
        tokens = b.tokens
        compute = (self._gemm_s_per_token * tokens
                   + self._attn_s_per_ctx * (b.decode_ctx + self._prefill_attn_ratio * b.prefill_attn_ctx)
                   + self._prefix_s_per_token * (b.prefill_kv_read - b.prefill_tokens))
        memory = (self._weight_bytes_rank
                  + self.kv_bytes_per_token_gpu * (b.decode_ctx + b.prefill_kv_read)) * self._mem_s_per_byte
        comm = self._tp_fixed + self._tp_s_per_token * tokens if tokens else 0.0
        return max(compute, memory) + comm

    def moe_time(self, tokens: int, prefill: bool = False) -> float:
        """The MoE layers of a step of `tokens` tokens over all ranks; `prefill`: some rank prefills."""
        key = (tokens, prefill)
        t = self._moe_memo.get(key)
        if t is None:
            t = self._moe_memo[key] = self._moe_time(tokens, prefill)
        return t

    def _moe_time(self, tokens: int, prefill: bool) -> float:
        moe = self.model.moe
        if moe is None or tokens == 0:
            return 0.0
        n = self._moe_gpus
        flops = 2 * self.model.active_expert_params * tokens / (n * self._gemm_peak * self.perf.gemm_mfu)
        touched = moe.experts * (1 - ((moe.experts - moe.top_k) / moe.experts) ** tokens)
        bytes_ = touched / moe.experts * self.model.expert_params * self.model.weight_bytes / n
        t = max(flops, bytes_ * self._mem_s_per_byte)
        if self.par.ep and n > GPUS_PER_NODE and prefill:   # across nodes, DeepEP's normal kernels
            t += moe.layers * (2 * self.perf.collective_latency_s + self._forwarded_all_to_all(tokens / n))
        elif self.par.ep and n > 1:  # dispatch + combine per MoE layer, every expert copy on the link
            link = self.gpu.scaleup_bw if n <= GPUS_PER_NODE else self.gpu.nic_bw * self.perf.nic_efficiency
            if self._fp8:   # FP8 dispatch, BF16 combine (DeepSeek-V3 report, arXiv 2412.19437, section 3.3.3)
                per_gpu = tokens / n * moe.top_k * self.model.hidden * (n - 1) / n
                t += moe.layers * (2 * self.perf.collective_latency_s
                                   + per_gpu * (self.model.weight_bytes + BYTES_PER_PARAM) / link)
            else:
                per_gpu = tokens / n * moe.top_k * self.model.hidden * BYTES_PER_PARAM * (n - 1) / n
                t += 2 * moe.layers * (self.perf.collective_latency_s + per_gpu / link)
        return t

    def _forwarded_all_to_all(self, tokens_per_gpu: float) -> float:
        """One MoE layer's dispatch + combine across nodes in a step that prefills. SGLang's DeepEP `auto`
        mode runs the normal kernels when any rank prefills, the low-latency ones otherwise (sglang
        python/sglang/srt/layers/moe/utils.py DeepEPMode.resolve). Normal kernels send a token over RDMA once
        to each other node holding one of its experts, to the GPU of the same local index, which forwards it
        over NVLink to the GPUs holding them (DeepEP docs/legacy.md, "asymmetric-domain bandwidth
        forwarding"; DeepSeek-V3 report, arXiv 2412.19437, section 3.2.2); the low-latency kernels send
        every expert copy over RDMA ("pure RDMA"), priced in _moe_time. Experts sit evenly on the nodes and
        a token's top_k are distinct experts drawn uniformly (no EPLB imbalance, no node-limited routing).
        The RDMA and NVLink legs run at once (forwarding is pipelined): the slower one counts."""
        moe = self.model.moe
        assert moe is not None
        nodes = self._moe_gpus / GPUS_PER_NODE
        per_node = moe.experts / nodes
        miss = 1.0   # P(another node holds none of a token's top_k experts): hypergeometric, C(E - E/N, k) / C(E, k)
        for i in range(moe.top_k):
            miss *= (moe.experts - per_node - i) / (moe.experts - i)
        remote_nodes = (nodes - 1) * (1 - miss)
        dispatch = self.model.weight_bytes if self._fp8 else BYTES_PER_PARAM   # FP8 dispatch, BF16 combine (as below)
        copy = self.model.hidden * (dispatch + BYTES_PER_PARAM)
        rdma = tokens_per_gpu * remote_nodes * copy / (self.gpu.nic_bw * self.perf.nic_efficiency)
        nvlink = tokens_per_gpu * moe.top_k * copy * (GPUS_PER_NODE - 1) / GPUS_PER_NODE / self.gpu.scaleup_bw
        return max(rdma, nvlink)

    def _fixed(self, requests: int, eager: bool) -> float:
        t = self.perf.overhead_per_step_s + self.perf.overhead_per_request_s * requests
        if eager:   # no CUDA graph: every layer's kernel launches are paid
            t += self.perf.overhead_per_layer_s * self.model.layers
        return t

    def step_time(self, ranks: list[RankBatch], graph: bool = True) -> float:
        """Time of one engine step; ranks with no work still take part (DP attention idle batch).
        A step runs as a CUDA graph when no rank prefills and `graph` (the batch fits the graph)."""
        tokens = requests = 0
        eager = not graph
        prefills = False
        slowest = 0.0
        for r in ranks:   # one pass: the simulator calls this for every step that prefills
            tokens += r.decode_seqs + r.prefill_tokens
            requests += r.requests
            if r.prefill_tokens:
                eager = prefills = True
            t = self.rank_time(r)
            if t > slowest:
                slowest = t
        return slowest + self.moe_time(tokens, prefills) + self._fixed(requests, eager)

    def mixed_step_time(self, seqs: list[int], ctx: list[int], prefill: list[tuple], graph: bool = True) -> float:
        """`step_time` of ranks r = RankBatch(seqs[r], ctx[r], requests=seqs[r]), with the prefill chunks
        of `prefill` ((rank, tokens, attn_ctx, kv_read, requests), in rank order) on theirs: the same
        float operations in the same order, without building the batches (the simulator's steps
        that prefill)."""
        g, a, w, kv, ms = (self._gemm_s_per_token, self._attn_s_per_ctx, self._weight_bytes_rank,
                           self.kv_bytes_per_token_gpu, self._mem_s_per_byte)
        ratio, prefix = self._prefill_attn_ratio, self._prefix_s_per_token
        tp_fixed, tp_token = self._tp_fixed, self._tp_s_per_token
        total = requests = 0
        eager = not graph
        prefills = False
        slowest = 0.0
        k, nxt = 0, prefill[0][0] if prefill else -1
        for r, (n, c) in enumerate(zip(seqs, ctx)):
            if r == nxt:
                _, pt, attn_ctx, kv_read, req = prefill[k]
                k += 1
                nxt = prefill[k][0] if k < len(prefill) else -1
                tokens = n + pt
                if pt:
                    eager = prefills = True
            else:
                pt, attn_ctx, kv_read, req = 0, 0.0, 0, n
                tokens = n
            total += tokens
            requests += req
            compute = g * tokens + a * (c + ratio * attn_ctx) + prefix * (kv_read - pt)
            memory = (w + kv * (c + kv_read)) * ms
            t = max(compute, memory) + (tp_fixed + tp_token * tokens if tokens else 0.0)
            if t > slowest:
                slowest = t
        return slowest + self.moe_time(total, prefills) + self._fixed(requests, eager)

    def decode_step_times(self, seqs: np.ndarray, ctx: np.ndarray, steps: int, graph: bool = True) -> np.ndarray:
        """Times of `steps` consecutive decode-only steps whose batch does not change.

        seqs[r], ctx[r]: decoding sequences and their summed context on rank r at the first step;
        each step adds seqs[r] to ctx[r]. Both the fast-forward and the token-by-token path use
        this function, so the two give bit-identical times.
        """
        j = np.arange(steps, dtype=np.float64)[:, None]
        c = ctx[None, :].astype(np.float64) + j * seqs[None, :]
        n = seqs.astype(np.float64)[None, :]
        compute = self._gemm_s_per_token * n + self._attn_s_per_ctx * c
        memory = (self._weight_bytes_rank + self.kv_bytes_per_token_gpu * c) * self._mem_s_per_byte
        comm = np.where(n > 0, self._tp_fixed + self._tp_s_per_token * n, 0.0)
        slowest = (np.maximum(compute, memory) + comm).max(axis=1)
        total = int(seqs.sum())
        return slowest + (self.moe_time(total) + self._fixed(total, not graph))

    # --- the simulator's hot path: the same numbers as decode_step_times, without numpy ------------
    def _decode_shared(self, total: int, graph: bool) -> float:
        """What every decode-only step of `total` sequences adds to its slowest rank (MoE, overheads)."""
        key = (total, graph)
        t = self._decode_memo.get(key)
        if t is None:
            t = self._decode_memo[key] = self.moe_time(total) + self._fixed(total, not graph)
        return t

    def decode_step_time(self, seqs: list[int], ctx: list[int], graph: bool = True) -> float:
        """`decode_step_times(seqs, ctx, 1, graph)[0]` for lists of ints: the same float operations in
        the same order, so the same bits, at a fraction of numpy's per-call cost."""
        g, a, w, kv, ms = (self._gemm_s_per_token, self._attn_s_per_ctx, self._weight_bytes_rank,
                           self.kv_bytes_per_token_gpu, self._mem_s_per_byte)
        slowest = 0.0
        for n, c in zip(seqs, ctx):
            nf, cf = float(n), float(c)
            compute = g * nf + a * cf
            memory = (w + kv * cf) * ms
            t = (compute if compute > memory else memory) + (self._tp_fixed + self._tp_s_per_token * nf if n > 0 else 0.0)
            if t > slowest:
                slowest = t
        return slowest + self._decode_shared(sum(seqs), graph)

    def decode_span_ends(self, seqs: list[int], ctx: list[int], steps: int, graph: bool, start: float) -> list[float]:
        """End times of `steps` decode-only steps from `start`: `np.cumsum([start, *decode_step_times(...)])[1:]`,
        bit for bit. When every rank stays memory-bound through the span and pays the same all-reduce
        time, the slowest rank of a step is the one with the most context (memory time grows with it),
        so a step costs a few float operations instead of a pass over the ranks."""
        extra = 0.0
        if self._tp_fixed or self._tp_s_per_token:
            comm = [self._tp_fixed + self._tp_s_per_token * float(n) if n > 0 else 0.0 for n in seqs]
            extra = comm[0]
            if any(x != extra for x in comm):
                return self._span_ends_by_rank(seqs, ctx, steps, graph, start)
        g, a, w, kv, ms = (self._gemm_s_per_token, self._attn_s_per_ctx, self._weight_bytes_rank,
                           self.kv_bytes_per_token_gpu, self._mem_s_per_byte)
        # Memory-bound with a margin (1e-7) far above rounding at the span's step closest to compute-bound
        # (both times are linear in the context), so the float max picks memory at every step.
        scale = 1 - 1e-7
        at = self._binding if steps > 1 else (0,)
        last = steps - 1
        top_n = top_c = -1          # the rank with the most context at step 0 (the steeper of equals)
        most = total = 0            # the most sequences on a rank, all of them
        for n, c0 in zip(seqs, ctx):
            for j in at:
                c = c0 + j * last * n
                if not g * n + a * c < (w + kv * c) * ms * scale:
                    return self._span_ends_by_rank(seqs, ctx, steps, graph, start)
            if c0 > top_c or (c0 == top_c and n > top_n):
                top_n, top_c = n, c0
            if n > most:
                most = n
            total += n
        shared = self._decode_memo.get((total, graph))
        if shared is None:
            shared = self._decode_shared(total, graph)
        if most > top_n:   # a rank with more sequences may overtake it
            segments = _upper_envelope(seqs, ctx, steps)
        else:
            segments = [(0, steps, top_n, top_c)]
        ends: list[float] = []
        append = ends.append
        t = start
        for j0, j1, n, c0 in segments:
            c = c0 + j0 * n
            if n and j1 - j0 >= _VECTOR_STEPS:
                # The Python branches' operations elementwise, in place in one buffer whose first cell is
                # the start, then added up in order (add.accumulate: what cumsum calls, without its
                # dispatch): half the numpy calls, the same bits. (The context counts are exact in
                # float64 below 2**53, as kv * int is; a + b == b + a; x + 0.0 == x for these times.)
                buf = np.arange(c - n, c + (j1 - j0) * n, n, dtype=np.float64)
                np.multiply(buf, kv, out=buf)
                np.add(buf, w, out=buf)
                np.multiply(buf, ms, out=buf)
                if extra:
                    np.add(buf, extra, out=buf)
                np.add(buf, shared, out=buf)
                buf[0] = t
                run = np.add.accumulate(buf, out=buf)[1:].tolist()
                ends += run
                t = run[-1]
            elif n and extra:   # kv * int == kv * float(int) below 2**53
                ends += [t := t + (((w + kv * c) * ms + extra) + shared) for c in range(c, c + (j1 - j0) * n, n)]
            elif n:   # x + 0.0 == x for the positive times here: the same bits without the add
                ends += [t := t + ((w + kv * c) * ms + shared) for c in range(c, c + (j1 - j0) * n, n)]
            else:
                dt = ((w + kv * c) * ms + extra) + shared
                for _ in range(j1 - j0):
                    t += dt
                    append(t)
        return ends

    def _span_ends_by_rank(self, seqs: list[int], ctx: list[int], steps: int, graph: bool,
                              start: float) -> list[float]:
        """Any span, every rank at every step: with numpy, or for a short span (ranks x steps <=
        `_PYTHON_CELLS`) the same float operations in the same order in Python, where numpy's per-call
        cost (~15 us) is most of the work. On DeepSeek-V3 engines (TP4 x DP4, ranks with unequal
        all-reduce times) a Prorsa run's what-if makes ~700k such calls."""
        if steps * len(seqs) > _PYTHON_CELLS:
            times = self.decode_step_times(np.array(seqs), np.array(ctx), steps, graph)
            return np.cumsum(np.concatenate(([start], times)))[1:].tolist()
        g, a, w, kv, ms = (self._gemm_s_per_token, self._attn_s_per_ctx, self._weight_bytes_rank,
                           self.kv_bytes_per_token_gpu, self._mem_s_per_byte)
        tp_fixed, tp_token = self._tp_fixed, self._tp_s_per_token
        ranks = [(float(n), float(c), tp_fixed + tp_token * float(n) if n > 0 else 0.0) for n, c in zip(seqs, ctx)]
        shared = self._decode_shared(sum(seqs), graph)
        ends: list[float] = []
        t = start
        for j in range(steps):
            jf = float(j)
            slowest = 0.0
            for nf, cf, comm in ranks:
                c = cf + jf * nf
                compute = g * nf + a * c
                memory = (w + kv * c) * ms
                x = (compute if compute > memory else memory) + comm
                if x > slowest:
                    slowest = x
            t += slowest + shared
            ends.append(t)
        return ends

_VECTOR_STEPS = 64   # a span segment at least this long is computed with numpy (per-call cost ~ 60 steps)
_PYTHON_CELLS = 96   # a span of at most this many rank-steps is timed without numpy (~0.13 us a rank-step)


def _upper_envelope(seqs: list[int], ctx: list[int], steps: int) -> list[tuple[int, int, int, int]]:
    """The most context on any rank at each step j < steps (rank r holds ctx[r] + j * seqs[r]), as
    segments (j0, j1, seqs, ctx) of the rank that holds it for j0 <= j < j1 (integers: exact)."""
    n = c0 = -1
    for m, d0 in zip(seqs, ctx):   # the most context at step 0 (the steeper of equals)
        if d0 > c0 or (d0 == c0 and m > n):
            n, c0 = m, d0
    j, out = 0, []
    while True:
        best = None     # (first step at which another rank holds more, minus its context there, minus slope)
        for m, d0 in zip(seqs, ctx):
            if m > n:   # it gains on the current one: ahead from step floor((c0 - d0) / (m - n)) + 1
                jj = (c0 - d0) // (m - n) + 1
                if jj < steps:
                    cand = (jj, -(d0 + jj * m), -m, d0)
                    if best is None or cand < best:
                        best = cand
        if best is None:
            out.append((j, steps, n, c0))
            return out
        out.append((j, best[0], n, c0))
        j, n, c0 = best[0], -best[2], best[3]
