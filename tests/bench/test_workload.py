"""The seeded workload generator: determinism, popularity skew, order shuffling, Poisson arrivals."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from lazyattn.bench.workload import (
    Load,
    WorkloadSpec,
    arrival_times,
    make_trace,
    popularity_weights,
    token_range,
    warmup_trace,
)

SPEC = WorkloadSpec(
    num_docs=30, doc_len=40, docs_per_request=4, zipf_alpha=2.1, question_len=6, output_len=3, num_requests=200, seed=3
)
VOCAB, BOS = 256, 256


def trace(spec=SPEC, load=None):
    return make_trace(spec, load or Load(), VOCAB, BOS)


def doc_counts(t) -> Counter:
    return Counter(d for r in t.requests for d in r.doc_ids)


def test_same_seed_same_trace_and_other_seed_differs():
    a, b = trace(), trace()
    assert a.documents == b.documents and a.system == b.system
    assert [(r.doc_ids, r.question, r.arrival) for r in a.requests] == [
        (r.doc_ids, r.question, r.arrival) for r in b.requests
    ]
    c = trace(replace(SPEC, seed=4))
    assert c.documents != a.documents and [r.doc_ids for r in c.requests] != [r.doc_ids for r in a.requests]


def test_load_and_length_change_only_what_they_should():
    base = trace()
    poisson = trace(load=Load(rate=2.0))
    assert [r.doc_ids for r in poisson.requests] == [r.doc_ids for r in base.requests]
    shorter = trace(replace(SPEC, num_requests=50))
    assert [(r.doc_ids, r.question) for r in shorter.requests] == [(r.doc_ids, r.question) for r in base.requests[:50]]


def test_requests_are_well_formed():
    t = trace()
    for r in t.requests:
        assert len(set(r.doc_ids)) == SPEC.docs_per_request and len(r.question) == SPEC.question_len
        prompt = t.prompt(r)
        assert prompt.segments[0] == [BOS] and prompt.segments[1:] == [t.documents[d] for d in r.doc_ids]
    tokens = [x for d in t.documents for x in d] + [x for r in t.requests for x in r.question]
    assert min(tokens) >= 0 and max(tokens) < VOCAB
    assert all(len(d) == SPEC.doc_len for d in t.documents)


def test_zipf_is_skewed_and_uniform_is_not():
    zipf, uniform = doc_counts(trace()), doc_counts(trace(replace(SPEC, zipf_alpha=None)))
    draws = SPEC.num_requests * SPEC.docs_per_request
    assert zipf[0] == max(zipf.values()) and zipf[0] > 0.15 * draws  # rank 1 is the most popular by far
    assert zipf[0] > 4 * uniform[0]
    expected = draws / SPEC.num_docs
    chi2 = sum((uniform[d] - expected) ** 2 / expected for d in range(SPEC.num_docs))
    assert chi2 < 80  # 29 degrees of freedom: p < 1e-6 beyond ~75
    top5 = lambda c: sum(n for _, n in c.most_common(5)) / draws  # noqa: E731
    assert top5(zipf) > 0.7 and top5(uniform) < 0.3
    w = popularity_weights(5, 2.0)
    assert w.sum() == pytest.approx(1.0) and w[0] / w[1] == pytest.approx(4.0)


def test_shuffle_changes_order_not_choice():
    shuffled, ordered = trace(), trace(replace(SPEC, shuffle=False))
    assert all(list(r.doc_ids) == sorted(r.doc_ids) for r in ordered.requests)
    assert any(list(r.doc_ids) != sorted(r.doc_ids) for r in shuffled.requests)


def test_poisson_interarrival_mean_and_scaling():
    n = 20000
    times = np.array(arrival_times(n, Load(rate=4.0), seed=1))
    gaps = np.diff(times)
    assert times[0] == 0.0 and np.all(gaps > 0)
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() == pytest.approx(0.25, rel=0.05)  # exponential: std == mean
    twice = np.array(arrival_times(n, Load(rate=8.0), seed=1))
    assert np.allclose(twice, times / 2)
    assert arrival_times(5, Load(), seed=1) == [0.0] * 5
    assert arrival_times(5, Load(concurrency=2), seed=1) == [0.0] * 5
    assert Load(rate=2).label == "rate 2" and Load().label == "saturation" and math.isinf(Load().rate)


def test_warmup_documents_are_outside_the_pool():
    t = trace()
    warm = warmup_trace(SPEC, 3, VOCAB, BOS)
    assert len(warm.requests) == 3
    pool = {tuple(d) for d in t.documents}
    assert not any(tuple(warm.documents[d]) in pool for r in warm.requests for d in r.doc_ids)


def test_token_range_stays_below_specials():
    assert token_range(320, 256, (257,)) == 256
    assert token_range(128256, 128000, (128001, 128009)) == 128000
    assert token_range(1000, 1, (2,)) == 1000  # specials at the bottom are left in range


def test_bad_specs_are_rejected():
    with pytest.raises(ValueError):
        WorkloadSpec(num_docs=3, docs_per_request=4)
    with pytest.raises(ValueError):
        WorkloadSpec(zipf_alpha=0.0)
    with pytest.raises(ValueError):
        WorkloadSpec(doc_len=8, system_len=8)
    with pytest.raises(ValueError):
        Load(rate=0.0)
