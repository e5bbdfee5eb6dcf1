"""The content-addressed segment cache, shared by every mode (docs/design.md, The document cache).

A segment's KV is cached under its key (cache/keys.py). The cache keeps page ids and refcounts only; the KV itself
lives in the engine's page pool. It is the GPU tier: the tiers below it (host memory, disk) plug in through one
interface (cache/tiers.py).

Life of a segment, as seen by the engine:

    seg, is_new = cache.acquire(key, n_tokens)   # refcount += 1
    if is_new:      encode it into seg.pages, then cache.mark_ready(seg)
                    (on failure: cache.abort(seg); cache.release(seg))
    else:           wait until seg.ready or seg.failed (another request is encoding it)
                    (if seg.failed: cache.release(seg), then fail the request or acquire the key again,
                     which now misses and makes this request the encoder)
    ... attend to seg.pages ...
    cache.release(seg)                           # refcount -= 1; at 0 a ready segment becomes evictable

With lower tiers, an acquire that misses on the GPU but finds the key in a lower tier *fills* GPU pages from it:
a hit (is_new False) on a pending segment that becomes ready when its copy lands, which `poll` notices. The fill
holds a reference of its own until then, so a filled segment is never freed or evicted under a copy that still
writes into it.
"""

from __future__ import annotations

from collections import OrderedDict

from lazyattn.cache.keys import KEY_MEMO_TOKENS, KeyMemo, SegmentKeyer, segment_key, token_bytes
from lazyattn.cache.page_pool import PagePool
from lazyattn.cache.segment import CacheStats, Segment
from lazyattn.cache.tiers import LowerTier
from lazyattn.errors import CacheInvariantError, OutOfPagesError

__all__ = [
    "KEY_MEMO_TOKENS",
    "CacheStats",
    "DocumentCache",
    "KeyMemo",
    "Segment",
    "SegmentKeyer",
    "segment_key",
    "token_bytes",
]

_WHERE = {"host": "host memory", "disk": "disk"}
MAX_LINKED = 1 << 16  # documents whose shared-prefix copies `remove` finds (DocumentCache.link)


