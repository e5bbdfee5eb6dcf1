"""Every error as OpenAI's body, `{"error": {"message", "type", "param", "code"}}`, with the right status.

lazyattn's exceptions carry their own `status_code` and `error_type` (lazyattn/errors.py); schema errors from
FastAPI are 400s naming the field; anything unexpected is a 500 that says nothing about internals.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Match

from lazyattn.errors import (
    AuthenticationError,
    ContextTooLongError,
    LazyAttnError,
    QueueFullError,
    UnknownDocumentError,
)

logger = logging.getLogger("lazyattn.server")


class ModelNotFoundError(LazyAttnError):
    status_code = 404
    error_type = "not_found_error"


# OpenAI-style machine-readable codes for the errors clients commonly branch on.
_CODES: list[tuple[type[LazyAttnError], str]] = [
    (ContextTooLongError, "context_length_exceeded"),
    (UnknownDocumentError, "document_not_found"),
    (ModelNotFoundError, "model_not_found"),
    (AuthenticationError, "invalid_api_key"),
    (QueueFullError, "queue_full"),
]

_STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
}


def error_body(e: BaseException) -> dict[str, Any]:
    if isinstance(e, LazyAttnError):
        code = next((c for cls, c in _CODES if isinstance(e, cls)), None)
        return _body(str(e), e.error_type, getattr(e, "param", None), code)
    return _body("internal server error", "internal_error")


def _body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status_code: int, message: str) -> JSONResponse:
    """A client error answered outside the app's routes (body_limit.py), with the body its handlers give."""
    return JSONResponse(_body(message, _STATUS_TYPES.get(status_code, "invalid_request_error")), status_code)


def _param(loc: Sequence[Any]) -> str | None:
    """("body", "messages", 0, "content") -> "messages[0].content"; a tagged union's alternative ("<inline>",
    protocol.union_tag) is not a field and is left out."""
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)
    out = ""
    for p in parts:
        if isinstance(p, str) and p.startswith("<") and p.endswith(">"):
            continue
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or None


def _validation_message(errors: Sequence[dict[str, Any]]) -> tuple[str, str | None]:
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid").get("ctx", {}).get("error", "")
        return f"the request body is not valid JSON ({detail})".replace(" ()", ""), None
    shown = []
    for e in errors[:3]:  # a union (documents, prompt) reports one error per alternative; three are plenty
        where = _param(e.get("loc", ()))
        msg = e.get("msg", "invalid value")
        if e.get("type") == "extra_forbidden":
            msg = "unknown field (not part of this endpoint's schema)"
        shown.append(f"{where}: {msg}" if where else msg)
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    # The field all errors share: a union's alternatives add their type names to the path ("documents.0.str",
    # "documents.0.DocumentText.text"), the value at fault is where they meet ("documents[0]").
    locs = [tuple(e.get("loc", ())) for e in errors]
    common = locs[0] if locs else ()
    for loc in locs[1:]:
        n = 0
        while n < min(len(common), len(loc)) and common[n] == loc[n]:
            n += 1
        common = common[:n]
    return "; ".join(shown) + more, _param(common)


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at this path. Starlette's own 405 names only the first route whose path
    matches, and one path can have several routes (GET and DELETE /v1/documents/{id})."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods))


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(LazyAttnError)
    async def lazyattn_error(request: Request, e: LazyAttnError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(e, AuthenticationError) else None
        if isinstance(e, QueueFullError):
            headers = {"Retry-After": str(e.retry_after_s)}
        return JSONResponse(error_body(e), status_code=e.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        content_type = request.headers.get("content-type", "")
        if request.method == "POST" and content_type and "json" not in content_type:
            # FastAPI only parses JSON bodies sent as JSON; say so instead of "input should be an object".
            message = f"the request body must be JSON sent with 'Content-Type: application/json', not {content_type!r}"
            return JSONResponse(_body(message, "invalid_request_error"), status_code=400)
        message, param = _validation_message(e.errors())
        return JSONResponse(_body(message, "invalid_request_error", param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        type_ = _STATUS_TYPES.get(e.status_code, "invalid_request_error" if e.status_code < 500 else "internal_error")
        headers = e.headers
        if e.status_code == 405:
            headers = {**(headers or {}), "Allow": _allowed_methods(request)}
        return JSONResponse(_body(str(e.detail), type_), status_code=e.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(error_body(e), status_code=500)
