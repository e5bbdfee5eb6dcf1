"""Many clients at once, and clients that leave: their requests are aborted and every page comes back."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from openai import OpenAI

POOL = [f"Shared document number {i}: " + "lorem ipsum " * (3 + i) for i in range(4)]
LONG = {"messages": [{"role": "user", "content": "Go on."}], "max_tokens": 1000, "ignore_eos": True, "temperature": 0.0}


def test_concurrent_clients(server):
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)

    def one(i: int) -> tuple[int, str, str | None]:
        docs = [POOL[i % 4], POOL[(i + 1) % 4]]
        kw = dict(
            model="tiny",
            max_tokens=3,
            temperature=0.0,
            extra_body={"documents": docs, "ignore_eos": True},
            messages=[{"role": "user", "content": f"Question {i}?"}],
        )
        if i % 2:
            chunks = list(client.chat.completions.create(stream=True, **kw))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            return 3, text, next(c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason)
        r = client.chat.completions.create(**kw)
        return r.usage.completion_tokens, r.choices[0].message.content, r.choices[0].finish_reason

    def worker(t: int) -> list:
        return [one(2 * t + k) for k in range(2)]

    with ThreadPoolExecutor(8) as pool:
        results = [r for rs in pool.map(worker, range(8)) for r in rs]
    client.close()
    assert len(results) == 16
    assert all(n == 3 and reason == "length" for n, _, reason in results)
    server.idle()


def _first_content(lines) -> None:
    """Read SSE lines until a token has been streamed."""
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            delta = json.loads(line[6:])["choices"][0]
            if delta.get("logprobs") is not None or delta["delta"].get("content"):
                return
            if delta["finish_reason"]:
                raise AssertionError("the request finished before the client could leave")


def test_client_disconnecting_mid_stream_frees_its_pages(server):
    aborted = server.metric("lazyattn:request_success_total", finished_reason="abort")
    generated = server.metric("lazyattn:generation_tokens_total")
    body = {**LONG, "stream": True, "logprobs": True, "documents": [POOL[0]]}
    with httpx.Client(timeout=60) as http, http.stream("POST", f"{server.url}/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()  # held: dropping a half-read iterator already closes the connection
        _first_content(lines)
        assert server.metric("lazyattn:num_requests_running") == 1
    # Leaving the block closed the connection mid-stream.
    m = server.idle()
    assert m[("lazyattn:request_success_total", (("finished_reason", "abort"),))] == aborted + 1
    assert m[("lazyattn:generation_tokens_total", ())] == generated  # an aborted request never finished


def test_client_disconnecting_while_waiting_for_a_full_response(server):
    aborted = server.metric("lazyattn:request_success_total", finished_reason="abort")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/chat/completions", json=LONG, timeout=httpx.Timeout(60, read=1.0))
    m = server.idle()
    assert m[("lazyattn:request_success_total", (("finished_reason", "abort"),))] == aborted + 1