class DocumentCache:
    """Segments by key, refcounted, evicted LRU among the unreferenced ready ones.

    Invariants, after every call (a call that raises changes nothing):
    - pages held by segments (indexed, plus unindexed ones still referenced) + pool.num_free + pages the
      engine allocated elsewhere from the pool = pool.num_pages; no page belongs to two segments;
    - the LRU holds exactly the indexed segments with refcount 0, oldest release first, and they are all
      ready (a pending segment whose refcount drops to 0 is dropped at once);
    - a segment with refcount > 0 is never evicted and its pages are never freed;
    - an unindexed segment (aborted or removed) has refcount > 0; its last release frees its pages.

    Prefix mode: release a request's pages last-to-first so that LRU evicts the tail of a chain before
    the pages it hangs from.
    """

    def __init__(self, pool: PagePool, page_size: int, *tiers: LowerTier | None) -> None:
        """`tiers`: the lower tiers, top first (host, then disk); None entries are skipped."""
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.pool = pool
        self.page_size = page_size
        self.tiers: tuple[LowerTier, ...] = tuple(t for t in tiers if t is not None)
        self._index: dict[str, Segment] = {}
        self._lru: OrderedDict[str, Segment] = OrderedDict()
        # Unindexed segments (aborted, removed, a refused fill) that holders still reference, by identity: their
        # pages are freed on the last release.
        self._orphans: dict[int, Segment] = {}
        # A document's plain key -> the keys of its copies encoded after a first segment (ape_prefix), so that
        # removing the document removes them too; the most recent MAX_LINKED documents are remembered.
        self._copies: OrderedDict[str, set[str]] = OrderedDict()
        self._evictable = 0  # pages of the segments in _lru
        self._held = 0  # pages of every live segment, indexed or not
        self._tick = 0
        self.reset_stats()

    def reset_stats(self) -> None:
        """Restart the counters (lookups, hits, ...); what is cached stays."""
        self._lookups = self._hits = self._misses = self._evictions = self._tokens_reused = 0
        self._tier_hits = {t.name: 0 for t in self.tiers}
        self._tier_tokens = {t.name: 0 for t in self.tiers}

    # -- queries ---------------------------------------------------------------------------------

    def lookup(self, key: str) -> Segment | None:
        """The indexed segment for key, pending or ready; no refcount, counters or LRU change."""
        return self._index.get(key)

    def contains(self, key: str) -> bool:
        """Whether an acquire of key would hit, on the GPU or a lower tier (a disk file may still be refused)."""
        return key in self._index or any(t.contains(key) for t in self.tiers)

    @property
    def promoting(self) -> int:
        """Fills from lower tiers not yet seen to land."""
        return sum(t.in_flight for t in self.tiers)

    def evictable_pages(self) -> int:
        """Pages that eviction could free now (unreferenced ready segments)."""
        return self._evictable

    def available_pages(self) -> int:
        """Pages an allocation could get now: free in the pool plus evictable."""
        return self.pool.num_free + self._evictable

    def pages_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.page_size)

    def stats(self) -> CacheStats:
        return CacheStats(
            lookups=self._lookups,
            hits=self._hits,
            misses=self._misses,
            evictions=self._evictions,
            tokens_reused=self._tokens_reused,
            pages_in_use=self._held,
            segments=len(self._index),
            host_hits=self._tier_hits.get("host", 0),
            host_tokens_reused=self._tier_tokens.get("host", 0),
            disk_hits=self._tier_hits.get("disk", 0),
            disk_tokens_reused=self._tier_tokens.get("disk", 0),
        )

    def __len__(self) -> int:
        return len(self._index)

    # -- refcounting -------------------------------------------------------------------------------

    def acquire(self, key: str, n_tokens: int) -> tuple[Segment, bool]:
        """Take a reference on key's segment: (segment, True) if the caller must encode it.

        A hit may return a pending segment: wait for `ready` (or `failed`) before attending to it.
        A miss allocates the pages, evicting LRU unreferenced segments only if that makes enough room;
        otherwise OutOfPagesError and nothing has changed.
        """
        seg = self._index.get(key)
        if seg is not None:
            if seg.n_tokens != n_tokens:
                raise ValueError(f"segment {key[:16]} has {seg.n_tokens} tokens, acquired with {n_tokens}")
            if seg.refcount == 0:
                del self._lru[key]
                self._evictable -= len(seg.pages)
            seg.refcount += 1
            seg.last_use = self._next_tick()
            self._lookups += 1
            self._hits += 1
            self._tokens_reused += n_tokens
            return seg, False
        if n_tokens <= 0:
            raise ValueError(f"a segment needs at least one token, got {n_tokens}")
        for tier in self.tiers:
            if tier.contains(key):
                seg = self._promote(tier, key, n_tokens)
                if seg is not None:
                    return seg, False
        pages = self.allocate(self.pages_for(n_tokens))
        seg = Segment(key, n_tokens, tuple(pages), last_use=self._next_tick())
        self._index[key] = seg
        self._held += len(pages)
        self._lookups += 1
        self._misses += 1
        return seg, True

    def mark_ready(self, seg: Segment) -> None:
        """The encoder wrote all of seg's KV: waiters may attend to it."""
        if seg.failed:
            raise ValueError(f"segment {seg.key[:16]} was aborted and cannot become ready")
        if seg.refcount <= 0:
            raise ValueError(f"segment {seg.key[:16]} is not held; only a holder can mark it ready")
        seg.ready = True
        for tier in self.tiers:
            tier.encoded(seg)

    def release(self, seg: Segment) -> None:
        """Drop one reference. At 0: a ready indexed segment becomes evictable (most recently used);
        a pending one (its encoder gave up), an aborted or a removed one is dropped and its pages freed."""
        if seg.refcount <= 0:
            raise ValueError(f"segment {seg.key[:16]} released more often than acquired")
        self._check_owned(seg)
        seg.refcount -= 1
        seg.last_use = self._next_tick()
        if seg.refcount > 0:
            return
        if seg.cached and seg.ready:
            self._lru[seg.key] = seg
            self._evictable += len(seg.pages)
            return
        if seg.cached:
            del self._index[seg.key]
            seg.cached = False
        else:
            del self._orphans[id(seg)]
        self._free(seg)

    def abort(self, seg: Segment) -> None:
        """Encoding of a pending segment failed: unindex it so no new acquire hits it, and set `failed`.

        Every holder (the encoder and each waiter) keeps its reference and must still release it; the
        pages are freed on the last release. A later acquire of the key misses and encodes afresh.
        """
        if seg.ready:
            raise ValueError(f"segment {seg.key[:16]} is ready; only a pending segment can be aborted")
        if seg.refcount <= 0:
            raise ValueError(f"segment {seg.key[:16]} is not held")
        self._check_owned(seg)
        seg.failed = True
        if seg.cached:
            self._unindex(seg)

    def poll(self, wait: bool = False) -> int:
        """Make the segments whose fill from a lower tier has landed ready, and drop the fills' own references (a
        segment nobody else holds becomes evictable). A fill the tier could not complete (a disk file refused by
        the background read) comes back `failed`: it is unindexed and no longer counted as a hit, and its waiters
        start over (the next acquire misses and encodes it). wait: block until every fill in flight has landed.
        Returns how many became ready."""
        n = 0
        for tier in self.tiers:
            for seg in tier.finished(wait):
                if seg.failed:
                    self._unclaim(tier, seg)
                else:
                    seg.ready = True
                    n += 1
                self.release(seg)
        return n

    def _unclaim(self, tier: LowerTier, seg: Segment) -> None:
        """A fill that failed: out of the index, and its hit taken back (the acquire that encodes it is the miss)."""
        if seg.cached:
            self._unindex(seg)
        self._lookups -= 1
        self._hits -= 1
        self._tier_hits[tier.name] -= 1
        self._tokens_reused -= seg.n_tokens
        self._tier_tokens[tier.name] -= seg.n_tokens

    def _promote(self, tier: LowerTier, key: str, n_tokens: int) -> Segment | None:
        """Fill new GPU pages from `tier`'s copy of key; None if the tier refuses its copy (a miss)."""
        n = self.pages_for(n_tokens)
        if n > self.pool.num_free + self._evictable:  # checked before the tier is touched: a raise changes nothing
            raise OutOfPagesError(
                f"need {n} KV pages to bring a document back from {_WHERE.get(tier.name, tier.name)}: "
                f"{self.pool.num_free} free and {self._evictable} evictable of {self.pool.num_pages}; the rest is "
                "held by running requests"
            )
        handle = tier.claim(key, n_tokens)  # first, so that the demotions this allocation causes cannot evict it
        if handle is None:
            return None
        pages = self.allocate(n)
        # refcount 2: the caller's reference and the fill's, dropped by poll once the copy has landed.
        seg = Segment(key, n_tokens, tuple(pages), refcount=2, last_use=self._next_tick())
        tier.fill(handle, seg)
        self._index[key] = seg
        self._held += n
        self._lookups += 1
        self._hits += 1
        self._tier_hits[tier.name] += 1
        self._tokens_reused += n_tokens
        self._tier_tokens[tier.name] += n_tokens
        return seg

    # -- making room -------------------------------------------------------------------------------

    def allocate(self, n_pages: int) -> list[int]:
        """n pages from the pool for the caller's own use (a final segment, block mode's copies),
        evicting LRU segments as needed. All or nothing: if free + evictable < n, nothing is evicted."""
        short = n_pages - self.pool.num_free
        if short > 0:
            if short > self._evictable:
                raise OutOfPagesError(
                    f"need {n_pages} KV pages: {self.pool.num_free} free and {self._evictable} evictable of "
                    f"{self.pool.num_pages}; the rest is held by running requests"
                )
            self.evict(short)
        return self.pool.allocate(n_pages)

    def evict(self, n_pages: int) -> int:
        """Evict least recently used unreferenced segments until at least n_pages are freed or none is
        left. Returns the pages freed."""
        freed = 0
        while freed < n_pages and self._lru:
            _, seg = self._lru.popitem(last=False)
            del self._index[seg.key]
            seg.cached = False
            self._evictable -= len(seg.pages)
            self._evictions += 1
            freed += len(seg.pages)
            for tier in self.tiers:
                tier.evicted(seg)  # a copy it starts is ordered before every later write of these pages
            self._free(seg)
        return freed

    def link(self, origin: str, key: str) -> None:
        """Record that segment `key` is a copy of document `origin` encoded after a first segment (ape_prefix):
        `remove(origin)` removes it too. Only the MAX_LINKED most recently linked documents are remembered."""
        self._copies.setdefault(origin, set()).add(key)
        self._copies.move_to_end(origin)
        if len(self._copies) > MAX_LINKED:
            self._copies.popitem(last=False)

    def remove(self, key: str) -> bool:
        """Delete key's segment (e.g. a document unregistered) and the copies linked to it (`link`).
        Unreferenced: freed now. Referenced: unindexed now (no new acquire hits it), freed on its last release.
        Lower tiers' copies are dropped too. False if no tier held any of them."""
        copies = [self._remove(k) for k in self._copies.pop(key, ())]
        return self._remove(key) or any(copies)

    def _remove(self, key: str) -> bool:
        below = [t.discard(key) for t in self.tiers]
        seg = self._index.get(key)
        if seg is None:
            return any(below)
        if seg.refcount == 0:
            del self._index[key]
            seg.cached = False
            del self._lru[key]
            self._evictable -= len(seg.pages)
            self._free(seg)
        else:
            self._unindex(seg)
        return True

    def clear(self) -> int:
        """Drop every unreferenced segment and every lower tier's copy (the disk tier's files too); referenced
        ones stay. Returns the GPU pages freed."""
        for tier in self.tiers:
            tier.clear()
        self._copies.clear()
        freed = 0
        while self._lru:
            _, seg = self._lru.popitem(last=False)
            del self._index[seg.key]
            seg.cached = False
            freed += len(seg.pages)
            self._free(seg)
        self._evictable = 0
        return freed

    # -- invariants --------------------------------------------------------------------------------

    def check(self) -> None:
        """Verify the invariants of the class docstring (and the lower tiers' own); CacheInvariantError names the
        first one broken. O(segments + pages): for tests and the engine's `check_invariants` option."""
        lru_pages = held = 0
        seen: set[int] = set()

        def fail(what: str) -> None:
            raise CacheInvariantError(f"document cache: {what}")

        if len(self._copies) > MAX_LINKED:
            fail(f"{len(self._copies)} documents with linked copies, over {MAX_LINKED}")
        for key, seg in self._index.items():
            if seg.key != key or not seg.cached or seg.failed:
                fail(f"index entry {key[:16]} is segment {seg.key[:16]} (cached={seg.cached}, failed={seg.failed})")
            if (seg.refcount == 0) != (key in self._lru):
                fail(
                    f"segment {key[:16]} has refcount {seg.refcount} and is {'' if key in self._lru else 'not '}in LRU"
                )
            if seg.refcount < 0:
                fail(f"segment {key[:16]} has refcount {seg.refcount}")
        for key, seg in self._lru.items():
            if self._index.get(key) is not seg:
                fail(f"LRU entry {key[:16]} is not the segment indexed under its key")
            if not seg.ready:
                fail(f"LRU entry {key[:16]} is not ready")
            lru_pages += len(seg.pages)
        for seg in self._orphans.values():
            if seg.cached or seg.refcount <= 0:
                fail(f"unindexed segment {seg.key[:16]} has cached={seg.cached}, refcount {seg.refcount}")
        ticks = [s.last_use for s in self._lru.values()]
        if ticks != sorted(ticks):
            fail("LRU is not in order of last release")
        for seg in [*self._index.values(), *self._orphans.values()]:
            if len(seg.pages) != self.pages_for(seg.n_tokens):
                fail(f"segment {seg.key[:16]} has {len(seg.pages)} pages for {seg.n_tokens} tokens")
            for page in seg.pages:
                if page in seen or not self.pool.is_used(page):
                    fail(f"page {page} of segment {seg.key[:16]} is {'shared' if page in seen else 'free'}")
                seen.add(page)
            held += len(seg.pages)
        if lru_pages != self._evictable:
            fail(f"evictable count {self._evictable}, LRU holds {lru_pages} pages")
        if held != self._held:
            fail(f"held count {self._held}, segments hold {held} pages")
        if self._hits + self._misses != self._lookups or min(self._hits, self._misses) < 0:
            fail(f"lookups {self._lookups} != hits {self._hits} + misses {self._misses}")
        for tier in self.tiers:
            for seg in tier.filling():
                live = self._index.get(seg.key) is seg or self._orphans.get(id(seg)) is seg
                if seg.ready or seg.refcount < 1 or not live:
                    fail(f"{tier.name} fill of {seg.key[:16]} targets a segment that is not pending and held")
            tier.check()

    def live_segments(self) -> list[Segment]:
        """Every live segment: the indexed ones and the unindexed ones still referenced."""
        return [*self._index.values(), *self._orphans.values()]

    # -- internals ---------------------------------------------------------------------------------

    def _check_owned(self, seg: Segment) -> None:
        """A segment handed back must be one of this cache's live ones: a stale holder (a segment of a cache that
        was reset, or one already freed) would otherwise corrupt the index and the pool."""
        if self._index.get(seg.key) is not seg and self._orphans.get(id(seg)) is not seg:
            raise CacheInvariantError(
                f"segment {seg.key[:16]} is not held by this document cache (freed already, or another cache's)"
            )

    def _unindex(self, seg: Segment) -> None:
        """Out of the index, alive for its holders until the last release."""
        del self._index[seg.key]
        seg.cached = False
        self._orphans[id(seg)] = seg

    def _free(self, seg: Segment) -> None:
        self.pool.free(seg.pages)
        self._held -= len(seg.pages)

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick
