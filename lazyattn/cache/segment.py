"""A cached segment and the document cache's counters (cache/document_cache.py)."""

from __future__ import annotations

from dataclasses import dataclass


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
    hits: int  # including hits on a pending segment (its prefill is shared) and on the lower tiers
    misses: int
    evictions: int  # segments evicted for room (acquire, allocate, evict); not remove/clear
    tokens_reused: int  # tokens of hit segments
    pages_in_use: int  # pages held by the cache's segments, including removed/aborted ones still held
    segments: int  # segments in the index (pending or ready)
    host_hits: int = 0  # hits found on the host tier (promoted), a part of `hits`
    host_tokens_reused: int = 0  # tokens of those, a part of `tokens_reused`
    disk_hits: int = 0  # hits read back from the disk tier, a part of `hits`
    disk_tokens_reused: int = 0  # tokens of those, a part of `tokens_reused`

    @property
    def gpu_hits(self) -> int:
        return self.hits - self.host_hits - self.disk_hits

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0
