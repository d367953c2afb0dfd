"""One simulated engine: continuous batching over one or more data-parallel attention ranks.

Two step semantics (`cluster.engine`), as the two engines RL frameworks use schedule a step:
  - vllm (vLLM v1's scheduler): each step first gives every decoding sequence one token, then fills
    the rest of the token budget (`max_num_batched_tokens`) with prefill chunks, FCFS;
  - sglang (SGLang's scheduler): prefill first. A rank that can form a prefill batch (up to
    `chunked_prefill_size` tokens) runs it and its decodes pause for that step, unless
    `enable_mixed_chunk` lets them ride along; with DP attention the other ranks' steps stretch to it.
    A decode step runs as a CUDA graph only if every rank decodes or idles and no rank's batch
    exceeds `cuda_graph_max_bs`.
KV memory is reserved for a request's whole prompt when it is admitted; decode grows it one token
per step; when a step cannot get memory, the prefix cache is evicted (LRU) and then the most
recently admitted request is preempted (its KV dropped and recomputed later, as vLLM's recompute mode).

Decode progress is counted per rank (`decode_clock`), so a decode step costs O(1) whatever the
batch size; while nothing can change a decode-only batch, many steps are advanced at once
(`fast_forward`), giving the same times as stepping one token at a time.
"""
from __future__ import annotations

import heapq
from bisect import bisect_left
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import numpy as np

from harness.api import EventKind, Role, Route, TurnRequest
from harness.perf.catalogue import GPUSpec
from harness.perf.roofline import Parallelism, RankBatch
from harness.sim.clock import EventLoop

FULL, PREFILL, DECODE = "full", "prefill", "decode"   # leg kinds: colocated, P side, D side


class EngineHost(Protocol):
    """What an engine needs from the cluster that owns it (harness/sim/backend.py): the clock, the cost
    model, and the cluster-level consequences of its steps. The engine never imports its owner."""

    gpu: GPUSpec
    loop: EventLoop

    def cost_model(self, par: Parallelism): ...
    def mark_stale(self, e: SimEngine) -> None: ...          # the cluster view must re-read `e`
    def emit(self, kind: EventKind, s: SimRequest, engine_id: int, tokens: int = 0, extra_tokens: int = 0): ...
    def prefill_handoff(self, s: SimRequest) -> None: ...    # a PD prefill leg ended: start its decode leg
    def start_transfer(self, s: SimRequest, tokens: int) -> None: ...   # pull a decode leg's KV
    def engine_went_idle(self, e: SimEngine) -> None: ...


@dataclass(eq=False, slots=True)
class SimRequest:
    request: TurnRequest
    route: Route
    kind: str
    rank: int = -1
    state: str = "waiting"          # waiting | transferring | prefilling | decoding
    target: int = 0                 # KV tokens to hold before decoding
    computed: int = 0               # KV tokens present (cached + prefilled or moved)
    prefilled: int = 0              # tokens prefilled by the current attempt
    generated: int = 0              # output tokens (set on entering decode; see Rank.generated)
    kv_held: int = 0                # KV tokens reserved on the rank
    admit_seq: int = 0
    clock0: int = 0                 # rank decode_clock when this request joined the decode batch
    started_prefill: bool = False
    recompute: bool = False         # preempted before: prefill prompt + generated, no handoff

    @property
    def trajectory_id(self) -> int:
        return self.request.trajectory_id


_NO_FINISH = 1 << 62   # Rank.next_finish when nothing decodes


@dataclass(slots=True)
class Rank:
    capacity: int
    waiting: deque = field(default_factory=deque)
    running: dict = field(default_factory=dict)     # admit_seq -> SimRequest, admission order
    prefilling: dict = field(default_factory=dict)  # the running requests still prefilling, same order
    cache: OrderedDict = field(default_factory=OrderedDict)   # trajectory_id -> tokens, LRU first
    cache_tokens: int = 0
    kv_used: int = 0
    decode_clock: int = 0
    decode_n: int = 0
    decode_ctx: int = 0
    finish_heap: list = field(default_factory=list)  # (finish clock, admit_seq, request)
    first_token_due: list = field(default_factory=list)
    ready: list = field(default_factory=list)        # KV arrived, joins the batch next step
    pending_prefill: int = 0        # tokens still to prefill, waiting and running requests
    waiting_kv: int = 0             # prompt tokens of the waiting requests
    # The earliest finish clock of a decoding request (None: to be found in finish_heap, whose top
    # may be a preempted request's stale entry); kept so a step need not look into the heap.
    next_finish: int | None = _NO_FINISH
    # Which ranks of the engine cache each trajectory's prefix (trajectory_id -> bit mask of rank
    # indices), shared by the engine's ranks, so a leg finds its rank without probing every cache.
    holders: dict = field(default_factory=dict)
    bit: int = 1                    # this rank's bit in `holders`

    @property
    def free(self) -> int:
        return self.capacity - self.kv_used - self.cache_tokens

    def generated(self, s: SimRequest) -> int:
        return s.generated + (self.decode_clock - s.clock0 if s.state == "decoding" else 0)

    def held(self, s: SimRequest) -> int:
        return s.kv_held + (self.decode_clock - s.clock0 if s.state == "decoding" else 0)

    def evict_until(self, need: int) -> bool:
        while self.free < need and self.cache:
            tid, tokens = self.cache.popitem(last=False)
            self.cache_tokens -= tokens
            self._forget(tid)
        return self.free >= need

    def cache_put(self, trajectory_id: int, tokens: int) -> None:
        old = self.cache.pop(trajectory_id, 0)
        self.cache_tokens += tokens - old
        self.cache[trajectory_id] = tokens
        self.holders[trajectory_id] = self.holders.get(trajectory_id, 0) | self.bit

    def cache_take(self, trajectory_id: int) -> int:
        """Remove the trajectory's cached prefix; its tokens (0 if none)."""
        hit = self.cache.pop(trajectory_id, None)
        if hit is None:
            return 0
        self.cache_tokens -= hit
        self._forget(trajectory_id)
        return hit

    def cache_put_back(self, trajectory_id: int, tokens: int) -> None:
        """Undo `cache_take` (admission could not get memory): the prefix returns, first to evict."""
        self.cache[trajectory_id] = tokens
        self.cache.move_to_end(trajectory_id, last=False)
        self.cache_tokens += tokens
        self.holders[trajectory_id] = self.holders.get(trajectory_id, 0) | self.bit

    def cache_clear(self) -> None:
        for tid in self.cache:
            self._forget(tid)
        self.cache.clear()
        self.cache_tokens = 0

    def _forget(self, trajectory_id: int) -> None:
        mask = self.holders[trajectory_id] & ~self.bit
        if mask:
            self.holders[trajectory_id] = mask
        else:
            del self.holders[trajectory_id]

    def finish_clock(self) -> int:
        """The earliest finish clock of a decoding request (_NO_FINISH if none)."""
        if self.next_finish is None:
            heap = self.finish_heap
            while heap:   # drop stale entries of preempted requests
                _, seq, s = heap[0]
                if s.state == "decoding" and self.running.get(seq) is s:
                    break
                heapq.heappop(heap)
            self.next_finish = heap[0][0] if heap else _NO_FINISH
        return self.next_finish


@dataclass
class EngineConfig:
    prefill_budget: int             # prefill tokens per rank per step (vLLM: minus that step's decodes)
    max_num_seqs: int
    memory_fraction: float
    activation_reserve_bytes: float
    fast_forward: bool = True
    prefill_first: bool = False     # SGLang: a rank with prefill work pauses its decodes for the step
    mixed_chunk: bool = False       # SGLang --enable-mixed-chunk: decodes join the prefill step
    cuda_graph_max_bs: int = 0      # decode batches per rank above this run eagerly (0: no limit)


