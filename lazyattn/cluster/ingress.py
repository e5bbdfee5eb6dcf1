"""The ingress: today's server (`server/app.py`: auth, tenants, the document registry, rendering, validation,
errors, streaming, metrics) with a `RemoteEngineLoop` in place of the engine thread.

The registry lives here, in the one ingress, so an id registered through it is valid whichever replica serves
the request: requests leave the ingress with their documents resolved to token ids, already rendered. The
tenant scope travels as the engine's cache salt, and the router's document keys hash it too
(`cluster/keys.py`), so a tenant's documents are never another tenant's hits on any replica. Registering a
document pre-encodes it on the replica the router picks for it (its home, with nothing cached yet); deleting
it drops its KV on every replica.

A replica that dies with requests in flight: a request that had sent nothing to its client yet is sent once
more (the router no longer offers the dead replica), otherwise it fails with a 503 (`ReplicaFailedError`),
as an error event on a stream. The other replicas serve on.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from ray.exceptions import RayActorError, RayTaskError
from ray.serve.exceptions import RequestCancelledError

from lazyattn.cluster.keys import route_key
from lazyattn.cluster.replica import EngineInfo, EngineJob, ReplicaUpdate
from lazyattn.cluster.routing_log import ROUTING_LOG
from lazyattn.engine.choice import Choice
from lazyattn.engine.client import EngineRequest, OutputObserver
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.limits import RequestLimits
from lazyattn.engine.llm_engine import EngineStats, engine_tokenizer
from lazyattn.engine.modes import Mode, make_mode
from lazyattn.engine.outputs import RequestOutput
from lazyattn.engine.prompt import RenderedPrompt
from lazyattn.engine.request_options import ENGINE_DEFAULTS, OFF, RequestOptions
from lazyattn.errors import LazyAttnError
from lazyattn.model.tokenizer_base import TokenizerBase

REPLICA_HEADER = "x-lazyattn-replica"
REASON_HEADER = "x-lazyattn-route-reason"


class ReplicaFailedError(LazyAttnError):
    """The replica serving the request died after it had started answering; retry the request."""

    status_code = 503
    error_type = "replica_failed"


# Set per HTTP request by `RouteHeaders`; `RemoteEngineLoop.submit` fills it in.
_ROUTE: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("lazyattn_route", default=None)


class RouteHeaders:
    """ASGI middleware: adds where the request's engine work went, and why, to its response headers."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route: dict[str, str] = {}
        _ROUTE.set(route)

        async def send_with_route(message: dict) -> None:
            if message["type"] == "http.response.start" and route:
                headers = list(message.get("headers", []))
                headers += [(k.encode(), v.encode("latin-1", "replace")) for k, v in route.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_route)


def _unwrap(e: BaseException) -> BaseException:
    """The error a replica raised, as a single engine would raise it (Ray wraps it with the remote traceback)."""
    if isinstance(e, RayTaskError) and isinstance(e.cause, LazyAttnError):
        return e.cause
    return e


def _sum_stats(stats: list[EngineStats]) -> EngineStats:
    """Counters and gauges summed field by field (nested dataclasses too; a part only some replicas have, such
    as a host tier, over those that have it); sizes (`page_bytes`) are each replica's, not summed."""

    def add(items: list) -> Any:
        items = [i for i in items if i is not None]
        if not items:
            return None
        values = {}
        for f in dataclasses.fields(items[0]):
            parts = [getattr(i, f.name) for i in items]
            if f.name == "page_bytes":
                values[f.name] = parts[0]
            elif any(dataclasses.is_dataclass(p) for p in parts) or all(p is None for p in parts):
                values[f.name] = add(parts)
            else:
                values[f.name] = sum(parts)
        return type(items[0])(**values)

    return add(stats)


class RemoteStream:
    """An `OutputStream` (engine/client.py) over a replica's update stream."""

    def __init__(
        self, owner: RemoteEngineLoop, job: EngineJob, updates: Any, arrival: float, route: dict[str, str] | None = None
    ) -> None:
        self._owner = owner
        self._route = route  # the response's route headers, while they are not sent yet
        self._job = job
        self._updates = updates
        self._arrival = arrival
        self.request_ids = [rid for rid, _, _ in job.requests]
        self.pending = set(self.request_ids)
        self._delivered = False

    async def __aiter__(self) -> AsyncIterator[list[RequestOutput]]:
        retried = False
        while self.pending:
            try:
                update: ReplicaUpdate = await self._updates.__anext__()
            except StopAsyncIteration:
                return
            except (RayActorError, RequestCancelledError) as e:
                if isinstance(e, RequestCancelledError) or self._delivered or retried:
                    self.pending.clear()
                    raise ReplicaFailedError("the replica serving this request failed; retry the request") from e
                retried = True  # nothing reached the client: the same request, to another replica
                self._updates, first = await self._owner._send(self._job, self._arrival)
                if self._route is not None:
                    failed = self._route.get(REPLICA_HEADER, "?")
                    self._route[REPLICA_HEADER] = first.replica
                    self._route[REASON_HEADER] = f"sent again: replica {failed} failed before answering"
                continue
            except RayTaskError as e:
                self.pending.clear()
                raise _unwrap(e) from None
            self._owner._observe(update)
            for out in update.outputs:
                if out.finished:
                    self.pending.discard(out.request_id)
            if update.outputs:
                self._delivered = True
                yield update.outputs

    def abort(self) -> None:
        if self.pending:
            self.pending.clear()
            self._updates.cancel()  # the replica's generator ends, and aborts its engine requests


