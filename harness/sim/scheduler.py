"""The scheduler of one simulated engine, in vLLM v1's shape: `schedule()` returns a typed plan of the
next step (with what deciding it produced: preemptions, decode starts, KV pulls), the engine times it
on its cost model, and `update_from_output()` applies the step and yields what it produces (lifecycle
reports, prefill legs handed off), in order. The scheduler never calls out: the backend acts on what
it returns.

Two step semantics (`cluster.engine`), as the two engines RL frameworks use schedule a step, one
class each (SCHEDULERS):
  - vllm (`Scheduler`, vLLM v1's): each step first gives every decoding sequence one token, then fills
    the rest of the token budget (`max_num_batched_tokens`) with prefill chunks, FCFS;
  - sglang (`SGLangScheduler`): prefill first. A rank that can form a prefill batch (up to
    `chunked_prefill_size` tokens) runs it and its decodes pause for that step, unless
    `enable_mixed_chunk` lets them ride along; with DP attention the other ranks' steps stretch to it.
    A decode step runs as a CUDA graph only if every rank decodes or idles and no rank's batch
    exceeds `cuda_graph_max_bs`.
KV memory (kv_cache.py) is reserved for a request's whole prompt when it is admitted; decode grows it
one token per step; when a step cannot get memory, the prefix cache is evicted (LRU) and then the
most recently admitted request is preempted (its KV dropped and recomputed later, as vLLM's recompute
mode).

Decode progress is counted per rank (`decode_clock`), so a decode step costs O(1) whatever the batch
size; while nothing can change a decode-only batch, many steps are planned at once (a span, with
`fast_forward`), giving the same times as stepping one token at a time.
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterator

from mypy_extensions import mypyc_attr

from harness.api import EventKind, Route, TurnRequest
from harness.perf.cost_model import prefill_attn_ctx
from harness.sim.kv_cache import KVCacheManager


class Leg(Enum):
    """Which part of a turn a request runs on its engine."""
    FULL = "full"           # colocated: prefill and decode
    PREFILL = "prefill"     # the P side of a disaggregated turn
    DECODE = "decode"       # the D side: pulls the KV, then decodes


class RequestStatus(Enum):
    WAITING = "waiting"
    TRANSFERRING = "transferring"   # admitted decode leg pulling its KV
    READY = "ready"                 # KV arrived: joins the decode batch next step
    PREFILLING = "prefilling"
    DECODING = "decoding"
    DONE = "done"


_WAITING, _TRANSFERRING, _READY = RequestStatus.WAITING, RequestStatus.TRANSFERRING, RequestStatus.READY
_PREFILLING, _DECODING, _DONE = RequestStatus.PREFILLING, RequestStatus.DECODING, RequestStatus.DONE


@mypyc_attr(serializable=True, allow_interpreted_subclasses=True)
@dataclass(eq=False, slots=True)
class SimRequest:
    request: TurnRequest
    route: Route
    leg: Leg
    target: int = 0                 # KV tokens to hold before decoding
    resumed: int = 0                # a decode moved here under way: output tokens it had generated
    rank: int = field(default=-1, init=False)
    status: RequestStatus = field(default=RequestStatus.WAITING, init=False)
    # KV tokens present (cached + prefilled or moved)
    computed: int = field(default=0, init=False)
    prefilled: int = field(default=0, init=False)         # tokens prefilled by the current attempt
    # output tokens (set on entering decode; see Rank.generated)
    generated: int = field(default=0, init=False)
    kv_held: int = field(default=0, init=False)           # KV tokens reserved on the rank
    admit_seq: int = field(default=0, init=False)
    # the rank's decode_clock when this request joined the decode batch
    clock0: int = field(default=0, init=False)
    started_prefill: bool = field(default=False, init=False)
    # preempted before: prefill prompt + generated, no handoff
    recompute: bool = field(default=False, init=False)
    # a decode leg: DECODE_START reported (a moved decode: where it began)
    decode_started: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.decode_started = self.resumed > 0

    @property
    def trajectory_id(self) -> int:
        return self.request.trajectory_id


@mypyc_attr(serializable=True, allow_interpreted_subclasses=True)
@dataclass(slots=True)
class Report:
    """A lifecycle event of a request, for the backend to report."""
    kind: EventKind
    request: SimRequest
    tokens: int = 0
    extra_tokens: int = 0


@mypyc_attr(serializable=True, allow_interpreted_subclasses=True)
@dataclass(slots=True)
class HandOff:
    """A disaggregated turn's prefill leg is done: its decode leg goes to the decode engine."""
    request: SimRequest


