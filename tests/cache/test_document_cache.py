import hashlib
import random
import struct

import pytest

from lazyattn.cache.document_cache import CacheStats, DocumentCache, Segment, SegmentKeyer, segment_key
from lazyattn.cache.page_pool import PagePool
from lazyattn.errors import OutOfPagesError

PAGE = 4


def make(num_pages: int = 16) -> DocumentCache:
    return DocumentCache(PagePool(num_pages), PAGE)


def ready(cache: DocumentCache, key: str, n_tokens: int) -> Segment:
    seg, new = cache.acquire(key, n_tokens)
    assert new
    cache.mark_ready(seg)
    return seg


def cached_unreferenced(cache: DocumentCache, key: str, n_tokens: int) -> Segment:
    seg = ready(cache, key, n_tokens)
    cache.release(seg)
    return seg


# -- keys ----------------------------------------------------------------------------------------------

BASE = dict(
    model_fingerprint="llama-3.1-8b@abc",
    rope_fingerprint="rope:500000",
    salt="tenant-a",
    token_ids=[1, 2, 3],
    parent=None,
)


def test_key_is_deterministic_hex_and_ignores_the_container_type():
    k = segment_key(**BASE)
    assert len(k) == 64 and int(k, 16) >= 0
    assert segment_key(**{**BASE, "token_ids": (1, 2, 3)}) == k
    assert segment_key(**{**BASE, "token_ids": range(1, 4)}) == k
    assert segment_key("llama-3.1-8b@abc", "rope:500000", "tenant-a", [1, 2, 3]) == k


@pytest.mark.parametrize(
    "change",
    [
        {"model_fingerprint": "llama-3.1-8b@abd"},
        {"rope_fingerprint": "rope:10000"},
        {"salt": "tenant-b"},
        {"salt": None},
        {"salt": ""},
        {"token_ids": [1, 2, 4]},
        {"token_ids": [3, 2, 1]},
        {"token_ids": [1, 2, 3, 0]},
        {"token_ids": [1, 2]},
        {"token_ids": [1, 2, 3 + (1 << 32)]},
        {"parent": "0" * 64},
        {"parent": ""},
    ],
)
def test_key_depends_on_each_field(change):
    assert segment_key(**{**BASE, **change}) != segment_key(**BASE)


def test_key_field_boundaries_are_unambiguous():
    assert segment_key("ab", "c", None, [1]) != segment_key("a", "bc", None, [1])
    assert segment_key("m", "r", "s", [1]) != segment_key("m", "r", None, [1], parent="s")
    assert segment_key("m", "r", None, []) != segment_key("m", "r", "", [])


def test_parent_chains_page_keys():
    k1 = segment_key("m", "r", None, [1, 2])
    k2 = segment_key("m", "r", None, [3, 4], parent=k1)
    other_first = segment_key("m", "r", None, [9, 9])
    assert k2 != segment_key("m", "r", None, [3, 4], parent=other_first)
    assert k2 == segment_key("m", "r", None, [3, 4], parent=k1)


def _expected_key(model: str, rope: str, salt: str | None, ids: list[int], parent: str | None, width: int) -> str:
    """The documented layout, written out by hand: version, four length-prefixed string fields (a 0 byte for
    None), the id count (8 bytes LE), the width byte, the ids as LE int32 or int64."""

    def field(s):
        return b"\x00" if s is None else b"\x01" + struct.pack("<Q", len(s.encode())) + s.encode()

    body = b"".join(struct.pack("<i" if width == 4 else "<q", t) for t in ids)
    blob = (
        b"lazyattn-segment-key-v2\x00"
        + field(model)
        + field(rope)
        + field(salt)
        + field(parent)
        + struct.pack("<Q", len(ids))
        + bytes([width])
        + body
    )
    return hashlib.sha256(blob).hexdigest()


