"""The host tier: documents evicted from the GPU wait in host memory and come back by copy (docs/design.md, "The
host tier").

A lazy- or block-mode document's KV is encoded alone at local positions, so it does not depend on where a request
places it: the pages can leave the GPU and come back as they are, with no re-rotation and no recompute. The tier
keeps page ids, an LRU index and the in-flight promotions; the bytes move through a `PageMover`
(cache/kv_transfer.py). Without a mover (the hit-ratio simulation) it is bookkeeping only and every copy is done
at once.

Exclusive tiers: a key is indexed in at most one of them. The DocumentCache demotes a segment it evicts (`demote`)
and, on a GPU miss that the host holds, takes the entry out of the host index (`take`), gives it GPU pages and
starts its promotion (`promote`); `finished` hands back the segments whose copy has landed, and only then are the
entry's host pages freed (the copy reads them until then).

The pool grows on demand, a chunk at a time (`chunk_pages`, the mover's lock chunk): it starts empty, and a
demotion that finds no free page adds the next chunk (page-locking it first, inline) before it evicts anything,
up to the capacity. New pages go after the free ones, so the tier fills the memory already locked, lowest ids
first; every page it hands out is locked, so no copy touches unlocked memory.

Invariants, after every call: pages of indexed entries + pages of in-flight promotions + pool.num_free + withheld
pages = pool.num_pages <= the capacity; the LRU order is the index's order, oldest demotion first.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from lazyattn.cache.page_pool import GiB, PagePool
from lazyattn.errors import CacheInvariantError

if TYPE_CHECKING:
    import torch

    from lazyattn.cache.kv_transfer import PageMover, Transfer
    from lazyattn.cache.segment import Segment

# The default host tier on CUDA (docs/design.md): a quarter of the host memory available at start-up, at most this.
# Page-locked memory is taken from everything else on the host; it is locked as the tier grows, not at start-up.
DEFAULT_HOST_SHARE = 0.25
DEFAULT_HOST_CAP_BYTES = 64 * GiB


def default_host_bytes(device_type: str) -> int:
    """Host tier bytes when `host_cache_gb` is not given: none on a CPU-only engine (the GPU pool already is host
    memory), else DEFAULT_HOST_SHARE of available host memory, capped at DEFAULT_HOST_CAP_BYTES."""
    if device_type != "cuda":
        return 0
    return min(int(DEFAULT_HOST_SHARE * _available_host_bytes()), DEFAULT_HOST_CAP_BYTES)


def _available_host_bytes() -> int:
    """MemAvailable (free plus reclaimable page cache) on Linux, free pages elsewhere; 0 if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


@dataclass(eq=False, slots=True)
class HostEntry:
    key: str
    n_tokens: int
    pages: tuple[int, ...]  # host page ids, in the segment's page order


@dataclass(eq=False, slots=True)
class _Promotion:
    segment: Segment
    entry: HostEntry
    transfer: Transfer | None


@dataclass(frozen=True)
class HostTierStats:
    num_pages: int  # host pages the tier may grow to (the capacity)
    pages_used: int  # pages of indexed entries and of in-flight promotions
    entries: int  # documents indexed on the host
    hits: int  # GPU misses found on the host (each starts one promotion)
    promotions: int  # promotions finished (copy landed, segment ready)
    demotions: int  # GPU evictions copied to the host
    dropped: int  # GPU evictions that did not fit even in an empty host tier (lost, as without the tier)
    evictions: int  # host entries evicted LRU for room
    bytes_to_host: int
    bytes_to_device: int
    seconds_to_device: float  # copy time of finished promotions on the copy stream (CUDA events; 0 on CPU)
    page_bytes: int
    locked_pages: int = 0  # pages the tier has grown to so far: page-locked, free or used (<= num_pages)

    @property
    def promotion_gbps(self) -> float:
        """Achieved promotion bandwidth, GB/s (1e9), over the promotions' own copy time; 0 if not timed."""
        return self.bytes_to_device / self.seconds_to_device / 1e9 if self.seconds_to_device else 0.0


