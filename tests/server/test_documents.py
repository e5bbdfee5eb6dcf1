"""Registered documents and cache salts: hits by id, isolation between salts, deletion."""

from __future__ import annotations

import uuid

import httpx

QUESTION = [{"role": "user", "content": "What does it say?"}]


def chat(url: str, **body) -> httpx.Response:
    body = {"messages": QUESTION, "max_tokens": 2, "temperature": 0.0, "ignore_eos": True, **body}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)


def cached_tokens(r: httpx.Response) -> int:
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_registered_document_by_id_is_a_cache_hit(server):
    salt = f"t-{uuid.uuid4().hex}"  # a fresh scope: nothing of it is cached yet
    doc = {"title": "Manual", "text": "Pages hold sixteen tokens each in these tests.", "cache_salt": salt}
    r = httpx.post(f"{server.url}/v1/documents", json=doc, timeout=60)
    assert r.status_code == 200, r.text
    created = r.json()
    assert created["id"].startswith("doc-") and created["object"] == "document" and created["num_tokens"] > 0
    # Registering it again is idempotent.
    assert httpx.post(f"{server.url}/v1/documents", json=doc, timeout=60).json()["id"] == created["id"]

    got = httpx.get(f"{server.url}/v1/documents/{created['id']}", params={"cache_salt": salt}).json()
    assert got["text"] == doc["text"] and got["title"] == "Manual" and got["num_tokens"] == created["num_tokens"]
    listed = httpx.get(f"{server.url}/v1/documents", params={"cache_salt": salt}).json()
    assert [d["id"] for d in listed["data"]] == [created["id"]]

    hits = server.metric("lazyattn:document_cache_hits_total")
    r = chat(server.url, documents=[{"id": created["id"]}], cache_salt=salt)
    # The pre-encoded document is a hit; the system segment of this fresh scope is not.
    assert cached_tokens(r) == created["num_tokens"]
    assert server.metric("lazyattn:document_cache_hits_total") == hits + 1

    # Inline, the same document is the same segment: now the system segment hits too, and the output agrees.
    inline = chat(server.url, documents=[{"title": "Manual", "text": doc["text"]}], cache_salt=salt)
    assert cached_tokens(inline) > created["num_tokens"]
    assert inline.json()["usage"]["prompt_tokens"] == r.json()["usage"]["prompt_tokens"]
    assert inline.json()["choices"][0]["message"]["content"] == r.json()["choices"][0]["message"]["content"]


def test_salts_isolate_the_same_document(server):
    text = f"A document two tenants both send, {uuid.uuid4().hex}."
    a, b = f"a-{uuid.uuid4().hex}", f"b-{uuid.uuid4().hex}"
    misses = server.metric("lazyattn:document_cache_misses_total")
    hits = server.metric("lazyattn:document_cache_hits_total")
    assert cached_tokens(chat(server.url, documents=[text], cache_salt=a)) == 0
    assert cached_tokens(chat(server.url, documents=[text], cache_salt=b)) == 0
    # Two segments (system prompt, document) missed under each salt; nothing was shared.
    assert server.metric("lazyattn:document_cache_misses_total") == misses + 4
    assert server.metric("lazyattn:document_cache_hits_total") == hits
    # Under its own salt, a tenant does hit its documents.
    assert cached_tokens(chat(server.url, documents=[text], cache_salt=a)) > 0


def test_document_ids_are_scoped_by_salt(server):
    salt, other = f"s-{uuid.uuid4().hex}", f"o-{uuid.uuid4().hex}"
    doc_id = httpx.post(f"{server.url}/v1/documents", json={"text": "scoped", "cache_salt": salt}).json()["id"]
    for params in ({"cache_salt": other}, {}):
        r = httpx.get(f"{server.url}/v1/documents/{doc_id}", params=params)
        assert r.status_code == 404 and r.json()["error"]["code"] == "document_not_found"
        assert httpx.delete(f"{server.url}/v1/documents/{doc_id}", params=params).status_code == 404
    r = chat(server.url, documents=[{"id": doc_id}], cache_salt=other)
    assert r.status_code == 404 and r.json()["error"]["param"] == "documents[0].id"
    assert doc_id not in [d["id"] for d in httpx.get(f"{server.url}/v1/documents").json()["data"]]


def test_delete_document(server):
    salt = f"d-{uuid.uuid4().hex}"
    doc_id = httpx.post(f"{server.url}/v1/documents", json={"text": "to be deleted", "cache_salt": salt}).json()["id"]
    segments = server.metric("lazyattn:document_cache_segments")
    r = httpx.delete(f"{server.url}/v1/documents/{doc_id}", params={"cache_salt": salt})
    assert r.status_code == 200 and r.json() == {"id": doc_id, "object": "document.deleted", "deleted": True}
    # Its KV is dropped at once, not left for LRU.
    server.wait_for(lambda m: m[("lazyattn:document_cache_segments", ())] == segments - 1, what="segment dropped")
    assert httpx.get(f"{server.url}/v1/documents/{doc_id}", params={"cache_salt": salt}).status_code == 404
    assert chat(server.url, documents=[{"id": doc_id}], cache_salt=salt).status_code == 404
    assert httpx.get(f"{server.url}/v1/documents", params={"cache_salt": salt}).json()["data"] == []


def test_a_recurring_document_is_tokenised_once(server):
    """Registration and requests share the tokenizer's cache of document ids (/metrics counts its lookups)."""
    text = f"A document several requests carry, long enough to be kept by the tokenizer cache: {uuid.uuid4().hex}."
    hits, misses = (server.metric(f"lazyattn:tokenizer_cache_{n}_total") for n in ("hits", "misses"))
    r = httpx.post(f"{server.url}/v1/documents", json={"text": text}, timeout=60)
    assert r.status_code == 200, r.text
    first = chat(server.url, documents=[text])
    again = chat(server.url, documents=[{"id": r.json()["id"]}, text])
    assert cached_tokens(first) > 0 and cached_tokens(again) > cached_tokens(first)
    assert server.metric("lazyattn:tokenizer_cache_misses_total") == misses + 1  # registration tokenised it
    # Then one hit per document of each request: a registered one is rendered from its text too.
    assert server.metric("lazyattn:tokenizer_cache_hits_total") == hits + 3
