"""The per-rank KV cache manager (harness/sim/kv_cache.py): known answers computed by hand."""
from __future__ import annotations

from harness.sim.kv_cache import KVCacheManager


def test_a_reused_prefix_counts_once():
    """1,500 tokens, 1,300 reserved, trajectory 7's 100-token prefix cached. Its next turn needs 300
    tokens of which the 100 cached: taking the prefix frees 100 (200 free), so 300 do not fit and the
    request must wait (or something be preempted). Counting the prefix as both freed and reused
    would reserve 1,600 tokens on a 1,500-token rank."""
    kv = KVCacheManager(capacity=1500, used=1300)
    kv.cache_prefix(7, 100)
    assert kv.free == 100
    assert kv.take_prefix(7) == 100 and kv.free == 200
    assert not kv.allocate(300) and kv.used == 1300
    assert kv.allocate(200) and kv.used == 1500 and kv.free == 0


def test_eviction_is_least_recently_cached_first_and_a_put_back_prefix_goes_first():
    kv = KVCacheManager(capacity=1000)
    for tid, tokens in ((1, 300), (2, 300), (3, 300)):
        kv.cache_prefix(tid, tokens)
    assert kv.take_prefix(3) == 300
    kv.put_back_prefix(3, 300)           # admission failed: the prefix returns, first to evict
    assert kv.allocate(350)              # 100 free: evicts 3 (now oldest), then 300 + 100 >= 350
    assert list(kv.cache) == [1, 2] and kv.used == 350 and kv.free == 50
    assert kv.allocate(300)              # evicts 1
    assert list(kv.cache) == [2] and kv.free == 50
    assert not kv.allocate(400) and kv.cache == {} and kv.used == 650   # evicted 2, still short
    kv.grow(400)                          # decode wrote past capacity: nothing left to evict
    assert kv.used == 1050


def test_prefix_holders_are_shared_by_the_ranks_of_an_engine():
    holders: dict[int, int] = {}
    r0, r1 = KVCacheManager(1000, holders, 1), KVCacheManager(1000, holders, 2)
    r0.cache_prefix(5, 10)
    r1.cache_prefix(5, 20)
    assert holders == {5: 3}
    r0.clear_cache()
    assert holders == {5: 2}
    assert r1.take_prefix(5) == 20 and holders == {}
