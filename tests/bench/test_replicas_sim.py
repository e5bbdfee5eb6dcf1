"""The replica simulation (lazyattn/bench/replicas.py): hand-computed routing outcomes, and agreement with the
one-engine simulation it extends."""

from __future__ import annotations

import pytest

from lazyattn.bench.hitratio import PageAccounting, TraceKeys, simulate
from lazyattn.bench.replicas import CostModel, route_keys, simulate_cluster, sweep_replicas
from lazyattn.bench.workload import Load, Trace, TraceRequest, WorkloadSpec, make_trace

PAGE = 16


def _trace(order: list[int], gap_s: float = 10.0) -> Trace:
    """One document per request, in `order`, each arriving long after the last finished (loads stay 0)."""
    spec = WorkloadSpec(
        num_docs=2, doc_len=64, docs_per_request=1, question_len=4, output_len=2, num_requests=len(order)
    )
    documents = [[1] * 64, [2] * 64]
    requests = [TraceRequest(i, (d,), [3, 3, 3, 3], i * gap_s) for i, d in enumerate(order)]
    return Trace(spec, Load(rate=1 / gap_s) if gap_s else Load(), [], documents, requests)


def _run(trace: Trace, policy: str, replicas: int = 2, pages: int = 64):
    keys = TraceKeys(trace, PAGE)
    return simulate_cluster(trace, keys, route_keys(trace, keys, PAGE), policy, replicas, pages)


def test_affinity_hits_where_round_robin_misses():
    trace = _trace([0, 0, 1, 1])
    # Round-robin: doc 0 -> r0, doc 0 -> r1, doc 1 -> r0, doc 1 -> r1: each lands where it was never encoded.
    assert _run(trace, "round-robin").doc_hit_ratio == 0.0
    # Document affinity: each repeat goes where the document is: 2 hits of 4.
    assert _run(trace, "document-affinity").doc_hit_ratio == 0.5
    # One replica holding both: the same 2 hits.
    assert _run(trace, "round-robin", replicas=1).doc_hit_ratio == 0.5


def test_one_replica_is_the_one_engine_simulation():
    spec = WorkloadSpec(num_docs=30, doc_len=128, docs_per_request=3, num_requests=120, question_len=8, output_len=4)
    trace = make_trace(spec, Load(rate=5.0), vocab_high=1000, bos=999)
    keys = TraceKeys(trace, PAGE)
    pages = 40  # about 4 documents: evictions happen
    alone = simulate(trace, "lazy", pages, PAGE, keys)
    for policy in ("round-robin", "document-affinity"):
        one = simulate_cluster(trace, keys, route_keys(trace, keys, PAGE), policy, 1, pages)
        assert one.doc_hit_ratio == alone.doc_hit_ratio
        assert one.token_reuse_ratio == alone.token_reuse_ratio
        assert one.busy_imbalance == one.request_imbalance == 1.0


def test_cost_model_and_imbalance():
    # Two requests at t=0 and t=0 on one replica: the second waits for the first.
    trace = _trace([0, 1], gap_s=0.0)
    cost = CostModel(fixed_s=0.5, token_s=0.001)
    r = simulate_cluster(trace, *_keys_routes(trace), "round-robin", 1, 64, cost)
    # Both miss their 64-token document (the 4-token question is never cached): 0.5 + 0.068 s each.
    assert r.mean_latency_s == pytest.approx((0.568 + 2 * 0.568) / 2)
    # Four requests of one document over two replicas: round-robin even; affinity puts all four on one (the loads
    # are 0 at every arrival, so no bound binds): 4 / (4 / 2) = 2.
    trace4 = _trace([0, 0, 0, 0])
    assert simulate_cluster(trace4, *_keys_routes(trace4), "round-robin", 2, 64).request_imbalance == 1.0
    assert simulate_cluster(trace4, *_keys_routes(trace4), "document-affinity", 2, 64).request_imbalance == 2.0


def _keys_routes(trace: Trace):
    keys = TraceKeys(trace, PAGE)
    return keys, route_keys(trace, keys, PAGE)


def test_sweep_document_affinity_beats_round_robin_on_the_paper_workload_shape():
    spec = WorkloadSpec(num_docs=40, doc_len=128, docs_per_request=3, num_requests=300, question_len=8, output_len=4)
    acct = PageAccounting(PAGE, PAGE * 1024)  # 1 KiB per token: 1 MiB holds 1024 tokens, 8 documents
    rows = sweep_replicas(
        spec,
        ["paper", "uniform"],
        [1, 4],
        ["round-robin", "document-affinity"],
        1 / 1024,
        acct,
        vocab_high=1000,
        bos=999,
    )
    by = {(r["variant"], r["replicas"], r["policy"]): r for r in rows}
    for variant in ("paper", "uniform"):
        hit = {
            (n, p): by[(variant, n, p)]["doc_hit_ratio"] for n in (1, 4) for p in ("round-robin", "document-affinity")
        }
        assert hit[(1, "round-robin")] == hit[(1, "document-affinity")]
        assert hit[(4, "document-affinity")] > hit[(4, "round-robin")]
        # No router beats one engine holding the cluster's whole KV.
        assert hit[(4, "document-affinity")] <= by[(variant, 4, "round-robin")]["single_engine_hit_ratio"] + 1e-9
    with pytest.raises(ValueError, match="unknown variant"):
        sweep_replicas(spec, ["nope"], [1], ["round-robin"], 1.0, acct, 1000, 999)
