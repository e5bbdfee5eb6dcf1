"""The OpenAPI schema at /openapi.json says what the server does.

`test_schemathesis_finds_no_mismatch` runs schemathesis (every check, a fixed seed, a few examples per
operation) against a keyed server on the loopback; the other tests pin the schema facts it relies on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from lazyattn.engine.prompt import PromptLayout
from lazyattn.model.byte_tokenizer import ByteTokenizer
from lazyattn.server import ServerConfig

from .conftest import start_server, stop_server

ROOT = Path(__file__).resolve().parents[2]
KEY = "schema-key"


@pytest.fixture(scope="module")
def small_server():
    """Keyed, with a context and a KV pool small enough that no schema-valid request generates for long (an n of
    128 samples does not fit: a 400 with code context_length_exceeded, which schemathesis is told to expect),
    and a short layout so that requests with documents fit."""
    s = start_server(
        dict(page_size=16, kv_cache_gb=0.004, max_model_len=64),
        ServerConfig(
            model_name="tiny",
            api_keys=(KEY,),
            layout=PromptLayout(system_prompt="Documents:", question_format="{question}"),
        ),
    )
    yield s
    stop_server(s)


def test_schemathesis_finds_no_mismatch(small_server, tmp_path):
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{small_server.url}/openapi.json",
        "--checks",
        "all",
        "--exclude-checks",
        "positive_data_acceptance",  # replaced by the hook's version
        "-H",
        f"Authorization: Bearer {KEY}",
        "--seed",
        "0",
        "--max-examples",
        "5",
        "--workers",
        "1",
        "--request-timeout",
        "60",
        "--generation-database",
        "none",
        "--suppress-health-check",
        "all",
        "--no-color",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "SCHEMATHESIS_HOOKS": "tests.server.schemathesis_hooks",
    }
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "No issues found" in run.stdout, run.stdout[-3000:]


def schema(server) -> dict:
    return httpx.get(f"{server.url}/openapi.json", timeout=30).json()


def test_errors_are_documented_as_openai_bodies_and_400_not_422(small_server):
    s = schema(small_server)
    for path, operations in s["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert "422" not in responses, (method, path)
            if path.startswith("/v1/"):
                assert "401" in responses and operation["security"] == [{"bearerAuth": []}], (method, path)
            for status, response in responses.items():
                if status != "200" and path.startswith("/v1/"):
                    assert response["content"]["application/json"]["schema"] == {
                        "$ref": "#/components/schemas/ErrorResponse"
                    }
            assert all(p["name"].lower() != "authorization" for p in operation.get("parameters", []))
    for path in ("/v1/chat/completions", "/v1/completions"):
        assert {"400", "404", "413", "503"} <= set(s["paths"][path]["post"]["responses"])
    assert "413" in s["paths"]["/v1/documents"]["post"]["responses"]  # every body is bounded (--max-body-mb)
    assert s["components"]["securitySchemes"]["bearerAuth"] == {
        **s["components"]["securitySchemes"]["bearerAuth"],
        "type": "http",
        "scheme": "bearer",
    }
    assert "HTTPValidationError" not in s["components"]["schemas"]


def test_model_dependent_limits_and_content_types(small_server, server):
    s = schema(small_server)
    request = s["components"]["schemas"]["CompletionRequest"]["properties"]
    assert request["top_k"]["maximum"] == ByteTokenizer.VOCAB_SIZE
    token_ids = request["prompt"]["anyOf"][2]
    assert token_ids["items"]["maximum"] == ByteTokenizer.VOCAB_SIZE - 1
    assert "x-lazyattn-maximum" not in str(s)
    assert list(s["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    chat_200 = s["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert set(chat_200) == {"application/json", "text/event-stream"}
    assert "ChatCompletionChunk" in s["components"]["schemas"]
    # Without keys there is nothing to authenticate: no security scheme.
    open_schema = schema(server)
    assert "securitySchemes" not in open_schema["components"]
    assert all("security" not in op for ops in open_schema["paths"].values() for op in ops.values())


def test_405_names_every_method_of_the_path(server):
    for method in ("PUT", "PATCH", "OPTIONS"):
        r = httpx.request(method, f"{server.url}/v1/documents/doc-x", timeout=30)
        assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
        assert {m.strip() for m in r.headers["allow"].split(",")} == {"GET", "DELETE"}
    r = httpx.get(f"{server.url}/v1/chat/completions", timeout=30)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
