"""The steady-state protocol (bench/steady.py): nearest-rank percentiles, the warm-up's steadiness test, a window's
statistics from hand-built requests, the memory-bound KV budget, the Poisson stream, and points served by the tiny
model (a light one fully answered, an overloaded one whose unanswered requests fail the target)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from lazyattn.bench.metrics import RequestRecord
from lazyattn.bench.replay import make_engine
from lazyattn.bench.steady import (
    PhaseConfig,
    PointResult,
    _window_stats,
    base_trace,
    cold_start_bins,
    idle_flags,
    percentile,
    request_stream,
    run_point,
    steady_block,
)
from lazyattn.bench.workload import WorkloadSpec, popularity_weights, token_space
from lazyattn.bench.workloads import membound_kv_gb, named_workload


def test_nearest_rank_percentile():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99 and percentile(values, 100) == 100
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    # Two of 100 requests never answered: p99 is infinite, p90 is not.
    assert percentile(values[:98] + [math.inf, math.inf], 99) == math.inf
    assert percentile(values[:98] + [math.inf, math.inf], 90) == 90
    assert math.isnan(percentile([], 50))


def test_steady_block_compares_the_last_two_full_blocks():
    assert not steady_block([0.5] * 7, block=4, tol=0.01)  # one full block only
    assert steady_block([0.0] * 4 + [0.5] * 8, block=4, tol=0.01)
    assert not steady_block([0.0] * 4 + [0.5] * 4, block=4, tol=0.01)
    # The partial block at the end (one request) is ignored: blocks are [0.5]*4 and [0.6]*4.
    assert steady_block([0.5] * 4 + [0.6] * 4 + [0.0], block=4, tol=0.11)


def _record(arrival, ttft=None, hits=0, docs=2, finished=True, tokens=3, gap=0.01):
    rec = RequestRecord(0, arrival, num_docs=docs, doc_hits=hits, finished=finished and ttft is not None)
    if ttft is not None:
        rec.token_times = [arrival + ttft + k * gap for k in range(tokens)]
    return rec


def test_window_statistics_by_hand():
    # Window [10, 20): four arrivals. One never answers (infinite TTFT), one arrives before the window.
    records = {
        0: _record(9.0, 0.05, hits=0),
        1: _record(10.0, 0.01, hits=2),
        2: _record(12.0, 0.03, hits=1),
        3: _record(15.0, 0.20, hits=2),
        4: _record(19.0, None),
        5: _record(20.0, 0.02, hits=2),
    }
    completions = [9.07, 10.03, 12.05, 15.22, 20.04]
    tokens = [(10.01, 1), (12.03, 2), (25.0, 5)]
    p = PointResult("lazy", 0.4)
    _window_stats(p, records, completions, tokens, 10.0, 20.0, PhaseConfig(window_s=10, window_requests=4), [0.5])
    assert (p.window_s, p.window_requests, p.unanswered) == (10.0, 4, 1)
    assert not p.shortened
    assert p.hit_ratio == pytest.approx(5 / 6)  # answered requests 1, 2, 3: 5 of 6 documents
    assert p.offered_rate == pytest.approx(0.4) and p.achieved_rate == pytest.approx(0.3)  # 3 completions
    assert p.keep_up == pytest.approx(0.75)
    assert p.output_throughput == pytest.approx(0.3)
    assert p.ttft_ms["p50"] == pytest.approx(30.0) and p.ttft_ms["p99"] == math.inf
    assert p.goodput(50.0) == pytest.approx(0.2) and p.goodput(1000.0) == pytest.approx(0.3)
    assert p.tpot_ms["p50"] == pytest.approx(10.0)
    assert not p.meets(1000.0, 0.95)  # p99 infinite
    # Idle: nothing else in flight from arrival to first token. Requests 0-3 were alone; 4 never answered and 5
    # arrived meanwhile (so neither is); of the window's requests, 1, 2 and 3.
    assert p.timeline["idle"] == [True, True, True, True, False, False]
    assert p.idle_ttfts_ms == pytest.approx([10.0, 30.0, 200.0])
    assert p.timeline["finish_s"] == [9.07, 10.03, 12.05, 15.22, None, 20.04]


def test_idle_requests_had_the_server_to_themselves_until_their_first_token():
    # (arrival, first token, finish) in seconds; inf: never finished (aborted at the point's end).
    timeline = [
        (0.0, 0.3, 0.5, True),  # alone; the next arrival (0.4) comes after its first token
        (0.4, 0.8, 1.0, False),  # queued behind the first, still in flight at 0.4
        (2.0, 2.3, 2.6, False),  # the next request arrived during its prefill (batched with it)
        (2.1, 2.5, 2.7, False),
        (3.0, 3.2, 3.5, True),  # a request arrived during its decode, after its first token: still idle
        (3.3, 3.4, 3.6, False),
        (3.6, 3.9, math.inf, True),  # arrived as the one before finished; then never finished
        (5.0, 5.2, 5.4, False),  # the one before is in flight to the end
    ]
    order = [5, 2, 7, 0, 3, 6, 1, 4]  # any order in, flags in the same order out
    arrival, first, finish, idle = zip(*(timeline[i] for i in order))
    assert idle_flags(list(arrival), list(first), list(finish)) == list(idle)
    # Two requests arriving at the same moment overlap; a lone request never answered is idle (an infinite TTFT).
    assert idle_flags([1.0, 1.0], [1.2, 1.3], [1.4, 1.5]) == [False, False]
    assert idle_flags([1.0], [math.inf], [math.inf]) == [True] and idle_flags([], [], []) == []


def test_point_result_round_trips_through_json_encoding():
    from lazyattn.bench.report import _jsonable

    p = PointResult("block", 3.0, window_s=5.0, window_requests=2, ttft_ms={"p99": math.inf}, window_ttfts_ms=[1.0])
    p.idle_ttfts_ms = [2.0, math.inf]
    q = PointResult.from_dict(_jsonable(p.to_dict()))
    assert q.ttft_ms["p99"] == math.inf and q.window_ttfts_ms == [1.0] and q.rate == 3.0
    assert q.idle_ttfts_ms == [2.0, math.inf]


def test_membound_budget_from_kv_bytes_per_token():
    num_docs, doc_len, per_request, alpha = named_workload("paper-membound")
    spec = WorkloadSpec(num_docs=num_docs, doc_len=doc_len, docs_per_request=per_request, zipf_alpha=alpha)
    # Llama-3.1-8B bf16: 128 KiB per token, 64-token pages. A document: 32 pages; a request: 5 x 32 + 1 (BOS) +
    # 1 (48 question + output tokens) = 162 pages. A quarter of the pool (25 documents) + 4 requests: 1448 pages.
    assert membound_kv_gb(spec, 128 * 1024, 64) == pytest.approx(1448 * 64 * 128 * 1024 / 2**30)
    with pytest.raises(ValueError, match="unknown workload"):
        named_workload("narrow")


def test_request_stream_is_poisson_and_follows_popularity():
    spec = WorkloadSpec(num_docs=10, doc_len=16, docs_per_request=1, zipf_alpha=1.5, question_len=2, seed=3)
    stream = request_stream(spec, 20.0, 100, point=0)
    reqs = [next(stream) for _ in range(4000)]
    gaps = np.diff([r.arrival for r in reqs])
    assert gaps.mean() == pytest.approx(1 / 20, rel=0.05)
    counts = np.bincount([r.doc_ids[0] for r in reqs], minlength=10) / len(reqs)
    assert np.abs(counts - popularity_weights(10, 1.5)).max() < 0.03
    again = request_stream(spec, 20.0, 100, point=0)
    assert [next(again).doc_ids for _ in range(50)] == [r.doc_ids for r in reqs[:50]]
    other = request_stream(spec, 20.0, 100, point=1)
    assert [next(other).doc_ids for _ in range(50)] != [r.doc_ids for r in reqs[:50]]


SPEC = WorkloadSpec(num_docs=6, doc_len=32, docs_per_request=3, zipf_alpha=1.1, question_len=4, output_len=2, seed=1)


@pytest.fixture(scope="module")
def engine():
    return make_engine(dict(model="tiny", device="cpu", page_size=16), "lazy")


def test_a_light_point_answers_every_window_request(engine):
    vocab_high, bos = token_space(engine.model_config)
    trace = base_trace(SPEC, vocab_high, bos)
    engine.reset_cache()
    phases = PhaseConfig(window_s=0.5, window_requests=5, warmup_min_s=0.1, warmup_max_s=3.0, warmup_block=4)
    p = run_point(engine, trace, 20.0, phases, vocab_high)
    assert not engine.has_unfinished()
    assert p.window_requests >= 5 and p.window_s >= 0.5 and p.unanswered == 0
    assert p.warmup_s >= 0.1
    assert 0 <= p.hit_ratio <= 1
    assert p.ttft_ms["p99"] == percentile(p.window_ttfts_ms, 99) < math.inf
    assert p.meets(10_000.0, 0.0)


def test_an_overloaded_point_fails_its_target(engine):
    vocab_high, bos = token_space(engine.model_config)
    trace = base_trace(SPEC, vocab_high, bos)
    phases = PhaseConfig(window_s=0.2, window_requests=0, warmup=False, drain_s=0.05)
    p = run_point(engine, trace, 3000.0, phases, vocab_high)
    assert not engine.has_unfinished()  # what was left got aborted
    assert p.unanswered > 0.01 * p.window_requests
    assert p.ttft_ms["p99"] == math.inf and not p.meets(1e9, 0.0)
    assert p.keep_up < 0.95


def test_cold_start_bins_by_hand():
    p = PointResult("lazy", 2.0)
    p.timeline = {
        "arrival_s": [0.0, 0.4, 1.1, 1.6, 2.2],
        "ttft_ms": [100.0, 40.0, 20.0, None, 10.0],
        "hit_ratio": [0.0, 0.5, 1.0, None, 1.0],
    }
    rows = cold_start_bins(p, 1.0)
    assert [r["t_s"] for r in rows] == [0.0, 1.0, 2.0]
    assert [r["requests"] for r in rows] == [2, 2, 1]
    assert rows[0]["ttft_p50_ms"] == 40.0 and rows[0]["ttft_p99_ms"] == 100.0 and rows[0]["hit_ratio"] == 0.25
    assert rows[1]["ttft_p50_ms"] == 20.0 and rows[1]["ttft_p99_ms"] == math.inf  # one never answered
    assert rows[1]["hit_ratio"] == 1.0 and rows[2]["ttft_p99_ms"] == 10.0


def test_a_deadline_closes_the_window_early_and_leaves_its_drain(engine):
    vocab_high, bos = token_space(engine.model_config)
    trace = base_trace(SPEC, vocab_high, bos)
    phases = PhaseConfig(window_s=60.0, window_requests=1000, warmup=False, drain_s=1.0)
    start = time.monotonic()
    p = run_point(engine, trace, 10.0, phases, vocab_high, deadline=start + 2.0)
    assert time.monotonic() - start < 2.0 + 0.5
    assert p.shortened and 0.5 < p.window_s <= 1.2 and p.window_requests > 0
    assert p.unanswered == 0  # light load: the drain was enough for every window request
