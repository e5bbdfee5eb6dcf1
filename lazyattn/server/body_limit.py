"""The request body limit: a body over the limit is a 413 before any of it is parsed.

A Content-Length over the limit is answered at once, without reading the body; a body sent without one (chunked)
is counted as it arrives and refused as soon as it passes the limit. So a request never makes the server hold
more than the limit, whatever its JSON would have held (a 200 MB `user`, ten million one-letter documents).
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lazyattn.server.errors import error_response


class BodyLimit:
    """ASGI middleware: at most `max_bytes` of request body."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _message(self) -> str:
        return f"the request body is over the server's limit of {self.max_bytes} bytes (--max-body-mb)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await error_response(413, self._message())(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # An HTTPException passes through FastAPI's body reading as it is; the app's handler (errors.py)
                    # answers it with OpenAI's body.
                    raise HTTPException(413, self._message())
            return message

        await self.app(scope, counted, send)
