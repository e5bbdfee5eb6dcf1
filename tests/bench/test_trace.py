"""`lazyattn bench --trace` on the CPU (tiny model, a few requests): the trace file against what the bench itself
reports (its per-request TTFTs, the engine's prefilled-token counter), and the engine's step observer."""

from __future__ import annotations

import gc
import json
import math
import time

import pytest

from lazyattn.bench.replay import make_engine
from lazyattn.bench.trace import GC_TID, STEPS_TID, TraceRecorder, summary
from lazyattn.cli import main
from lazyattn.engine.prompt import RenderedPrompt
from lazyattn.engine.sampling import SamplingParams

KINDS = {"prefill", "decode", "mixed", "split", "empty"}


def _well_formed(doc: dict) -> None:
    assert doc["traceEvents"]
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "M") and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] >= 0 and isinstance(e["args"], dict)
            assert e["cat"] == "request" or e["name"] in KINDS or (e["cat"] == "gc" and e["tid"] == GC_TID)


def _requests(doc: dict, pid: int) -> list[dict]:
    """One event per request (its queue span carries its args), arrival order."""
    queued = [e for e in doc["traceEvents"] if e["pid"] == pid and e["ph"] == "X" and e["name"] == "queue"]
    return sorted(queued, key=lambda e: (e["ts"], e["args"]["request"]))


def _steps(doc: dict, pid: int) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["pid"] == pid and e["ph"] == "X" and e["cat"] == "step"]


def test_steady_window_trace_matches_the_bench(tmp_path, capsys):
    trace = tmp_path / "window.json"
    code = main(
        ["bench", "--smoke", "--steady", "--rate", "6", "--modes", "lazy", "--budget-s", "4", "--cold-start-s", "0.3"]
        + ["--out", str(tmp_path / "out"), "--no-progress", "--no-prime", "--trace", str(trace)]
    )
    assert code == 0
    doc = json.loads(trace.read_text())
    _well_formed(doc)
    points = json.loads((tmp_path / "out" / "steady.json").read_text())["modes"]["lazy"]["points"]
    windows = doc["lazyattn_windows"]
    assert len(windows) == len(points) >= 1  # one traced window per point; the cold start is not traced
    for window, point in zip(windows, points):
        pid = window["pid"]
        inside = [e for e in _requests(doc, pid) if e["args"]["in_window"]]
        ttfts = [math.inf if e["args"]["ttft_ms"] is None else e["args"]["ttft_ms"] for e in inside]
        expected = [math.inf if t is None else t for t in point["window_ttfts_ms"]]
        assert ttfts == pytest.approx(expected)
        steps = _steps(doc, pid)
        assert sum(s["args"]["prefill_tokens"] for s in steps) == window["prefilled_tokens"] > 0
        # Only the window: no step before it starts (the warm-up's are not recorded).
        assert min(s["ts"] for s in steps) >= window["window_start_s"] * 1e6
    out = capsys.readouterr().out
    assert "p99 TTFT" in out and f"wrote {trace}" in out


def test_plain_run_trace_matches_the_bench(tmp_path, capsys):
    trace = tmp_path / "plain.json"
    code = main(
        ["bench", "--model", "tiny", "--modes", "lazy", "--num-docs", "6", "--doc-len", "32", "--num-requests", "5"]
        + ["--output-len", "3", "--question-len", "4", "--rate", "20", "--warmup-requests", "1", "--no-progress"]
        + ["--out", str(tmp_path / "out"), "--trace", str(trace)]
    )
    assert code == 0
    doc = json.loads(trace.read_text())
    _well_formed(doc)
    (window,) = doc["lazyattn_windows"]
    (point,) = json.loads((tmp_path / "out" / "bench.json").read_text())["points"]
    by_request = {e["args"]["request"]: e["args"]["ttft_ms"] for e in _requests(doc, window["pid"])}
    assert [by_request[i] for i in range(5)] == pytest.approx(point["requests"]["ttft_ms"], abs=1e-3)
    assert sum(s["args"]["prefill_tokens"] for s in _steps(doc, window["pid"])) == window["prefilled_tokens"]
    # Every request's spans follow one another on its slot: queue, prefill, decode.
    for i in range(5):
        spans = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["args"].get("request") == i]
        assert [e["name"] for e in spans] == ["queue", "prefill", "decode"]
        assert len({e["tid"] for e in spans}) == 1
        assert spans[1]["ts"] >= spans[0]["ts"] and spans[2]["ts"] >= spans[1]["ts"]
    lines = summary(doc)
    assert lines[0].startswith("trace lazy rate 20: p99 TTFT") and lines[1].startswith("  request ")
    assert lines[0] in capsys.readouterr().out