@mypyc_attr(serializable=True, allow_interpreted_subclasses=True)
@dataclass(slots=True)
class PullKV:
    """An admitted decode leg pulls `tokens` of KV (its prompt minus what this rank has cached)."""
    request: SimRequest
    tokens: int


_NO_FINISH = 1 << 62   # Rank.next_finish when nothing decodes


@mypyc_attr(serializable=True, allow_interpreted_subclasses=True)
@dataclass(slots=True)
class Rank:
    """One data-parallel attention rank: its queues, its decode batch and its KV memory."""
    kv: KVCacheManager
    waiting: deque = field(default_factory=deque)
    running: dict = field(default_factory=dict)     # admit_seq -> SimRequest, admission order
    prefilling: dict = field(default_factory=dict)  # the running requests still prefilling, same order
                                                    # (a decode leg's rest of its prompt: from its transfer's end, or at once if none)
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

    def generated(self, s: SimRequest) -> int:
        return s.generated + (self.decode_clock - s.clock0 if s.status is _DECODING else 0)

    def held(self, s: SimRequest) -> int:
        return s.kv_held + (self.decode_clock - s.clock0 if s.status is _DECODING else 0)

    def finish_clock(self) -> int:
        """The earliest finish clock of a decoding request (_NO_FINISH if none)."""
        if self.next_finish is None:
            heap = self.finish_heap
            while heap:   # drop stale entries of preempted requests
                _, seq, s = heap[0]
                if s.status is _DECODING and self.running.get(seq) is s:
                    break
                heapq.heappop(heap)
            self.next_finish = heap[0][0] if heap else _NO_FINISH
        return self.next_finish


@mypyc_attr(native_class=False)
@dataclass(frozen=True)
class SchedulerConfig:
    prefill_budget: int             # prefill tokens per rank per step (vLLM: minus that step's decodes)
    max_num_seqs: int
    fast_forward: bool = True
    mixed_chunk: bool = False       # SGLang --enable-mixed-chunk: decodes join the prefill step
    cuda_graph_max_bs: int = 0      # decode batches per rank above this run eagerly (0: no limit)
    prefix_block_tokens: int = 1    # a prefix-cache hit counts whole blocks of this many tokens (vLLM)
    transfer_block_tokens: int = 1  # a decode leg loads its prompt's KV in whole blocks of this many tokens


@mypyc_attr(serializable=True, allow_interpreted_subclasses=True)
@dataclass(slots=True)
class StepPlan:
    """What the next step runs, per rank, and what deciding it produced (preemptions, decode legs
    joining the batch, prefill starts, KV pulls of admitted decode legs), in order."""
    outputs: list
    seqs: list[int]                 # decoding sequences
    ctx: list[int]                  # their total context
    decoding: list[bool]            # does the rank decode in this step (SGLang: not while it prefills)
    graph: bool                     # the decode runs as a CUDA graph
    # >= 2: that many decode-only steps nothing can interrupt
    span_steps: int = field(default=0, init=False)
    # per rank: (request, tokens) prefill chunks
    chunks: list = field(default_factory=list, init=False)
    # per rank with prefill: (rank, tokens, attn ctx, KV read, requests)
    prefill: list = field(default_factory=list, init=False)

    @property
    def idle(self) -> bool:
        return not self.span_steps and not self.prefill and not any(self.seqs)


