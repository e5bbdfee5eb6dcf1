"""Bounded fault tests on loopback: one bad request beside good streams, a dropped huge batch, SIGTERM under load.
Each sends a fixed, small number of requests and stops by itself."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time

import httpx
import pytest

from lazyattn.server import ServerConfig
from tests.server.conftest import start_server, stop_server
from tests.server.test_cli import start_serve

POISON_TOP_K = 7  # a valid request that the (patched) sampler fails on: an engine bug that only it triggers


@pytest.fixture
def poisoned():
    s = start_server(dict(page_size=16, kv_cache_gb=0.05), ServerConfig(model_name="tiny"))
    real = s.engine.sampler.sample

    def sample(logits, params, generators, **constraints):
        if any(p.top_k == POISON_TOP_K for p in params):
            raise RuntimeError("poisoned sampler")
        return real(logits, params, generators, **constraints)

    s.engine.sampler.sample = sample
    yield s
    stop_server(s)


def stream_chat(url: str, body: dict) -> tuple[int, list[dict]]:
    events = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return r.status_code, events


def test_a_poison_request_fails_alone_beside_concurrent_streams(poisoned):
    good = {
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 12,
        "ignore_eos": True,
        "documents": ["a document", "another one"],
    }
    bad = {**good, "temperature": 1.0, "top_k": POISON_TOP_K}
    results: dict[int, tuple[int, list[dict]]] = {}
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, stream_chat(poisoned.url, good))) for i in range(4)
    ]
    threads.append(threading.Thread(target=lambda: results.__setitem__(-1, stream_chat(poisoned.url, bad))))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i in range(4):
        status, events = results[i]
        assert status == 200 and not any("error" in e for e in events)
        text = "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", []))
        assert events[-1]["choices"] == [] or events[-1]["choices"][0]["finish_reason"] == "length", text
    status, events = results[-1]
    assert any("error" in e for e in events)  # the poisoned stream ends with an error event
    poisoned.idle()


def test_non_finite_logits_fail_their_request_with_a_clear_error():
    """NaN logits (a corrupt document's KV, say) for the requests with top_k NAN_TOP_K: a completion gets a 500
    naming them, a stream an error event; the engine serves the next request as usual."""
    s = start_server(dict(page_size=16, kv_cache_gb=0.05), ServerConfig(model_name="tiny"))
    real = s.engine.sampler.sample

    def sample(logits, params, generators, **constraints):
        bad = [i for i, p in enumerate(params) if p.top_k == POISON_TOP_K]
        logits = logits.clone()
        logits[bad] = float("nan")
        return real(logits, params, generators, **constraints)

    s.engine.sampler.sample = sample
    try:
        good = {"prompt": "hello", "max_tokens": 4, "ignore_eos": True}
        r = httpx.post(f"{s.url}/v1/completions", json={**good, "top_k": POISON_TOP_K}, timeout=60)
        assert r.status_code == 500 and "non-finite logits" in r.json()["error"]["message"]
        status, events = stream_chat(s.url, {"messages": [{"role": "user", "content": "hi"}], "top_k": POISON_TOP_K})
        assert status == 200 and "non-finite logits" in events[-1]["error"]["message"]
        r = httpx.post(f"{s.url}/v1/completions", json=good, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
        s.idle()
    finally:
        stop_server(s)


def test_a_dropped_huge_batch_does_not_stall_the_next_request(poisoned):
    url = poisoned.url
    body = {"prompt": [f"prompt {i}" for i in range(64)], "n": 4, "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        next(r.iter_lines())  # it runs; then the client goes away with 256 sequences in flight or waiting
    start = time.monotonic()
    small = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
    assert small.status_code == 200 and time.monotonic() - start < 2.0
    poisoned.idle()


def test_sigterm_under_load_exits_within_10_s():
    proc, url = start_serve("--shutdown-timeout", "2")
    try:
        body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 400, "ignore_eos": True}
        load = [
            threading.Thread(target=lambda: _quietly(lambda: stream_chat(url, body)), daemon=True) for _ in range(6)
        ]
        for t in load:
            t.start()
        time.sleep(1.0)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        assert time.monotonic() - start < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = proc.stdout.read()
    assert proc.returncode in (0, -signal.SIGTERM), output
    assert "Traceback" not in output, output


def _quietly(fn) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the server goes away mid-stream: expected here
        fn()
