"""APE options per request (docs/design.md, "APE"): `ape_temperature`, `ape_scale`, `ape_tilt`, `ape_prefix` and
`ape_parallel` reach the engine and answer as the Python API does with the same options; the server's own settings
are the default; a value out of range, or an option the server's mode does not take, is a 400 naming it."""

from __future__ import annotations

import uuid

import httpx
import pytest

from lazyattn import LLM, SamplingParams
from lazyattn.server import ServerConfig

from .conftest import _ENGINE, start_server, stop_server

DOCS = [
    {"title": "Shared prefix", "text": "With the shared prefix, each document is encoded after the system prompt."},
    "Attention temperature sharpens how the question reads its documents.",
]
MESSAGES = [{"role": "user", "content": "How is a document encoded?"}]
PROMPT = "Question: how is a document encoded? Answer:"


def offline(**engine_options) -> LLM:
    """The Python API on the test servers' engine settings."""
    return LLM(model="tiny", device="cpu", progress=False, **_ENGINE, **engine_options)


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=60)


def chat(url: str, **fields) -> dict:
    body = {"messages": MESSAGES, "documents": DOCS, "max_tokens": 4, "temperature": 0.0, "ignore_eos": True}
    r = post(url, "/v1/chat/completions", {**body, "logprobs": True, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def complete(url: str, documents: list, **fields) -> dict:
    body = {"prompt": PROMPT, "documents": documents, "max_tokens": 4, "temperature": 0.0, "ignore_eos": True}
    r = post(url, "/v1/completions", {**body, "logprobs": 0, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def chat_logprobs(response: dict) -> list[float]:
    return [t["logprob"] for t in response["choices"][0]["logprobs"]["content"]]


def offline_logprobs(out) -> list[float]:
    return [next(iter(lp.values())) for lp in out.outputs[0].logprobs]


GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def block_server():
    s = start_server({**_ENGINE, "mode": "block"}, ServerConfig(model_name="tiny"))
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def ape_server():
    """A lazy server started with APE on (`lazyattn serve --ape-prefix --ape-temperature 0.5`)."""
    s = start_server({**_ENGINE, "ape_prefix": True, "ape_temperature": 0.5}, ServerConfig(model_name="tiny"))
    yield s
    stop_server(s)


def test_ape_prefix_matches_the_offline_engine_and_caches_documents_apart(server):
    """A completion with ape_prefix gives the Python API's tokens and logprobs with the engine's ape_prefix on;
    its documents are cached under keys of their own: a miss each though a plain request cached them, then hits."""
    docs = [{"title": "Apart", "text": "Documents read after the system prompt are keyed by it."}, "A second one."]
    plain = complete(server.url, docs)
    m = server.idle()
    hits, misses = m[("lazyattn:document_cache_hits_total", ())], m[("lazyattn:document_cache_misses_total", ())]
    first = complete(server.url, docs, ape_prefix=True)
    # The first segment (BOS here) hits: the plain request cached it; each document is encoded again, after it.
    m = server.idle()
    assert m[("lazyattn:document_cache_hits_total", ())] == hits + 1
    assert m[("lazyattn:document_cache_misses_total", ())] == misses + len(docs)
    again = complete(server.url, docs, ape_prefix=True)
    m = server.idle()
    assert m[("lazyattn:document_cache_hits_total", ())] == hits + 2 + len(docs)
    assert m[("lazyattn:document_cache_misses_total", ())] == misses + len(docs)
    assert (
        again["usage"]["prompt_tokens_details"]["cached_tokens"]
        > first["usage"]["prompt_tokens_details"]["cached_tokens"]
    )
    assert again["choices"][0]["text"] == first["choices"][0]["text"]

    want = offline(ape_prefix=True).generate(PROMPT, GREEDY, documents=[docs])[0]
    got = first["choices"][0]
    assert got["text"] == want.outputs[0].text
    assert got["logprobs"]["token_logprobs"] == pytest.approx(offline_logprobs(want), abs=1e-5)
    assert got["logprobs"]["token_logprobs"] != pytest.approx(
        plain["choices"][0]["logprobs"]["token_logprobs"], abs=1e-5
    )


def test_ape_temperature_matches_the_offline_engine(server):
    """ape_temperature 0.5 (and ape_scale) on a chat: the Python API's answer at the same setting, not plain
    lazy's."""
    llm = offline()
    for fields in (
        {"ape_temperature": 0.5},
        {"ape_temperature": 0.5, "ape_scale": 2.0},
        {"ape_tilt": 3.0},
        {"ape_parallel": True, "ape_prefix": True},
    ):
        got = chat(server.url, **fields)
        want = llm.chat(MESSAGES, GREEDY, documents=[DOCS], **fields)[0]
        assert got["choices"][0]["message"]["content"] == want.outputs[0].text
        assert chat_logprobs(got) == pytest.approx(offline_logprobs(want), abs=1e-5)
    plain = chat(server.url)
    assert chat_logprobs(plain) == pytest.approx(offline_logprobs(llm.chat(MESSAGES, GREEDY, documents=[DOCS])[0]))
    assert chat_logprobs(plain) != pytest.approx(chat_logprobs(got), abs=1e-5)


def test_server_settings_are_the_default_and_a_request_overrides_them(ape_server):
    """On a server started with --ape-prefix --ape-temperature 0.5, a request that says nothing gets both; one
    that says ape_prefix false and ape_temperature 1 gets plain lazy attention."""
    default = chat(ape_server.url)
    want = offline(ape_prefix=True, ape_temperature=0.5).chat(MESSAGES, GREEDY, documents=[DOCS])[0]
    assert chat_logprobs(default) == pytest.approx(offline_logprobs(want), abs=1e-5)
    off = chat(ape_server.url, ape_prefix=False, ape_temperature=1.0)
    plain = offline().chat(MESSAGES, GREEDY, documents=[DOCS])[0]
    assert chat_logprobs(off) == pytest.approx(offline_logprobs(plain), abs=1e-5)
    assert off["choices"][0]["message"]["content"] == plain.outputs[0].text


def test_block_mode_takes_temperature_not_prefix(block_server):
    r = post(block_server.url, "/v1/completions", {"prompt": PROMPT, "documents": DOCS, "ape_prefix": True})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "ape_prefix" and error["type"] == "invalid_request_error"
    assert "needs mode 'lazy'" in error["message"]
    r = post(block_server.url, "/v1/chat/completions", {"messages": MESSAGES, "documents": DOCS, "ape_prefix": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "ape_prefix"
    r = post(block_server.url, "/v1/chat/completions", {"messages": MESSAGES, "documents": DOCS, "ape_parallel": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "ape_parallel"
    # false is plain block mode; the temperature and scale are block mode's too
    got = chat(block_server.url, ape_prefix=False, ape_temperature=0.5, ape_scale=2.0)
    want = offline(mode="block").chat(MESSAGES, GREEDY, documents=[DOCS], ape_temperature=0.5, ape_scale=2.0)[0]
    assert chat_logprobs(got) == pytest.approx(offline_logprobs(want), abs=1e-5)


@pytest.mark.parametrize(
    "field, value",
    [
        ("ape_temperature", 0),
        ("ape_temperature", -1),
        ("ape_temperature", "0.5"),
        ("ape_temperature", True),
        ("ape_temperature", 1e-5),  # below 0.001: 1/T would overflow the scores
        ("ape_scale", 0),
        ("ape_scale", -2.5),
        ("ape_scale", "2"),
        ("ape_prefix", "yes"),
        ("ape_prefix", 1),
        ("ape_tilt", 25),
        ("ape_tilt", "1"),
        ("ape_parallel", "yes"),
        ("ape_parallel", 1),
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_bad_values_are_a_400_naming_the_field(server, path, field, value):
    body = {"messages": MESSAGES} if path == "/v1/chat/completions" else {"prompt": PROMPT}
    r = post(server.url, path, {**body, "documents": DOCS, "max_tokens": 1, field: value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and error["type"] == "invalid_request_error", error
    assert "unknown field" not in error["message"]


@pytest.mark.parametrize("literal", [b"Infinity", b"NaN", b"1e999"])
def test_non_finite_values_are_a_400(server, literal):
    for field in (b"ape_temperature", b"ape_scale", b"ape_tilt"):
        body = b'{"prompt": "q", "max_tokens": 1, "' + field + b'": ' + literal + b"}"
        r = httpx.post(
            f"{server.url}/v1/completions", content=body, headers={"content-type": "application/json"}, timeout=60
        )
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == field.decode() and "finite number" in error["message"], error


def test_parallel_with_relink_is_a_400_naming_it(server):
    r = post(
        server.url, "/v1/completions", {"prompt": PROMPT, "documents": DOCS, "ape_parallel": True, "relink_tokens": 2}
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "ape_parallel" and "relink" in error["message"], error


def test_null_is_the_servers_setting(server):
    plain = chat(server.url)
    explicit = chat(server.url, ape_temperature=None, ape_scale=None, ape_prefix=None)
    assert chat_logprobs(explicit) == pytest.approx(chat_logprobs(plain), abs=1e-6)


def test_a_registered_document_hits_on_a_shared_prefix_server_and_deleting_it_removes_every_copy(ape_server):
    """Registration on a server whose requests encode documents after the system segment (--ape-prefix) encodes
    that copy too: a chat request naming the document misses nothing. Deleting the document removes its
    shared-prefix copy with it: the same text inline is then a miss."""
    salt = f"t-{uuid.uuid4().hex}"  # a fresh scope: nothing of it is cached yet
    doc = {"title": "Manual", "text": f"Each document reads the system prompt first, {uuid.uuid4().hex}."}
    r = post(ape_server.url, "/v1/documents", {**doc, "cache_salt": salt})
    assert r.status_code == 200, r.text
    doc_id = r.json()["id"]
    misses = ape_server.metric("lazyattn:document_cache_misses_total")
    by_id = chat(ape_server.url, documents=[{"id": doc_id}], cache_salt=salt)
    assert ape_server.metric("lazyattn:document_cache_misses_total") == misses  # system segment and copy: hits
    assert by_id["usage"]["prompt_tokens_details"]["cached_tokens"] > r.json()["num_tokens"]
    want = offline(ape_prefix=True, ape_temperature=0.5).chat(MESSAGES, GREEDY, documents=[[doc]], cache_salt=salt)
    assert chat_logprobs(by_id) == pytest.approx(offline_logprobs(want[0]), abs=1e-5)

    assert httpx.delete(f"{ape_server.url}/v1/documents/{doc_id}", params={"cache_salt": salt}).status_code == 200
    chat(ape_server.url, documents=[doc], cache_salt=salt)
    assert ape_server.metric("lazyattn:document_cache_misses_total") == misses + 1  # the copy, gone with it
