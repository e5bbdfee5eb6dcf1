"""Metric computation on known data, against numpy; document hits from cached-token counts; the vLLM block."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lazyattn.bench.metrics import EngineCounters, RequestRecord, Stat, Summary, summarize
from lazyattn.bench.report import PointResult, comparison_rows, result_block, text_table
from lazyattn.engine.modes import make_mode

# (arrival, token times) of four finished requests and one cut short; times in seconds
REQUESTS = [
    (0.0, [0.10, 0.15, 0.22, 0.30]),
    (0.5, [0.90, 0.95, 1.05, 1.10]),
    (1.0, [1.05, 1.30, 1.31, 1.50]),
    (1.2, [2.00, 2.01, 2.02, 2.03]),
]


def records() -> list[RequestRecord]:
    out = [
        RequestRecord(
            i,
            a,
            list(t),
            context_tokens=100,
            num_docs=5,
            doc_hits=i,
            cached_tokens=10 * i,
            prefilled_tokens=7,
            finished=True,
        )
        for i, (a, t) in enumerate(REQUESTS)
    ]
    out.append(
        RequestRecord(
            4,
            1.5,
            [2.5],
            context_tokens=100,
            num_docs=5,
            doc_hits=5,
            cached_tokens=100,
            prefilled_tokens=3,
            finished=False,
        )
    )
    return out


COUNTERS = EngineCounters(rows_computed=500, preemptions=1, evictions=2, peak_kv_bytes=3 * 2**29, pool_bytes=2**31)


def ms(x):
    return np.asarray(x) * 1e3


def test_latencies_match_numpy():
    s = summarize(records(), COUNTERS)
    ttft = [t[0] - a for a, t in REQUESTS] + [2.5 - 1.5]  # the cut request has a first token
    e2e = [t[-1] - a for a, t in REQUESTS]
    tpot = [(t[-1] - t[0]) / (len(t) - 1) for _, t in REQUESTS]
    itl = np.concatenate([np.diff(t) for _, t in REQUESTS])
    for stat, values in ((s.ttft, ttft), (s.e2el, e2e), (s.tpot, tpot), (s.itl, itl)):
        assert stat.mean == pytest.approx(ms(values).mean())
        assert stat.median == pytest.approx(np.percentile(ms(values), 50))
        assert stat.p99 == pytest.approx(np.percentile(ms(values), 99))


def test_counts_and_throughput():
    s = summarize(records(), COUNTERS)
    assert (s.completed, s.total) == (4, 5)
    assert s.duration_s == pytest.approx(2.5)  # first arrival to the last token handed out
    assert s.output_tokens == 16 and s.input_tokens == 400
    assert s.request_throughput == pytest.approx(4 / 2.5)
    assert s.output_throughput == pytest.approx(16 / 2.5)
    assert s.total_token_throughput == pytest.approx(416 / 2.5)
    assert s.doc_hit_ratio == pytest.approx((0 + 1 + 2 + 3 + 5) / 25)
    assert s.token_reuse_ratio == pytest.approx((0 + 10 + 20 + 30 + 100) / 500)
    decode_rows = 4 * 3 + 0
    assert s.prefill_tokens == 500 - decode_rows
    assert s.doc_tokens_encoded == 500 - (4 * 7 + 3)
    assert s.peak_kv_gb == pytest.approx(1.5) and s.pool_gb == pytest.approx(2.0)


def test_empty_and_single_token_requests():
    s = summarize([RequestRecord(0, 0.0, [0.2], finished=True)], COUNTERS)
    assert s.tpot.mean != s.tpot.mean and s.itl.mean != s.itl.mean  # NaN: no second token
    assert s.ttft.mean == pytest.approx(200.0)
    empty = summarize([], COUNTERS)
    assert empty.completed == 0 and math.isnan(empty.ttft.mean) and math.isnan(empty.request_throughput)
    assert all(math.isnan(v) for v in (Stat.of([]).mean, Stat.of([]).median, Stat.of([]).p99))


def test_summary_survives_a_json_round_trip():
    import json

    s = summarize(records(), COUNTERS)
    back = Summary.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s


@pytest.mark.parametrize(
    "mode, cached, hits",
    [
        ("lazy", 0, 0),
        ("lazy", 1, 0),
        ("lazy", 1 + 2 * 64, 2),
        ("lazy", 3 * 64, 3),
        ("block", 1 + 5 * 64, 5),
        ("prefix", 0, 0),
        ("prefix", 1 + 32, 0.5),
        ("prefix", 1 + 64, 1),
        ("prefix", 1 + 3 * 64 + 16, 3.25),
        ("prefix", 1 + 5 * 64 + 30, 5),
        ("full", 0, 0),
    ],
)
def test_document_hits_from_cached_tokens(mode, cached, hits):
    assert make_mode(mode).reused_documents(cached, system_len=1, doc_len=64, num_docs=5) == pytest.approx(hits)


def test_result_block_has_vllm_layout():
    text = result_block("lazy", "rate 2", summarize(records(), COUNTERS))
    lines = text.splitlines()
    assert lines[0] == "============ Serving Benchmark Result ============" and lines[-1] == "=" * 50
    assert "---------------Time to First Token----------------" in lines
    assert "-----Time per Output Token (excl. 1st token)------" in lines
    row = next(line for line in lines if line.startswith("Successful requests:"))
    assert row[:41] == "Successful requests:".ljust(41) and row.split()[-1] == "4"
    assert any(line.startswith("Document hit ratio (%):") for line in lines)


def test_comparison_ratios_are_against_lazy():
    fast = summarize(records(), COUNTERS)
    slow_records = [
        RequestRecord(
            r.index,
            r.arrival,
            [t * 2 - r.arrival for t in r.token_times],
            r.context_tokens,
            r.num_docs,
            r.doc_hits,
            r.cached_tokens,
            r.prefilled_tokens,
            r.finished,
        )
        for r in records()
    ]
    slow = summarize(slow_records, COUNTERS)
    rows = comparison_rows(
        [
            PointResult("g", "lazy", "sat", None, None, fast),
            PointResult("g", "block", "sat", None, None, slow),
            PointResult.failed("g", "full", "sat", "boom"),
        ]
    )
    assert rows[0]["ttft_vs_lazy"] == pytest.approx(1.0)
    assert rows[1]["ttft_vs_lazy"] == pytest.approx(slow.ttft.mean / fast.ttft.mean)
    assert rows[1]["thr_vs_lazy"] == pytest.approx(slow.request_throughput / fast.request_throughput)
    assert "error" in rows[2]["done"]
    table = text_table(rows)
    assert "TTFT / lazy" in table.splitlines()[0] and len(table.splitlines()) == 5