class RemoteEngineLoop:
    """An `EngineClient` (engine/client.py) over the engine deployment: what the server calls, as the in-process
    `EngineLoop` (server/engine_loop.py) offers it. What it serves comes from a replica's `EngineInfo` (replicas are
    alike), and the tokenizer is loaded here: the ingress renders requests."""

    def __init__(self, handle: Any, info: EngineInfo, route_page_tokens: int = 0) -> None:
        self.handle = handle.options(stream=True)
        self.unary = handle
        self.info = info
        config = EngineConfig(
            model=info.model, random_weights=info.random_weights, tokenizer_cache_tokens=info.tokenizer_cache_tokens
        )
        self._tokenizer = engine_tokenizer(config)
        self._mode = make_mode(info.mode)
        # Of a request's options only relink rows take pages: the engine's default is all `max_new_tokens` needs.
        defaults = dataclasses.replace(
            OFF, relink_tokens=info.relink_tokens, relink_last_tokens=info.relink_last_tokens
        )
        self._limits = RequestLimits(self._mode, info.page_size, info.max_model_len, info.vocab_size, defaults)
        self.observer: OutputObserver | None = None
        self.route_page_tokens = route_page_tokens  # > 0: compute prefix keys (the prefix-affinity policy)
        self._stats: dict[str, EngineStats] = {}
        self._running = False

    # -- what it serves ------------------------------------------------------------------------------------

    @property
    def tokenizer(self) -> TokenizerBase:
        return self._tokenizer

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def max_model_len(self) -> int:
        return self.info.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size

    @property
    def ape_prefix(self) -> bool:
        return self.info.ape_prefix

    def max_new_tokens(self, prompt: RenderedPrompt, n: int = 1, options: RequestOptions = ENGINE_DEFAULTS) -> int:
        return self._limits.max_new_tokens(prompt, n, options, self.info.num_pages)

    # -- lifetime ------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._running = True

    def stop(self, timeout: float = 30.0) -> None:
        self._running = False

    @property
    def alive(self) -> bool:
        return self._running

    def stalled_for(self) -> float:
        return 0.0  # each replica's health is Serve's (its health checks restart a stuck one)

    @property
    def stats(self) -> EngineStats:
        """Counters summed over the replicas, as of their latest updates; the tokenizer cache is this process's
        (the replicas get token ids)."""
        summed = _sum_stats(list(self._stats.values())) if self._stats else _empty_stats()
        cache = self._tokenizer.cache
        return dataclasses.replace(summed, tokenizer_cache=cache.stats() if cache is not None else None)

    # -- requests ------------------------------------------------------------------------------------------

    async def submit(
        self,
        requests: list[EngineRequest],
        *,
        cache_salt: str | None,
        arrival: float,
        options: RequestOptions = ENGINE_DEFAULTS,
        choices: list[Choice | None] | None = None,
    ) -> RemoteStream:
        prompt = requests[0][1]  # a request's prompts share their documents (server/inputs.py)
        job = EngineJob(
            job_id=uuid.uuid4().hex,
            requests=requests,
            cache_salt=cache_salt,
            options=options,
            choices=choices,
            route=route_key(prompt, cache_salt, self.route_page_tokens),
        )
        updates, first = await self._send(job, arrival)
        route = _ROUTE.get()
        if route is not None:
            decision = ROUTING_LOG.pop(job.job_id)
            route[REPLICA_HEADER] = first.replica
            if decision is not None:
                route[REASON_HEADER] = (
                    decision.reason
                    if decision.replica == first.replica
                    else f"{decision.replica} did not accept; next in ranking ({decision.reason})"
                )
        return RemoteStream(self, job, updates, arrival, route)

    async def _send(self, job: EngineJob, arrival: float) -> tuple[Any, ReplicaUpdate]:
        """Send a job; returns its update stream once a replica accepted it (or raises the engine's error)."""
        job = dataclasses.replace(job, queued_s=time.monotonic() - arrival)
        for attempt in range(2):
            updates = self.handle.generate.remote(job)
            try:
                first: ReplicaUpdate = await updates.__anext__()
            except asyncio.CancelledError:
                updates.cancel()  # the client left while the replica was accepting: stop it generating for nobody
                raise
            except RayTaskError as e:
                raise _unwrap(e) from None
            except RayActorError:
                if attempt:
                    raise ReplicaFailedError("no replica could take the request; retry later") from None
                continue  # died between routing and accepting: route again
            self._observe(first)
            return updates, first
        raise AssertionError("unreachable")

    async def drop_documents(self, segments: list[list[int]], cache_salt: str | None) -> None:
        """On every replica: a deleted document must not stay readable (by timing) anywhere."""
        prompt = RenderedPrompt([list(s) for s in segments], [])
        for replica in ROUTING_LOG.replicas:
            job = EngineJob(
                job_id=uuid.uuid4().hex, requests=[("drop", prompt, None)], cache_salt=cache_salt, pin=replica
            )
            with contextlib.suppress(RayActorError):  # a dead replica's cache died with it
                self._observe(await self.unary.drop_documents.remote(job))

    def _observe(self, update: ReplicaUpdate) -> None:
        self._stats[update.replica] = update.stats
        if self.observer is not None:
            now = time.monotonic()
            for out in update.outputs:
                self.observer.on_output(out, now)


def _empty_stats() -> EngineStats:
    from lazyattn.cache.document_cache import CacheStats

    return EngineStats(
        cache=CacheStats(0, 0, 0, 0, 0, 0, 0),
        num_pages=0,
        pages_used=0,
        pages_high_water=0,
        page_bytes=0,
        prefilled_tokens=0,
        decoded_tokens=0,
        preemptions=0,
        running=0,
        waiting=0,
    )
