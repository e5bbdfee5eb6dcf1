"""Routing policies: which replica serves a request. Pure Python, no Ray: the Ray Serve request router
(`cluster/router.py`) and the replica simulation (`bench/replicas.py`) call this same code.

A policy sees a request's `RouteKey` (its documents' keys and token counts, and for prefix affinity the chained
keys of its prompt pages) and each candidate replica's load (requests in flight), and returns a `Decision`: the
chosen replica, every replica in order of preference (the router hands the rest to Serve as fallbacks), and a
sentence saying why. It learns what replicas hold from its own decisions (`routed`): a document routed to a
replica is being encoded or cached there, and later requests placing it should hit. That view is an estimate:
each replica's LRU is mirrored with the replica's KV capacity in tokens (`set_capacity`), so it ages documents
out roughly when the engine does.

- round-robin: each replica in turn. Every replica ends up caching every popular document: the cluster's
  cache is one replica's cache, N times.
- least-loaded: the replica with the fewest requests in flight.
- prefix-affinity: the replica holding the longest cached prefix of the prompt (page-chained keys, as token
  prefix routers do), falling back to least-loaded below a minimum match. Reordered documents break a prefix
  after the first document, so this finds little in RAG traffic.
- document-affinity: the replica already holding most of the request's document tokens, whatever their
  order. With nothing cached, each document's home replica by rendezvous (highest-random-weight) hashing,
  and the replica that is home to most of the request's tokens. So a document has one home while the
  replica set holds, and adding or removing a replica moves only the documents whose home it was.

The load bound (document- and prefix-affinity): a replica more than `load_margin` requests above the least
loaded candidate is skipped, so a hot document cannot pin one replica; it spreads to the next replicas of its
rendezvous order, which then cache it too.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

POLICIES = ("round-robin", "least-loaded", "prefix-affinity", "document-affinity")
# Requests in flight a replica may have above the least loaded one and still be chosen for affinity. Small: in the
# simulation (bench/replicas.py, paper workload) margins of 1-2 gave both the best hit ratio and the lowest
# latency, since spreading a hot document lets every replica cache it; 4 and 8 let hot documents pile up on one
# replica. Same default for both affinity policies, so they compare fairly.
DEFAULT_LOAD_MARGIN = 2
# Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018): a replica is full at this factor
# times the mean load (counting the request being placed). It is what spreads hot documents when the cluster is
# lightly loaded and the margin never binds; 1.5 cut the simulated busiest-replica share by a quarter at 8-64
# replicas for under 3 points of hit ratio.
DEFAULT_CAPACITY_FACTOR = 1.5


@dataclass(frozen=True)
class RoutedDocument:
    key: str  # content key, scoped to the tenant (cluster/keys.py): equal only for the same tokens and scope
    tokens: int


@dataclass(frozen=True)
class RouteKey:
    documents: tuple[RoutedDocument, ...] = ()
    prefix: tuple[str, ...] = ()  # chained keys of the prompt's full pages (prefix-affinity only)
    page_tokens: int = 0  # tokens per prefix key

    @property
    def document_tokens(self) -> int:
        return sum(d.tokens for d in self.documents)


@dataclass(frozen=True)
class Decision:
    replica: str
    ranking: tuple[str, ...]  # every candidate, most preferred first (ranking[0] == replica)
    reason: str


@lru_cache(maxsize=1 << 16)
def rendezvous_weight(key: str, replica: str) -> int:
    """The replica's weight for `key` in rendezvous hashing: the same in every process (no Python hash seed)."""
    return int.from_bytes(hashlib.blake2b(f"{key}\x00{replica}".encode(), digest_size=8).digest(), "big")


def home(key: str, replicas: Sequence[str]) -> str:
    """The replica `key` belongs to among `replicas`: the highest rendezvous weight."""
    return max(replicas, key=lambda r: rendezvous_weight(key, r))


