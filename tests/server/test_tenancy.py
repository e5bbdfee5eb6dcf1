"""API keys: 401s, one tenant per key (documents and cache isolated), and the waiting-queue limit (429)."""

from __future__ import annotations

import threading
import uuid

import httpx
import openai
import pytest
from openai import OpenAI

from lazyattn.server.tenancy import Authenticator
from tests.server.conftest import KEYS

QUESTION = [{"role": "user", "content": "Summarise."}]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def chat(url: str, key: str, **body) -> httpx.Response:
    body = {"messages": QUESTION, "max_tokens": 2, "ignore_eos": True, "temperature": 0.0, **body}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth(key), timeout=60)


def test_missing_or_wrong_key_is_401(keyed_server):
    url = keyed_server.url
    for headers in ({}, auth("nope"), {"Authorization": "key-a"}, {"Authorization": "Basic a2V5LWE6"}):
        for method, path in (
            ("POST", "/v1/chat/completions"),
            ("GET", "/v1/models"),
            ("GET", "/v1/documents"),
            ("POST", "/v1/documents"),
        ):
            r = httpx.request(method, f"{url}{path}", headers=headers, json={"messages": QUESTION})
            assert r.status_code == 401, (headers, path, r.text)
            assert r.json()["error"]["type"] == "authentication_error"
            assert r.headers["www-authenticate"] == "Bearer"
    # Probes and scrapers need no key.
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.get(f"{url}/metrics").status_code == 200


def test_openai_client_with_key(keyed_server):
    with OpenAI(base_url=f"{keyed_server.url}/v1", api_key=KEYS[1], max_retries=0, timeout=60) as client:
        assert [m.id for m in client.models.list().data] == ["tiny"]
        r = client.chat.completions.create(
            model="tiny", messages=QUESTION, max_tokens=2, extra_body={"documents": ["keyed"], "ignore_eos": True}
        )
        assert r.usage.completion_tokens == 2
    with (
        OpenAI(base_url=f"{keyed_server.url}/v1", api_key="wrong", max_retries=0, timeout=60) as client,
        pytest.raises(openai.AuthenticationError),
    ):
        client.models.list()


def test_each_key_is_a_tenant_for_documents(keyed_server):
    url = keyed_server.url
    a, b = KEYS
    r = httpx.post(f"{url}/v1/documents", json={"text": f"tenant A's notes {uuid.uuid4().hex}"}, headers=auth(a))
    doc_id = r.json()["id"]
    assert httpx.get(f"{url}/v1/documents/{doc_id}", headers=auth(a)).status_code == 200
    # Tenant B cannot read, list, use or delete it: to B the id does not exist.
    assert httpx.get(f"{url}/v1/documents/{doc_id}", headers=auth(b)).status_code == 404
    assert doc_id not in [d["id"] for d in httpx.get(f"{url}/v1/documents", headers=auth(b)).json()["data"]]
    assert chat(url, b, documents=[{"id": doc_id}]).status_code == 404
    assert httpx.delete(f"{url}/v1/documents/{doc_id}", headers=auth(b)).status_code == 404
    # A can: a hit on the pre-encoded document.
    r = chat(url, a, documents=[{"id": doc_id}])
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_each_key_has_its_own_cache(keyed_server):
    url = keyed_server.url
    a, b = KEYS
    doc = f"A document both tenants send {uuid.uuid4().hex}"
    for key in KEYS:  # each tenant's system segment is cached from here on
        assert chat(url, key, documents=["warm-up"]).status_code == 200
    first = chat(url, a, documents=[doc])
    assert first.status_code == 200
    # B sends the very same document right after A: a miss, so B learns nothing about what A sent.
    misses = keyed_server.metric("lazyattn:document_cache_misses_total")
    cached_b = chat(url, b, documents=[doc]).json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert keyed_server.metric("lazyattn:document_cache_misses_total") == misses + 1
    # A hits both its system segment and the document.
    cached_a = chat(url, a, documents=[doc]).json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert keyed_server.metric("lazyattn:document_cache_misses_total") == misses + 1
    assert cached_a - cached_b == len(doc) + 1  # the document segment: its bytes and a newline (tiny tokenizer)


def test_full_waiting_queue_is_429_with_retry_after(keyed_server):
    """One running sequence and one waiting slot: a third request is refused until the first leaves."""
    url, key = keyed_server.url, KEYS[0]
    long = {"messages": QUESTION, "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", f"{url}/v1/chat/completions", json=long, headers=auth(key)) as running,
    ):
        assert running.status_code == 200
        keyed_server.wait_for(lambda m: m[("lazyattn:num_requests_running", ())] == 1, what="one running")

        waiting: dict[str, httpx.Response] = {}
        second = threading.Thread(target=lambda: waiting.setdefault("r", chat(url, key)))
        second.start()
        keyed_server.wait_for(lambda m: m[("lazyattn:num_requests_waiting", ())] == 1, what="one waiting")

        r = chat(url, key)
        assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
        assert r.json()["error"]["type"] == "server_overloaded" and r.json()["error"]["code"] == "queue_full"
    # The streaming client left: its request is aborted, so the waiting one runs and completes.
    second.join(60)
    assert waiting["r"].status_code == 200 and waiting["r"].json()["usage"]["completion_tokens"] == 2
    keyed_server.idle()


def test_keys_are_stripped_as_the_header_is():
    """A key configured with spaces around it (`--api-key " k1 "`) once matched no header, which is stripped."""
    auth_ = Authenticator([" k1 ", "k2\n"])
    assert auth_.tenant("Bearer k1") == auth_.tenant("Bearer  k1 ") != auth_.tenant("Bearer k2")
    for keys in ([""], ["k1", "  "]):
        with pytest.raises(ValueError, match="an API key must not be empty"):
            Authenticator(keys)