class SimEngine:
    def __init__(self, engine_id: int, role: Role, par: Parallelism, backend: EngineHost, cfg: EngineConfig,
                 launched_as: Role | None = None):
        self.id = engine_id
        self.backend = backend
        self.cfg = cfg
        self.role = role
        self.target_role: Role | None = None
        self.available = True
        self.switching = False
        self._admit_counter = 0
        self._version = 0            # invalidates a scheduled step end when a span is cut short
        self._busy = False
        self._span: list[float] | None = None   # end time of each step of a fast-forward span
        self._span_steps = 0                    # the steps of it that run (a prefix of _span)
        self._span_start = 0.0
        self._pending_wake = False
        self.busy_s = 0.0
        self.stale = False           # backend.view() must re-read this engine
        self.configure(launched_as or role, par)

    # --- configuration ------------------------------------------------------------------------
    def configure(self, role: Role, par: Parallelism) -> None:
        """(Re)load the engine with parallelism `par` (launched for `role`): an empty KV cache."""
        self.par, self.launched_as = par, role
        self.cost = self.backend.cost_model(par)
        # numpy-free decode times where the cost model has them (the same bits; see roofline.py)
        self._decode_step_time = getattr(self.cost, "decode_step_time", None)
        self._decode_span_ends = getattr(self.cost, "decode_span_ends", None)
        self._mixed_step_time = getattr(self.cost, "mixed_step_time", None)
        cap = self.cost.kv_capacity_tokens(self.cfg.memory_fraction, self.cfg.activation_reserve_bytes)
        if cap <= 0:
            raise ValueError(f"cluster.parallelism.{role.value}: model weights leave no KV memory "
                             f"on a {self.backend.gpu.name} rank (tp={self.par.tp}, dp={self.par.dp}, "
                             f"ep={self.par.ep}); use more GPUs per engine or a larger GPU")
        holders: dict[int, int] = {}
        self.ranks = [Rank(capacity=cap, holders=holders, bit=1 << i) for i in range(self.par.dp)]
        self._all_decode = [True] * self.par.dp    # vLLM semantics: every rank decodes in every step
        self.backend.mark_stale(self)

    def clear_prefix_cache(self) -> None:
        for r in self.ranks:
            r.cache_clear()

    @property
    def kv_capacity_tokens(self) -> int:
        return self.ranks[0].capacity * len(self.ranks)

    # --- intake -------------------------------------------------------------------------------
    def enqueue(self, s: SimRequest) -> None:
        """A leg arrives: pick the rank holding its prefix, else the least loaded one."""
        tid = s.request.trajectory_id
        mask = self.ranks[0].holders.get(tid)
        if mask:   # the first rank holding it
            best = (mask & -mask).bit_length() - 1
        else:
            best = min(range(len(self.ranks)), key=lambda i: (self.ranks[i].kv_used + self.ranks[i].waiting_kv, i))
        s.rank = best
        need = s.request.prompt_tokens if s.kind == DECODE else s.target
        if need > self.ranks[best].capacity:
            raise ValueError(
                f"trajectory {tid} turn {s.request.turn} needs {need} KV tokens but a rank of engine "
                f"{self.id} ({self.role.value}) holds {self.ranks[best].capacity}; lower the workload's "
                "context cap or give the engines more memory")
        rank = self.ranks[best]
        self.backend.mark_stale(self)
        q, i = rank.waiting, len(rank.waiting)   # behind every waiting leg of no higher priority
        while i and q[i - 1].route.priority > s.route.priority:
            i -= 1
        q.insert(i, s)
        rank.waiting_kv += need
        if s.kind != DECODE:
            rank.pending_prefill += s.target
        self.wake()

    def wake(self) -> None:
        """Something changed: start a step now, or end a fast-forward span at its next step."""
        loop = self.backend.loop
        span = self._span
        if span is not None:
            i = bisect_left(span, loop.now, 0, self._span_steps)
            if i < self._span_steps - 1:
                self._span_steps = i + 1
                self._version += 1
                loop.at_engine(span[i], partial(self._end_span, self._version))
            return
        if not self._busy and not self._pending_wake:
            self._pending_wake = True
            loop.at_engine(loop.now, self._step)

    def take_waiting(self) -> list[SimRequest]:
        """Hand back the legs not yet admitted that a router may send elsewhere (role switch)."""
        out = []
        self.backend.mark_stale(self)
        for r in self.ranks:
            keep = deque()
            for s in r.waiting:
                if s.kind != DECODE and not s.recompute:
                    out.append(s)
                    r.pending_prefill -= s.target
                    r.waiting_kv -= s.target
                else:
                    keep.append(s)
            r.waiting = keep
        return out

    @property
    def idle(self) -> bool:
        return not self._busy and all(not r.running and not r.waiting for r in self.ranks)

    # --- admission ----------------------------------------------------------------------------
    def _admit(self, r: Rank) -> None:
        while r.waiting and len(r.running) < self.cfg.max_num_seqs:
            s = r.waiting[0]
            tid = s.request.trajectory_id
            hit = r.cache_take(tid)
            if s.kind == DECODE and not s.recompute:
                need = s.request.prompt_tokens
                local = min(hit, need)
            else:
                need = s.target
                local = min(hit, need - 1)
            if not r.evict_until(need - local):
                if hit:
                    r.cache_put_back(tid, hit)
                return
            r.waiting.popleft()
            r.waiting_kv -= need
            self._admit_counter += 1
            s.admit_seq = self._admit_counter
            s.kv_held = need
            s.computed = local
            r.kv_used += need
            r.running[s.admit_seq] = s
            if s.kind == DECODE and not s.recompute:
                s.state = "transferring"
                s.target = need
                self.backend.start_transfer(s, need - local)
            else:
                s.state = "prefilling"
                r.prefilling[s.admit_seq] = s
                s.prefilled = 0
                r.pending_prefill -= local

    def transfer_done(self, s: SimRequest) -> None:
        s.computed = s.target
        s.state = "ready"
        self.ranks[s.rank].ready.append(s)
        self.wake()

    def _join_decode(self, r: Rank, s: SimRequest, generated: int) -> None:
        s.state = "decoding"
        s.generated = generated
        s.clock0 = r.decode_clock
        r.decode_n += 1
        r.decode_ctx += s.kv_held
        if generated == 0:
            r.first_token_due.append(s)
        finish = r.decode_clock + s.request.output_tokens - generated
        heapq.heappush(r.finish_heap, (finish, s.admit_seq, s))
        if r.next_finish is not None and finish < r.next_finish:
            r.next_finish = finish

    # --- memory pressure ----------------------------------------------------------------------
    def _preempt(self, r: Rank, s: SimRequest) -> None:
        held = r.held(s)                    # KV reserved on the rank
        dropped = s.computed if s.state == "prefilling" else held   # KV actually computed
        # Recomputed: tokens the recompute will prefill that were computed or sampled before (when
        # decoding, the last sampled token has no KV yet and is prefilled with the others, as vLLM does).
        recomputed = dropped + (1 if s.state == "decoding" else 0)
        if s.state == "decoding":
            s.generated = r.generated(s)
            r.next_finish = None    # its heap entry is stale now
            r.decode_n -= 1
            r.decode_ctx -= held
            if s in r.first_token_due:
                r.first_token_due.remove(s)
        elif s.state == "ready":
            r.ready.remove(s)
        extra = 0
        if s.state == "prefilling":
            del r.prefilling[s.admit_seq]
            extra = s.prefilled
            r.pending_prefill -= s.target - s.computed
        r.kv_used -= held
        del r.running[s.admit_seq]
        s.kv_held = 0
        s.state = "waiting"
        s.recompute = True
        s.started_prefill = True
        s.target = s.request.prompt_tokens + s.generated
        s.computed = 0
        s.prefilled = 0
        r.pending_prefill += s.target
        r.waiting_kv += s.target
        r.waiting.appendleft(s)
        self.backend.emit(EventKind.PREEMPTED, s, self.id, tokens=recomputed, extra_tokens=extra)

    def _reserve_decode_slots(self, r: Rank) -> None:
        while r.decode_n and not r.evict_until(r.decode_n):
            victim = next(x for x in reversed(r.running.values()) if x.state != "transferring")
            if victim.state == "decoding" and r.held(victim) + 1 > r.capacity:
                raise ValueError(f"trajectory {victim.trajectory_id}: its context alone exceeds the KV "
                                 f"memory of a rank of engine {self.id} ({r.capacity} tokens)")
            self._preempt(r, victim)

    # --- stepping -----------------------------------------------------------------------------
    def _step(self) -> None:
        self._pending_wake = False
        if self._busy:
            return
        if not self.stale:
            self.backend.mark_stale(self)
        cfg = self.cfg
        prefill_first = cfg.prefill_first and not cfg.mixed_chunk
        max_seqs = cfg.max_num_seqs
        span = cfg.fast_forward             # while no rank so far rules out a fast-forward span
        steps = None                        # decode steps no rank so far can interrupt
        decoding = [] if prefill_first else self._all_decode   # per rank: does it decode in this step
        seqs, ctx = [], []                  # per rank: this step's decoding sequences and their context
        for r in self.ranks:
            if r.ready:
                for s in r.ready:
                    # The first decode step re-feeds the last prompt token (its KV is recomputed on the
                    # decode side, as vLLM's connectors do), so the context grows from prompt - 1.
                    s.kv_held -= 1
                    r.kv_used -= 1
                    self._join_decode(r, s, generated=0)
                    self.backend.emit(EventKind.DECODE_START, s, self.id)
                r.ready.clear()
            if prefill_first:
                # As SGLang's scheduler: a prefill batch if one can be formed, else the decode batch.
                if r.waiting:
                    self._admit(r)
                if r.prefilling:
                    decoding.append(False)
                    seqs.append(0)
                    ctx.append(0)
                    span = False
                    continue
                decoding.append(True)
            # vLLM's scheduler (and SGLang's decode batch or mixed chunk): running requests get their
            # decode slot first, then new ones are admitted.
            n = r.decode_n
            if n and r.capacity - r.kv_used - r.cache_tokens < n:
                self._reserve_decode_slots(r)   # not enough free memory: evict, then preempt
                n = r.decode_n
            r.kv_used += n
            if r.waiting and not prefill_first:
                self._admit(r)
            seqs.append(n)
            ctx.append(r.decode_ctx)
            if span:   # how many decode steps nothing inside the engine can interrupt
                if r.first_token_due or r.prefilling or (r.waiting and len(r.running) < max_seqs):
                    span = False   # (a waiting head blocked only by memory stays blocked: spans free none)
                elif n:
                    # this step's slots are reserved; later steps may use free memory and the cache
                    k = (r.next_finish if r.next_finish is not None else r.finish_clock()) - r.decode_clock
                    k2 = 1 + (r.capacity - r.kv_used) // n
                    if k2 < k:
                        k = k2
                    if steps is None or k < steps:
                        steps = k
        limit = cfg.cuda_graph_max_bs
        graph = not limit or max(seqs) <= limit
        if span and steps is not None and steps >= 2:
            self._start_span(steps, seqs, ctx, graph)
            return
        chunks, prefill = [], []
        budget0 = cfg.prefill_budget
        for r, n in zip(self.ranks, seqs):
            rank_chunks = []
            if r.prefilling:
                budget = budget0 - n
                tokens, attn_ctx, kv_read, requests = 0, 0.0, 0, n
                for s in r.prefilling.values():
                    if budget <= 0:
                        break
                    c = min(s.target - s.computed, budget)
                    budget -= c
                    p = s.computed
                    tokens += c
                    attn_ctx += c * (p + (c - 1) / 2)
                    kv_read += p + c
                    requests += 1
                    rank_chunks.append((s, c))
                    if not s.started_prefill:
                        s.started_prefill = True
                        self.backend.emit(EventKind.PREFILL_START, s, self.id, tokens=s.computed)
                if tokens:
                    prefill.append((len(chunks), tokens, attn_ctx, kv_read, requests))
            chunks.append(rank_chunks)
        if prefill and self._mixed_step_time is not None:
            dt = self._mixed_step_time(seqs, ctx, prefill, graph)
        elif prefill:
            batches = [RankBatch(decode_seqs=n, decode_ctx=c, requests=n) for n, c in zip(seqs, ctx)]
            for i, tokens, attn_ctx, kv_read, requests in prefill:
                b = batches[i]
                b.prefill_tokens, b.prefill_attn_ctx, b.prefill_kv_read, b.requests = tokens, attn_ctx, kv_read, requests
            dt = self.cost.step_time(batches, graph)
        elif not any(seqs):
            self.backend.engine_went_idle(self)  # nothing runnable: wait for an arrival or a transfer
            return
        elif self._decode_step_time is not None:
            dt = self._decode_step_time(seqs, ctx, graph)
        else:
            dt = float(self.cost.decode_step_times(np.array(seqs), np.array(ctx), 1, graph)[0])
        self._busy = True
        self.busy_s += dt
        self._version += 1
        loop = self.backend.loop
        loop.at_engine(loop.now + dt, partial(self._end_step, self._version, chunks, decoding))

    def _start_span(self, steps: int, seqs: list[int], ctx: list[int], graph: bool) -> None:
        """Advance `steps` decode-only steps as one event (every rank decodes: none prefills)."""
        now = self.backend.loop.now
        if self._decode_span_ends is not None:
            self._span = self._decode_span_ends(seqs, ctx, steps, graph, now)
        else:
            times = self.cost.decode_step_times(np.array(seqs), np.array(ctx), steps, graph)
            self._span = np.cumsum(np.concatenate(([now], times)))[1:].tolist()
        self._span_steps = steps   # cut short by `wake` when something arrives
        self._span_start = now
        self._busy = True
        self._version += 1
        self.backend.loop.at_engine(self._span[-1], partial(self._end_span, self._version))

    def _end_span(self, version: int) -> None:
        if version != self._version:
            return
        if not self.stale:
            self.backend.mark_stale(self)
        steps = self._span_steps
        self.busy_s += self._span[steps - 1] - self._span_start
        self._span = None
        for r in self.ranks:
            n = r.decode_n
            if not n:
                continue
            r.decode_clock += steps
            r.decode_ctx += steps * n
            r.kv_used += (steps - 1) * n
            if r.capacity - r.kv_used - r.cache_tokens < 0:
                r.evict_until(0)
            if r.next_finish is None or r.next_finish <= r.decode_clock:
                self._finish_decodes(r)
        self._busy = False
        self._step()

    def _end_step(self, version: int, chunks: list, decoding: list[bool]) -> None:
        if version != self._version:
            return
        if not self.stale:
            self.backend.mark_stale(self)
        emit = self.backend.emit
        for r, rank_chunks, decoded in zip(self.ranks, chunks, decoding):
            if r.decode_n and decoded:
                r.decode_clock += 1
                r.decode_ctx += r.decode_n
                if r.first_token_due:
                    for s in r.first_token_due:
                        emit(EventKind.FIRST_TOKEN, s, self.id)
                    r.first_token_due.clear()
                if r.next_finish is None or r.next_finish <= r.decode_clock:
                    self._finish_decodes(r)
            for s, c in rank_chunks:
                if s.state != "prefilling":
                    continue  # preempted since
                s.computed += c
                s.prefilled += c
                r.pending_prefill -= c
                if s.computed == s.target:
                    self._prefill_done(r, s)
        self._busy = False
        self._step()

    def _prefill_done(self, r: Rank, s: SimRequest) -> None:
        emit = self.backend.emit
        del r.prefilling[s.admit_seq]
        emit(EventKind.PREFILL_END, s, self.id, tokens=s.prefilled)
        if s.kind == PREFILL:
            del r.running[s.admit_seq]
            r.kv_used -= s.kv_held
            r.cache_put(s.trajectory_id, s.kv_held)
            s.kv_held = 0
            self.backend.prefill_handoff(s)
            return
        generated = s.generated + 1          # the prefill step samples a token
        if s.generated == 0:
            emit(EventKind.FIRST_TOKEN, s, self.id)
            if s.kind == FULL:
                emit(EventKind.DECODE_START, s, self.id)
        self._join_decode(r, s, generated)
        if generated >= s.request.output_tokens:
            self._finish_decodes(r)

    def _finish_decodes(self, r: Rank) -> None:
        heap = r.finish_heap
        r.next_finish = None
        while heap and heap[0][0] <= r.decode_clock:
            _, seq, s = heapq.heappop(heap)
            if s.state != "decoding" or r.running.get(seq) is not s:
                continue  # stale entry of a preempted request
            held = s.kv_held + r.decode_clock - s.clock0
            r.decode_n -= 1
            r.decode_ctx -= held
            r.kv_used -= held
            del r.running[seq]
            s.state = "done"
            r.cache_put(s.request.trajectory_id, held)
            self.backend.emit(EventKind.DECODE_END, s, self.id, tokens=s.request.output_tokens)