class CacheView:
    """A policy's estimate of what one replica caches: keys in LRU order, bounded by the replica's capacity in
    tokens (None: unbounded until the replica reports it)."""

    def __init__(self, capacity_tokens: int | None = None) -> None:
        self.capacity_tokens = capacity_tokens
        self._keys: OrderedDict[str, int] = OrderedDict()
        self._tokens = 0

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def touch(self, key: str, tokens: int) -> None:
        if key in self._keys:
            self._keys.move_to_end(key)
            return
        self._keys[key] = tokens
        self._tokens += tokens
        while self.capacity_tokens is not None and self._tokens > self.capacity_tokens and len(self._keys) > 1:
            _, n = self._keys.popitem(last=False)
            self._tokens -= n


class RoutingPolicy:
    """Base: a view per replica, kept by `routed`, dropped by `forget`. Subclasses implement `choose`."""

    name = ""

    def __init__(self) -> None:
        self.views: dict[str, CacheView] = {}
        self._capacity: dict[str, int | None] = {}

    def choose(self, key: RouteKey, loads: Mapping[str, int]) -> Decision:
        """The replica for a request among `loads`' keys (replica id -> requests in flight; at least one)."""
        raise NotImplementedError

    def routed(self, key: RouteKey, replica: str) -> None:
        """`replica` got the request: it now holds (or is encoding) its documents."""
        view = self._view(replica)
        for d in key.documents:
            view.touch(d.key, d.tokens)

    def set_capacity(self, replica: str, tokens: int | None) -> None:
        self._capacity[replica] = tokens
        if replica in self.views:
            self.views[replica].capacity_tokens = tokens

    def forget(self, replica: str) -> None:
        """The replica is gone: its cache with it."""
        self.views.pop(replica, None)
        self._capacity.pop(replica, None)

    def _view(self, replica: str) -> CacheView:
        view = self.views.get(replica)
        if view is None:
            view = self.views[replica] = CacheView(self._capacity.get(replica))
        return view

    def _cached_tokens(self, replica: str, key: RouteKey) -> int:
        view = self.views.get(replica)
        return 0 if view is None else sum(d.tokens for d in key.documents if d.key in view)


def _candidates(loads: Mapping[str, int]) -> list[str]:
    if not loads:
        raise ValueError("no replica to route to")
    return sorted(loads)


class RoundRobin(RoutingPolicy):
    name = "round-robin"

    def __init__(self) -> None:
        super().__init__()
        self._next = itertools.count()

    def choose(self, key: RouteKey, loads: Mapping[str, int]) -> Decision:
        replicas = _candidates(loads)
        i = next(self._next) % len(replicas)
        ranking = tuple(replicas[i:] + replicas[:i])
        return Decision(ranking[0], ranking, f"round-robin: turn {i} of {len(replicas)}")


class LeastLoaded(RoutingPolicy):
    name = "least-loaded"

    def __init__(self) -> None:
        super().__init__()
        self._turn = itertools.count()

    def choose(self, key: RouteKey, loads: Mapping[str, int]) -> Decision:
        replicas = _candidates(loads)
        # Ties rotate, so an idle cluster spreads requests instead of sending all to the first replica.
        start = next(self._turn) % len(replicas)
        order = {r: (i - start) % len(replicas) for i, r in enumerate(replicas)}
        ranking = tuple(sorted(replicas, key=lambda r: (loads[r], order[r])))
        return Decision(ranking[0], ranking, f"least-loaded: {loads[ranking[0]]} in flight")


class _LoadBounded(RoutingPolicy):
    def __init__(
        self, load_margin: int = DEFAULT_LOAD_MARGIN, capacity_factor: float = DEFAULT_CAPACITY_FACTOR
    ) -> None:
        super().__init__()
        if load_margin < 0:
            raise ValueError(f"load_margin must be >= 0, got {load_margin}")
        if capacity_factor < 1:
            raise ValueError(f"capacity_factor must be >= 1, got {capacity_factor}")
        self.load_margin = load_margin
        self.capacity_factor = capacity_factor

    def _eligible(self, replicas: list[str], loads: Mapping[str, int]) -> tuple[list[str], int]:
        """The replicas within both load bounds, and the least load. Never empty: the least loaded replica is
        within the margin, and below the cap since the cap exceeds the mean load."""
        least = min(loads[r] for r in replicas)
        cap = math.ceil(self.capacity_factor * (sum(loads[r] for r in replicas) + 1) / len(replicas))
        return [r for r in replicas if loads[r] <= least + self.load_margin and loads[r] < cap], least


