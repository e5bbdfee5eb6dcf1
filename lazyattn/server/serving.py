"""The generation endpoints: request in, engine requests submitted, a full response or an SSE stream out.

Everything that can be wrong with a request (schema, documents, rendering, ranges, context length, a full
queue) is raised before the first byte is sent, so it gets its HTTP status. A stream can then only end early
because the client left (its requests are aborted and their pages freed) or the engine failed (an error event,
then `[DONE]`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from lazyattn.engine.best_document import candidates, check_answer, pick_answers, with_confidence
from lazyattn.engine.client import EngineClient, OutputStream
from lazyattn.engine.outputs import RequestOutput
from lazyattn.errors import InvalidRequestError, LazyAttnError
from lazyattn.server.errors import ModelNotFoundError, error_body
from lazyattn.server.inputs import (
    Renderer,
    check_completion_options,
    request_options,
    requested_chat_logprobs,
    resolve_documents,
    sampling_params,
)
from lazyattn.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
)
from lazyattn.server.protocol_responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionResponse,
    Usage,
)
from lazyattn.server.registry import DocumentRegistry
from lazyattn.server.responses import StreamState, TokenText, chat_logprobs, completion_logprobs, usage
from lazyattn.server.tenancy import cache_scope

logger = logging.getLogger("lazyattn.server")

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# Sent for a client that left before its response: nobody reads it (nginx's "client closed request").
_CLIENT_GONE = 499


class OpenAIServing:
    def __init__(
        self,
        engine_loop: EngineClient,
        renderer: Renderer,
        registry: DocumentRegistry,
        model_name: str,
        max_request_sequences: int = 256,
        max_request_documents: int = 1024,
    ) -> None:
        self.engine_loop = engine_loop
        self.max_request_sequences = max_request_sequences
        self.max_request_documents = max_request_documents
        self.renderer = renderer
        self.registry = registry
        self.model_name = model_name
        self.token_text = TokenText(renderer.tokenizer)

    # -- /v1/chat/completions -------------------------------------------------------------------------------------

    async def chat(self, body: ChatCompletionRequest, request: Request, tenant: str) -> Response:
        arrival = time.monotonic()
        self._check_model(body.model)
        check_answer(body.answer, body.n, body.stream)
        choose = body.answer != "joint"
        self._check_documents(body.documents)
        self._check_sequences(1, body.n, _fan_out(body.documents, body.answer))
        logprobs = requested_chat_logprobs(body)
        scope = cache_scope(tenant, body.cache_salt)
        documents = await resolve_documents(body.documents, self.registry, scope)
        owners, sets, sources = candidates([documents], body.answer)
        prompts = await run_in_threadpool(lambda: [self.renderer.chat(body, docs) for docs in sets])
        requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        options = request_options(body)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        requests = []
        for i, prompt in enumerate(prompts):
            max_tokens = self.renderer.max_tokens(requested, prompt, body.n, "messages", options)
            params = sampling_params(body, max_tokens, logprobs)
            requests.append((f"{rid}-{i}", prompt, with_confidence(params)) if choose else (rid, prompt, params))
        stream = await self.engine_loop.submit(requests, cache_salt=scope, arrival=arrival, options=options)
        created = int(time.time())
        top = logprobs or 0
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            events = self._chat_events(stream, rid, created, body.n, top, include_usage)
            return _StreamResponse(events, stream)
        finals = await _collect(stream, request)
        if finals is None:
            return Response(status_code=_CLIENT_GONE)
        outs = [finals[r] for r, _, _ in requests]
        out = pick_answers(owners, outs, sources, [logprobs is not None])[0] if choose else outs[0]
        choices = [
            ChatChoice(
                index=c.index,
                message=AssistantMessage(content=c.text),
                finish_reason=c.finish_reason,
                logprobs=chat_logprobs(c, 0, top, self.token_text),
                answered_from=out.answered_from,
            )
            for c in out.outputs
        ]
        response = ChatCompletionResponse(
            id=rid, created=created, model=self.model_name, choices=choices, usage=usage(outs)
        )
        return _json(response, choose)

    async def _chat_events(
        self, stream: OutputStream, rid: str, created: int, n: int, top: int, include_usage: bool
    ) -> AsyncIterator[str]:
        def chunk(choices: list[ChatChunkChoice], usage_: Usage | None = None) -> str:
            c = ChatCompletionChunk(id=rid, created=created, model=self.model_name, choices=choices, usage=usage_)
            return c.model_dump_json(exclude=None if include_usage else {"usage"})

        # The role first, at once: the client sees the response start before the first token is computed.
        for i in range(n):
            yield chunk([ChatChunkChoice(index=i, delta={"role": "assistant", "content": ""})])
        state = StreamState(n, {rid: 0})
        async for outs in stream:
            for out in outs:
                for index, c, text, first in state.deltas(out):
                    delta = {"content": text} if text else {}
                    logprobs = chat_logprobs(c, first, top, self.token_text)
                    yield chunk(
                        [ChatChunkChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=c.finish_reason)]
                    )
        if include_usage:
            yield chunk([], usage(list(state.finals.values())))

    # -- /v1/completions ------------------------------------------------------------------------------------------

    async def completions(self, body: CompletionRequest, request: Request, tenant: str) -> Response:
        arrival = time.monotonic()
        self._check_model(body.model)
        check_answer(body.answer, body.n, body.stream)
        choose = body.answer != "joint"
        p = body.prompt
        num_prompts = len(p) if isinstance(p, list) and p and not isinstance(p[0], int) else 1
        self._check_sequences(num_prompts, body.n, _fan_out(body.documents, body.answer))
        self._check_documents(body.documents)
        check_completion_options(body)
        scope = cache_scope(tenant, body.cache_salt)
        documents = await resolve_documents(body.documents, self.registry, scope)
        _, sets, sources = candidates([documents], body.answer)  # every prompt of the batch has these candidates
        # per_set[j][i]: prompt i with the documents of candidate j; requests go prompt by prompt, each over them
        per_set = await run_in_threadpool(lambda: [self.renderer.completions(body, docs) for docs in sets])
        cid = f"cmpl-{uuid.uuid4().hex}"
        options = request_options(body)
        count = len(per_set[0])
        requests, owners = [], []
        for i in range(count):
            for j, prompts in enumerate(per_set):
                max_tokens = self.renderer.max_tokens(body.max_tokens, prompts[i], body.n, "prompt", options)
                params = sampling_params(body, max_tokens, body.logprobs)
                if choose:
                    requests.append((f"{cid}-{i}-{j}", prompts[i], with_confidence(params)))
                else:
                    requests.append((f"{cid}-{i}", prompts[i], params))
                owners.append(i)
        stream = await self.engine_loop.submit(requests, cache_salt=scope, arrival=arrival, options=options)
        created = int(time.time())
        prompt_index = {rid: i for rid, i in zip((r for r, _, _ in requests), owners)}
        top = body.logprobs or 0
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            events = self._completion_events(stream, cid, created, body.n, top, prompt_index, include_usage)
            return _StreamResponse(events, stream)
        finals = await _collect(stream, request)
        if finals is None:
            return Response(status_code=_CLIENT_GONE)
        outs = [finals[rid] for rid, _, _ in requests]
        answers = outs
        if choose:
            answers = pick_answers(owners, outs, sources * count, [body.logprobs is not None] * count)
        choices = []
        for i, out in enumerate(answers):
            for c in out.outputs:
                choices.append(
                    CompletionChoice(
                        index=i * body.n + c.index,
                        text=c.text,
                        finish_reason=c.finish_reason,
                        logprobs=completion_logprobs(c, 0, top, self.token_text, 0),
                        answered_from=out.answered_from,
                    )
                )
        response = CompletionResponse(
            id=cid, created=created, model=self.model_name, choices=choices, usage=usage(outs)
        )
        return _json(response, choose)

    async def _completion_events(
        self,
        stream: OutputStream,
        cid: str,
        created: int,
        n: int,
        top: int,
        prompt_index: dict[str, int],
        include_usage: bool,
    ) -> AsyncIterator[str]:
        def chunk(choices: list[CompletionChoice], usage_: Usage | None = None) -> str:
            c = CompletionResponse(id=cid, created=created, model=self.model_name, choices=choices, usage=usage_)
            return c.model_dump_json(exclude=_JOINT if include_usage else {**_JOINT, "usage": True})

        state = StreamState(n, prompt_index)
        async for outs in stream:
            for out in outs:
                for index, c, text, first in state.deltas(out):
                    logprobs = completion_logprobs(c, first, top, self.token_text, len(c.text) - len(text))
                    yield chunk(
                        [CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=c.finish_reason)]
                    )
        if include_usage:
            yield chunk([], usage(list(state.finals.values())))

    # -- helpers --------------------------------------------------------------------------------------------------

    def _check_sequences(self, prompts: int, n: int | None, fan_out: int = 1) -> None:
        """Bound what one request can queue: a batch of prompts x n is that many sequences, and an answer chosen
        among candidates asks each prompt `fan_out` times."""
        total = prompts * (n or 1) * fan_out
        if total > self.max_request_sequences:
            each = f" x {fan_out} candidate requests (answer)" if fan_out > 1 else ""
            raise InvalidRequestError(
                f"this request asks for {prompts} prompt(s) x n = {n}{each} = {total} sequences; "
                f"the limit is {self.max_request_sequences}",
                param="documents" if fan_out > 1 else "n",
            )

    def _check_documents(self, documents: list | None) -> None:
        """Bound the documents one request brings: each is resolved, rendered and tokenised before the context
        length can refuse them."""
        if documents is not None and len(documents) > self.max_request_documents:
            raise InvalidRequestError(
                f"this request has {len(documents)} documents; the limit is {self.max_request_documents}",
                param="documents",
            )

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise ModelNotFoundError(f"model {model!r} is not served here; this server serves {self.model_name!r}")


# A choice's answered_from belongs to the strategies that choose among candidates: left out of joint responses.
_JOINT = {"choices": {"__all__": {"answered_from"}}}


def _json(model, chosen: bool = False) -> Response:
    """The response; `chosen`: its answers were chosen among candidates, and their choices say from what."""
    return Response(model.model_dump_json(exclude=None if chosen else _JOINT), media_type="application/json")


def _fan_out(documents: list | None, answer: str) -> int:
    """How many requests `answer` makes of each prompt with these documents (best_document.candidates)."""
    return len(candidates([documents or []], answer)[0])


class _StreamResponse(StreamingResponse):
    """Aborts what is left of its requests however the response ends. When the client disconnects, Starlette
    cancels the response, possibly before the body generator ever started (then no `finally` inside it would
    run): the requests must stop and give back their pages rather than generate for nobody."""

    def __init__(self, events: AsyncIterator[str], stream: OutputStream) -> None:
        super().__init__(_frames(events), media_type="text/event-stream", headers=_SSE_HEADERS)
        self._stream = stream

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except asyncio.CancelledError:
            # The server is shutting down and its grace period (--shutdown-timeout) is over: this stream ends
            # here, cut off like a dropped connection, rather than as an "exception in ASGI application".
            return
        finally:
            self._stream.abort()  # no-op once everything finished


async def _frames(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """Server-sent events: one `data:` frame per chunk, an error frame if the engine failed, then [DONE]."""
    try:
        async for data in events:
            yield f"data: {data}\n\n"
    except LazyAttnError as e:
        yield f"data: {json.dumps(error_body(e))}\n\n"
    except Exception as e:
        logger.exception("stream failed")
        yield f"data: {json.dumps(error_body(e))}\n\n"
    yield "data: [DONE]\n\n"


async def _collect(stream: OutputStream, request: Request) -> dict[str, RequestOutput] | None:
    """The final output of each request, or None if the client disconnected first (then they are aborted)."""
    finals: dict[str, RequestOutput] = {}

    async def consume() -> None:
        async for outs in stream:
            for out in outs:
                if out.finished:
                    finals[out.request_id] = out

    consumer = asyncio.ensure_future(consume())
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if consumer in done:
            consumer.result()  # the engine's error, if it failed
            return finals
        return None
    finally:
        consumer.cancel()
        watcher.cancel()
        stream.abort()  # no-op once everything finished


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away. The body is read by now, so the next ASGI message is the disconnect."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
        await asyncio.sleep(0.05)  # another ASGI server might answer with empty body messages: do not spin
