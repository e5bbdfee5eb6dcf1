"""The schema served at /openapi.json, made to say what the server does.

FastAPI's generated schema is close but not true here: it documents 422 for schema errors (this server answers
400 with OpenAI's error body, `errors.py`), it lists the Authorization header as a plain optional parameter
instead of a bearer security scheme, and it cannot know the model's vocabulary, which bounds `top_k` and token
ids. The routes declare their own responses (`protocol_responses.error_responses`); this module fixes the rest once,
when the schema is first asked for. `tests/server/test_openapi.py` holds the server to it with schemathesis.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from lazyattn.server.protocol import LIMIT

BEARER = "bearerAuth"


def install_openapi(app: FastAPI, *, vocab_size: int, keyed: bool) -> None:
    """`keyed`: the server requires an API key on /v1 routes (then the schema declares bearer security)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            app.openapi_schema = make_true(schema, vocab_size=vocab_size, keyed=keyed)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def make_true(schema: dict[str, Any], *, vocab_size: int, keyed: bool) -> dict[str, Any]:
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
            # The key travels in Authorization, declared below as a security scheme, not as a parameter.
            params = [
                p
                for p in operation.get("parameters", [])
                if not (p.get("in") == "header" and p.get("name", "").lower() == "authorization")
            ]
            if params:
                operation["parameters"] = params
            else:
                operation.pop("parameters", None)
            if keyed and path.startswith("/v1/"):
                operation["security"] = [{BEARER: []}]
    components = schema.setdefault("components", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.get("schemas", {}).pop(unused, None)
    if keyed:
        components["securitySchemes"] = {
            BEARER: {
                "type": "http",
                "scheme": "bearer",
                "description": "One of the server's API keys (`--api-key`); /health and /metrics need none.",
            }
        }
    _hoist_defs(schema, components.setdefault("schemas", {}))
    maxima = {"vocab_size": vocab_size, "token_id": vocab_size - 1}
    _fill_limits(schema, maxima)
    return schema


def _hoist_defs(node: Any, schemas: dict[str, Any]) -> None:
    """Move the `$defs` of schemas written inline (the stream chunks') into components, where their refs
    point."""
    if isinstance(node, dict):
        for name, definition in node.pop("$defs", {}).items():
            schemas.setdefault(name, definition)
        for value in node.values():
            _hoist_defs(value, schemas)
    elif isinstance(node, list):
        for value in node:
            _hoist_defs(value, schemas)


def _fill_limits(node: Any, maxima: dict[str, int]) -> None:
    if isinstance(node, dict):
        if LIMIT in node:
            node["maximum"] = maxima[node.pop(LIMIT)]
        for value in node.values():
            _fill_limits(value, maxima)
    elif isinstance(node, list):
        for value in node:
            _fill_limits(value, maxima)