class DocumentAffinity(_LoadBounded):
    name = "document-affinity"

    def choose(self, key: RouteKey, loads: Mapping[str, int]) -> Decision:
        replicas = _candidates(loads)
        eligible, least = self._eligible(replicas, loads)
        cached = {r: self._cached_tokens(r, key) for r in replicas}
        homes = dict.fromkeys(replicas, 0)
        for d in key.documents:
            homes[home(d.key, eligible)] += d.tokens

        def preference(r: str) -> tuple:
            return (r in eligible, cached[r], homes[r], -loads[r], r)

        ranking = tuple(sorted(replicas, key=preference, reverse=True))
        best = ranking[0]
        total = key.document_tokens
        if cached[best]:
            reason = f"document-affinity: {cached[best]} of {total} document tokens cached here"
        elif total:
            reason = f"document-affinity: nothing cached; home of {homes[best]} of {total} document tokens"
        else:
            reason = "document-affinity: no documents; least loaded"
        skipped = [r for r in replicas if r not in eligible and cached[r] > cached[best]]
        if skipped:
            reason += (
                f"; skipped {len(skipped)} replica(s) caching more, over the load bound "
                f"(least loaded {least} + margin {self.load_margin}, or {self.capacity_factor:g}x the mean)"
            )
        return Decision(best, ranking, reason)


class PrefixAffinity(_LoadBounded):
    """Longest cached prompt prefix, in pages (the view holds page keys here, not documents)."""

    name = "prefix-affinity"

    def __init__(
        self,
        load_margin: int = DEFAULT_LOAD_MARGIN,
        capacity_factor: float = DEFAULT_CAPACITY_FACTOR,
        min_match: float = 0.1,
    ) -> None:
        super().__init__(load_margin, capacity_factor)
        self.min_match = min_match  # below this share of the prompt matched: least loaded instead
        self._turn = itertools.count()

    def routed(self, key: RouteKey, replica: str) -> None:
        view = self._view(replica)
        for k in key.prefix:
            view.touch(k, key.page_tokens)

    def _matched(self, replica: str, key: RouteKey) -> int:
        view = self.views.get(replica)
        n = 0
        if view is not None:
            for k in key.prefix:
                if k not in view:
                    break
                n += 1
        return n * key.page_tokens

    def choose(self, key: RouteKey, loads: Mapping[str, int]) -> Decision:
        replicas = _candidates(loads)
        eligible, least = self._eligible(replicas, loads)
        matched = {r: self._matched(r, key) for r in replicas}
        total = len(key.prefix) * key.page_tokens
        start = next(self._turn) % len(replicas)
        order = {r: (i - start) % len(replicas) for i, r in enumerate(replicas)}
        best_match = max(matched[r] for r in eligible)
        if total and best_match >= self.min_match * total:
            ranking = tuple(sorted(replicas, key=lambda r: (r not in eligible, -matched[r], loads[r], order[r])))
            reason = f"prefix-affinity: {matched[ranking[0]]} of {total} prompt tokens match a cached prefix"
        else:
            ranking = tuple(sorted(replicas, key=lambda r: (loads[r], order[r])))
            reason = (
                f"prefix-affinity: best match {best_match} of {total} tokens is below {self.min_match:.0%}; "
                "least loaded"
            )
        return Decision(ranking[0], ranking, reason)


def make_policy(
    name: str, load_margin: int = DEFAULT_LOAD_MARGIN, capacity_factor: float = DEFAULT_CAPACITY_FACTOR
) -> RoutingPolicy:
    if name == "round-robin":
        return RoundRobin()
    if name == "least-loaded":
        return LeastLoaded()
    if name == "prefix-affinity":
        return PrefixAffinity(load_margin, capacity_factor)
    if name == "document-affinity":
        return DocumentAffinity(load_margin, capacity_factor)
    raise ValueError(f"unknown routing policy {name!r}; choose from {', '.join(POLICIES)}")
