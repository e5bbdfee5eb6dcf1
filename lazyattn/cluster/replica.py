"""One engine replica: an `LLMEngine` driven by the server's own `EngineLoop`, as a Ray Serve deployment.

A replica takes requests already rendered, validated against the registry and keyed for routing by the
ingress (`cluster/ingress.py`): the `EngineJob` carries token-level prompts, the tenant's cache salt and the
`RouteKey` the router reads. It answers with a stream of `ReplicaUpdate`s: first an empty one once the engine
accepted the requests (or the engine's validation error, raised before anything streams, as a single engine
raises it), then the outputs as they come, each update with the replica's engine counters for /metrics.
Cancelling the stream (the client left) aborts the requests and frees their pages, as on a single engine.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from lazyattn.cluster.policy import RouteKey
from lazyattn.engine.choice import Choice
from lazyattn.engine.llm_engine import EngineStats
from lazyattn.engine.outputs import RequestOutput
from lazyattn.engine.prompt import RenderedPrompt
from lazyattn.engine.request_options import ENGINE_DEFAULTS, RequestOptions
from lazyattn.engine.sampling import SamplingParams


@dataclass
class EngineJob:
    job_id: str
    requests: list[tuple[str, RenderedPrompt, SamplingParams | None]] = field(default_factory=list)
    cache_salt: str | None = None
    # Seconds since the request arrived at the ingress, when it was sent: the replica dates the arrival on its
    # own clock (monotonic clocks of two hosts do not compare), so TTFT still counts the time in the ingress.
    queued_s: float = 0.0
    options: RequestOptions = ENGINE_DEFAULTS
    route: RouteKey = field(default_factory=RouteKey)
    pin: str | None = None  # a replica id: go there, whatever the policy says (deletion reaches every replica)
    choices: list[Choice | None] | None = None  # the choice each request joins (engine/choice.py)


@dataclass(frozen=True)
class ReplicaUpdate:
    replica: str
    outputs: list[RequestOutput]
    stats: EngineStats


@dataclass(frozen=True)
class EngineInfo:
    """What the ingress needs to render and validate requests like the engine would (cluster/ingress.py)."""

    model: str
    mode: str
    max_model_len: int
    vocab_size: int
    num_pages: int
    page_size: int
    relink_tokens: int
    random_weights: bool
    tokenizer_cache_tokens: int  # the ingress renders, so its tokenizer keeps the documents' ids
    relink_last_tokens: int = 0
    ape_prefix: bool = False  # the engine's default: registration encodes the documents' shared-prefix copies too


class EngineReplica:
    """The deployment class (`cluster/app.py` wraps it with `serve.deployment`)."""

    def __init__(self, engine_options: dict) -> None:
        from ray import serve

        from lazyattn.engine.config import EngineConfig
        from lazyattn.engine.llm_engine import LLMEngine
        from lazyattn.server.engine_loop import EngineLoop

        if engine_options.get("device") == "cpu":
            import torch

            torch.set_num_threads(1)  # replicas share the host's cores; intra-op threads only contend
        self.engine = LLMEngine(EngineConfig(**{**engine_options, "progress": False}))
        self.loop = EngineLoop(self.engine)
        self.loop.start()
        self.name = serve.get_replica_context().replica_id.unique_id

    def info(self) -> EngineInfo:
        e = self.engine
        return EngineInfo(
            model=e.config.model,
            mode=e.mode.name,
            max_model_len=e.max_model_len,
            vocab_size=e.model_config.vocab_size,
            num_pages=e.num_pages,
            page_size=e.config.page_size,
            relink_tokens=e.config.relink_tokens,
            relink_last_tokens=e.config.relink_last_tokens,
            random_weights=e.config.random_weights,
            tokenizer_cache_tokens=e.config.tokenizer_cache_tokens,
            ape_prefix=e.config.ape_prefix,
        )

    async def generate(self, job: EngineJob) -> AsyncIterator[ReplicaUpdate]:
        stream = await self.loop.submit(
            job.requests,
            cache_salt=job.cache_salt,
            arrival=time.monotonic() - job.queued_s,
            options=job.options,
            choices=job.choices,
        )
        try:
            yield ReplicaUpdate(self.name, [], self.loop.stats)
            async for outs in stream:
                yield ReplicaUpdate(self.name, outs, self.loop.stats)
        finally:
            stream.abort()  # no-op once finished; the ingress cancelled us otherwise

    async def drop_documents(self, job: EngineJob) -> ReplicaUpdate:
        await self.loop.drop_documents([list(s) for _, p, _ in job.requests for s in p.segments], job.cache_salt)
        return ReplicaUpdate(self.name, [], self.loop.stats)

    def record_routing_stats(self) -> dict:
        """Polled by Serve's controller; the router reads it as the replica's `routing_stats`."""
        return {"kv_tokens": self.engine.num_pages * self.engine.config.page_size}

    def __del__(self) -> None:
        # Serve calls this on a graceful shutdown: stop the engine thread (it fails what is still in flight).
        loop = getattr(self, "loop", None)
        if loop is not None:
            loop.stop()
