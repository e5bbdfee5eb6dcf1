"""`"answer": "best-document"` through the server: the same answer and document as the Python API's, usage that
counts every one-document request, the choice's `answered_from` only then, and a 400 naming the field for what the
strategy cannot do."""

from __future__ import annotations

import json

import httpx
import pytest

from lazyattn import LLM, SamplingParams
from lazyattn.errors import InvalidRequestError
from lazyattn.server.app import ServerConfig, create_app

from .conftest import _ENGINE, start_server, stop_server

DOCS = ["The lighthouse keeper is called Maren.", "Tides here rise twice a day.", "The ferry leaves at noon."]
MESSAGES = [{"role": "user", "content": "Who keeps the lighthouse?"}]
PROMPTS = ["Q: who keeps the lighthouse? A:", "Q: when does the ferry leave? A:"]
BODY = {"max_tokens": 5, "temperature": 0.0, "ignore_eos": True, "documents": DOCS}


@pytest.fixture(scope="module")
def offline():
    with LLM(model="tiny", device="cpu", progress=False, **_ENGINE) as llm:
        yield llm


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=60)


def streamed(r: httpx.Response) -> tuple[str, list]:
    """A chat stream's text (its deltas joined) and its finish reasons. How the tokens fall into events depends on
    when the server flushes them (a multi-byte character waits for its last token), so events are not compared."""
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    return text, [e["choices"][0]["finish_reason"] for e in events if e["choices"] and e["choices"][0]["finish_reason"]]


def prompt_tokens(outs) -> int:
    return sum(o.num_document_tokens + len(o.prompt_token_ids) for o in outs)


@pytest.mark.parametrize("answer", ["best-document", "best-document-or-joint"])
def test_chat_answers_as_the_python_api_and_counts_every_request(server, offline, answer):
    r = post(server.url, "/v1/chat/completions", {**BODY, "messages": MESSAGES, "answer": answer})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    want = offline.chat(MESSAGES, params, documents=[DOCS], answer=answer)[0]
    # answered_from is there even when it is null (the request as given won)
    assert (choice["message"]["content"], choice["answered_from"]) == (want.text, want.answered_from)
    assert choice["logprobs"] is None  # not asked for, though the choice read them
    # usage counts every candidate: the request as given (best-document-or-joint), then each document alone
    asked = ([DOCS] if answer == "best-document-or-joint" else []) + [[d] for d in DOCS]
    outs = offline.chat([MESSAGES] * len(asked), params, documents=asked)
    assert r.json()["usage"]["prompt_tokens"] == prompt_tokens(outs)
    assert r.json()["usage"]["completion_tokens"] == len(asked) * 5


def test_a_joint_answer_says_nothing_of_its_source(server):
    joint = post(server.url, "/v1/chat/completions", {**BODY, "messages": MESSAGES})
    assert joint.status_code == 200
    assert not {"answered_from", "document_order"} & set(joint.json()["choices"][0])


def answers_as_the_python_api(server, offline, answer: str, asked) -> dict:
    """A chat request and a two-prompt completion answered as `answer` give the Python API's texts and orders, and the
    chat's usage counts every request it made (`asked(want)`: their document lists); returns the chat's choice."""
    r = post(server.url, "/v1/chat/completions", {**BODY, "messages": MESSAGES, "answer": answer})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    want = offline.chat(MESSAGES, params, documents=[DOCS], answer=answer)[0]
    assert (choice["message"]["content"], choice["document_order"]) == (want.text, want.document_order)
    assert "answered_from" not in choice
    made = asked(want)
    outs = offline.chat([MESSAGES] * len(made), params, documents=made)
    assert r.json()["usage"]["prompt_tokens"] == prompt_tokens(outs)
    assert r.json()["usage"]["completion_tokens"] == len(made) * 5
    # completions: one answer per prompt, each the Python API's
    r = post(server.url, "/v1/completions", {**BODY, "prompt": PROMPTS, "answer": answer})
    assert r.status_code == 200, r.text
    want = offline.generate(PROMPTS, params, documents=[DOCS, DOCS], answer=answer)
    assert [(c["text"], c["document_order"]) for c in r.json()["choices"]] == [(w.text, w.document_order) for w in want]
    return choice


