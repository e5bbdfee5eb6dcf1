"""Priming the document cache (bench/prime.py): how many documents fit and which requests place them, by hand; then
on the tiny engine, that the cache holds exactly those documents afterwards and that a point measured from the
primed cache finds every document (from an empty cache its first request cannot)."""

from __future__ import annotations

import pytest

from lazyattn.bench.prime import PRIME_CONCURRENCY, prime_cache, priming_documents, priming_requests
from lazyattn.bench.replay import make_engine, replay
from lazyattn.bench.steady import PhaseConfig, base_trace, run_point
from lazyattn.bench.workload import Load, Trace, TraceRequest, WorkloadSpec, token_space


def test_priming_documents_leave_room_for_the_running_requests():
    spec = WorkloadSpec(num_docs=100, doc_len=2048, docs_per_request=5, question_len=32, output_len=16)
    # 64-token pages: a document 32 pages, the system segment (BOS) 1, a request 5 x 32 + 1 + 1 (question and
    # output) = 162. Room for 25 documents next to 4 requests: 1 + 4 x 162 + 25 x 32 = 1449 pages (+31 spare).
    assert PRIME_CONCURRENCY == 4
    assert priming_documents(spec, 1449 + 31, 64) == 25
    assert priming_documents(spec, 1449 - 1, 64) == 24
    assert priming_documents(spec, 10**6, 64) == 100  # the whole pool fits
    assert priming_documents(spec, 100, 64) == 0


def test_priming_requests_walk_the_most_popular_documents_least_popular_first():
    spec = WorkloadSpec(num_docs=10, doc_len=16, docs_per_request=3, question_len=4)
    reqs = priming_requests(spec, 7, vocab_high=50)
    # Chunks [0 1 2] [3 4 5] [6 + 0 1], served in reverse: the most popular documents last.
    assert [r.doc_ids for r in reqs] == [(6, 0, 1), (3, 4, 5), (0, 1, 2)]
    assert [r.index for r in reqs] == [0, 1, 2]
    assert all(len(r.question) == 4 and max(r.question) < 50 for r in reqs)
    assert priming_requests(spec, 0, 50) == []
    # Fewer documents fit than a request holds: the request is filled up with the next most popular.
    assert [r.doc_ids for r in priming_requests(spec, 2, 50)] == [(0, 1, 2)]


SPEC = WorkloadSpec(num_docs=12, doc_len=32, docs_per_request=3, zipf_alpha=1.1, question_len=4, output_len=2, seed=1)
PAGE = 16


@pytest.fixture(scope="module")
def engine():
    return make_engine(dict(model="tiny", device="cpu", page_size=PAGE), "lazy")


def _hits(engine, trace: Trace, doc_ids: list[tuple[int, ...]]) -> list[float]:
    """Documents found cached per request, served one at a time on the cache as it stands."""
    requests = [TraceRequest(i, d, [1, 2, 3, 4], 0.0) for i, d in enumerate(doc_ids)]
    run = replay(engine, Trace(SPEC, Load(concurrency=1), trace.system, trace.documents, requests), cache="as_is")
    return [r.doc_hits for r in run.records]


def test_priming_leaves_exactly_the_documents_that_fit(engine):
    vocab_high, bos = token_space(engine.model_config)
    trace = base_trace(SPEC, vocab_high, bos)
    # A pool of 1 (system) + 4 x 8 (requests: 3 x 2 document pages, 1 system, 1 question + output) + 5 x 2 pages:
    # the five most popular documents fit.
    engine.set_kv_budget(1 + PRIME_CONCURRENCY * 8 + 5 * 2)
    try:
        primed = prime_cache(engine, trace, vocab_high)
        stats = engine.stats()
        assert (primed.documents, primed.requests, primed.timed_out) == (5, 2, False)
        assert stats.cache.segments == 6 and stats.cache.pages_in_use == 5 * 2 + 1  # 5 documents, the system
        assert primed.kv_gib == pytest.approx(11 * stats.page_bytes / 2**30)
        # Documents 0..4 are cached, 5.. are not (each request alone, so its own misses don't evict them).
        assert _hits(engine, trace, [(0, 1, 2), (3, 4, 0), (1, 2, 5)]) == [3, 3, 2]
    finally:
        engine.set_kv_budget(None)


def test_a_point_from_the_primed_cache_finds_every_document(engine):
    vocab_high, bos = token_space(engine.model_config)
    trace = base_trace(SPEC, vocab_high, bos)
    phases = PhaseConfig(window_s=0.3, window_requests=4, warmup=False, drain_s=5.0)
    engine.reset_cache()
    cold = run_point(engine, trace, 20.0, phases, vocab_high)
    assert cold.hit_ratio < 1  # the first request found nothing
    engine.reset_cache()
    primed = prime_cache(engine, trace, vocab_high)
    assert primed.documents == SPEC.num_docs  # the whole pool fits the default KV
    warm = run_point(engine, trace, 20.0, phases, vocab_high)
    assert warm.window_requests >= 4 and warm.unanswered == 0 and warm.hit_ratio == 1.0


def test_run_modes_primes_before_the_first_point_and_says_so():
    import math

    from lazyattn.bench import headline, steady_report

    spec = WorkloadSpec(num_docs=8, doc_len=32, docs_per_request=2, question_len=4, output_len=2, seed=2)
    options = dict(model="tiny", device="cpu", page_size=PAGE)
    vocab_high, bos = token_space(make_engine(options, "lazy").model_config)
    data = {"workload": {"name": "t", "spec": spec.to_dict()}, "phases": {}}
    phases = PhaseConfig(window_s=0.3, window_requests=3, warmup=False, drain_s=5.0)
    common = dict(spec=spec, vocab_high=vocab_high, bos=bos, phases=phases, search_cfg=None, rates=[10.0])
    common |= dict(cold_start=None, deadline=math.inf, min_point_s=0.0, warmup_requests=0, out=None)
    headline.run_modes(modes=["lazy"], options=options, data=data, **common)
    entry = data["modes"]["lazy"]
    assert entry["primed"]["documents"] == 8 and not entry["primed"]["timed_out"]
    assert entry["points"][0]["hit_ratio"] == 1.0  # no warm-up: the window's first request found its documents
    assert "points start from a primed cache" in steady_report.summary_markdown(data)
    headline.run_modes(modes=["lazy"], options=options, data=data, prime=False, **common)
    assert data["modes"]["lazy"]["primed"] is None and data["modes"]["lazy"]["points"][0]["hit_ratio"] < 1
    assert "Cache: not primed" in steady_report.summary_markdown(data)
