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
from collections.abc import AsyncIterator, Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from lazyattn.engine.best_document import (
    BOTH_PLACEMENTS,
    CHOOSING,
    ORDERING,
    FirstRound,
    answer_for,
    candidates,
    check_answer,
    choices,
    confidence_tokens_for,
    ordered_answers,
    pick_answers,
    placement_groups,
    with_confidence,
)
from lazyattn.engine.choice import Choice
from lazyattn.engine.client import EngineClient, OutputStream
from lazyattn.engine.outputs import RequestOutput
from lazyattn.engine.prompt import RenderedPrompt
from lazyattn.engine.request_options import RequestOptions
from lazyattn.engine.sampling import SamplingParams
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
from lazyattn.server.metrics import ServerMetrics
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
        answer: str = "joint",
        metrics: ServerMetrics | None = None,
        confidence_tokens: int | None = None,
    ) -> None:
        self.engine_loop = engine_loop
        self.metrics = metrics  # counts the answers the strategies keep (on_answers)
        self.answer = answer  # the strategy of a request that names none, where it can answer it (answer_for)
        self.confidence_tokens = confidence_tokens  # the k of a request that gives none (confidence_tokens_for)
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
        answer, confidence_tokens = self._asked(body)
        self._check_documents(body.documents)
        self._check_sequences(1, body.n, _fan_out(body.documents, answer))
        logprobs = requested_chat_logprobs(body)
        scope = cache_scope(tenant, body.cache_salt)
        documents = await resolve_documents(body.documents, self.registry, scope)
        requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        options = request_options(body)
        rid = f"chatcmpl-{uuid.uuid4().hex}"

        def render(_: int, which: list[int]) -> RenderedPrompt:
            return self.renderer.chat(body, [documents[k] for k in which])

        def params(prompt: RenderedPrompt) -> SamplingParams:
            max_tokens = self.renderer.max_tokens(requested, prompt, body.n, "messages", options)
            return sampling_params(body, max_tokens, logprobs)

        created = int(time.time())
        top = logprobs or 0
        if answer == "joint":
            prompt = await run_in_threadpool(render, 0, list(range(len(documents))))
            stream = await self.engine_loop.submit(
                [(rid, prompt, params(prompt))], cache_salt=scope, arrival=arrival, options=options
            )
            if body.stream:
                include_usage = body.stream_options is not None and body.stream_options.include_usage
                events = self._chat_events(stream, rid, created, body.n, top, include_usage)
                return _StreamResponse(events, stream)
            finals = await _collect(stream, request)
            if finals is None:
                return Response(status_code=_CLIENT_GONE)
            outs = asked = [finals[rid]]
        else:
            answered = await self._answer(
                request,
                rid,
                render,
                params,
                count=1,
                num_documents=len(documents),
                answer=answer,
                confidence_tokens=confidence_tokens,
                keep_logprobs=logprobs is not None,
                scope=scope,
                arrival=arrival,
                options=options,
            )
            if answered is None:
                return Response(status_code=_CLIENT_GONE)
            outs, asked = answered
        out = outs[0]
        choices = [
            ChatChoice(
                index=c.index,
                message=AssistantMessage(content=c.text),
                finish_reason=c.finish_reason,
                logprobs=chat_logprobs(c, 0, top, self.token_text),
                answered_from=out.answered_from,
                document_order=out.document_order,
                read_in_parallel=out.read_in_parallel,
            )
            for c in out.outputs
        ]
        response = ChatCompletionResponse(
            id=rid,
            created=created,
            model=self.model_name,
            choices=choices,
            usage=usage(asked),
        )
        return _json(response, answer)

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
        answer, confidence_tokens = self._asked(body)
        p = body.prompt
        num_prompts = len(p) if isinstance(p, list) and p and not isinstance(p[0], int) else 1
        self._check_sequences(num_prompts, body.n, _fan_out(body.documents, answer))
        self._check_documents(body.documents)
        check_completion_options(body)
        scope = cache_scope(tenant, body.cache_salt)
        documents = await resolve_documents(body.documents, self.registry, scope)
        cid = f"cmpl-{uuid.uuid4().hex}"
        options = request_options(body)
        # The renderer renders every prompt of the batch over one list of documents: once per list asked for.
        rendered: dict[tuple[int, ...], list[RenderedPrompt]] = {}

        def render(i: int, which: list[int]) -> RenderedPrompt:
            key = tuple(which)
            if key not in rendered:
                rendered[key] = self.renderer.completions(body, [documents[k] for k in which])
            return rendered[key][i]

        def params(prompt: RenderedPrompt) -> SamplingParams:
            max_tokens = self.renderer.max_tokens(body.max_tokens, prompt, body.n, "prompt", options)
            return sampling_params(body, max_tokens, body.logprobs)

        created = int(time.time())
        top = body.logprobs or 0
        if answer == "joint":
            prompts = await run_in_threadpool(lambda: self.renderer.completions(body, documents))
            requests = [(f"{cid}-{i}", prompt, params(prompt)) for i, prompt in enumerate(prompts)]
            stream = await self.engine_loop.submit(requests, cache_salt=scope, arrival=arrival, options=options)
            if body.stream:
                include_usage = body.stream_options is not None and body.stream_options.include_usage
                prompt_index = {rid: i for i, (rid, _, _) in enumerate(requests)}
                events = self._completion_events(stream, cid, created, body.n, top, prompt_index, include_usage)
                return _StreamResponse(events, stream)
            finals = await _collect(stream, request)
            if finals is None:
                return Response(status_code=_CLIENT_GONE)
            answers = asked = [finals[rid] for rid, _, _ in requests]
        else:
            answered = await self._answer(
                request,
                cid,
                render,
                params,
                count=num_prompts,
                num_documents=len(documents),
                answer=answer,
                confidence_tokens=confidence_tokens,
                keep_logprobs=body.logprobs is not None,
                scope=scope,
                arrival=arrival,
                options=options,
            )
            if answered is None:
                return Response(status_code=_CLIENT_GONE)
            answers, asked = answered
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
                        document_order=out.document_order,
                        read_in_parallel=out.read_in_parallel,
                    )
                )
        response = CompletionResponse(
            id=cid, created=created, model=self.model_name, choices=choices, usage=usage(asked)
        )
        return _json(response, answer)

    async def _answer(
        self,
        request: Request,
        rid: str,
        render: Callable[[int, list[int]], RenderedPrompt],
        params: Callable[[RenderedPrompt], SamplingParams],
        count: int,
        num_documents: int,
        answer: str,
        confidence_tokens: int | None,
        keep_logprobs: bool,
        scope: str | None,
        arrival: float,
        options: RequestOptions,
    ) -> tuple[list[RequestOutput], list[RequestOutput]] | None:
        """The answers of `count` prompts over `num_documents` documents asked as `answer` (not "joint") says
        (engine/best_document.py), and every request made for them (usage counts them all); None if the client left.
        `render(i, which)`: prompt i over those of the documents; `params(prompt)`: its sampling parameters (which
        check its length). The candidate requests run, then each prompt's are folded back into its most confident
        one, or (the confidence-order strategies) into the order of its documents for one more, joint, request."""
        every = list(range(num_documents))
        owners, sets, sources = candidates([every] * count, answer)
        if answer in ORDERING and None not in sources:
            # The joint round's prompts are the prompts as given, reordered; where the first round does not ask them
            # (and check their length), a prompt too long fails here, before any request runs.
            await run_in_threadpool(lambda: [params(render(i, every)) for i in range(count)])
        prompts = await run_in_threadpool(lambda: [render(o, which) for o, which in zip(owners, sets)])
        asked = [with_confidence(params(p), src, confidence_tokens, answer) for p, src in zip(prompts, sources)]
        groups = placement_groups(options, answer, sources)
        keep = [keep_logprobs] * count
        chosen = choices(owners, f"{rid}-choice-", answer, confidence_tokens)

        async def run(prefix: str, which: list[int], options: RequestOptions = options) -> list[RequestOutput] | None:
            picked = [prompts[i] for i in which]
            return await self._run_all(
                request, prefix, picked, [asked[i] for i in which], scope, arrival, options, [chosen[i] for i in which]
            )

        if answer not in ORDERING:
            # one group of requests per options they ask with (both-placements: in order, and in parallel)
            prefixes = [f"{rid}-"] if len(groups) == 1 else [f"{rid}-{g}-" for g in range(len(groups))]
            started = [asyncio.ensure_future(run(prefix, which, o)) for prefix, (o, which) in zip(prefixes, groups)]
            try:
                made = await asyncio.gather(*started)
            except BaseException:  # as for the ordering strategies' groups below
                for task in started:
                    task.cancel()
                raise
            if any(group is None for group in made):
                return None
            outs: list[RequestOutput] = [None] * len(prompts)  # type: ignore[list-item]
            for (_, which), group in zip(groups, made):
                for i, out in zip(which, group):
                    outs[i] = out
            return self._counted(answer, pick_answers(owners, outs, sources, keep, confidence_tokens)), outs
        # The requests as given answer as one group; each prompt's one-document requests as another, and its joint
        # request follows as soon as they are in, beside the requests as given.
        rounds = FirstRound(owners, sources, count)
        joint: dict[int, RequestOutput] = {}

        async def group(prefix: str, which: list[int]) -> list[RequestOutput] | None:
            """A group's requests, then, once they complete a prompt's first round, its joint request."""
            outs = await run(prefix, which)
            ready = [] if outs is None else [rounds.record(i, out) for i, out in zip(which, outs)]
            r = next((r for r in ready if r is not None), None)
            if outs is None or r is None:
                return outs
            reordered = await run_in_threadpool(render, r, rounds.orders[r])
            finals = await self._run_all(
                request, f"{rid}-joint-{r}-", [reordered], [with_confidence(params(reordered))], scope, arrival, options
            )
            if finals is None:
                return None
            joint[r] = finals[0]
            return outs + finals

        groups = [[i for i, src in enumerate(sources) if src is None]]
        groups += [
            [i for i, (o, src) in enumerate(zip(owners, sources)) if o == r and src is not None] for r in range(count)
        ]
        started = [asyncio.ensure_future(group(f"{rid}-{g}-", which)) for g, which in enumerate(groups) if which]
        try:
            made = await asyncio.gather(*started)
        except BaseException:  # one group failed (the engine's error): the others are cancelled, their requests aborted
            for task in started:
                task.cancel()
            raise
        if any(outs is None for outs in made):
            return None
        orders = rounds.orders  # a prompt whose candidate failed after its joint round began answers that failure
        answers = ordered_answers(rounds.firsts, orders, {r: o for r, o in joint.items() if orders[r]}, keep)
        return self._counted(answer, answers), [out for outs in made for out in outs]

    def _counted(self, answer: str, answers: list[RequestOutput]) -> list[RequestOutput]:
        """`answers`, counted in the metrics by `answer` and what each read."""
        if self.metrics is not None:
            self.metrics.on_answers(answer, answers)
        return answers

    async def _run_all(
        self,
        request: Request,
        prefix: str,
        prompts: list[RenderedPrompt],
        params: list[SamplingParams],
        scope: str | None,
        arrival: float,
        options: RequestOptions,
        chosen: list[Choice | None] | None = None,
    ) -> list[RequestOutput] | None:
        """The final outputs of these requests, in order (ids `prefix` and a count); None if the client left.
        `chosen[i]`: the choice request i joins (engine/choice.py)."""
        requests = [(f"{prefix}{k}", prompt, p) for k, (prompt, p) in enumerate(zip(prompts, params))]
        if not requests:
            return []
        stream = await self.engine_loop.submit(
            requests, cache_salt=scope, arrival=arrival, options=options, choices=chosen
        )
        finals = await _collect(stream, request)
        return None if finals is None else [finals[rid] for rid, _, _ in requests]

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
            hidden = _hidden("joint")
            return c.model_dump_json(exclude=hidden if include_usage else {**hidden, "usage": True})

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

    def _asked(self, body: ChatCompletionRequest | CompletionRequest) -> tuple[str, int | None]:
        """The answer strategy of the request (its own, or the server's default where that can answer it), checked
        against the request's n, stream and confidence_tokens, and the confidence_tokens it is answered with (its
        own, or the server's default where the strategy asks candidates)."""
        answer = answer_for(body.answer, self.answer, body.n, body.stream, body.ape_parallel)
        check_answer(answer, body.n, body.stream, body.confidence_tokens)
        return answer, confidence_tokens_for(body.confidence_tokens, self.confidence_tokens, answer)

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise ModelNotFoundError(f"model {model!r} is not served here; this server serves {self.model_name!r}")


def _hidden(answer: str) -> dict:
    """What a response's choices leave out: answered_from belongs to the strategies that answer from one document,
    document_order to those that reorder them (the confidence-order ones, each-last and both-orders),
    read_in_parallel to both-placements."""
    shown = (
        set()
        if answer == "joint"
        else {"answered_from"}
        if answer in CHOOSING
        else {"read_in_parallel"}
        if answer == BOTH_PLACEMENTS
        else {"document_order"}
    )
    return {"choices": {"__all__": {"answered_from", "document_order", "read_in_parallel"} - shown}}


def _json(model, answer: str = "joint") -> Response:
    """The response to a request answered as `answer` says, its choices with the fields of that strategy."""
    return Response(model.model_dump_json(exclude=_hidden(answer)), media_type="application/json")


def _fan_out(documents: list | None, answer: str) -> int:
    """How many requests `answer` makes of each prompt with these documents (best_document.candidates, and the
    joint round of the confidence-order ones)."""
    docs = documents or []
    return len(candidates([docs], answer)[0]) + (answer in ORDERING and len(docs) > 1)


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
