"""The server through the official `openai` client: chat and completions, streamed and not, with documents."""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from lazyattn import LLM, SamplingParams

DOCS = [
    {"title": "Lazy attention", "text": "Each document is cached once and placed at any position."},
    "Rotary embeddings make attention scores depend on relative positions only.",
]
MESSAGES = [{"role": "user", "content": "Where is a document placed?"}]
GREEDY = dict(temperature=0.0, max_tokens=4, extra_body={"documents": DOCS, "ignore_eos": True})


@pytest.fixture(scope="module")
def client(server) -> OpenAI:
    c = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    yield c
    c.close()


def test_health_and_models(server, client):
    r = httpx.get(f"{server.url}/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].owned_by == "lazyattn"


def test_chat_with_documents_second_request_hits_cache(server, client):
    first = client.chat.completions.create(model="tiny", messages=MESSAGES, **GREEDY)
    assert first.object == "chat.completion" and first.id.startswith("chatcmpl-")
    choice = first.choices[0]
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    assert first.usage.completion_tokens == 4
    assert first.usage.total_tokens == first.usage.prompt_tokens + 4

    second = client.chat.completions.create(model="tiny", messages=MESSAGES, **GREEDY)
    # The system segment and both documents come from the cache; only the question is computed.
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < second.usage.prompt_tokens
    assert second.choices[0].message.content == choice.message.content  # greedy, cached KV: same text


def test_streaming_chat_equals_non_streaming(server, client):
    full = client.chat.completions.create(model="tiny", messages=MESSAGES, **GREEDY)
    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **GREEDY
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_matches_offline_engine(server, client):
    """The server renders and samples exactly as the offline API does."""
    got = client.chat.completions.create(model="tiny", messages=MESSAGES, **GREEDY).choices[0].message.content
    llm = LLM(model="tiny", device="cpu", progress=False, page_size=16, kv_cache_gb=0.05)
    want = llm.chat(MESSAGES, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True), documents=[DOCS])
    assert got == want[0].text


@pytest.mark.parametrize("option", ["relink_tokens", "relink_last_tokens"])
def test_relink_tokens_per_request_match_the_offline_engine(server, client, option):
    """A request's relink_tokens (or relink_last_tokens) reaches the engine: the answer (logprobs included) is the
    offline API's with the same option, and differs from plain lazy's."""
    kw = dict(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0.0, logprobs=True)
    body = {"documents": DOCS, "ignore_eos": True}
    relinked = client.chat.completions.create(**kw, extra_body={**body, option: 3}).choices[0]
    plain = client.chat.completions.create(**kw, extra_body=body).choices[0]
    llm = LLM(model="tiny", device="cpu", progress=False, page_size=16, kv_cache_gb=0.05)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=0)
    want = llm.chat(MESSAGES, params, documents=[DOCS], **{option: 3})[0].outputs[0]
    got = [t.logprob for t in relinked.logprobs.content]
    assert relinked.message.content == want.text
    assert got == pytest.approx([next(iter(lp.values())) for lp in want.logprobs], abs=1e-5)
    assert got != pytest.approx([t.logprob for t in plain.logprobs.content], abs=1e-5)


def test_chat_logprobs_and_n(client):
    r = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        n=2,
        logprobs=True,
        top_logprobs=3,
        temperature=1.0,
        seed=7,
        max_tokens=3,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        assert len(c.logprobs.content) == 3
        for entry in c.logprobs.content:
            assert len(entry.top_logprobs) == 3
            assert entry.logprob <= entry.top_logprobs[0].logprob + 1e-6
    assert r.usage.completion_tokens == 6


def test_completions_batch_streamed_and_not(client):
    kw = dict(model="tiny", max_tokens=3, temperature=0.0, n=2, extra_body={"documents": DOCS, "ignore_eos": True})
    r = client.completions.create(prompt=["Question one:", "Question two:"], **kw)
    assert r.object == "text_completion"
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.usage.completion_tokens == 12
    assert r.choices[0].text == r.choices[1].text  # greedy: both samples of a prompt agree

    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    for chunk in client.completions.create(prompt=["Question one:", "Question two:"], stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert texts == {c.index: c.text for c in r.choices}
    assert finish == {0: "length", 1: "length", 2: "length", 3: "length"}


def test_completion_from_token_ids_with_logprobs(client):
    r = client.completions.create(
        model="tiny", prompt=[104, 105, 33], max_tokens=2, logprobs=2, temperature=0.0, extra_body={"ignore_eos": True}
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 2 and len(lp.token_logprobs) == 2 and len(lp.top_logprobs) == 2
    assert r.usage.prompt_tokens == 4  # BOS + the three ids


def test_guided_choice_answers_with_a_choice_as_the_offline_engine_does(client):
    """guided_choice (vLLM's extra field): every sampled answer is one of the strings, streamed or not, chat or
    completion; the greedy one is the offline engine's."""
    choices = ["yes", "yes sir", "no", "maybe"]
    for seed in range(4):
        r = client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=9,
            temperature=1.5,
            seed=seed,
            n=2,
            extra_body={"documents": DOCS, "guided_choice": choices},
        )
        assert all(c.message.content in choices and c.finish_reason == "stop" for c in r.choices)
    stream = client.completions.create(
        model="tiny", prompt="Is it?", max_tokens=9, temperature=0.0, stream=True, extra_body={"guided_choice": choices}
    )
    streamed = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    offline = LLM(model="tiny", device="cpu", progress=False).generate(
        ["Is it?"], SamplingParams(max_tokens=9, temperature=0.0, guided_choice=choices), use_tqdm=False
    )
    assert streamed == offline[0].outputs[0].text and streamed in choices


def test_raw_sse_framing(server):
    body = {"messages": MESSAGES, "max_tokens": 2, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