def test_step_observer_reports_each_step_once_read():
    engine = make_engine(dict(model="tiny", device="cpu", page_size=16), "lazy")
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    engine.add_request("off", RenderedPrompt([[1, 2, 3, 4]], [5, 6]), params)
    while engine.has_unfinished():
        engine.step()  # no observer: no report is built
    reports = []
    engine.step_observer = reports.append
    engine.add_request("on", RenderedPrompt([[7, 8, 9, 10]], [11, 12]), params)
    while engine.has_unfinished():
        engine.step()
    assert [r.index for r in reports] == list(range(len(reports)))
    assert {r.kind for r in reports} <= {"prefill", "decode"} and reports[-1].kind == "decode"
    assert sum(r.documents for r in reports) == 1  # the new document, encoded once
    assert sum(r.decode_rows for r in reports) == 2  # tokens 2 and 3; the first came from the prefill
    assert all(r.scheduled_at <= r.launched_at <= r.read_at for r in reports)
    assert all(r.graph_passes == 0 and not r.overlapped for r in reports)  # the CPU: eager, synchronous


def test_trace_records_the_window_garbage_collections():
    """Every collection while a window is recorded, on a thread of its own; a step's args give the collection time
    inside its host time. Nothing is recorded once the window stops."""
    engine = make_engine(dict(model="tiny", device="cpu", page_size=16, gc_control=False), "lazy")
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    recorder = TraceRecorder()
    threshold = gc.get_threshold()
    gc.set_threshold(50, 1000, 1000)  # young collections inside the steps
    try:
        recorder.start(engine, time.monotonic())
        engine.add_request("a", RenderedPrompt([[1, 2, 3, 4]], [5, 6]), params)
        while engine.has_unfinished():
            engine.step()
            gc.collect()  # a full one between steps
        recorder.stop(engine)
    finally:
        gc.set_threshold(*threshold)
    gc.collect()  # after the window: not recorded
    recorder.add_window("lazy gc", {}, 0.0, 1.0)
    doc = recorder.document()
    _well_formed(doc)
    collections = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "gc"]
    (window,) = doc["lazyattn_windows"]
    assert window["collections"][2] == sum(e["args"]["generation"] == 2 for e in collections) == window["steps"]
    assert window["collections"][0] > 0 and sum(window["collections"]) == len(collections)
    assert all(e["tid"] == GC_TID and e["name"] == f"gc gen {e['args']['generation']}" for e in collections)
    steps = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["tid"] == STEPS_TID]
    assert any(s["args"]["gc_ms"] > 0 for s in steps)  # the young ones ran inside steps
    assert all(s["args"]["gc_ms"] <= s["args"]["host_ms"] for s in steps)
    assert recorder._on_gc not in gc.callbacks


def test_summary_names_the_collections_a_slow_request_waited_through():
    step = {"ph": "X", "cat": "step", "name": "decode", "pid": 1, "tid": 1, "ts": 0, "dur": 250_000}
    step["args"] = {"prefill_tokens": 0, "documents": 0, "read_ms": 1.0}
    full = {"ph": "X", "cat": "gc", "name": "gc gen 2", "pid": 1, "tid": GC_TID, "ts": 5_000, "dur": 240_000}
    full["args"] = {"generation": 2, "ms": 240.0, "collected": 0}
    young = {**full, "name": "gc gen 0", "ts": 300_000, "dur": 500, "args": {"generation": 0, "ms": 0.5}}
    args = {"request": 0, "ttft_ms": 260.0, "queue_ms": 250.0, "in_window": True}
    request = {"ph": "X", "cat": "request", "name": "queue", "pid": 1, "tid": 100, "ts": 1_000, "dur": 0, "args": args}
    doc = {"traceEvents": [step, full, young, request], "lazyattn_windows": [{"label": "lazy", "pid": 1}]}
    head, slow = summary(doc)
    assert head.endswith("; 2 garbage collections (1 full, longest 240.0 ms)")
    assert slow.endswith("; 1 garbage collection (1 full, longest 240.0 ms)")  # the young one came after


def test_summary_names_the_prefill_a_slow_request_waited_behind():
    def step(ts, dur, tokens, read_ms=0.5):
        args = {"prefill_tokens": tokens, "documents": tokens // 100, "read_ms": read_ms}
        return {"ph": "X", "cat": "step", "name": "prefill", "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}

    def request(i, ts, ttft_ms):
        args = {"request": i, "ttft_ms": ttft_ms, "queue_ms": ttft_ms / 2, "in_window": True}
        return {"ph": "X", "cat": "request", "name": "queue", "pid": 1, "tid": 100, "ts": ts, "dur": 0, "args": args}

    # Request 1 arrives while a 4000-token prefill runs (started before it) and waits 60 ms; request 0 is quick.
    events = [step(0, 50_000, 4000), step(51_000, 5_000, 300), step(90_000, 1_000, 0)]
    events += [request(0, 0, 55.0), request(1, 10_000, 60.0)]
    doc = {"traceEvents": events, "lazyattn_windows": [{"label": "lazy 8 req/s (point 0)", "pid": 1}]}
    head, slow = summary(doc)
    assert head.startswith("trace lazy 8 req/s (point 0): p99 TTFT 60.0 ms over 2 window requests, 3 steps")
    assert slow.startswith("  request 1: TTFT 60.0 ms, queued 30.0 ms; waited through 2 steps, 2 with prefill")
    assert "(4300 tokens, largest 4000 tokens (50.0 ms host, 40 documents))" in slow
