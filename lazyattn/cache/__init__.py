"""KV page bookkeeping: the page pool allocator and the content-addressed document cache."""

from lazyattn.cache.document_cache import CacheStats, DocumentCache, Segment, SegmentKeyer, segment_key
from lazyattn.cache.page_pool import (
    PagePool,
    bytes_per_page,
    pages_for_budget,
    pages_from_free_memory,
)

__all__ = [
    "CacheStats",
    "DocumentCache",
    "PagePool",
    "Segment",
    "SegmentKeyer",
    "bytes_per_page",
    "pages_for_budget",
    "pages_from_free_memory",
    "segment_key",
]
