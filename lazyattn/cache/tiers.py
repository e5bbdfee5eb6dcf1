"""The interface between the document cache (the GPU tier) and the tiers below it (docs/design.md, "Tiers").

A lazy- or block-mode document's KV is encoded alone at local positions, so its pages are valid in any slot of any
request: they can leave the GPU and come back as they are. Below the GPU's DocumentCache sit, in order, the host
tier (cache/host_tier.py: pinned host memory, exclusive: a document is on the GPU or on the host) and the disk tier
(cache/disk_tier.py: files, inclusive: written through when a document is encoded, so it outlives the process).

The DocumentCache calls every lower tier the same way, top tier first:

- `encoded(segment)`: the segment's KV was just computed (the disk tier writes it through);
- `evicted(segment)`: the GPU evicts the segment; the tier may copy its pages before they are freed (the host tier
  demotes it; the copy is ordered before any later write of those pages);
- on a GPU miss, the first tier whose `contains(key)` is true: `claim(key, n_tokens)` (a handle, or None if the tier
  refuses its copy: the disk tier checks the file, and a refused file is a miss), then, with GPU pages allocated,
  `fill(handle, segment)`; the segment is ready once `finished()` hands it back (`in_flight` counts those not
  handed back yet), unless the tier set its `failed` flag (a disk file refused by the read in the background):
  then the cache unindexes it and its waiters start over, encoding it. Until then the fill holds a reference of
  its own on the segment;
- `discard(key)` (the document was deleted) and `clear()` (forget everything);
- `filling()`: the segments whose fill is in flight; `check()`: the tier's own invariants (CacheInvariantError).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from lazyattn.cache.segment import Segment


class LowerTier(Protocol):
    name: str  # "host" or "disk": the CacheStats fields its hits count in

    @property
    def in_flight(self) -> int: ...

    def contains(self, key: str) -> bool: ...

    def claim(self, key: str, n_tokens: int) -> Any | None: ...

    def fill(self, handle: Any, segment: Segment) -> None: ...

    def finished(self, wait: bool = False) -> list[Segment]: ...

    def encoded(self, segment: Segment) -> None: ...

    def evicted(self, segment: Segment) -> None: ...

    def discard(self, key: str) -> bool: ...

    def clear(self) -> int: ...

    def filling(self) -> list[Segment]: ...

    def check(self) -> None: ...
