"""The document cache with its host and disk tiers and the page pool, driven by random interleavings of every call
(hypothesis' RuleBasedStateMachine), with every invariant checked after every step.

The model beside the cache is the test's own: which references it holds, which private pages it allocated, and
what each document's KV must read. An encode writes a pattern that only the document's key determines, so a
document brought back from the host or from disk must read exactly that pattern, and so must every ready
segment, whatever was evicted, demoted, promoted or freed meanwhile. Encodes fail (abort), disk files are
damaged (the background read refuses them), and OutOfPagesError must change nothing.
"""

from __future__ import annotations

import hashlib
import os

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from lazyattn.cache.disk_tier import DiskTier, layout_id
from lazyattn.cache.document_cache import DocumentCache, Segment
from lazyattn.cache.host_tier import HostTier
from lazyattn.cache.kv_transfer import PageMover
from lazyattn.cache.page_pool import PagePool
from lazyattn.errors import CacheInvariantError, OutOfPagesError

PAGE = 4
GPU_PAGES = 8
HOST_PAGES = 3
SHAPE = (2, 2, GPU_PAGES, PAGE, 1, 4)  # layers, K/V, pages, page_size, kv_heads, head_dim
PAGE_BYTES = 2 * 2 * PAGE * 1 * 4 * 4  # float32
KEYS = {f"doc{i}": n for i, n in enumerate([1, 4, 5, 8, 9, 12, 3, 16, 2, 7])}  # key -> tokens (1 to 4 pages)


def pattern(key: str, i: int) -> float:
    """The value every element of page i of key's KV holds once encoded."""
    return float(int.from_bytes(hashlib.blake2b(key.encode(), digest_size=2).digest(), "big") * 8 + i)


