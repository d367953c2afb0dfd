"""The KV memory of one data-parallel attention rank: tokens reserved by running requests and a prefix
cache of finished turns' contexts, evicted least recently used first.

As vLLM v1's KVCacheManager, it owns the memory and answers whether a request fits: `allocate` returns
False when even an empty prefix cache would not make room, and the scheduler then preempts. Memory is
counted in tokens (a rank's capacity comes from the cost model: free HBM / KV bytes per token), not in
blocks: the simulator's step times do not depend on the block size.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from mypy_extensions import mypyc_attr


@mypyc_attr(serializable=True, allow_interpreted_subclasses=True)
@dataclass(slots=True)
class KVCacheManager:
    capacity: int                   # tokens of KV memory on the rank
    # Which ranks of the engine cache each trajectory's prefix (trajectory_id -> bit mask of rank
    # indices), shared by the engine's ranks, so a leg finds its rank without probing every cache.
    holders: dict = field(default_factory=dict)
    bit: int = 1                    # this rank's bit in `holders`
    used: int = 0                   # tokens reserved by running requests
    cache: OrderedDict = field(default_factory=OrderedDict)   # trajectory_id -> tokens, LRU first
    cache_tokens: int = 0

    @property
    def free(self) -> int:
        return self.capacity - self.used - self.cache_tokens

    def allocate(self, tokens: int) -> bool:
        """Reserve `tokens`, evicting prefixes if need be; False, and nothing reserved, when even an empty
        cache leaves too little. A request that reuses its own cached prefix takes it out of the cache
        first (`take_prefix`), which frees those tokens: they count once, in `tokens`. (The free-memory
        test is written out: this runs for every rank in every step.)"""
        if self.capacity - self.used - self.cache_tokens < tokens and not self.evict_until(tokens):
            return False
        self.used += tokens
        return True

    def grow(self, tokens: int) -> None:
        """Decoding sequences wrote `tokens` more; prefixes that no longer fit are evicted."""
        self.used += tokens
        if self.capacity - self.used - self.cache_tokens < 0:
            self.evict_until(0)

    def release(self, tokens: int) -> None:
        self.used -= tokens

    def evict_until(self, need: int) -> bool:
        """Evict prefixes, oldest first, until `need` tokens are free; whether they are."""
        while self.free < need and self.cache:
            tid, tokens = self.cache.popitem(last=False)
            self.cache_tokens -= tokens
            self._forget(tid)
        return self.free >= need

    def cache_prefix(self, trajectory_id: int, tokens: int) -> None:
        """A turn ended here: its context stays cached for the trajectory's next turn."""
        old = self.cache.pop(trajectory_id, 0)
        self.cache_tokens += tokens - old
        self.cache[trajectory_id] = tokens
        self.holders[trajectory_id] = self.holders.get(trajectory_id, 0) | self.bit

    def take_prefix(self, trajectory_id: int) -> int:
        """Remove the trajectory's cached prefix; its tokens (0 if none)."""
        hit = self.cache.pop(trajectory_id, None)
        if hit is None:
            return 0
        self.cache_tokens -= hit
        self._forget(trajectory_id)
        return hit

    def put_back_prefix(self, trajectory_id: int, tokens: int) -> None:
        """Undo `take_prefix` (admission could not get memory): the prefix returns, first to evict."""
        self.cache[trajectory_id] = tokens
        self.cache.move_to_end(trajectory_id, last=False)
        self.cache_tokens += tokens
        self.holders[trajectory_id] = self.holders.get(trajectory_id, 0) | self.bit

    def clear_cache(self) -> None:
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