@pytest.mark.parametrize(
    "ids, width", [([1, 2, 3], 4), ([128000, 0, -5, 2**31 - 1], 4), ([1, 2**31], 8), ([-(2**31) - 1], 8), ([], 4)]
)
def test_key_matches_its_documented_byte_layout(ids, width):
    assert segment_key("m@1", "rope:500000", "t", ids, None) == _expected_key(
        "m@1", "rope:500000", "t", ids, None, width
    )
    assert segment_key("m@1", "r", None, ids, "p" * 64) == _expected_key("m@1", "r", None, ids, "p" * 64, width)


def test_int32_and_int64_encodings_never_collide():
    # -1 as int32 and 2**32 - 1 as int64 start with the same four bytes; ids on either side of the int32 range.
    assert segment_key("m", "r", None, [-1]) != segment_key("m", "r", None, [2**32 - 1])
    assert segment_key("m", "r", None, [2**31 - 1]) != segment_key("m", "r", None, [2**31])
    assert segment_key("m", "r", None, [7, 2**40]) != segment_key("m", "r", None, [7, 2**40 + 1])


def test_keyer_equals_segment_key_and_rejects_non_int64_ids():
    keyer = SegmentKeyer("llama-3.1-8b@abc", "rope:500000")
    rng = random.Random(0)
    for n in (0, 1, 31, 2048):
        ids = [rng.randrange(0, 128256) for _ in range(n)]
        for salt, parent in ((None, None), ("tenant-a", None), (None, "0" * 64), ("", "")):
            assert keyer(ids, salt, parent) == segment_key("llama-3.1-8b@abc", "rope:500000", salt, ids, parent)
            assert keyer(tuple(ids), salt, parent) == keyer(ids, salt, parent)  # the hash state is copied, not reused
    assert keyer([1, 2], None) != SegmentKeyer("llama-3.1-8b@abd", "rope:500000")([1, 2], None)
    for bad in ([2**63], [1.5], ["1"]):
        with pytest.raises(struct.error):
            keyer(bad, None)


def test_key_memo_gives_the_computed_key_and_never_a_stale_one():
    keyer = SegmentKeyer("m", "r", memo_tokens=4 * 2048)
    rng = random.Random(1)
    doc = [rng.randrange(0, 128256) for _ in range(2048)]
    first = keyer(doc, None)
    assert first == segment_key("m", "r", None, doc) and len(keyer.memo) == 1
    assert keyer(list(doc), None) == first and keyer.memo.hits == 1  # a copy of the list: a hit
    assert keyer([int(str(t)) for t in doc], None) == first  # fresh int objects of equal value: a hit too
    assert keyer(doc, "tenant") == segment_key("m", "r", "tenant", doc) != first  # the salt is part of the slot
    # The same sampled ids (every 64th), another id in between: the slot's copy differs, so the key is computed.
    other = list(doc)
    other[1] += 1
    assert other[:: 2048 // 32] == doc[:: 2048 // 32]
    assert keyer(other, None) == segment_key("m", "r", None, other) != first
    assert keyer(doc, None) == first
    doc[5] += 1  # the caller changes its list after keying it: the memo holds its own copy
    assert keyer(doc, None) == segment_key("m", "r", None, doc) != first


def test_key_memo_is_bounded_least_recently_used_first():
    keyer = SegmentKeyer("m", "r", memo_tokens=3 * 1000)
    docs = [[i * 10_000 + j for j in range(1000)] for i in range(5)]
    for d in docs[:3]:
        keyer(d, None)
    keyer(docs[0], None)  # docs[0] is now the most recently used
    keyer(docs[3], None)  # evicts docs[1]
    assert keyer.memo.tokens <= 3000 and len(keyer.memo) == 3
    hits = keyer.memo.hits
    keyer(docs[0], None)
    keyer(docs[2], None)
    assert keyer.memo.hits == hits + 2
    keyer(docs[1], None)  # a miss: computed, and correct
    assert keyer.memo.hits == hits + 2 and keyer(docs[1], None) == segment_key("m", "r", None, docs[1])
    off = SegmentKeyer("m", "r", memo_tokens=0)
    assert off(docs[4], None) == segment_key("m", "r", None, docs[4]) and len(off.memo) == 0
    short = [7] * 100  # below the memo's minimum: never held
    assert keyer(short, None) == segment_key("m", "r", None, short) and keyer.memo.tokens <= 3000
    assert all(len(ids) == 1000 for ids, _ in keyer.memo._slots.values())


# -- acquire / release ---------------------------------------------------------------------------------


def test_miss_allocates_whole_pages_then_hit_shares_them():
    cache = make()
    for n, pages in ((1, 1), (PAGE, 1), (PAGE + 1, 2), (3 * PAGE, 3)):
        seg, new = cache.acquire(f"k{n}", n)
        assert new and len(seg.pages) == pages and seg.refcount == 1 and not seg.ready
    a, _ = cache.acquire("doc", 5)
    cache.mark_ready(a)
    b, new = cache.acquire("doc", 5)
    assert not new and b is a and a.refcount == 2
    assert cache.lookup("doc") is a and cache.lookup("nope") is None
    assert cache.stats().pages_in_use == 9 == cache.pool.num_used


def test_acquire_rejects_wrong_length_and_empty_segments():
    cache = make()
    ready(cache, "a", 5)
    with pytest.raises(ValueError):
        cache.acquire("a", 6)
    with pytest.raises(ValueError):
        cache.acquire("empty", 0)
    assert cache.stats().lookups == 1


def test_release_at_zero_keeps_ready_segment_cached_and_evictable():
    cache = make()
    seg = cached_unreferenced(cache, "a", 9)
    assert seg.refcount == 0 and cache.lookup("a") is seg and cache.evictable_pages() == 3
    again, new = cache.acquire("a", 9)
    assert again is seg and not new and cache.evictable_pages() == 0
    cache.release(seg)
    with pytest.raises(ValueError):
        cache.release(seg)  # one release too many
    assert seg.refcount == 0 and cache.evictable_pages() == 3


def test_lookup_changes_nothing():
    cache = make()
    cached_unreferenced(cache, "a", 4)
    before = cache.stats()
    cache.lookup("a")
    cache.lookup("b")
    assert cache.stats() == before and cache.lookup("a").refcount == 0


# -- eviction -------------------------------------------------------------------------------------------


def test_lru_order_follows_last_release():
    cache = make()
    for k in "abc":
        cached_unreferenced(cache, k, PAGE)
    seg, _ = cache.acquire("a", PAGE)  # a becomes most recently used
    cache.release(seg)
    assert cache.evict(1) == 1 and cache.lookup("b") is None
    assert cache.evict(1) == 1 and cache.lookup("c") is None
    assert cache.lookup("a") is not None
    assert cache.stats().evictions == 2


def test_evict_frees_at_least_n_and_reports_what_it_freed():
    cache = make()
    cached_unreferenced(cache, "big", 3 * PAGE)
    cached_unreferenced(cache, "small", PAGE)
    assert cache.evict(1) == 3  # a whole segment goes
    assert cache.evict(5) == 1  # only what exists
    assert cache.evict(1) == 0
    assert cache.pool.num_free == 16


def test_eviction_never_touches_referenced_or_pending_segments():
    cache = make(8)
    held = ready(cache, "held", 2 * PAGE)
    pending, _ = cache.acquire("pending", 2 * PAGE)
    cached_unreferenced(cache, "old", 2 * PAGE)
    assert cache.evictable_pages() == 2
    assert cache.evict(100) == 2
    assert cache.lookup("held") is held and cache.lookup("pending") is pending
    assert held.cached and pending.cached


def test_miss_evicts_lru_to_make_room():
    cache = make(4)
    cached_unreferenced(cache, "a", 2 * PAGE)
    cached_unreferenced(cache, "b", 2 * PAGE)
    seg, new = cache.acquire("c", PAGE)
    assert new and cache.lookup("a") is None and cache.lookup("b") is not None
    assert cache.pool.num_free == 1 and cache.stats().evictions == 1
    assert set(seg.pages).isdisjoint(cache.lookup("b").pages)


def test_out_of_pages_changes_nothing():
    cache = make(4)
    held = ready(cache, "held", 2 * PAGE)
    cached_unreferenced(cache, "old", PAGE)
    before = (cache.stats(), cache.pool.num_free, cache.evictable_pages())
    with pytest.raises(OutOfPagesError):
        cache.acquire("too-big", 3 * PAGE)  # 1 free + 1 evictable < 3
    with pytest.raises(OutOfPagesError):
        cache.allocate(3)
    assert (cache.stats(), cache.pool.num_free, cache.evictable_pages()) == before
    assert cache.lookup("old") is not None and cache.lookup("too-big") is None and held.refcount == 1


def test_allocate_for_the_engine_evicts_only_what_it_needs():
    cache = make(4)
    cached_unreferenced(cache, "a", PAGE)
    cached_unreferenced(cache, "b", PAGE)
    pages = cache.allocate(3)
    assert len(pages) == 3 and cache.lookup("a") is None and cache.lookup("b") is not None
    assert cache.stats().pages_in_use == 1 and cache.pool.num_used == 4
    cache.pool.free(pages)


# -- pending segments: shared prefill, abort -----------------------------------------------------------


def test_pending_segment_is_shared_by_concurrent_acquirers():
    cache = make()
    enc, new_a = cache.acquire("doc", 6)
    waiter, new_b = cache.acquire("doc", 6)
    assert new_a and not new_b and waiter is enc and not waiter.ready and enc.refcount == 2
    assert cache.pool.num_used == 2  # one copy, one prefill
    cache.mark_ready(enc)
    assert waiter.ready
    s = cache.stats()
    assert (s.lookups, s.hits, s.misses, s.tokens_reused) == (2, 1, 1, 6)


def test_pending_segment_released_by_its_only_holder_is_dropped():
    cache = make()
    seg, _ = cache.acquire("doc", 6)
    cache.release(seg)  # encoder gave up without abort()
    assert cache.lookup("doc") is None and not seg.cached and cache.pool.num_free == 16
    assert cache.evictable_pages() == 0 and cache.stats().pages_in_use == 0


def test_abort_unindexes_and_waiters_see_failed():
    cache = make()
    enc, _ = cache.acquire("doc", 6)
    waiter, _ = cache.acquire("doc", 6)
    cache.abort(enc)
    assert waiter.failed and not waiter.ready and cache.lookup("doc") is None
    with pytest.raises(ValueError):
        cache.mark_ready(enc)
    # A new request misses and encodes afresh, on other pages; the failed copy lives until released.
    retry, new = cache.acquire("doc", 6)
    assert new and retry is not enc and set(retry.pages).isdisjoint(enc.pages)
    assert cache.stats().pages_in_use == 4
    cache.release(enc)
    assert cache.pool.num_used == 4
    cache.release(waiter)
    assert cache.pool.num_used == 2 and cache.stats().pages_in_use == 2
    cache.abort(retry)
    cache.abort(retry)  # idempotent
    cache.release(retry)
    assert cache.pool.num_used == 0 and cache.stats().segments == 0


def test_abort_a_ready_segment_is_an_error():
    cache = make()
    seg = ready(cache, "doc", 6)
    with pytest.raises(ValueError):
        cache.abort(seg)
    assert cache.lookup("doc") is seg and not seg.failed


# -- remove / clear -----------------------------------------------------------------------------------


def test_remove_unreferenced_frees_now():
    cache = make()
    cached_unreferenced(cache, "doc", 6)
    assert cache.remove("doc") and cache.lookup("doc") is None
    assert cache.pool.num_free == 16 and cache.evictable_pages() == 0
    assert not cache.remove("doc")


def test_remove_while_referenced_frees_on_last_release():
    cache = make()
    seg = ready(cache, "doc", 6)
    other, _ = cache.acquire("doc", 6)
    assert cache.remove("doc")
    assert cache.lookup("doc") is None and seg.ready and not seg.cached and cache.pool.num_used == 2
    fresh, new = cache.acquire("doc", 6)  # no new acquire hits the removed segment
    assert new and fresh is not seg
    cache.release(seg)
    assert cache.pool.num_used == 4
    cache.release(other)
    assert cache.pool.num_used == 2 and cache.evictable_pages() == 0
    assert cache.stats().segments == 1


def test_remove_while_pending_still_serves_its_holders():
    cache = make()
    enc, _ = cache.acquire("doc", 6)
    assert cache.remove("doc")
    cache.mark_ready(enc)  # the running encoder finishes; its request may use it
    cache.release(enc)
    assert cache.pool.num_free == 16 and cache.lookup("doc") is None


def test_clear_keeps_referenced_segments():
    cache = make()
    held = ready(cache, "held", 6)
    cached_unreferenced(cache, "a", 6)
    cached_unreferenced(cache, "b", 1)
    assert cache.clear() == 3
    assert cache.lookup("held") is held and cache.stats().segments == 1
    assert cache.evictable_pages() == 0 and cache.pool.num_used == 2
    assert cache.stats().evictions == 0


def test_stats_and_hit_ratio():
    assert CacheStats(0, 0, 0, 0, 0, 0, 0).hit_ratio == 0.0
    cache = make()
    cached_unreferenced(cache, "a", 5)
    for _ in range(3):
        seg, _ = cache.acquire("a", 5)
        cache.release(seg)
    s = cache.stats()
    assert (s.lookups, s.hits, s.misses, s.tokens_reused, s.pages_in_use, s.segments) == (4, 3, 1, 15, 2, 1)
    assert s.hit_ratio == 0.75


# -- random operation sequences: page conservation and the invariants after every step -----------------

NUM_PAGES = 24
KEYS = [f"k{i}" for i in range(8)]
N_TOKENS = {k: 1 + (7 * i) % 15 for i, k in enumerate(KEYS)}  # 1 to 4 pages of 4 tokens


class Driver:
    """Applies operations to a DocumentCache and checks it against what the caller holds."""

    def __init__(self) -> None:
        self.cache = DocumentCache(PagePool(NUM_PAGES), PAGE)
        self.handles: list[Segment] = []  # one entry per reference taken
        self.elsewhere: list[list[int]] = []  # pages the "engine" took with cache.allocate

    def snapshot(self) -> tuple:
        c = self.cache
        idx = {k: (s.refcount, s.ready) for k in KEYS if (s := c.lookup(k)) is not None}
        return c.stats(), c.pool.num_free, c.evictable_pages(), idx

    def apply(self, op: str, arg: int) -> None:
        c = self.cache
        held_cached = [s for s in self.handles if s.cached]
        may_unindex = op in ("remove", "abort")
        h = self.handles[arg % len(self.handles)] if self.handles else None
        if op == "acquire":
            key = KEYS[arg % len(KEYS)]
            before, was = self.snapshot(), c.lookup(key)
            try:
                seg, new = c.acquire(key, N_TOKENS[key])
            except OutOfPagesError:
                assert self.snapshot() == before
                return
            assert new == (was is None) and (new or seg is was)
            self.handles.append(seg)
        elif op == "ready" and h is not None:
            if h.failed:
                with pytest.raises(ValueError):
                    c.mark_ready(h)
            else:
                c.mark_ready(h)
                assert h.ready
        elif op == "release" and h is not None:
            self.handles.remove(h)
            c.release(h)
        elif op == "abort" and h is not None:
            if h.ready:
                with pytest.raises(ValueError):
                    c.abort(h)
            else:
                c.abort(h)
                assert h.failed and not h.cached
        elif op == "evict":
            c.evict(arg % 6)
        elif op == "remove":
            c.remove(KEYS[arg % len(KEYS)])
        elif op == "allocate":
            n = arg % 6
            before = self.snapshot()
            try:
                self.elsewhere.append(c.allocate(n))
            except OutOfPagesError:
                assert self.snapshot() == before
        elif op == "free" and self.elsewhere:
            c.pool.free(self.elsewhere.pop(arg % len(self.elsewhere)))
        elif op == "clear":
            c.clear()
        if not may_unindex:  # a referenced segment is never evicted
            assert all(s.cached and c.lookup(s.key) is s for s in held_cached if s.refcount > 0)
        self.check()

    def check(self) -> None:
        c = self.cache
        indexed = [s for k in KEYS if (s := c.lookup(k)) is not None]
        live = {id(s): s for s in indexed + self.handles}.values()
        pages = [p for s in live for p in s.pages]
        engine = [p for e in self.elsewhere for p in e]
        # conservation, and no page in two owners
        assert len(pages) + len(engine) + c.pool.num_free == NUM_PAGES
        assert len(set(pages + engine)) == len(pages) + len(engine)
        assert all(c.pool.is_used(p) for p in pages + engine)
        for s in live:
            assert s.refcount == sum(h is s for h in self.handles)
            assert len(s.pages) == -(-s.n_tokens // PAGE)
            if s.cached:
                assert c.lookup(s.key) is s and not s.failed
                assert s.refcount > 0 or s.ready  # no unreferenced pending segment
            else:
                assert s.refcount > 0  # unindexed segments live only while held
        assert c.evictable_pages() == sum(len(s.pages) for s in indexed if s.refcount == 0)
        st = c.stats()
        assert st.pages_in_use == len(pages) and st.segments == len(indexed) == len(c)
        assert st.lookups == st.hits + st.misses

    def finish(self) -> None:
        """Release everything: the pool must come back whole once the cache is cleared."""
        while self.handles:
            self.apply("release", 0)
        for e in self.elsewhere:
            self.cache.pool.free(e)
        self.elsewhere.clear()
        self.cache.clear()
        assert self.cache.pool.num_free == NUM_PAGES and self.cache.stats().pages_in_use == 0


OPS = [
    "acquire",
    "acquire",
    "acquire",
    "ready",
    "ready",
    "release",
    "release",
    "abort",
    "evict",
    "remove",
    "allocate",
    "free",
    "clear",
]


@pytest.mark.parametrize("seed", range(20))
def test_random_operation_sequences(seed):
    rng = random.Random(seed)
    d = Driver()
    for _ in range(300):
        d.apply(rng.choice(OPS), rng.randrange(1000))
    d.finish()


try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # hypothesis is optional; the seeded sequences above still run
    pass
else:

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 999)), max_size=80))
    def test_hypothesis_operation_sequences(ops):
        d = Driver()
        for op, arg in ops:
            d.apply(op, arg)
        d.finish()


def test_removing_a_document_removes_its_linked_copies(monkeypatch):
    """`link(origin, copy)`: removing origin removes the copy too (True even when only the copy was cached); a
    copy removed alone leaves origin; clear() forgets the links; only MAX_LINKED origins are remembered."""
    import lazyattn.cache.document_cache as dc

    cache = make()
    for key in ("copy-1", "copy-2", "other"):
        cached_unreferenced(cache, key, 3)
    cache.link("doc", "copy-1")
    cache.link("doc", "copy-2")
    assert cache.remove("doc")  # the document itself was never cached here, its copies were
    assert not cache.contains("copy-1") and not cache.contains("copy-2") and cache.contains("other")
    assert not cache.remove("doc")  # the links went with it
    held = cached_unreferenced(cache, "copy-3", 3)
    cache.acquire("copy-3", 3)  # referenced: unindexed now, freed on its last release
    cache.link("doc", "copy-3")
    assert cache.remove("doc") and not cache.contains("copy-3")
    cache.release(held)
    cache.check()
    assert cache.pool.num_free == cache.pool.num_pages - 1  # only "other" holds a page

    monkeypatch.setattr(dc, "MAX_LINKED", 2)
    for i in range(3):
        cached_unreferenced(cache, f"c{i}", 1)
        cache.link(f"d{i}", f"c{i}")
    assert not cache.remove("d0") and cache.contains("c0")  # the oldest link was forgotten
    assert cache.remove("d2") and not cache.contains("c2")
    cache.link("d1", "c1")
    cache.clear()
    cached_unreferenced(cache, "c1", 1)
    assert not cache.remove("d1") and cache.contains("c1")
