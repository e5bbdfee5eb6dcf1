"""The content-addressed segment cache, shared by every mode (docs/design.md, The document cache).

A segment's KV is cached under a key that hashes everything its KV depends on: the model's weights,
the RoPE configuration, the tenant's salt and the token ids (plus, in prefix mode, the key of the page
before it). The cache keeps page ids and refcounts only; the KV itself lives in the engine's page pool.

Life of a segment, as seen by the engine:

    seg, is_new = cache.acquire(key, n_tokens)   # refcount += 1
    if is_new:      encode it into seg.pages, then cache.mark_ready(seg)
                    (on failure: cache.abort(seg); cache.release(seg))
    else:           wait until seg.ready or seg.failed (another request is encoding it)
                    (if seg.failed: cache.release(seg), then fail the request or acquire the key again,
                     which now misses and makes this request the encoder)
    ... attend to seg.pages ...
    cache.release(seg)                           # refcount -= 1; at 0 a ready segment becomes evictable

With a host tier (cache/host_tier.py), an evicted segment is demoted to host memory, and an acquire that misses
on the GPU but finds the key on the host *promotes* it: a hit (is_new False) on a pending segment that becomes
ready when its copy lands, which `poll` notices. The copy holds a reference of its own until then, so a
promoted segment is never freed or evicted under a copy that still writes into it.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lazyattn.cache.page_pool import PagePool
from lazyattn.errors import OutOfPagesError

if TYPE_CHECKING:
    from lazyattn.cache.host_tier import HostTier

_KEY_VERSION = b"lazyattn-segment-key-v2\x00"


def _field(s: str | None) -> bytes:
    # A presence byte tells None from "", a length prefix keeps field boundaries unambiguous.
    if s is None:
        return b"\x00"
    b = s.encode("utf-8")
    return b"\x01" + len(b).to_bytes(8, "little") + b


@functools.lru_cache(maxsize=64)  # one compiled format per id count (a miss costs ~0.1 us)
def _packer(n: int, code: str) -> struct.Struct:
    return struct.Struct(f"<{n}{code}")


def token_bytes(token_ids: Sequence[int]) -> tuple[bytes, bytes]:
    """The key's encoding of token ids, as (header, body), hashed one after the other: their count, a width byte,
    then each id as a little-endian int32 when all fit (every vocabulary id does), else as int64, so the encoding
    is one-to-one on int64 sequences whatever the host. Raises struct.error for a value that is no int64 (or no
    integer).

    Why not int64 throughout: hashing is about half of a key's time (~10 us for 2048 ids), and half the bytes
    halve it. Why struct: from a Python list it is ~3x faster than array or numpy."""
    n = len(token_ids)
    try:
        return n.to_bytes(8, "little") + b"\x04", _packer(n, "i").pack(*token_ids)
    except struct.error:
        return n.to_bytes(8, "little") + b"\x08", _packer(n, "q").pack(*token_ids)


# Token ids the keyer's memo holds (KeyMemo): ~8 MiB of list slots, 512 documents of 2048 tokens.
KEY_MEMO_TOKENS = 1 << 20
_MEMO_MIN_TOKENS = 256  # shorter segments (prefix mode's pages, system prompts) key in a few µs: not worth a slot
_MEMO_PROBES = 32  # ids sampled, evenly spaced, for a slot's probe


class KeyMemo:
    """Keys of recently keyed segments, so that a document which recurs is not packed and hashed again.

    A slot is found by a cheap probe (salt, length, a hash of ~32 evenly spaced ids) and holds a copy of the ids
    its key was computed from; it answers only if that copy equals the ids asked about, element by element, so a
    probe collision costs a comparison and a miss, never a wrong key. The comparison is what makes it pay: list
    equality checks identity before value, so ids whose int objects are the ones the slot holds (the same
    document list passed again, or lists copied from one) compare in ~2 µs, against ~18 µs to pack and hash 2048
    ids (this CPU; docs/benchmarks.md has the GPU host's). Fresh int objects of equal value compare in about the
    time a key takes: the memo then neither gains nor costs much. A value that equals an int without being one
    (np.int64(7)) is that token id and gets its key, as struct would give it.

    Least recently used slots go first once the copies exceed `max_tokens`. Not thread-safe: the engine's thread
    owns it, as it owns the keyer."""

    def __init__(self, max_tokens: int = KEY_MEMO_TOKENS) -> None:
        self.max_tokens = max_tokens
        self.tokens = 0  # ids held by the slots
        self.hits = 0
        self._slots: OrderedDict[tuple, tuple[list[int], str]] = OrderedDict()

    def probe(self, token_ids: Sequence[int], salt: str | None) -> tuple | None:
        """The slot a segment maps to; None for segments the memo does not keep (short ones, or not lists)."""
        n = len(token_ids)
        if n < _MEMO_MIN_TOKENS or n > self.max_tokens or type(token_ids) is not list:
            return None
        return salt, n, hash(tuple(token_ids[:: n // _MEMO_PROBES]))

    def get(self, probe: tuple, token_ids: list[int]) -> str | None:
        slot = self._slots.get(probe)
        if slot is None or slot[0] != token_ids:
            return None
        self._slots.move_to_end(probe)
        self.hits += 1
        return slot[1]

    def put(self, probe: tuple, token_ids: list[int], key: str) -> None:
        old = self._slots.pop(probe, None)
        if old is not None:
            self.tokens -= len(old[0])
        self._slots[probe] = (list(token_ids), key)
        self.tokens += len(token_ids)
        while self.tokens > self.max_tokens:
            _, (ids, _) = self._slots.popitem(last=False)
            self.tokens -= len(ids)

    def __len__(self) -> int:
        return len(self._slots)


class SegmentKeyer:
    """`segment_key` for one model: (token ids, salt, parent) -> key. The model and RoPE fields, then each salt,
    are hashed once here and the hash state copied per key; the engine keys every segment of every request
    (~10K tokens for five documents) before it can schedule it, all on the time to first token, so documents
    keyed recently are remembered too (KeyMemo; `memo_tokens=0` turns that off)."""

    def __init__(self, model_fingerprint: str, rope_fingerprint: str, memo_tokens: int = KEY_MEMO_TOKENS) -> None:
        self._model = hashlib.sha256(_KEY_VERSION)  # sha256 over blake2b: SHA-NI makes it ~2x faster here
        self._model.update(_field(model_fingerprint) + _field(rope_fingerprint))
        self._salted: dict[str | None, hashlib._Hash] = {}  # the state after (salt, no parent), per recent salt
        self.memo = KeyMemo(memo_tokens)

    def __call__(self, token_ids: Sequence[int], salt: str | None, parent: str | None = None) -> str:
        probe = self.memo.probe(token_ids, salt) if parent is None else None
        if probe is not None:
            key = self.memo.get(probe, token_ids)  # type: ignore[arg-type]  (probe says: a list)
            if key is not None:
                return key
        header, body = token_bytes(token_ids)
        h = self._state(salt, parent)
        h.update(header)
        h.update(body)
        key = h.hexdigest()
        if probe is not None:
            self.memo.put(probe, token_ids, key)  # type: ignore[arg-type]
        return key

    def _state(self, salt: str | None, parent: str | None) -> hashlib._Hash:
        """A copy of the hash state after the model fields, the salt and the parent."""
        if parent is None:
            base = self._salted.get(salt)
            if base is None:
                if len(self._salted) >= 1024:  # one state per tenant salt, not one per salt ever seen
                    self._salted.clear()
                base = self._salted[salt] = self._model.copy()
                base.update(_field(salt) + _field(None))
            return base.copy()
        h = self._model.copy()
        h.update(_field(salt) + _field(parent))
        return h


def segment_key(
    model_fingerprint: str,
    rope_fingerprint: str,
    salt: str | None,
    token_ids: Sequence[int],
    parent: str | None = None,
) -> str:
    """Hex sha256 over (version, model, rope, salt, parent, token ids): each string field length-prefixed, the ids
    as `token_bytes` encodes them.

    `parent` is the key of the previous page in prefix mode (vLLM-style chained page hashes), so a page
    key covers the whole prefix; None for block/lazy segments, which are position-independent.
    """
    return SegmentKeyer(model_fingerprint, rope_fingerprint, memo_tokens=0)(token_ids, salt, parent)


@dataclass(eq=False, slots=True)
class Segment:
    """One cached segment: its own whole pages (never shared with another segment).

    The last page holds `n_tokens - (len(pages) - 1) * page_size` keys; its tail is masked.
    States: pending (`ready` False: its encoder has not finished), ready, failed (aborted while pending).
    `cached` is True while new acquires of `key` hit this segment; once False (aborted or removed) the
    segment lives on only for its current holders and its pages are freed on the last release.
    """

    key: str
    n_tokens: int
    pages: tuple[int, ...]
    refcount: int = 1
    ready: bool = False
    failed: bool = False
    cached: bool = True
    last_use: int = 0  # cache tick of the last acquire or release


@dataclass(frozen=True)
class CacheStats:
    lookups: int  # acquire calls that returned (a failed OutOfPagesError acquire is not counted)
    hits: int  # including hits on a pending segment (its prefill is shared) and on the host tier
    misses: int
    evictions: int  # segments evicted for room (acquire, allocate, evict); not remove/clear
    tokens_reused: int  # tokens of hit segments
    pages_in_use: int  # pages held by the cache's segments, including removed/aborted ones still held
    segments: int  # segments in the index (pending or ready)
    host_hits: int = 0  # hits found on the host tier (promoted), a part of `hits`
    host_tokens_reused: int = 0  # tokens of those, a part of `tokens_reused`

    @property
    def gpu_hits(self) -> int:
        return self.hits - self.host_hits

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


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

    def __init__(self, pool: PagePool, page_size: int, tier: HostTier | None = None) -> None:
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.pool = pool
        self.page_size = page_size
        self.tier = tier
        self._index: dict[str, Segment] = {}
        self._lru: OrderedDict[str, Segment] = OrderedDict()
        self._evictable = 0  # pages of the segments in _lru
        self._held = 0  # pages of every live segment, indexed or not
        self._tick = 0
        self._lookups = self._hits = self._misses = self._evictions = self._tokens_reused = 0
        self._host_hits = self._host_tokens_reused = 0

    # -- queries ---------------------------------------------------------------------------------

    def lookup(self, key: str) -> Segment | None:
        """The indexed segment for key, pending or ready; no refcount, counters or LRU change."""
        return self._index.get(key)

    def contains(self, key: str) -> bool:
        """Whether an acquire of key would hit, on the GPU or on the host tier."""
        return key in self._index or (self.tier is not None and self.tier.contains(key))

    @property
    def promoting(self) -> int:
        """Promotions from the host tier not yet seen to land."""
        return self.tier.in_flight if self.tier is not None else 0

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
            host_hits=self._host_hits,
            host_tokens_reused=self._host_tokens_reused,
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
        if self.tier is not None and self.tier.contains(key):
            return self._promote(key, n_tokens), False
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

    def release(self, seg: Segment) -> None:
        """Drop one reference. At 0: a ready indexed segment becomes evictable (most recently used);
        a pending one (its encoder gave up), an aborted or a removed one is dropped and its pages freed."""
        if seg.refcount <= 0:
            raise ValueError(f"segment {seg.key[:16]} released more often than acquired")
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
        seg.failed = True
        if seg.cached:
            del self._index[seg.key]
            seg.cached = False

    def poll(self, wait: bool = False) -> int:
        """Make the segments whose promotion has landed ready, and drop the promotions' own references (a segment
        nobody else holds becomes evictable). wait: block until every promotion in flight has landed.
        Returns how many became ready."""
        if self.tier is None:
            return 0
        done = self.tier.finished(wait)
        for seg in done:
            seg.ready = True
            self.release(seg)
        return len(done)

    def _promote(self, key: str, n_tokens: int) -> Segment:
        if self.tier.n_tokens(key) != n_tokens:
            raise ValueError(f"segment {key[:16]} has {self.tier.n_tokens(key)} tokens, acquired with {n_tokens}")
        n = self.pages_for(n_tokens)
        if n > self.pool.num_free + self._evictable:  # checked before the tier is touched: a raise changes nothing
            raise OutOfPagesError(
                f"need {n} KV pages to bring a document back from host memory: {self.pool.num_free} free and "
                f"{self._evictable} evictable of {self.pool.num_pages}; the rest is held by running requests"
            )
        entry = self.tier.take(key)  # first, so that the demotions this allocation causes cannot evict it
        pages = self.allocate(n)
        # refcount 2: the caller's reference and the promotion's, dropped by poll once the copy has landed.
        seg = Segment(key, n_tokens, tuple(pages), refcount=2, last_use=self._next_tick())
        self.tier.promote(entry, seg)
        self._index[key] = seg
        self._held += n
        self._lookups += 1
        self._hits += 1
        self._host_hits += 1
        self._tokens_reused += n_tokens
        self._host_tokens_reused += n_tokens
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
            if self.tier is not None:
                self.tier.demote(seg)  # the mover orders every later write of these pages after the copy
            self._free(seg)
        return freed

    def remove(self, key: str) -> bool:
        """Delete key's segment (e.g. a document unregistered). Unreferenced: freed now. Referenced:
        unindexed now (no new acquire hits it), freed on its last release. A host copy is dropped too.
        False if neither tier held it."""
        on_host = self.tier is not None and self.tier.discard(key)
        seg = self._index.pop(key, None)
        if seg is None:
            return on_host
        seg.cached = False
        if seg.refcount == 0:
            del self._lru[key]
            self._evictable -= len(seg.pages)
            self._free(seg)
        return True

    def clear(self) -> int:
        """Drop every unreferenced segment and every host copy; referenced ones stay. Returns the GPU pages
        freed."""
        if self.tier is not None:
            self.tier.clear()
        freed = 0
        while self._lru:
            _, seg = self._lru.popitem(last=False)
            del self._index[seg.key]
            seg.cached = False
            freed += len(seg.pages)
            self._free(seg)
        self._evictable = 0
        return freed

    # -- internals ---------------------------------------------------------------------------------

    def _free(self, seg: Segment) -> None:
        self.pool.free(seg.pages)
        self._held -= len(seg.pages)

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick
