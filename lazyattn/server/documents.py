"""The document registry: documents registered ahead of requests and referred to by id.

Registration tokenises a document once (with the same `encode_document` a request uses, so the ids are the
cache key a request would produce) and the server pre-encodes its KV. The registry keeps the text and token
ids, not the KV: the KV lives in the document cache and may be evicted like any other; a request that uses
the id after an eviction re-encodes it (a miss), it never fails.

Every entry belongs to a scope (`tenancy.cache_scope`). An id is only found in its own scope: another tenant
gets the same 404 as for an id that never existed, so ids reveal nothing across tenants. Ids are derived from
the scope and the content, so registering the same document twice in a scope gives the same id.

`DocumentService` is what the routes call: registration (tokenise, register, pre-encode as a prefill-only
engine request through the same path as generation) and deletion (unregister, drop the KV).

Used from the event loop only (no lock).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool

from lazyattn.engine.prompt import PromptLayout, RenderedPrompt, encode_document
from lazyattn.errors import ContextTooLongError, QueueFullError, UnknownDocumentError
from lazyattn.server.engine_loop import EngineLoop


@dataclass(frozen=True)
class RegisteredDocument:
    id: str
    scope: str | None
    title: str | None
    text: str
    token_ids: tuple[int, ...]
    created: int

    def as_input(self) -> dict[str, str]:
        """The document as a request's `documents` entry: renders to exactly `token_ids`."""
        return {"text": self.text} if self.title is None else {"title": self.title, "text": self.text}


class DocumentRegistry:
    def __init__(self, max_documents: int | None = None) -> None:
        self.max_documents = max_documents
        self._docs: dict[tuple[str | None, str], RegisteredDocument] = {}

    def __len__(self) -> int:
        return len(self._docs)

    @staticmethod
    def document_id(scope: str | None, title: str | None, text: str) -> str:
        digest = hashlib.sha256(json.dumps([scope, title, text]).encode()).hexdigest()
        return f"doc-{digest[:32]}"

    def add(self, scope: str | None, title: str | None, text: str, token_ids: list[int]) -> RegisteredDocument:
        doc_id = self.document_id(scope, title, text)
        existing = self._docs.get((scope, doc_id))
        if existing is not None:
            return existing
        if self.max_documents is not None and len(self._docs) >= self.max_documents:
            # A 503 like a full queue: the server is at capacity, not the request at fault.
            raise QueueFullError(f"the document registry is full ({self.max_documents} documents); delete some")
        doc = RegisteredDocument(doc_id, scope, title, text, tuple(token_ids), int(time.time()))
        self._docs[(scope, doc_id)] = doc
        return doc

    def contains(self, scope: str | None, doc_id: str) -> bool:
        return (scope, doc_id) in self._docs

    def get(self, scope: str | None, doc_id: str, param: str = "id") -> RegisteredDocument:
        doc = self._docs.get((scope, doc_id))
        if doc is None:
            error = UnknownDocumentError(f"no document with id {doc_id!r}")
            error.param = param
            raise error
        return doc

    def remove(self, scope: str | None, doc_id: str) -> RegisteredDocument:
        doc = self.get(scope, doc_id)
        del self._docs[(scope, doc_id)]
        return doc

    def list(self, scope: str | None) -> list[RegisteredDocument]:
        return sorted((d for (s, _), d in self._docs.items() if s == scope), key=lambda d: (d.created, d.id))


class DocumentService:
    """Registration and deletion of documents: the registry entry and, in modes that cache documents (lazy, block;
    prefix and full would never hit a pre-encoded one), the KV in the engine's document cache."""

    def __init__(self, registry: DocumentRegistry, engine_loop: EngineLoop, layout: PromptLayout) -> None:
        self.registry = registry
        self.engine_loop = engine_loop
        self.layout = layout
        engine = engine_loop.engine
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.encodes = engine.mode.caches_documents

    async def register(self, scope: str | None, title: str | None, text: str) -> RegisteredDocument:
        """Register a document and, where the mode caches documents, return once its KV is cached: registration
        means "ready to hit". Registering the same document again in a scope returns the same entry."""
        as_input = {"text": text} if title is None else {"title": title, "text": text}
        token_ids = await run_in_threadpool(encode_document, self.tokenizer, as_input, self.layout, "document")
        if len(token_ids) > self.max_model_len:
            raise ContextTooLongError(
                f"the document has {len(token_ids)} tokens, over the context limit of {self.max_model_len}",
                param="text",
            )
        existed = self.registry.contains(scope, self.registry.document_id(scope, title, text))
        doc = self.registry.add(scope, title, text, token_ids)
        if self.encodes:
            try:
                await self._encode(doc, scope)
            except BaseException:
                if not existed:  # undo a registration whose encode did not happen
                    self.registry.remove(scope, doc.id)
                raise
        return doc

    async def delete(self, scope: str | None, doc_id: str) -> RegisteredDocument:
        doc = self.registry.remove(scope, doc_id)
        if self.encodes:
            # Free its KV now rather than wait for LRU: a deleted document should not stay readable by timing.
            await self.engine_loop.drop_documents([list(doc.token_ids)], scope)
        return doc

    async def _encode(self, doc: RegisteredDocument, scope: str | None) -> None:
        request = (f"encode-{uuid.uuid4().hex}", RenderedPrompt([list(doc.token_ids)], []), None)
        stream = await self.engine_loop.submit([request], cache_salt=scope, arrival=time.monotonic())
        try:
            async for _ in stream:
                pass
        finally:
            stream.abort()  # a no-op once it finished; frees the pages if the caller went away
