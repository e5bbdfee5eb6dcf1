"""The FastAPI application: routes, authentication, and the engine thread's lifetime.

    POST /v1/chat/completions, POST /v1/completions       OpenAI's, plus `documents` and `cache_salt`
    POST /v1/documents, GET /v1/documents[/{id}], DELETE /v1/documents/{id}
    GET  /v1/models, GET /health, GET /metrics

/v1 routes need a key when keys are configured; /health and /metrics do not (probes and scrapers), and
/metrics shows only totals over all tenants.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import Depends, FastAPI, Header, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, PlainTextResponse, Response

from lazyattn.engine.best_document import check_default_answer, check_default_confidence_tokens
from lazyattn.engine.client import EngineClient
from lazyattn.engine.llm_engine import LLMEngine
from lazyattn.engine.prompt import DEFAULT_LAYOUT, PromptLayout
from lazyattn.errors import RegistryError
from lazyattn.server.body_limit import BodyLimit
from lazyattn.server.documents import DocumentService
from lazyattn.server.engine_loop import EngineLoop
from lazyattn.server.errors import install_error_handlers
from lazyattn.server.inputs import Renderer
from lazyattn.server.metrics import ServerMetrics
from lazyattn.server.openapi import install_openapi
from lazyattn.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DocumentCreateRequest,
)
from lazyattn.server.protocol_responses import (
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionResponse,
    DocumentContent,
    DocumentDeleted,
    DocumentList,
    DocumentObject,
    HealthStatus,
    ModelCard,
    ModelList,
    error_responses,
    generation_responses,
)
from lazyattn.server.registry import MEMORY, DocumentRegistry, RegisteredDocument
from lazyattn.server.serving import OpenAIServing
from lazyattn.server.tenancy import Authenticator, cache_scope

# /health fails once the engine thread has had work but finished no turn for this long: one step of an 8B model
# at a full 8192-token budget takes well under a second on an H100, so this is a hang, not a slow step.
HEALTH_STALL_S = 30.0


@dataclass(frozen=True)
class ServerConfig:
    model_name: str
    api_keys: tuple[str, ...] = ()  # several: each key is a tenant with its own cache salt
    layout: PromptLayout = DEFAULT_LAYOUT
    max_documents: int | None = None  # registry capacity (all tenants); None: unbounded
    # Where registered documents are kept (server/registry.py): "memory" (lost at exit), sqlite:///PATH or
    # postgresql://... `lazyattn serve` defaults to a SQLite file in the state directory.
    registry_url: str = MEMORY
    max_request_sequences: int = 256  # prompts x n of one request
    max_request_documents: int = 1024  # `documents` entries of one request
    # Request bodies over this are a 413 before they are parsed (body_limit.py).
    max_body_bytes: int = 32 * 2**20
    # The answer strategy of a request that names none, where it can answer it (engine/best_document.answer_for).
    answer: str = "joint"
    # The confidence_tokens of a request that gives none, where its strategy asks candidates (confidence_tokens_for).
    confidence_tokens: int | None = None


def _registered(registry: DocumentRegistry) -> float:
    try:
        return registry.count()
    except RegistryError:  # the database is down: /metrics still answers, the gauge says it does not know
        return float("nan")


def create_app(engine: LLMEngine | EngineClient, config: ServerConfig) -> FastAPI:
    """Serve `engine`: an engine of this process, driven by a thread of its own (server/engine_loop.py), or any
    `EngineClient` (engine/client.py), e.g. the loop over Ray Serve replicas (cluster/ingress.py). The app calls
    nothing but the client's protocol."""
    engine_loop: EngineClient = EngineLoop(engine) if isinstance(engine, LLMEngine) else engine
    check_default_answer(config.answer, engine_loop.mode.name)
    check_default_confidence_tokens(config.confidence_tokens)
    registry = DocumentRegistry(config.registry_url, config.max_documents)
    metrics = ServerMetrics(config.model_name, lambda: engine_loop.stats, lambda: _registered(registry))
    engine_loop.observer = metrics
    renderer = Renderer(
        engine_loop.tokenizer,
        config.layout,
        engine_loop.max_model_len,
        engine_loop.vocab_size,
        engine_loop.max_new_tokens,
    )
    serving = OpenAIServing(
        engine_loop,
        renderer,
        registry,
        config.model_name,
        config.max_request_sequences,
        config.max_request_documents,
        config.answer,
        metrics,
        config.confidence_tokens,
    )
    documents = DocumentService(registry, engine_loop, config.layout)
    auth = Authenticator(config.api_keys)
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine_loop.start()
        try:
            yield
        finally:
            await run_in_threadpool(engine_loop.stop)
            registry.close()

    app = FastAPI(title="lazyattn", version="0.1.0", lifespan=lifespan)
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    install_openapi(app, vocab_size=engine_loop.vocab_size, keyed=auth.enabled)

    async def tenant(authorization: str | None = Header(None)) -> str:
        return auth.tenant(authorization)

    # -- generation -------------------------------------------------------------------------------------------

    @app.post("/v1/chat/completions", responses=generation_responses(ChatCompletionResponse, ChatCompletionChunk))
    async def chat_completions(body: ChatCompletionRequest, request: Request, t: str = Depends(tenant)):
        return await serving.chat(body, request, t)

    @app.post("/v1/completions", responses=generation_responses(CompletionResponse, CompletionResponse))
    async def completions(body: CompletionRequest, request: Request, t: str = Depends(tenant)):
        return await serving.completions(body, request, t)

    # -- documents --------------------------------------------------------------------------------------------

    def document_object(doc: RegisteredDocument) -> DocumentObject:
        return DocumentObject(id=doc.id, title=doc.title, num_tokens=doc.num_tokens, created=doc.created)

    @app.post("/v1/documents", responses=error_responses(400, 401, 413, 503))
    async def create_document(body: DocumentCreateRequest, t: str = Depends(tenant)) -> DocumentObject:
        return document_object(await documents.register(cache_scope(t, body.cache_salt), body.title, body.text))

    @app.get("/v1/documents", responses=error_responses(401, 503))
    async def list_documents(cache_salt: str | None = Query(None), t: str = Depends(tenant)) -> DocumentList:
        docs = await run_in_threadpool(registry.list, cache_scope(t, cache_salt))
        return DocumentList(data=[document_object(d) for d in docs])

    @app.get("/v1/documents/{doc_id}", responses=error_responses(401, 404, 503))
    async def get_document(
        doc_id: str, cache_salt: str | None = Query(None), t: str = Depends(tenant)
    ) -> DocumentContent:
        doc = await run_in_threadpool(registry.get, cache_scope(t, cache_salt), doc_id)
        return DocumentContent(**document_object(doc).model_dump(), text=doc.text)

    @app.delete("/v1/documents/{doc_id}", responses=error_responses(401, 404, 503))
    async def delete_document(
        doc_id: str, cache_salt: str | None = Query(None), t: str = Depends(tenant)
    ) -> DocumentDeleted:
        return DocumentDeleted(id=(await documents.delete(cache_scope(t, cache_salt), doc_id)).id)

    # -- service ----------------------------------------------------------------------------------------------

    @app.get("/v1/models", responses=error_responses(401))
    async def models(t: str = Depends(tenant)) -> ModelList:
        return ModelList(
            data=[
                ModelCard(
                    id=config.model_name,
                    created=started,
                    max_model_len=engine_loop.max_model_len,
                    mode=engine_loop.mode.name,
                )
            ]
        )

    @app.get("/health", responses={200: {"model": HealthStatus}, 503: {"model": HealthStatus}})
    async def health() -> Response:
        if not engine_loop.alive:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        stalled = engine_loop.stalled_for()
        if stalled > HEALTH_STALL_S:
            return JSONResponse({"status": f"engine has made no progress for {stalled:.0f} s"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus_metrics() -> Response:
        # In the thread pool: the registered-documents gauge counts the registry's rows.
        return Response(await run_in_threadpool(metrics.exposition), media_type=metrics.content_type)

    return app
