"""`replay(..., cache="warm")` (lazyattn bench --warm-cache) measures a point on the cache an unmeasured pass
of the same trace left: every document of every request is then a hit, against the cold pass's misses."""

from __future__ import annotations

import pytest

from lazyattn.bench.replay import make_engine, replay
from lazyattn.bench.workload import Load, WorkloadSpec, make_trace, token_space

SPEC = WorkloadSpec(
    num_docs=6, doc_len=40, docs_per_request=3, zipf_alpha=1.1, question_len=8, output_len=2, num_requests=6, seed=2
)


@pytest.mark.parametrize("mode", ["lazy", "block"])
def test_warm_cache_point_finds_every_document_cached(mode):
    engine = make_engine(dict(model="tiny", device="cpu", page_size=16), mode)
    trace = make_trace(SPEC, Load(), *token_space(engine.model_config))
    cold = replay(engine, trace)
    warm = replay(engine, trace, cache="warm")
    docs = SPEC.num_requests * SPEC.docs_per_request
    distinct = len({d for r in trace.requests for d in r.doc_ids})
    assert cold.summary.completed == warm.summary.completed == SPEC.num_requests
    assert sum(r.doc_hits for r in cold.records) <= docs - distinct  # each document missed at least once
    assert sum(r.doc_hits for r in warm.records) == docs
    assert sum(r.cached_tokens for r in warm.records) > sum(r.cached_tokens for r in cold.records)
