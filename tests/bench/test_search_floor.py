"""The rate search's unreachable-target rule (bench/search.py): the TTFTs of requests that had the server to
themselves are a floor under every rate's, so when clearly more of them miss a target than p99 allows, no rate
meets it. Points are built from synthetic request timelines through steady._window_stats, the code a measured point
goes through; the search runs against a simulated one-at-a-time server shaped like prefix mode on an H200."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from lazyattn.bench.metrics import RequestRecord
from lazyattn.bench.search import (
    ALLOWED_MISS,
    FLOOR_ALPHA,
    MIN_IDLE_REQUESTS,
    IdleEvidence,
    SearchConfig,
    binomial_tail,
    idle_evidence,
    search,
)
from lazyattn.bench.steady import PhaseConfig, PointResult, _window_stats

OUTPUT_TOKENS = 4


def point_of(rate: float, requests: list[tuple[float, float | None, float]], end: float) -> PointResult:
    """A point whose window is [0, end) from (arrival, first token or None, token gap) per request, in seconds;
    every answered request hands out OUTPUT_TOKENS tokens and finishes."""
    records, completions, tokens = {}, [], []
    for i, (arrival, first, gap) in enumerate(requests):
        rec = RequestRecord(i, arrival, num_docs=1)
        if first is not None:
            rec.token_times = [first + k * gap for k in range(OUTPUT_TOKENS)]
            rec.finished = True
            completions.append(rec.token_times[-1])
            tokens += [(t, 1) for t in rec.token_times]
        records[i] = rec
    p = PointResult("fake", rate)
    _window_stats(p, records, completions, tokens, 0.0, end, PhaseConfig(warmup=False), [])
    return p


def test_binomial_tail_by_hand():
    # P(X >= 2), X ~ Binomial(10, 0.01): 1 - 0.99^10 - 10 * 0.01 * 0.99^9
    assert binomial_tail(2, 10, 0.01) == pytest.approx(1 - 0.99**10 - 0.1 * 0.99**9)
    assert binomial_tail(10, 10, 0.01) == pytest.approx(1e-20)
    assert binomial_tail(0, 5, 0.3) == 1.0
    exact = sum(math.comb(40, i) * 0.2**i * 0.8 ** (40 - i) for i in range(7, 41))
    assert binomial_tail(7, 40, 0.2) == pytest.approx(exact)
    # Thousands of requests (a long window): no overflow, and the complement summed the plain way agrees.
    below = sum(math.comb(5000, i) * 0.01**i * 0.99 ** (5000 - i) for i in range(50))
    assert binomial_tail(50, 5000, 0.01) == pytest.approx(1 - below)
    assert binomial_tail(3000, 5000, 0.01) < 1e-300


def test_idle_requests_all_over_the_target_make_it_unreachable_after_one_point():
    # One request every second, alone, 250 ms to its first token (prefix mode's idle TTFT at 10K tokens).
    lone = [(float(k), k + 0.25, 0.02) for k in range(20)]
    point = point_of(1.0, lone, 20.0)
    assert len(point.idle_ttfts_ms) == 20

    calls = []

    def measure(rate, phases, shortened, deadline):
        calls.append(rate)
        return point

    result = search(measure, "fake", PhaseConfig(), SearchConfig(targets_ms=(100.0,), start=1.0))
    assert calls == [1.0] and result.converged
    b = result.brackets[0]
    assert b.unreachable and b.passed == 0.0
    assert b.idle == IdleEvidence(20, 20, pytest.approx(250.0))
    row = result.sustainable()[0]
    assert row["unreachable"] and row["rate"] == 0.0
    assert (row["idle_requests"], row["idle_missed"]) == (20, 20) and row["idle_ttft_p50_ms"] == pytest.approx(250)


@pytest.mark.parametrize("missed", range(0, 6))
def test_a_few_idle_misses_stay_below_the_bound(missed):
    # 40 idle requests at 30 ms, `missed` of them at 150 ms (a document the cache did not hold). p99 of 40 requests
    # is their largest, so the point fails a 100 ms target from one miss on; whether no rate can meet it is the
    # exact binomial tail's call: unreachable only when that many misses are unlikely (< FLOOR_ALPHA) at a 1 % share.
    requests = [(float(k), k + (0.15 if k < missed else 0.03), 0.02) for k in range(40)]
    e = idle_evidence([point_of(1.0, requests, 40.0)], 100.0, keep_up=0.95)
    assert (e.requests, e.missed) == (40, missed)
    p_value = sum(math.comb(40, i) * ALLOWED_MISS**i * (1 - ALLOWED_MISS) ** (40 - i) for i in range(missed, 41))
    assert e.unreachable == (p_value < FLOOR_ALPHA)
    assert not e.unreachable or missed >= 3  # one or two misses in 40 are within what a 1 % share gives


def test_a_few_idle_requests_do_not_decide():
    few = [(float(k), k + 0.25, 0.02) for k in range(MIN_IDLE_REQUESTS - 1)]
    assert not idle_evidence([point_of(1.0, few, 20.0)], 100.0, 0.95).unreachable
    more = [(float(k), k + 0.25, 0.02) for k in range(MIN_IDLE_REQUESTS)]
    assert idle_evidence([point_of(1.0, more, 20.0)], 100.0, 0.95).unreachable


def test_queued_requests_that_miss_do_not_count():
    # 20 lone requests answer in 30 ms; every half second past them three arrive within 2 ms and queue, taking
    # 150-250 ms. The point misses 100 ms at p99, but the floor meets it: the search must not call it unreachable.
    requests = []
    for k in range(20):
        requests.append((float(k), k + 0.03, 0.005))
        requests += [(k + 0.5 + 0.001 * j, k + 0.65 + 0.05 * j, 0.005) for j in range(3)]
    point = point_of(4.0, requests, 20.0)
    assert point.ttft_ms["p99"] > 100 and point.keeps_up(0.95)
    e = idle_evidence([point], 100.0, 0.95)
    assert (e.requests, e.missed) == (20, 0) and not e.unreachable


def test_an_overloaded_point_adds_no_evidence():
    # The same lone requests over the target, but completions fell behind arrivals: its cache is not the one lower
    # rates see, so its idle requests are not pooled.
    lone = [(float(k), k + 0.25, 0.02) for k in range(20)]
    point = point_of(1.0, lone, 20.0)
    point.achieved_rate = 0.5 * point.offered_rate
    assert idle_evidence([point], 100.0, 0.95) == IdleEvidence()


def simulated_server(prefill_s=(0.19, 0.32), decode_s: float = 0.02, drain_s: float = 5.0):
    """Prefix mode at 10K-token prompts, as a server that serves one request at a time, first come first served:
    prefill uniform in `prefill_s` (the idle TTFT), then OUTPUT_TOKENS tokens `decode_s` apart; arrivals Poisson,
    seeded per rate. Window requests without a first token `drain_s` after the window are unanswered."""
    calls = []

    def measure(rate, phases, shortened, deadline):
        calls.append(rate)
        rng = np.random.default_rng(int(rate * 1000))
        end = phases.window_length(rate)
        arrivals = np.cumsum(rng.exponential(1 / rate, size=int(rate * (end + drain_s)) + 50))
        arrivals = arrivals[arrivals < end + drain_s] - arrivals[0]
        free, requests = 0.0, []
        for a in arrivals:
            first = max(a, free) + rng.uniform(*prefill_s)
            free = first + (OUTPUT_TOKENS - 1) * decode_s
            requests.append((float(a), first if first <= end + drain_s else None, decode_s))
        return point_of(rate, requests, end)

    return measure, calls


def test_prefix_like_search_gives_up_on_100_ms_quickly_and_converges_on_1_s():
    measure, calls = simulated_server()
    cfg = SearchConfig(targets_ms=(100.0, 1000.0), start=4.0, tol=0.1)
    decided = []

    def on_point(result):
        if result.brackets[0].unreachable and not decided:
            decided.append(len(result.points))

    result = search(measure, "prefix", PhaseConfig(window_s=60, window_requests=50), cfg, on_point=on_point)
    fast, slow = result.brackets
    assert result.converged and fast.unreachable and decided and decided[0] <= 3
    assert fast.idle.missed == fast.idle.requests >= MIN_IDLE_REQUESTS
    assert 190 <= fast.idle.ttft_p50_ms <= 320
    json.dumps(result.sustainable())  # the rows go to steady.json as they are
    # No halving below the 1 s bracket: the search measured what the 1 s target needed and nothing lower.
    assert min(calls) >= slow.passed / cfg.growth >= cfg.min_rate
    assert 0 < slow.passed < slow.failed <= slow.passed * (1 + cfg.tol)
    at_pass = next(p for p in reversed(result.points) if p.rate == slow.passed)
    assert at_pass.ttft_ms["p99"] <= 1000 and at_pass.keeps_up(cfg.keep_up)
