"""The disk tier as bookkeeping only, for the hit-ratio simulation (bench/hitratio.py): the same lower-tier interface
(cache/tiers.py) and policy as cache/disk_tier.py, with keys and page counts instead of files.

Like the real tier it is inclusive and written through: a document is indexed when it is encoded, a document
already indexed is not written again, a hit makes it the most recently used, and the least recently used go first
once the pages exceed the budget. A fill lands at the next poll.
"""

from __future__ import annotations

from collections import OrderedDict

from lazyattn.cache.segment import Segment
from lazyattn.errors import CacheInvariantError


class SimulatedDiskTier:
    name = "disk"

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self.pages_used = 0
        self.evictions = 0
        self._index: OrderedDict[str, tuple[int, int]] = OrderedDict()  # key -> (tokens, pages), oldest use first
        self._filled: list[Segment] = []

    @property
    def in_flight(self) -> int:
        return len(self._filled)

    def contains(self, key: str) -> bool:
        return key in self._index

    def claim(self, key: str, n_tokens: int) -> bool | None:
        if self._index[key][0] != n_tokens:
            return None
        self._index.move_to_end(key)
        return True

    def fill(self, handle: bool, segment: Segment) -> None:
        self._filled.append(segment)

    def finished(self, wait: bool = False) -> list[Segment]:
        done, self._filled = self._filled, []
        return done

    def filling(self) -> list[Segment]:
        return list(self._filled)

    def check(self) -> None:
        if self.pages_used != sum(pages for _, pages in self._index.values()) or self.pages_used > self.num_pages:
            raise CacheInvariantError(f"simulated disk tier: {self.pages_used} pages counted of {self.num_pages}")

    def encoded(self, segment: Segment) -> None:
        n = len(segment.pages)
        if segment.key in self._index or n > self.num_pages:
            return
        self._index[segment.key] = (segment.n_tokens, n)
        self.pages_used += n
        while self.pages_used > self.num_pages:
            _, (_, pages) = self._index.popitem(last=False)
            self.pages_used -= pages
            self.evictions += 1

    def evicted(self, segment: Segment) -> None:
        pass

    def discard(self, key: str) -> bool:
        entry = self._index.pop(key, None)
        if entry is not None:
            self.pages_used -= entry[1]
        return entry is not None

    def clear(self) -> int:
        n = len(self._index)
        self._index.clear()
        self.pages_used = 0
        return n