class HostTier:
    """The host tier, one of the document cache's lower tiers (cache/tiers.py): exclusive, filled by demotion."""

    name = "host"

    def __init__(
        self, num_pages: int, page_bytes: int, mover: PageMover | None = None, chunk_pages: int | None = None
    ) -> None:
        if page_bytes <= 0:
            raise ValueError(f"page_bytes must be positive, got {page_bytes}")
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        if chunk_pages is None:
            chunk_pages = mover.chunk_pages if mover is not None else max(num_pages, 1)
        if chunk_pages <= 0:
            raise ValueError(f"chunk_pages must be positive, got {chunk_pages}")
        self.capacity = num_pages
        self.chunk_pages = chunk_pages
        self.pool = PagePool(0)  # grown a chunk at a time (_grow)
        self._budget = num_pages  # set_capacity's cut
        self.page_bytes = page_bytes
        self.mover = mover
        self._index: OrderedDict[str, HostEntry] = OrderedDict()  # LRU: oldest demotion first
        self._promotions: list[_Promotion] = []
        self._indexed_pages = 0  # pages of the indexed entries (what LRU eviction could free)
        self.reset_stats()

    def reset_stats(self) -> None:
        self._hits = self._promotions_done = self._demotions = self._dropped = self._evictions = 0
        self._bytes_to_host = self._bytes_to_device = 0
        self._seconds_to_device = 0.0

    # -- queries -----------------------------------------------------------------------------------------------

    def contains(self, key: str) -> bool:
        return key in self._index

    def n_tokens(self, key: str) -> int:
        return self._index[key].n_tokens

    @property
    def num_pages(self) -> int:
        """Host pages the tier may use (grow to)."""
        return max(self._ceiling(), self.pool.num_pages) - self.pool.num_withheld

    def _ceiling(self) -> int:
        """Pages the pool may grow to: the budget, within what the mover could lock."""
        return min(self._budget, self.mover.num_pages) if self.mover is not None else self._budget

    @property
    def in_flight(self) -> int:
        """Promotions whose copy has not been seen to land yet."""
        return len(self._promotions)

    def __len__(self) -> int:
        return len(self._index)

    def stats(self) -> HostTierStats:
        return HostTierStats(
            num_pages=self.num_pages,
            pages_used=self.pool.num_used - self.pool.num_withheld,
            entries=len(self._index),
            hits=self._hits,
            promotions=self._promotions_done,
            demotions=self._demotions,
            dropped=self._dropped,
            evictions=self._evictions,
            bytes_to_host=self._bytes_to_host,
            bytes_to_device=self._bytes_to_device,
            seconds_to_device=self._seconds_to_device,
            page_bytes=self.page_bytes,
            locked_pages=self.pool.num_pages - self.pool.num_withheld,
        )

    # -- moving documents --------------------------------------------------------------------------------------

    def demote(self, segment: Segment) -> bool:
        """Copy an evicted GPU segment's pages to the host and index it as the most recently used entry, evicting
        older entries for room. False (and nothing copied) if it cannot fit even in an empty tier. The caller may
        free the GPU pages at once: the mover orders every later write to them after this copy."""
        n = len(segment.pages)
        if n > self.pool.num_free + self._indexed_pages + max(0, self._ceiling() - self.pool.num_pages):
            self._dropped += 1
            return False
        self._grow(n)
        if n > self.pool.num_free + self._indexed_pages:  # the mover could lock less than the capacity
            self._dropped += 1
            return False
        while self.pool.num_free < n:
            _, oldest = self._index.popitem(last=False)
            self._free(oldest)
            self._evictions += 1
        pages = tuple(self.pool.allocate(n))
        if self.mover is not None:
            self.mover.to_host(list(segment.pages), list(pages))
        self._index[segment.key] = HostEntry(segment.key, segment.n_tokens, pages)
        self._indexed_pages += n
        self._demotions += 1
        self._bytes_to_host += n * self.page_bytes
        return True

    def _grow(self, need: int) -> None:
        """Add chunks until `need` pages are free or the pool is at its ceiling; each is locked first."""
        while self.pool.num_free < need and self.pool.num_pages < self._ceiling():
            target = min(self.pool.num_pages + self.chunk_pages, self._ceiling())
            if self.mover is not None:
                target = min(target, self.mover.lock(target))
                if target <= self.pool.num_pages:
                    return
            self.pool.grow(target - self.pool.num_pages)

    def take(self, key: str) -> HostEntry:
        """Take key's entry out of the index (no acquire hits it on the host now); its pages stay held until the
        promotion that must follow has landed."""
        entry = self._index.pop(key)
        self._indexed_pages -= len(entry.pages)
        return entry

    def promote(self, entry: HostEntry, segment: Segment) -> None:
        """Start copying a taken entry into `segment`'s GPU pages (as many as the entry's)."""
        if len(segment.pages) != len(entry.pages):
            raise ValueError(f"promoting {len(entry.pages)} host pages into {len(segment.pages)} GPU pages")
        transfer = self.mover.to_device(list(entry.pages), list(segment.pages)) if self.mover is not None else None
        self._promotions.append(_Promotion(segment, entry, transfer))
        self._hits += 1
        self._bytes_to_device += len(entry.pages) * self.page_bytes

    def finished(self, wait: bool = False) -> list[Segment]:
        """The segments whose promotion has landed since the last call, oldest first; their host pages are freed.
        wait: block until every promotion in flight has landed."""
        done, pending = [], []
        for p in self._promotions:
            if p.transfer is None or self.mover is None:
                done.append(p)
            elif wait:
                self.mover.wait(p.transfer)
                done.append(p)
            elif self.mover.done(p.transfer):
                done.append(p)
            else:
                pending.append(p)
        self._promotions = pending
        for p in done:
            self.pool.free(p.entry.pages)
            self._promotions_done += 1
            if p.transfer is not None and self.mover is not None:
                self._seconds_to_device += self.mover.seconds(p.transfer)
        return [p.segment for p in done]

    # -- the lower-tier interface (cache/tiers.py) -------------------------------------------------------------

    def claim(self, key: str, n_tokens: int) -> HostEntry:
        if self._index[key].n_tokens != n_tokens:
            raise ValueError(f"segment {key[:16]} has {self._index[key].n_tokens} tokens, acquired with {n_tokens}")
        return self.take(key)

    def fill(self, entry: HostEntry, segment: Segment) -> None:
        self.promote(entry, segment)

    def encoded(self, segment: Segment) -> None:
        """Nothing: the host holds only what the GPU evicted."""

    def evicted(self, segment: Segment) -> None:
        self.demote(segment)

    # -- dropping ----------------------------------------------------------------------------------------------

    def discard(self, key: str) -> bool:
        """Forget key's host copy (the document was deleted). False if the host does not hold it."""
        entry = self._index.pop(key, None)
        if entry is None:
            return False
        self._free(entry)
        return True

    def clear(self) -> int:
        """Drop every indexed entry (in-flight promotions finish as usual). Returns the pages freed."""
        freed = 0
        while self._index:
            _, entry = self._index.popitem(last=False)
            self._free(entry)
            freed += len(entry.pages)
        return freed

    def filling(self) -> list[Segment]:
        return [p.segment for p in self._promotions]

    def check(self) -> None:
        """The pool's used pages are exactly the indexed entries', the promotions' in flight and the withheld ones,
        each page once."""
        indexed = [page for e in self._index.values() for page in e.pages]
        held = indexed + [page for p in self._promotions for page in p.entry.pages]
        if len(indexed) != self._indexed_pages:
            raise CacheInvariantError(
                f"host tier: {self._indexed_pages} indexed pages counted, entries hold {len(indexed)}"
            )
        if len(set(held)) != len(held) or not all(self.pool.is_used(p) for p in held):
            raise CacheInvariantError("host tier: a host page is held twice, or held and free")
        if len(held) + self.pool.num_withheld != self.pool.num_used:
            raise CacheInvariantError(
                f"host tier: {self.pool.num_used} pages used, {len(held)} held and {self.pool.num_withheld} withheld"
            )
        if any(e.key != k for k, e in self._index.items()):
            raise CacheInvariantError("host tier: an entry is indexed under another key")

    def set_capacity(self, num_pages: int | None) -> None:
        """Use only `num_pages` host pages (None: all), as if the tier were that small; 0 turns it off. Empties
        the tier; no promotion may be in flight (the benchmark's host-budget sweep). Pages the pool has already
        grown beyond the cut are withheld; it grows no further than the cut."""
        if self._promotions:
            raise ValueError("set_capacity needs an idle tier; promotions are in flight")
        if num_pages is not None and not 0 <= num_pages <= self.capacity:
            raise ValueError(f"a host budget of {num_pages} pages does not fit the tier of {self.capacity}")
        self.clear()
        self._budget = self.capacity if num_pages is None else num_pages
        self.pool.set_budget(self._budget)

    def _free(self, entry: HostEntry) -> None:
        """Free an entry just taken out of the index."""
        self.pool.free(entry.pages)
        self._indexed_pages -= len(entry.pages)


class HostTierOptions(Protocol):
    """The engine options `make_host_tier` reads (EngineConfig has them): the cache layer names what it needs
    rather than importing the engine above it."""

    @property
    def mode(self) -> str: ...

    @property
    def host_cache_gb(self) -> float | None: ...


def make_host_tier(config: HostTierOptions, device_kv: torch.Tensor) -> HostTier | None:
    """The engine's host tier (`host_cache_gb`, else `default_host_bytes`) over its GPU pool's KV tensor, or None:
    off, or full mode, which caches nothing."""
    from lazyattn.cache.kv_transfer import PageMover

    if config.mode == "full":
        return None
    nbytes = (
        default_host_bytes(device_kv.device.type) if config.host_cache_gb is None else int(config.host_cache_gb * GiB)
    )
    page_bytes = device_kv[:, :, 0].numel() * device_kv.element_size()
    num_pages = nbytes // page_bytes
    return HostTier(num_pages, page_bytes, PageMover(device_kv, num_pages)) if num_pages else None
