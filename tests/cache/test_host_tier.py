"""The host tier's bookkeeping through the DocumentCache (no data: every copy lands at once), with hand-computed
page ids, refcounts and LRU orders, and the page mover's copies on the CPU against plain indexing."""

import pytest
import torch

from lazyattn.cache.document_cache import DocumentCache, Segment
from lazyattn.cache.host_tier import HostTier
from lazyattn.cache.kv_transfer import PageMover, _runs
from lazyattn.cache.page_pool import PagePool, allocate_kv
from lazyattn.errors import OutOfPagesError

PAGE = 4
PAGE_BYTES = 100


def make(gpu_pages: int = 4, host_pages: int = 4) -> tuple[DocumentCache, HostTier]:
    tier = HostTier(host_pages, PAGE_BYTES)
    return DocumentCache(PagePool(gpu_pages), PAGE, tier), tier


def cached(cache: DocumentCache, key: str, n_tokens: int = 8) -> Segment:
    seg, new = cache.acquire(key, n_tokens)
    assert new
    cache.mark_ready(seg)
    cache.release(seg)
    return seg


def test_eviction_demotes_and_a_host_hit_promotes_into_fresh_pages():
    cache, tier = make()
    a = cached(cache, "A")  # GPU pages 0, 1
    cached(cache, "B")  # GPU pages 2, 3; LRU: A, B
    c, new = cache.acquire("C", 8)  # evicts A (oldest): demoted to host pages 0, 1
    assert new and c.pages == (0, 1) and cache.lookup("A") is None and cache.contains("A")
    assert not a.cached and tier.stats().demotions == 1 and tier.stats().pages_used == 2
    cache.mark_ready(c)
    cache.release(c)  # LRU: B, C
    a2, new = cache.acquire("A", 8)  # a hit on the host: evicts B (GPU pages 2, 3) to host pages 2, 3
    assert not new and not a2.ready and a2.refcount == 2 and a2.pages == (2, 3)
    assert cache.lookup("B") is None and tier.contains("B") and not tier.contains("A")
    assert tier.stats().pages_used == 4  # A's host pages are still read by its promotion
    assert cache.poll() == 1
    assert a2.ready and a2.refcount == 1 and tier.stats().pages_used == 2 and tier.pool.num_free == 2
    s = cache.stats()
    assert (s.lookups, s.hits, s.host_hits, s.gpu_hits, s.misses, s.evictions) == (4, 1, 1, 0, 3, 2)
    assert s.tokens_reused == 8
    t = tier.stats()
    assert (t.hits, t.promotions, t.demotions, t.bytes_to_host, t.bytes_to_device) == (1, 1, 2, 400, 200)
    cache.release(a2)
    assert cache.evictable_pages() == 4 and cache.pool.num_free == 0  # C and A, LRU order C, A
    b, new = cache.acquire("B", 8)  # evicts C to host pages 0, 1 (A's, freed by the landed promotion)
    assert not new and b.pages == (0, 1) and tier._index["C"].pages == (0, 1)


def test_host_lru_evicts_the_oldest_demotion():
    cache, tier = make(gpu_pages=2, host_pages=4)
    for key in "ABC":  # each evicts the previous: host holds A, then A B, then B C
        cached(cache, key)
    cached(cache, "D")
    assert [tier.contains(k) for k in "ABC"] == [False, True, True]
    assert tier.stats().evictions == 1 and len(tier) == 2
    seg, new = cache.acquire("A", 8)  # gone from both tiers: encoded again
    assert new and cache.stats().host_hits == 0


def test_promotion_keeps_its_own_reference_through_an_abort():
    cache, tier = make()
    cached(cache, "A")
    cached(cache, "B")
    cached(cache, "C")  # A demoted
    a, _ = cache.acquire("A", 8)
    cache.release(a)  # the request went away before the copy landed
    assert a.refcount == 1 and a.cached and cache.evictable_pages() == 2  # only C: A is held by its copy
    assert cache.promoting == 1
    cache.poll()
    assert a.refcount == 0 and a.ready and cache.evictable_pages() == 4 and cache.promoting == 0
    assert cache.stats().pages_in_use == 4 and tier.pool.num_used == 2  # B's host copy; A's host pages freed


def test_a_promotion_that_cannot_get_pages_changes_nothing():
    cache, tier = make()
    cached(cache, "A")
    held = [cache.acquire(k, 8)[0] for k in "BC"]  # evicts A; B and C stay referenced
    before, tier_before = cache.stats(), tier.stats()
    with pytest.raises(OutOfPagesError, match="host memory"):
        cache.acquire("A", 8)
    assert tier.contains("A") and cache.stats() == before and tier.stats() == tier_before
    for seg in held:
        cache.abort(seg)
        cache.release(seg)
    a, new = cache.acquire("A", 8)
    assert not new and cache.poll() == 1 and a.ready


def test_too_large_for_the_tier_is_dropped_and_remove_forgets_host_copies():
    cache, tier = make(gpu_pages=6, host_pages=2)
    cached(cache, "big", 12)  # 3 pages: never fits 2 host pages
    cached(cache, "A")
    cache.acquire("X", 12)  # evicts big (dropped) then... big alone frees 3 of the 3 needed
    assert tier.stats().dropped == 1 and not cache.contains("big")
    cache.acquire("Y", 8)  # evicts A: demoted
    assert tier.contains("A") and cache.remove("A") and not cache.contains("A") and tier.pool.num_free == 2
    assert not cache.remove("A")