@mypyc_attr(serializable=True, allow_interpreted_subclasses=True)
class Scheduler:
    def __init__(self, engine_id: int, cfg: SchedulerConfig, capacity: int, ranks: int):
        self.engine_id = engine_id   # for messages
        self.cfg = cfg
        holders: dict[int, int] = {}
        self.ranks = [Rank(KVCacheManager(capacity, holders, 1 << i)) for i in range(ranks)]
        self._all_decode = [True] * ranks    # every rank decodes in this step (unless `_prefills_alone`)
        self._admits_beside_decodes = True   # waiting requests are admitted once the decode slots are reserved
        self._admit_counter = 0
        self._span_reserved = 0              # steps of the decode span under way whose KV is reserved

    @property
    def rank_capacity(self) -> int:
        return self.ranks[0].kv.capacity

    # --- intake -------------------------------------------------------------------------------
    def add_request(self, s: SimRequest) -> None:
        """A leg arrives: on the rank holding its prefix, else the least loaded one; behind every
        waiting leg of no higher priority."""
        ranks = self.ranks
        mask = ranks[0].kv.holders.get(s.request.trajectory_id)
        if mask:   # the first rank holding it
            best = (mask & -mask).bit_length() - 1
        else:
            best = min(range(len(ranks)), key=lambda i: (ranks[i].kv.used + ranks[i].waiting_kv, i))
        s.rank = best
        rank = ranks[best]
        q, i = rank.waiting, len(rank.waiting)
        while i and q[i - 1].route.priority > s.route.priority:
            i -= 1
        q.insert(i, s)
        rank.waiting_kv += self.kv_need(s)
        if s.leg is not Leg.DECODE:
            rank.pending_prefill += s.target

    @staticmethod
    def kv_need(s: SimRequest) -> int:
        """The KV tokens a leg reserves on admission."""
        return s.request.prompt_tokens + s.resumed if s.leg is Leg.DECODE else s.target

    def take_waiting(self, decode_legs: bool = False) -> list[SimRequest]:
        """Hand back the legs not yet admitted that a router may send elsewhere (role switch): the
        prefill and colocated legs (a draining engine), or the decode legs (`decode_legs`: a decode
        engine turned prefill engine sends them to another decode engine). Recomputes stay."""
        out = []
        for r in self.ranks:
            keep: deque = deque()
            for s in r.waiting:
                if (s.leg is Leg.DECODE) == decode_legs and not s.recompute:
                    out.append(s)
                    r.waiting_kv -= self.kv_need(s)
                    if s.leg is not Leg.DECODE:
                        r.pending_prefill -= s.target
                else:
                    keep.append(s)
            r.waiting = keep
        return out

    @property
    def has_decodes(self) -> bool:
        """Some rank decodes, or holds a decode leg whose KV arrived."""
        return any(r.decode_n or r.ready for r in self.ranks)

    def take_decoding(self, fits: int) -> list[tuple[SimRequest, int, int]]:
        """Remove every decode under way past its first token whose context fits in `fits` KV tokens,
        its KV freed here (live migration: the backend ships the KV and the decode resumes elsewhere):
        (request, output tokens generated, KV tokens it held). Call between steps. A decode still to
        emit its first token stays for a later call, so each turn reports its first token once."""
        out = []
        for r in self.ranks:
            if not r.decode_n:
                continue
            for seq, s in list(r.running.items()):
                if s.status is not _DECODING or s in r.first_token_due:
                    continue
                generated = r.generated(s)
                if s.request.prompt_tokens + generated > fits:
                    continue
                held = r.held(s)
                out.append((s, generated, held))
                r.decode_n -= 1
                r.decode_ctx -= held
                r.kv.release(held)
                del r.running[seq]
                s.status = _DONE
                r.next_finish = None     # its heap entry is stale now
        return out

    def reserve_span(self, steps: int) -> None:
        """The first `steps` steps of the decode span under way have started: reserve their KV slots now
        (evicting prefixes as those steps would), as stepping token by token would have, so that a leg
        arriving mid-span finds each rank's memory and prefix cache as they are (`add_request`)."""
        extra = steps - self._span_reserved
        if extra > 0:
            for r in self.ranks:
                if r.decode_n:
                    r.kv.grow(extra * r.decode_n)
            self._span_reserved = steps

    def transfer_done(self, s: SimRequest, tokens: int) -> None:
        """The `tokens` of KV a decode leg pulled have arrived (its own prefix cache held the rest)."""
        r = self.ranks[s.rank]
        loaded = s.computed + tokens
        if loaded < s.target - 1:
            # More than the last prompt token is left (whole-block transfers): the rank prefills it
            self._prefill_rest(r, s, loaded)
            return
        s.computed = s.target
        s.status = _READY
        r.ready.append(s)

    @staticmethod
    def _prefill_rest(r: Rank, s: SimRequest, loaded: int) -> None:
        """A decode leg holding `loaded` tokens of its prompt's KV prefills the rest on its rank, and that
        prefill samples the first output token. Not a prefill leg: no PREFILL_START or _END."""
        s.computed = loaded
        s.status = _PREFILLING
        s.started_prefill = True
        s.prefilled = 0
        r.prefilling[s.admit_seq] = s
        r.pending_prefill += s.target - loaded

    def clear_prefix_cache(self) -> None:
        for r in self.ranks:
            r.kv.clear_cache()

    def cache_prefix(self, rank: int, trajectory_id: int, tokens: int) -> None:
        """Place a trajectory's prefix in a rank's cache (a run continued from an observed state);
        `fit_caches` then evicts what does not fit."""
        self.ranks[rank].kv.cache_prefix(trajectory_id, tokens)

    def fit_caches(self) -> None:
        for r in self.ranks:
            r.kv.evict_until(0)

    @property
    def idle(self) -> bool:
        return all(not r.running and not r.waiting for r in self.ranks)

    def decoding(self) -> Iterator[tuple[int, int]]:
        """(trajectory id, output tokens generated as of the last step applied) of each request decoding."""
        for r in self.ranks:
            for s in r.running.values():
                if s.status is _DECODING:
                    yield s.request.trajectory_id, r.generated(s)

    def totals(self) -> tuple[int, int, int, int, int, int]:
        """Waiting requests, prefill tokens pending, running requests, decoding requests, KV tokens in
        use and KV tokens of waiting requests, over the ranks."""
        waiting = pending = running = decoding = used = queued = 0
        for r in self.ranks:
            waiting += len(r.waiting)
            pending += r.pending_prefill
            running += len(r.running)
            decoding += r.decode_n
            used += r.kv.used
            queued += r.waiting_kv
        return waiting, pending, running, decoding, used, queued

    # --- admission ----------------------------------------------------------------------------
    def _admit(self, r: Rank, outputs: list) -> None:
        kv = r.kv
        block = self.cfg.prefix_block_tokens
        while r.waiting and len(r.running) < self.cfg.max_num_seqs:
            s = r.waiting[0]
            tid = s.request.trajectory_id
            hit = kv.take_prefix(tid)
            if s.leg is Leg.DECODE and not s.recompute:
                need = s.request.prompt_tokens + s.resumed
                local = min(hit, need)
            else:
                need = s.target
                local = min(hit, need - 1)
            local -= local % block   # vLLM hits whole blocks: the rest of the last one is computed again
            if not kv.allocate(need):
                if hit:
                    kv.put_back_prefix(tid, hit)
                return
            r.waiting.popleft()
            r.waiting_kv -= need
            self._admit_counter += 1
            s.admit_seq = self._admit_counter
            s.kv_held = need
            s.computed = local
            r.running[s.admit_seq] = s
            if s.leg is Leg.DECODE and not s.recompute:
                s.status = _TRANSFERRING
                s.target = need
                tb = self.cfg.transfer_block_tokens
                if tb > 1 and not s.resumed:
                    # A connector that moves whole blocks loads the prompt but its last token up to a
                    # block boundary (vLLM's ExampleConnector: align_to_block_size(len(prompt) - 1)); the
                    # rank prefills the rest itself once the transfer ends. ExampleConnector stores
                    # align_to_block_size(len(prompt)) tokens under a hash of them, so when the prompt is
                    # one token past a block boundary the two lengths differ and the load finds nothing.
                    external = (need - 2) // tb * tb if (need - 1) % tb else 0
                    pull = max(external - local, 0)
                else:
                    # a moved decode's last sampled token has no KV yet (its next step computes it)
                    pull = max(need - local - (1 if s.resumed else 0), 0)
                if pull or s.resumed:
                    outputs.append(PullKV(s, pull))
                else:
                    # Nothing to load: the connector starts no transfer (vLLM's ExampleConnector and
                    # NixlConnector load only when get_num_new_matched_tokens finds external tokens) and
                    # the leg prefills what its own cache lacks, from this step on, the last prompt token
                    # at least (vLLM computes it again to sample the first token).
                    outputs.append(Report(EventKind.TRANSFER_END, s))
                    self._prefill_rest(r, s, min(local, need - 1))
            else:
                s.status = _PREFILLING
                r.prefilling[s.admit_seq] = s
                s.prefilled = 0
                r.pending_prefill -= local

    def _join_decode(self, r: Rank, s: SimRequest, generated: int) -> None:
        s.status = _DECODING
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
    def _preempt(self, r: Rank, s: SimRequest, outputs: list) -> None:
        held = r.held(s)                    # KV reserved on the rank
        dropped = s.computed if s.status is _PREFILLING else held   # KV actually computed
        # Recomputed: tokens the recompute will prefill that were computed or sampled before (when
        # decoding, the last sampled token has no KV yet and is prefilled with the others, as vLLM does).
        recomputed = dropped + (1 if s.status is _DECODING else 0)
        # A decode leg prefilling the rest of a whole-block transfer drops its whole prompt, as a READY
        # one does; the rest it prefilled was never counted as a prefill leg's work.
        tail = s.status is _PREFILLING and s.leg is Leg.DECODE and not s.recompute
        if tail:
            recomputed = s.target
        if s.status is _DECODING:
            s.generated = r.generated(s)
            r.next_finish = None    # its heap entry is stale now
            r.decode_n -= 1
            r.decode_ctx -= held
            if s in r.first_token_due:
                r.first_token_due.remove(s)
        elif s.status is _READY:
            r.ready.remove(s)
        extra = 0
        if s.status is _PREFILLING:
            del r.prefilling[s.admit_seq]
            extra = 0 if tail else s.prefilled
            r.pending_prefill -= s.target - s.computed
        r.kv.release(held)
        del r.running[s.admit_seq]
        s.kv_held = 0
        s.status = _WAITING
        s.recompute = True
        s.started_prefill = True
        s.target = s.request.prompt_tokens + s.generated
        s.computed = 0
        s.prefilled = 0
        r.pending_prefill += s.target
        r.waiting_kv += s.target
        r.waiting.appendleft(s)
        outputs.append(Report(EventKind.PREEMPTED, s, recomputed, extra))

    def _reserve_decode_slots(self, r: Rank, outputs: list) -> None:
        while r.decode_n and not r.kv.evict_until(r.decode_n):
            victim = next(x for x in reversed(r.running.values()) if x.status is not _TRANSFERRING)
            if victim.status is _DECODING and r.held(victim) + 1 > r.kv.capacity:
                raise ValueError(f"trajectory {victim.trajectory_id}: its context alone exceeds the KV "
                                 f"memory of a rank of engine {self.engine_id} ({r.kv.capacity} tokens)")
            self._preempt(r, victim, outputs)

    # --- the step -----------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """The next step: decode slots reserved, waiting requests admitted, prefill chunks chosen (or
        a span of decode-only steps). `plan.idle`: nothing can run until a request arrives or a KV
        transfer ends."""
        cfg = self.cfg
        max_seqs = cfg.max_num_seqs
        admit = self._admits_beside_decodes
        outputs: list = []
        span = cfg.fast_forward             # while no rank so far rules out a fast-forward span
        steps = None                        # decode steps no rank so far can interrupt
        decoding = self._all_decode         # per rank: does it decode in this step (copied before a change)
        seqs, ctx = [], []                  # per rank: this step's decoding sequences and their context
        for i, r in enumerate(self.ranks):
            kv = r.kv
            if r.ready:
                for s in r.ready:
                    # The first decode step re-feeds the last prompt token (its KV is recomputed on the
                    # decode side, as vLLM's connectors do), so the context grows from prompt - 1.
                    s.kv_held -= 1
                    kv.release(1)
                    self._join_decode(r, s, generated=s.resumed)
                    if not s.decode_started:
                        s.decode_started = True
                        outputs.append(Report(EventKind.DECODE_START, s))
                r.ready.clear()
            if self._prefills_alone(r, outputs):
                if decoding is self._all_decode:
                    decoding = list(decoding)
                decoding[i] = False
                seqs.append(0)
                ctx.append(0)
                span = False
                continue
            # Running requests get their decode slot first, then new ones are admitted.
            n = r.decode_n
            if n and not kv.allocate(n):   # a slot per decoding sequence, evicting prefixes if need be
                self._reserve_decode_slots(r, outputs)   # else preempt until the rest fit
                n = r.decode_n
                kv.grow(n)
            if r.waiting and admit:
                self._admit(r, outputs)
            seqs.append(n)
            ctx.append(r.decode_ctx)
            if span:   # how many decode steps nothing inside the engine can interrupt
                if r.first_token_due or r.prefilling or (r.waiting and len(r.running) < max_seqs):
                    span = False   # (a waiting head blocked only by memory stays blocked: spans free none)
                elif n:
                    # this step's slots are reserved; later steps may use free memory and the cache
                    k = (r.next_finish if r.next_finish is not None else r.finish_clock()) - r.decode_clock
                    k2 = 1 + (kv.capacity - kv.used) // n
                    if k2 < k:
                        k = k2
                    if steps is None or k < steps:
                        steps = k
        limit = cfg.cuda_graph_max_bs
        plan = StepPlan(outputs, seqs, ctx, decoding, graph=not limit or max(seqs) <= limit)
        if span and steps is not None and steps >= 2:
            plan.span_steps = steps
            self._span_reserved = 1      # its first step's slots, as above
            return plan
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
                    attn_ctx += prefill_attn_ctx(c, p)
                    kv_read += p + c
                    requests += 1
                    rank_chunks.append((s, c))
                    if not s.started_prefill:
                        s.started_prefill = True
                        outputs.append(Report(EventKind.PREFILL_START, s, s.computed))
                if tokens:
                    plan.prefill.append((len(plan.chunks), tokens, attn_ctx, kv_read, requests))
            plan.chunks.append(rank_chunks)
        return plan

    def _prefills_alone(self, r: Rank, outputs: list) -> bool:
        """Whether rank `r`'s step is a prefill batch its decodes wait out. vLLM: never (each step gives
        every decoding sequence its token, then fills the token budget with prefill chunks)."""
        return False

    def update_from_output(self, plan: StepPlan, steps: int = 1) -> Iterator[Report | HandOff]:
        """Apply a finished step (or the first `steps` steps of a span): decode progress, prefill chunks
        done. Yields what it produces, in order, as it goes (reports of first tokens, prefill and decode
        ends; hand-offs of finished prefill legs), so the backend acts on each before the next rank
        is applied, as the engine did when it reported them itself: the driver may route a new turn on
        a report, and delivering a step's reports only after the whole step moved async runs (three
        steps of shift_reason_browse_kvboth: 302.1 -> 333.0 s) where the reshaping must move none."""
        if plan.span_steps:
            for r in self.ranks:
                n = r.decode_n
                if not n:
                    continue
                r.decode_clock += steps
                r.decode_ctx += steps * n
                r.kv.grow((steps - self._span_reserved) * n)
                if r.next_finish is None or r.next_finish <= r.decode_clock:
                    yield from self._finish_decodes(r)
            self._span_reserved = 0
            return
        for r, rank_chunks, decoded in zip(self.ranks, plan.chunks, plan.decoding):
            if r.decode_n and decoded:
                r.decode_clock += 1
                r.decode_ctx += r.decode_n
                if r.first_token_due:
                    for s in r.first_token_due:
                        yield Report(EventKind.FIRST_TOKEN, s)
                    r.first_token_due.clear()
                if r.next_finish is None or r.next_finish <= r.decode_clock:
                    yield from self._finish_decodes(r)
            for s, c in rank_chunks:
                if s.status is not _PREFILLING:
                    continue  # preempted since
                s.computed += c
                s.prefilled += c
                r.pending_prefill -= c
                if s.computed == s.target:
                    yield from self._prefill_done(r, s)

    def _prefill_done(self, r: Rank, s: SimRequest) -> Iterator[Report | HandOff]:
        del r.prefilling[s.admit_seq]
        if s.leg is not Leg.DECODE or s.recompute:   # (else a decode leg's rest of its prompt: _prefill_rest)
            yield Report(EventKind.PREFILL_END, s, s.prefilled)
        if s.leg is Leg.DECODE and not s.decode_started:
            s.decode_started = True
            yield Report(EventKind.DECODE_START, s)
        if s.leg is Leg.PREFILL:
            del r.running[s.admit_seq]
            r.kv.release(s.kv_held)
            r.kv.cache_prefix(s.trajectory_id, s.kv_held)
            s.kv_held = 0
            yield HandOff(s)
            return
        generated = s.generated + 1          # the prefill step samples a token
        if s.generated == 0:
            yield Report(EventKind.FIRST_TOKEN, s)
            if s.leg is Leg.FULL:
                yield Report(EventKind.DECODE_START, s)
        self._join_decode(r, s, generated)
        if generated >= s.request.output_tokens:
            yield from self._finish_decodes(r)

    def _finish_decodes(self, r: Rank) -> Iterator[Report]:
        heap = r.finish_heap
        r.next_finish = None
        while heap and heap[0][0] <= r.decode_clock:
            entry: tuple[int, int, SimRequest] = heapq.heappop(heap)
            seq, s = entry[1], entry[2]
            if s.status is not _DECODING or r.running.get(seq) is not s:
                continue  # stale entry of a preempted request
            held = s.kv_held + r.decode_clock - s.clock0
            r.decode_n -= 1
            r.decode_ctx -= held
            r.kv.release(held)
            del r.running[seq]
            s.status = _DONE
            r.kv.cache_prefix(s.request.trajectory_id, held)
            yield Report(EventKind.DECODE_END, s, s.request.output_tokens)


@mypyc_attr(serializable=True, allow_interpreted_subclasses=True)
class SGLangScheduler(Scheduler):
    """SGLang's step semantics (python/sglang/srt/managers/scheduler.py, `get_next_batch_to_run`):
    prefill first. A rank that can form a prefill batch runs it and its decodes pause for that step,
    unless `--enable-mixed-chunk` lets them ride along (the step then is vLLM's: decode slots first)."""

    def __init__(self, engine_id: int, cfg: SchedulerConfig, capacity: int, ranks: int):
        super().__init__(engine_id, cfg, capacity, ranks)
        self._admits_beside_decodes = cfg.mixed_chunk

    def _prefills_alone(self, r: Rank, outputs: list) -> bool:
        if self.cfg.mixed_chunk:
            return False
        if r.waiting:
            self._admit(r, outputs)
        return bool(r.prefilling)


# Each engine's step semantics (`cluster.engine`): a third engine's is one more subclass here.
SCHEDULERS: dict[str, type[Scheduler]] = {"vllm": Scheduler, "sglang": SGLangScheduler}
