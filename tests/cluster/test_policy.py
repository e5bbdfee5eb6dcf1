"""Routing policies (lazyattn/cluster/policy.py) and route keys, against hand-computed cases."""

from __future__ import annotations

import pytest

from lazyattn.cluster.keys import document_key, prefix_keys, route_key
from lazyattn.cluster.policy import (
    CacheView,
    DocumentAffinity,
    LeastLoaded,
    PrefixAffinity,
    RoundRobin,
    RoutedDocument,
    RouteKey,
    home,
    make_policy,
)
from lazyattn.engine.prompt import RenderedPrompt


def docs(*spec: tuple[str, int]) -> RouteKey:
    return RouteKey(tuple(RoutedDocument(k, n) for k, n in spec))


def test_rendezvous_home_moves_only_what_it_must():
    keys = [f"doc-{i}" for i in range(300)]
    three = {k: home(k, ["a", "b", "c"]) for k in keys}
    four = {k: home(k, ["a", "b", "c", "d"]) for k in keys}
    moved = [k for k in keys if three[k] != four[k]]
    assert moved and all(four[k] == "d" for k in moved)  # a new replica only takes keys, to itself
    assert 300 / 4 * 0.6 < len(moved) < 300 / 4 * 1.4  # about a quarter of them
    two = {k: home(k, ["a", "b"]) for k in keys}
    assert all(two[k] == three[k] for k in keys if three[k] != "c")  # removing c moves only c's keys
    assert home("doc-7", ["c", "a", "b"]) == three["doc-7"]  # the order of the replica list does not matter


def test_cache_view_is_lru_bounded_by_tokens():
    view = CacheView(capacity_tokens=250)
    view.touch("a", 100)
    view.touch("b", 100)
    view.touch("c", 100)  # 300 > 250: the oldest, a, goes
    assert "a" not in view and "b" in view and "c" in view
    view.touch("b", 100)  # b is now the newest
    view.touch("d", 100)  # c is the oldest now
    assert "c" not in view and "b" in view and "d" in view


def test_document_affinity_follows_cached_documents_in_any_order():
    policy = DocumentAffinity(load_margin=2)
    idle = {"r0": 0, "r1": 0, "r2": 0}
    first = policy.choose(docs(("x", 100), ("y", 50)), idle)
    # Nothing cached: the replica that is home to the most tokens. x's 100 outweigh y's 50 unless both share one.
    hx, hy = home("x", ["r0", "r1", "r2"]), home("y", ["r0", "r1", "r2"])
    assert first.replica == hx and "nothing cached" in first.reason
    assert f"home of {100 + (50 if hy == hx else 0)} of 150" in first.reason
    policy.routed(docs(("x", 100), ("y", 50)), first.replica)
    # y first, then a new document z: x and y are cached on the first replica whatever their order.
    again = policy.choose(docs(("z", 120), ("y", 50), ("x", 100)), idle)
    assert again.replica == first.replica
    assert "150 of 270 document tokens cached here" in again.reason
    assert again.ranking[0] == again.replica and sorted(again.ranking) == ["r0", "r1", "r2"]


def test_load_bound_skips_a_replica_over_the_margin():
    policy = DocumentAffinity(load_margin=2, capacity_factor=100)  # only the margin binds here
    key = docs(("x", 100))
    policy.routed(key, "r0")
    assert policy.choose(key, {"r0": 2, "r1": 0}).replica == "r0"  # 2 <= 0 + 2: still eligible
    over = policy.choose(key, {"r0": 3, "r1": 0})  # 3 > 0 + 2: skipped
    assert over.replica == "r1"
    assert "skipped 1 replica(s) caching more" in over.reason
    assert over.ranking == ("r1", "r0")  # the skipped one is the fallback


def test_capacity_bound_spreads_a_hot_document_on_an_idle_cluster():
    policy = DocumentAffinity(load_margin=2, capacity_factor=1.5)
    key = docs(("hot", 100))
    policy.routed(key, "r0")
    # Loads 1, 0, 0: cap = ceil(1.5 * (1 + 1) / 3) = 1, and r0's load is not below it.
    assert policy.choose(key, {"r0": 1, "r1": 0, "r2": 0}).replica != "r0"
    # Loads 1, 1, 1: cap = ceil(1.5 * 4 / 3) = 2: r0 is back.
    assert policy.choose(key, {"r0": 1, "r1": 1, "r2": 1}).replica == "r0"


def test_prefix_affinity_matches_prefixes_and_misses_reordered_documents():
    page = 4
    a, b, q = list(range(8)), list(range(100, 108)), [7, 7, 7, 7, 7]
    ab = route_key(RenderedPrompt([a, b], q), None, page)
    ba = route_key(RenderedPrompt([b, a], q), None, page)
    policy = PrefixAffinity(load_margin=2)
    loads = {"r0": 0, "r1": 0}
    policy.routed(ab, "r1")
    same = policy.choose(ab, loads)
    assert same.replica == "r1" and "20 of 20 prompt tokens" in same.reason  # 21 tokens: 5 full pages of 4
    reordered = policy.choose(ba, loads)
    assert "best match 0 of 20" in reordered.reason  # the same documents, another order: no prefix in common
    document = DocumentAffinity(load_margin=2)
    document.routed(ab, "r1")
    assert document.choose(ba, loads).replica == "r1"


def test_round_robin_and_least_loaded():
    rr = RoundRobin()
    assert [rr.choose(RouteKey(), {"b": 0, "a": 9}).replica for _ in range(3)] == ["a", "b", "a"]
    ll = LeastLoaded()
    assert ll.choose(RouteKey(), {"a": 3, "b": 1, "c": 2}).replica == "b"
    ties = {ll.choose(RouteKey(), {"a": 0, "b": 0}).replica for _ in range(4)}
    assert ties == {"a", "b"}  # ties rotate


def test_route_keys_are_scoped_to_the_tenant_and_free_of_position():
    doc, other = [5, 6, 7], [8, 9]
    k1 = route_key(RenderedPrompt([[1], doc, other], [3]), '["t1", null]')
    k2 = route_key(RenderedPrompt([[1], other, doc], [4]), '["t1", null]')
    k3 = route_key(RenderedPrompt([[1], doc, other], [3]), '["t2", null]')
    assert k1.documents[1] == k2.documents[2] == RoutedDocument(document_key('["t1", null]', doc), 3)
    assert {d.key for d in k1.documents}.isdisjoint(d.key for d in k3.documents)
    assert prefix_keys(None, list(range(10)), 4) == prefix_keys(None, list(range(9)), 4)  # full pages only: 2
    assert len(prefix_keys(None, list(range(10)), 4)) == 2


def test_unknown_policy_and_bad_bounds_are_rejected():
    with pytest.raises(ValueError, match="unknown routing policy"):
        make_policy("random")
    with pytest.raises(ValueError, match="load_margin"):
        DocumentAffinity(load_margin=-1)
    with pytest.raises(ValueError, match="capacity_factor"):
        DocumentAffinity(capacity_factor=0.5)
    with pytest.raises(ValueError, match="no replica"):
        RoundRobin().choose(RouteKey(), {})