def test_token_count_mismatch_on_the_host_is_refused():
    cache, _ = make()
    cached(cache, "A")
    cached(cache, "B")
    cached(cache, "C")
    with pytest.raises(ValueError, match="8 tokens"):
        cache.acquire("A", 7)


def test_set_capacity_withholds_pages_and_zero_turns_the_tier_off():
    cache, tier = make(gpu_pages=2, host_pages=4)
    tier.set_capacity(0)
    cached(cache, "A")
    cached(cache, "B")
    assert tier.stats().dropped == 1 and tier.stats().num_pages == 0 and not cache.contains("A")
    tier.set_capacity(None)
    cached(cache, "C")
    assert tier.contains("B") and tier.stats().num_pages == 4


def test_the_pool_grows_a_chunk_at_a_time_up_to_the_capacity():
    tier = HostTier(5, PAGE_BYTES, chunk_pages=2)
    cache = DocumentCache(PagePool(2), PAGE, tier)  # the GPU holds one 2-page document
    assert tier.stats().locked_pages == 0 and tier.num_pages == 5
    cached(cache, "A")
    cached(cache, "B")  # demotes A: the first chunk, host pages 0-1
    assert tier._index["A"].pages == (0, 1) and tier.stats().locked_pages == 2
    cached(cache, "C")  # demotes B: the second chunk
    assert tier._index["B"].pages == (2, 3) and tier.stats().locked_pages == 4
    cached(cache, "D")  # demotes C: the last chunk is 1 page (capacity 5); A, the oldest, is evicted for room
    s = tier.stats()
    assert s.locked_pages == 5 and s.evictions == 1 and not tier.contains("A")
    assert tier._index["C"].pages == (0, 1) and s.pages_used == 4


def test_a_grown_pool_hands_out_its_free_pages_before_the_new_chunk():
    pool = PagePool(3)
    assert pool.allocate(2) == [0, 1]
    pool.free([0])
    pool.grow(2)
    assert pool.num_pages == 5 and pool.num_free == 4
    assert pool.allocate(3) == [0, 2, 3]
    assert pool.is_used(3) and not pool.is_used(4)
    with pytest.raises(ValueError, match="grow"):
        pool.grow(-1)


def test_set_capacity_below_the_grown_pool_withholds_and_stops_growth():
    tier = HostTier(6, PAGE_BYTES, chunk_pages=2)
    cache = DocumentCache(PagePool(2), PAGE, tier)
    for key in "ABCD":
        cached(cache, key)  # three demotions: grown to 6 pages
    assert tier.stats().locked_pages == 6
    tier.set_capacity(3)
    assert tier.num_pages == 3 and tier.stats().locked_pages == 3 and len(tier) == 0
    for key in "EFG":
        cached(cache, key)  # D, E, F demoted into 3 pages: one 2-page document at a time, D and E evicted
    s = tier.stats()
    assert len(tier) == 1 and tier.contains("F") and s.evictions == 2 and s.pages_used == 2
    with pytest.raises(ValueError, match="does not fit"):
        tier.set_capacity(7)
    tier.set_capacity(None)
    assert tier.num_pages == 6 and tier.stats().locked_pages == 6


# -- the page mover ---------------------------------------------------------------------------------------------


def test_runs_groups_consecutive_page_ids():
    assert _runs([4, 5, 6, 2, 9, 10]) == [(0, 3, 4), (3, 1, 2), (4, 2, 9)]
    assert _runs([]) == []
    assert _runs([2, 3, 4, 5, 9], chunk=4) == [(0, 2, 2), (2, 2, 4), (4, 1, 9)]  # 3 -> 4 crosses a chunk


@pytest.mark.parametrize("layout", ["token", "head"])
def test_page_mover_round_trip_on_the_cpu(layout):
    torch.manual_seed(0)
    kv = allocate_kv(3, 8, PAGE, 2, 5, torch.float32, "cpu", layout)  # [layers, 2, pages, page_size, heads, head_dim]
    kv.copy_(torch.randn(kv.shape))
    original = kv.clone()
    mover = PageMover(kv, 4)
    assert mover.page_bytes == 3 * 2 * PAGE * 2 * 5 * 4
    t = mover.to_host([6, 1, 2], [3, 0, 1])
    assert mover.done(t) and t.nbytes == 3 * mover.page_bytes
    for device_page, host_page in ((6, 3), (1, 0), (2, 1)):
        assert torch.equal(mover.host_kv[host_page], original[:, :, device_page])
    mover.to_device([1, 3], [7, 4])  # host 1 (= GPU page 2) into 7, host 3 (= GPU page 6) into 4
    expected = original.clone()
    expected[:, :, 7] = original[:, :, 2]
    expected[:, :, 4] = original[:, :, 6]
    assert torch.equal(kv, expected)


def test_default_size_is_off_on_the_cpu_and_a_capped_quarter_of_host_memory_on_cuda(monkeypatch):
    from lazyattn.cache import host_tier

    monkeypatch.setattr(host_tier, "_available_host_bytes", lambda: 100 * 2**30)
    assert host_tier.default_host_bytes("cpu") == 0
    assert host_tier.default_host_bytes("cuda") == 25 * 2**30
    monkeypatch.setattr(host_tier, "_available_host_bytes", lambda: 400 * 2**30)
    assert host_tier.default_host_bytes("cuda") == 64 * 2**30
