"""Bad input over raw HTTP: every error is OpenAI's body with the right status."""

from __future__ import annotations

import httpx
import pytest

MESSAGES = [{"role": "user", "content": "hi"}]


def post(url: str, path: str, **kw) -> httpx.Response:
    return httpx.post(f"{url}{path}", timeout=60, **kw)


def assert_error(r: httpx.Response, status: int, type_: str, param: str | None = None, code: str | None = None):
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == type_
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


def test_malformed_json(server):
    r = post(
        server.url, "/v1/chat/completions", content=b'{"messages": [', headers={"content-type": "application/json"}
    )
    assert "not valid JSON" in assert_error(r, 400, "invalid_request_error")["message"]


def test_body_not_sent_as_json(server):
    r = post(
        server.url,
        "/v1/chat/completions",
        content=b'{"messages": []}',
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert "Content-Type: application/json" in assert_error(r, 400, "invalid_request_error")["message"]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": MESSAGES, "max_tokens": 2, "frobnicate": 1}, "frobnicate"),  # unknown field
        ({"messages": MESSAGES, "tools": []}, "tools"),  # an OpenAI feature this server does not have
        ({"messages": [{"role": "user", "content": "hi", "extra": 1}]}, "messages[0].extra"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": []}, "messages"),
        ({}, "messages"),
        ({"messages": MESSAGES, "max_tokens": "many"}, "max_tokens"),
        (
            {"messages": MESSAGES, "documents": [{"id": "x", "text": "both"}]},
            "documents[0].text",
        ),  # an id takes no text
        ({"messages": MESSAGES, "documents": "not a list"}, "documents"),
    ],
)
def test_schema_errors(server, body, param):
    assert_error(post(server.url, "/v1/chat/completions", json=body), 400, "invalid_request_error", param)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": 2.5}, "temperature"),  # OpenAI's range is [0, 2]
        ({"top_p": 0.0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "5"}, "max_tokens"),  # strict types, as the schema says
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logit_bias": {"5": 1.0}}, "logit_bias"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"documents": [{"text": ""}]}, "documents[0].text"),
        ({"stop": ["x"] * 17}, "stop"),
    ],
)
def test_value_errors(server, body, param):
    r = post(server.url, "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, **body})
    assert_error(r, 400, "invalid_request_error", param)


@pytest.mark.parametrize(
    "document, param, message",
    [
        ("", "documents[0]", "documents[0]: String should have at least 1 character"),
        ({"title": "t"}, "documents[0].text", "documents[0].text: Field required"),
        ({"text": "x", "extra": 1}, "documents[0].extra", "documents[0].extra: unknown field"),
        ({"id": 3}, "documents[0].id", "documents[0].id: Input should be a valid string"),
        (
            5,
            "documents[0]",
            "documents[0]: a document is a non-empty string, an object with 'text' (and 'title'), or an "
            "object with the 'id' of a registered document",
        ),
    ],
)
def test_a_bad_document_is_reported_in_the_form_it_has(server, document, param, message):
    """A document's JSON shape picks its form (string, inline object, registered id): the error names that form's
    field, not every alternative of the union."""
    r = post(server.url, "/v1/chat/completions", json={"messages": MESSAGES, "documents": ["fine", document]})
    body = assert_error(r, 400, "invalid_request_error", param.replace("[0]", "[1]"))
    assert body["message"].startswith(message.replace("[0]", "[1]")) and "<" not in body["message"]


def test_completion_value_errors(server):
    assert_error(post(server.url, "/v1/completions", json={"prompt": []}), 400, "invalid_request_error", "prompt")
    assert_error(
        post(server.url, "/v1/completions", json={"prompt": "x", "echo": True}), 400, "invalid_request_error", "echo"
    )
    assert_error(post(server.url, "/v1/completions", json={"prompt": ""}), 400, "invalid_request_error", "prompt")
    assert_error(
        post(server.url, "/v1/completions", json={"prompt": [1, 2, 99999]}),
        400,
        "invalid_request_error",
        "prompt_token_ids",
    )


def test_context_too_long(server):
    r = post(server.url, "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 100_000})
    assert_error(r, 400, "invalid_request_error", code="context_length_exceeded")
    r = post(server.url, "/v1/completions", json={"prompt": "x", "documents": ["y" * 5000]})
    assert_error(r, 400, "invalid_request_error", code="context_length_exceeded")
    r = post(server.url, "/v1/documents", json={"text": "z" * 5000})
    assert_error(r, 400, "invalid_request_error", code="context_length_exceeded")


def test_not_found(server):
    r = post(server.url, "/v1/chat/completions", json={"messages": MESSAGES, "documents": [{"id": "doc-nope"}]})
    assert_error(r, 404, "not_found_error", "documents[0].id", "document_not_found")
    assert_error(httpx.get(f"{server.url}/v1/documents/doc-nope"), 404, "not_found_error", "id")
    r = post(server.url, "/v1/chat/completions", json={"model": "gpt-4o", "messages": MESSAGES})
    assert_error(r, 404, "not_found_error", code="model_not_found")
    assert_error(httpx.get(f"{server.url}/v1/nothing-here"), 404, "not_found_error")
    assert_error(httpx.get(f"{server.url}/v1/chat/completions"), 405, "invalid_request_error")


def test_errors_leave_nothing_behind(server):
    """Rejected requests hold no pages and leave no request in the engine."""
    server.idle()