def test_confidence_order_answers_as_the_python_api_and_counts_every_request(server, offline):
    # each document alone, then the joint request over all three in the order read
    choice = answers_as_the_python_api(
        server, offline, "confidence-order", lambda want: [[d] for d in DOCS] + [[DOCS[i] for i in want.document_order]]
    )
    assert sorted(choice["document_order"]) == [0, 1, 2]


def test_confidence_order_or_joint_answers_as_the_python_api(server, offline):
    body = {**BODY, "messages": MESSAGES, "answer": "confidence-order-or-joint"}
    r = post(server.url, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    want = offline.chat(MESSAGES, params, documents=[DOCS], answer="confidence-order-or-joint")[0]
    assert (choice["message"]["content"], choice["document_order"]) == (want.text, want.document_order)
    assert "answered_from" not in choice
    # usage: the request as given and each document alone, then the reordered one unless its order is the given one
    order = offline.chat(MESSAGES, params, documents=[DOCS], answer="confidence-order")[0].document_order
    asked = [DOCS] + [[d] for d in DOCS] + ([[DOCS[i] for i in order]] if order != sorted(order) else [])
    assert r.json()["usage"]["completion_tokens"] == len(asked) * 5
    assert r.json()["usage"]["prompt_tokens"] == prompt_tokens(
        offline.chat([MESSAGES] * len(asked), params, documents=asked)
    )


def test_each_last_answers_as_the_python_api_and_counts_every_request(server, offline):
    # the request as given, then the first and the second document each moved last
    asked = [DOCS, [DOCS[1], DOCS[2], DOCS[0]], [DOCS[0], DOCS[2], DOCS[1]]]
    answers_as_the_python_api(server, offline, "each-last", lambda want: asked)


def test_both_orders_answers_as_the_python_api_and_counts_both_requests(server, offline):
    # the request as given, then its documents last to first
    answers_as_the_python_api(server, offline, "both-orders", lambda want: [DOCS, DOCS[::-1]])
    for fields, param in (({"n": 2}, "n"), ({"stream": True}, "stream")):  # one answer per prompt, from finished ones
        r = post(server.url, "/v1/chat/completions", {**BODY, "messages": MESSAGES, "answer": "both-orders", **fields})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_both_placements_answers_as_the_python_api_and_counts_both_requests(server, offline):
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    r = post(server.url, "/v1/chat/completions", {**BODY, "messages": MESSAGES, "answer": "both-placements"})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    want = offline.chat(MESSAGES, params, documents=[DOCS], answer="both-placements")[0]
    assert (choice["message"]["content"], choice["read_in_parallel"]) == (want.text, want.read_in_parallel)
    assert "answered_from" not in choice and "document_order" not in choice
    # usage: the documents read in order and read in parallel, the same tokens twice
    outs = [offline.chat(MESSAGES, params, documents=[DOCS], ape_parallel=p)[0] for p in (False, True)]
    assert r.json()["usage"]["prompt_tokens"] == prompt_tokens(outs)
    assert r.json()["usage"]["completion_tokens"] == 2 * 5
    r = post(server.url, "/v1/completions", {**BODY, "prompt": PROMPTS, "answer": "both-placements"})
    assert r.status_code == 200, r.text
    want = offline.generate(PROMPTS, params, documents=[DOCS, DOCS], answer="both-placements")
    assert [(c["text"], c["read_in_parallel"]) for c in r.json()["choices"]] == [
        (w.text, w.read_in_parallel) for w in want
    ]
    # one answer per prompt, from finished answers; the strategy sets ape_parallel itself
    for fields, param in (({"n": 2}, "n"), ({"stream": True}, "stream")):
        r = post(
            server.url, "/v1/chat/completions", {**BODY, "messages": MESSAGES, "answer": "both-placements", **fields}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = post(server.url, "/v1/chat/completions", {**BODY, "messages": MESSAGES, "answer": "both-placements",
                                                  "ape_parallel": True})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] == "ape_parallel", r.text


def test_confidence_order_with_one_document_is_the_request_as_given(server, offline):
    body = {**BODY, "documents": DOCS[:1], "messages": MESSAGES, "answer": "confidence-order", "logprobs": True}
    r = post(server.url, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=0)
    want = offline.chat(MESSAGES, params, documents=[DOCS[:1]])[0]
    assert choice["message"]["content"] == want.text and choice["document_order"] is None
    assert len(choice["logprobs"]["content"]) == 5  # asked for, and kept
    assert r.json()["usage"]["prompt_tokens"] == prompt_tokens([want])


def test_completions_pick_per_prompt(server, offline):
    r = post(server.url, "/v1/completions", {**BODY, "prompt": PROMPTS, "answer": "best-document", "logprobs": 1})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=1)
    want = offline.generate(PROMPTS, params, documents=[DOCS, DOCS], answer="best-document")
    assert [(c["index"], c["text"], c["answered_from"]) for c in choices] == [
        (i, w.text, w.answered_from) for i, w in enumerate(want)
    ]
    assert all(len(c["logprobs"]["tokens"]) == 5 for c in choices)
    alone = offline.generate([p for p in PROMPTS for _ in DOCS], params, documents=[[d] for _ in PROMPTS for d in DOCS])
    assert r.json()["usage"]["prompt_tokens"] == prompt_tokens(alone)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"stream": True}, "stream"),
        ({"documents": DOCS * 90}, "documents"),  # 270 one-document requests: past the 256 sequences a request may make
    ],
)
@pytest.mark.parametrize("answer", ["best-document", "confidence-order", "confidence-order-or-joint", "each-last"])
def test_what_best_document_cannot_do_is_a_400_naming_the_field(server, fields, param, answer):
    body = {**BODY, "messages": MESSAGES, "answer": answer, **fields}
    r = post(server.url, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert post(server.url, "/v1/chat/completions", {**BODY, "messages": MESSAGES, "answer": "best"}).status_code == 400


def test_confidence_tokens_cap_the_one_document_answers_as_the_python_api(server, offline):
    body = {**BODY, "messages": MESSAGES, "answer": "confidence-order", "confidence_tokens": 2}
    r = post(server.url, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    want = offline.chat(MESSAGES, params, documents=[DOCS], answer="confidence-order", confidence_tokens=2)[0]
    assert (choice["message"]["content"], choice["document_order"]) == (want.text, want.document_order)
    # usage: each document alone for 2 tokens, then the joint request, in full
    assert r.json()["usage"]["completion_tokens"] == len(DOCS) * 2 + 5


@pytest.mark.parametrize("answer", ["both-placements", "best-document-or-joint"])
def test_confidence_tokens_choose_after_the_first_tokens_as_the_python_api(server, offline, answer):
    # chat and a two-prompt completion: the Python API's answers; usage counts each other candidate's 2 tokens only
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    shown = "read_in_parallel" if answer == "both-placements" else "answered_from"
    asked = {"answer": answer, "confidence_tokens": 2}
    r = post(server.url, "/v1/chat/completions", {**BODY, "messages": MESSAGES, **asked})
    assert r.status_code == 200, r.text
    want = offline.chat(MESSAGES, params, documents=[DOCS], **asked)[0]
    choice = r.json()["choices"][0]
    assert (choice["message"]["content"], choice[shown]) == (want.text, getattr(want, shown))
    candidates = 2 if answer == "both-placements" else 1 + len(DOCS)
    assert r.json()["usage"]["completion_tokens"] == 5 + (candidates - 1) * 2
    r = post(server.url, "/v1/completions", {**BODY, "prompt": PROMPTS, **asked})
    assert r.status_code == 200, r.text
    want = offline.generate(PROMPTS, params, documents=[DOCS, DOCS], **asked)
    assert [(c["text"], c[shown]) for c in r.json()["choices"]] == [(w.text, getattr(w, shown)) for w in want]
    assert r.json()["usage"]["completion_tokens"] == len(PROMPTS) * (5 + (candidates - 1) * 2)


@pytest.mark.parametrize(("answer", "tokens"), [("joint", 2), ("confidence-order", 0), ("confidence-order", "2")])
def test_a_confidence_cap_that_cannot_apply_is_a_400_naming_it(server, answer, tokens):
    body = {**BODY, "messages": MESSAGES, "answer": answer, "confidence_tokens": tokens}
    r = post(server.url, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "confidence_tokens"


@pytest.fixture(scope="module")
def both_placements_server():
    """A server whose requests that name no strategy are answered with both placements (`lazyattn serve --answer`)."""
    s = start_server(_ENGINE, ServerConfig(model_name="tiny", answer="both-placements"))
    yield s
    stop_server(s)


def test_a_server_default_answers_requests_that_name_no_strategy(both_placements_server, server):
    url = both_placements_server.url
    chat = {**BODY, "messages": MESSAGES}
    plain, asked = (post(url, "/v1/chat/completions", body) for body in (chat, {**chat, "answer": "both-placements"}))
    assert plain.status_code == asked.status_code == 200, plain.text
    # the default is the strategy the request could have named: the same choice, usage counting both placements
    # (the second finds the documents cached by the first)
    assert plain.json()["choices"][0]["read_in_parallel"] in (True, False)
    assert plain.json()["choices"] == asked.json()["choices"]
    counts = ("prompt_tokens", "completion_tokens")
    assert [plain.json()["usage"][k] for k in counts] == [asked.json()["usage"][k] for k in counts]
    completion = {**BODY, "prompt": PROMPTS}
    bodies = (completion, {**completion, "answer": "both-placements"})
    plain, asked = (post(url, "/v1/completions", body) for body in bodies)
    assert plain.status_code == 200 and plain.json()["choices"] == asked.json()["choices"], plain.text
    # answered jointly, as by a server without the default: a request naming "joint", one that streams or asks for
    # several samples, and one that sets ape_parallel (both placements would set it themselves)
    for extra in ({"answer": "joint"}, {"stream": True}, {"n": 2}, {"ape_parallel": True}):
        got, want = (post(u, "/v1/chat/completions", {**chat, **extra}) for u in (url, server.url))
        assert got.status_code == want.status_code == 200, (extra, got.text)
        if extra.get("stream"):
            assert streamed(got) == streamed(want) and streamed(want)[1] and "read_in_parallel" not in got.text
            continue
        assert "read_in_parallel" not in got.json()["choices"][0]
        assert [c["message"] for c in got.json()["choices"]] == [c["message"] for c in want.json()["choices"]]
    # confidence_tokens applies to the default strategy as to the one named; a request that asks for what its own
    # strategy cannot do is still told which field is wrong
    named = {**chat, "answer": "both-placements"}
    plain, asked = (post(url, "/v1/chat/completions", {**body, "confidence_tokens": 2}) for body in (chat, named))
    assert plain.status_code == asked.status_code == 200, plain.text
    assert plain.json()["choices"] == asked.json()["choices"]
    r = post(url, "/v1/chat/completions", {**chat, "answer": "joint", "confidence_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "confidence_tokens", r.text


def test_a_default_strategy_the_engine_cannot_run_is_refused_at_start():
    with LLM(model="tiny", mode="block", device="cpu", progress=False) as block:
        with pytest.raises(InvalidRequestError, match="needs mode 'lazy', not 'block'") as err:
            create_app(block.engine, ServerConfig(model_name="tiny", answer="both-placements"))
        assert err.value.param == "answer"
        with pytest.raises(InvalidRequestError, match="answer must be one of"):
            create_app(block.engine, ServerConfig(model_name="tiny", answer="surest"))
        create_app(block.engine, ServerConfig(model_name="tiny", answer="each-last"))  # every mode runs it
        for k in (0, 2.5):
            with pytest.raises(InvalidRequestError, match="confidence_tokens must be a positive integer") as err:
                create_app(block.engine, ServerConfig(model_name="tiny", confidence_tokens=k))
            assert err.value.param == "confidence_tokens"


@pytest.fixture(scope="module")
def first_tokens_server():
    """A server that answers with both placements, chosen after the first 2 tokens, requests that say neither
    (`lazyattn serve --answer both-placements --confidence-tokens 2`)."""
    s = start_server(_ENGINE, ServerConfig(model_name="tiny", answer="both-placements", confidence_tokens=2))
    yield s
    stop_server(s)


def test_a_server_default_confidence_tokens_answers_as_if_the_request_gave_it(first_tokens_server, server):
    url = first_tokens_server.url
    chat = {**BODY, "messages": MESSAGES}
    both = {**chat, "answer": "both-placements"}
    plain, named = post(url, "/v1/chat/completions", chat), post(server.url, "/v1/chat/completions",
                                                                  {**both, "confidence_tokens": 2})  # fmt: skip
    assert plain.status_code == named.status_code == 200, plain.text
    assert plain.json()["choices"] == named.json()["choices"]
    assert plain.json()["usage"]["completion_tokens"] == named.json()["usage"]["completion_tokens"] == 5 + 2
    # the request's own k wins; a joint answer (named, or for a request the default cannot answer) takes none
    own = post(url, "/v1/chat/completions", {**chat, "confidence_tokens": 1})
    assert own.status_code == 200 and own.json()["usage"]["completion_tokens"] == 5 + 1, own.text
    for extra in ({"answer": "joint"}, {"stream": True}):
        got, want = (post(u, "/v1/chat/completions", {**chat, **extra}) for u in (url, server.url))
        assert got.status_code == want.status_code == 200, (extra, got.text)
        if extra.get("stream"):
            assert streamed(got) == streamed(want) and streamed(want)[1]
        else:
            assert got.json()["choices"] == want.json()["choices"]


def test_metrics_count_each_kept_answer_by_strategy_and_what_it_read(both_placements_server):
    server = both_placements_server

    def counts() -> dict[tuple[str, str], float]:
        return {
            (dict(labels)["strategy"], dict(labels)["read"]): value
            for (name, labels), value in server.metrics().items()
            if name == "lazyattn:answers_total"
        }

    def read(choice: dict) -> str:  # what the choice says it read, by hand
        if choice.get("read_in_parallel"):
            return "parallel"
        if choice.get("answered_from") is not None:
            return "one_document"
        return "reordered" if choice.get("document_order") is not None else "as_given"

    expected = counts()
    asked = [
        ("/v1/chat/completions", {**BODY, "messages": MESSAGES}, "both-placements"),  # the server's default
        ("/v1/completions", {**BODY, "prompt": PROMPTS, "answer": "best-document"}, "best-document"),
        ("/v1/completions", {**BODY, "prompt": PROMPTS, "answer": "confidence-order"}, "confidence-order"),
        ("/v1/chat/completions", {**BODY, "messages": MESSAGES, "answer": "joint"}, None),  # joint: not counted
    ]
    for path, body, strategy in asked:
        r = post(server.url, path, body)
        assert r.status_code == 200, r.text
        for choice in r.json()["choices"] if strategy else []:
            key = (strategy, read(choice))
            expected[key] = expected.get(key, 0.0) + 1
    assert counts() == expected
    assert sum(expected.values()) >= 5  # one chat answer and two answers of each completion