class CacheMachine(RuleBasedStateMachine):
    @initialize(disk_pages=st.sampled_from([6, 12, 40]))
    def build(self, disk_pages: int) -> None:
        import tempfile

        self.dir = tempfile.TemporaryDirectory()
        self.kv = torch.zeros(SHAPE)
        self.host = HostTier(HOST_PAGES, PAGE_BYTES, PageMover(self.kv, HOST_PAGES))
        self.disk = DiskTier(self.dir.name, disk_pages * PAGE_BYTES, self.kv, layout_id("m", self.kv), always_read=True)
        self.cache = DocumentCache(PagePool(GPU_PAGES), PAGE, self.host, self.disk)
        self.held: list[Segment] = []  # one entry per reference the test holds
        self.private: list[list[int]] = []

    def teardown(self) -> None:
        if hasattr(self, "disk"):
            self.disk.close()
            self.dir.cleanup()

    # -- helpers ------------------------------------------------------------------------------------------------

    def filling(self) -> list[Segment]:
        return [s for t in self.cache.tiers for s in t.filling()]

    def encodable(self) -> list[Segment]:
        """Held segments waiting for an encoder: pending, not failed, not being filled from a tier."""
        fills = {id(s) for s in self.filling()}
        seen, out = set(), []
        for s in self.held:
            if not s.ready and not s.failed and id(s) not in fills and id(s) not in seen:
                seen.add(id(s))
                out.append(s)
        return out

    def snapshot(self) -> tuple:
        c = self.cache
        return (c.stats(), c.pool.num_free, c.evictable_pages(), len(c), self.host.stats(), len(c.live_segments()))

    # -- rules --------------------------------------------------------------------------------------------------

    @rule(key=st.sampled_from(sorted(KEYS)))
    def acquire(self, key: str) -> None:
        before = self.snapshot()
        indexed = self.cache.lookup(key)
        try:
            seg, is_new = self.cache.acquire(key, KEYS[key])
        except OutOfPagesError:
            assert self.snapshot()[:4] == before[:4]  # nothing changed on the GPU tier
            return
        if indexed is not None:
            assert seg is indexed and not is_new  # an indexed segment is always a hit, never a second copy
        assert seg.key == key and seg.n_tokens == KEYS[key] and seg.cached
        self.held.append(seg)

    @rule(key=st.sampled_from(sorted(KEYS)))
    def use(self, key: str) -> None:
        """What most requests do: acquire, encode on a miss, release (fills the GPU tier, so eviction demotes)."""
        try:
            seg, is_new = self.cache.acquire(key, KEYS[key])
        except OutOfPagesError:
            return
        if is_new:
            for i, page in enumerate(seg.pages):
                self.kv[:, :, page] = pattern(key, i)
            self.cache.mark_ready(seg)
        self.cache.release(seg)

    @rule()
    def flush_disk(self) -> None:
        self.disk.flush()

    @precondition(lambda self: self.encodable())
    @rule(data=st.data(), fail=st.booleans())
    def encode(self, data, fail: bool) -> None:
        seg = data.draw(st.sampled_from(self.encodable()))
        if fail:
            self.cache.abort(seg)
            assert seg.failed and self.cache.lookup(seg.key) is not seg
            return
        for i, page in enumerate(seg.pages):
            self.kv[:, :, page] = pattern(seg.key, i)
        self.cache.mark_ready(seg)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data) -> None:
        seg = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        self.cache.release(seg)

    @rule(wait=st.booleans())
    def poll(self, wait: bool) -> None:
        self.cache.poll(wait=wait)
        if wait:
            assert not self.filling() and self.cache.promoting == 0

    @rule(key=st.sampled_from(sorted(KEYS)), now=st.integers(0, 3))
    def remove(self, key: str, now: int) -> None:
        if now:
            return  # one draw in four: removal is rarer than use
        self.cache.remove(key)
        assert self.cache.lookup(key) is None and not self.host.contains(key) and not self.disk.contains(key)

    @rule(now=st.integers(0, 7))
    def clear(self, now: int) -> None:
        if now:
            return  # one draw in eight
        self.cache.clear()
        assert all(s.refcount > 0 for s in self.cache.live_segments())  # only what is held stays
        assert len(self.host) == 0 and not any(self.disk.contains(k) for k in KEYS)

    @rule(n=st.integers(1, GPU_PAGES))
    def evict(self, n: int) -> None:
        evictable = self.cache.evictable_pages()
        freed = self.cache.evict(n)
        assert freed >= min(n, evictable) and self.cache.evictable_pages() == evictable - freed

    @rule(n=st.integers(1, 4))
    def allocate(self, n: int) -> None:
        before = self.snapshot()
        try:
            self.private.append(self.cache.allocate(n))
        except OutOfPagesError:
            assert self.snapshot()[:4] == before[:4]

    @precondition(lambda self: self.private)
    @rule()
    def free_private(self) -> None:
        self.cache.pool.free(self.private.pop(0))

    @rule(key=st.sampled_from(sorted(KEYS)))
    def host_forgets(self, key: str) -> None:
        """The host tier lets a copy go (as its own LRU would): the next miss on the GPU reads the disk."""
        self.host.discard(key)
        assert not self.host.contains(key)

    @rule(key=st.sampled_from(sorted(KEYS)), damage=st.booleans())
    def read_from_disk(self, key: str, damage: bool) -> None:
        """A document off the GPU and the host is read back from its file; a damaged file (a payload byte flipped:
        its checksum fails) is refused by the background read and the document encoded again."""
        if self.cache.lookup(key) is not None:
            self.cache.evict(GPU_PAGES)  # every unreferenced segment goes (to the host)
            if self.cache.lookup(key) is not None:
                return  # held
        self.host.discard(key)
        self.disk.flush()
        path = self.disk.path(key)
        if not os.path.exists(path):
            return
        if damage:
            with open(path, "r+b") as f:
                f.seek(-3, os.SEEK_END)
                byte = f.read(1)
                f.seek(-3, os.SEEK_END)
                f.write(bytes([byte[0] ^ 0x40]))
        self.acquire(key)

    @rule()
    def stale_release_is_refused(self) -> None:
        """A segment this cache does not hold (freed already) cannot be handed back."""
        stranger = Segment("stranger", 4, (0,), ready=True)
        with pytest.raises(CacheInvariantError):
            self.cache.release(stranger)

    # -- invariants, after every step ---------------------------------------------------------------------------

    @invariant()
    def bookkeeping(self) -> None:
        if not hasattr(self, "cache"):
            return
        self.cache.check()
        live = self.cache.live_segments()
        holders: dict[int, int] = {}
        for s in [*self.held, *self.filling()]:
            holders[id(s)] = holders.get(id(s), 0) + 1
        for s in live:
            assert s.refcount == holders.pop(id(s), 0), f"{s.key}: refcount {s.refcount}"
        assert not holders, "a held segment is not live in the cache"
        pages = [p for s in live for p in s.pages] + [p for a in self.private for p in a]
        assert len(pages) == len(set(pages)) == self.cache.pool.num_used

    @invariant()
    def ready_segments_hold_their_documents(self) -> None:
        if not hasattr(self, "cache"):
            return
        for s in self.cache.live_segments():
            if s.ready:
                for i, page in enumerate(s.pages):
                    assert torch.all(self.kv[:, :, page] == pattern(s.key, i)), f"{s.key} page {i} holds other KV"


CacheMachine.TestCase.settings = settings(
    max_examples=150,  # up to 40 steps each: about 5,000 steps a run
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_document_cache_with_tiers = CacheMachine.TestCase
