"""Registering and deleting documents: the registry entry (server/registry.py) and the document's KV.

Registration tokenises a document once (with the same `encode_document` a request uses, so the ids are the
cache key a request would produce) and the server pre-encodes its KV: the document alone and, where documents are
encoded after the first segment by default (lazy mode with `ape_prefix`), also after the system segment that a chat
request in the server's layout starts with, the copy such requests read (docs/design.md, "APE"). Deleting a
document removes both, and every other shared-prefix copy the cache made of it. The registry keeps the text, not the KV:
the KV lives in the document cache and may be evicted like any other; a request that uses the id after an
eviction or a restart re-encodes it (a miss), it never fails.

Registry calls block on its database, so they run in the thread pool, never on the event loop.
"""

from __future__ import annotations

import time
import uuid

from starlette.concurrency import run_in_threadpool

from lazyattn.engine.client import EngineClient
from lazyattn.engine.prompt import PromptLayout, RenderedPrompt, encode_document, render_chat
from lazyattn.engine.request_options import RequestOptions
from lazyattn.errors import ContextTooLongError
from lazyattn.server.registry import DocumentRegistry, RegisteredDocument, document_id


class DocumentService:
    """Registration and deletion of documents: the registry entry and, in modes that cache documents (lazy, block;
    prefix and full would never hit a pre-encoded one), the KV in the engine's document cache."""

    def __init__(self, registry: DocumentRegistry, engine_loop: EngineClient, layout: PromptLayout) -> None:
        self.registry = registry
        self.engine_loop = engine_loop
        self.layout = layout
        self.tokenizer = engine_loop.tokenizer
        self.max_model_len = engine_loop.max_model_len
        self.encodes = engine_loop.mode.caches_documents
        # The first segment of a chat request in this layout (system prompt and BOS), after which documents are
        # encoded by default; None where they are not.
        self.first_segment: list[int] | None = None
        if self.encodes and engine_loop.ape_prefix:
            chat = render_chat(self.tokenizer, [{"role": "user", "content": "?"}], [{"text": "?"}], layout)
            self.first_segment = chat.segments[0]

    async def register(self, scope: str | None, title: str | None, text: str) -> RegisteredDocument:
        """Register a document and, where the mode caches documents, return once its KV is cached and its entry
        committed: registration means "ready to hit", and an acknowledged id survives a restart. Registering the
        same document again in a scope returns the same entry."""
        as_input = {"text": text} if title is None else {"title": title, "text": text}
        token_ids = await self._tokenize(as_input)
        if not await run_in_threadpool(self.registry.would_accept, scope, document_id(scope, title, text)):
            raise self.registry.full_error()
        if self.encodes:
            # The KV first, then the entry: an entry is never committed for a document whose encode failed, so there
            # is nothing to undo (concurrent registrations of it share the entry). KV left by a failed commit is an
            # ordinary cached segment, evicted like any other.
            await self._encode(token_ids, scope)
        return await run_in_threadpool(self.registry.add, scope, title, text, len(token_ids))

    async def delete(self, scope: str | None, doc_id: str) -> RegisteredDocument:
        doc = await run_in_threadpool(self.registry.remove, scope, doc_id)
        if self.encodes:
            # Free its KV now rather than wait for LRU: a deleted document should not stay readable by timing. Its
            # token ids as this server encodes them (the entry may come from a server with another tokenizer; one
            # over this server's context limit was never cached here, and dropping it is a no-op).
            token_ids = await run_in_threadpool(encode_document, self.tokenizer, doc.as_input(), self.layout)
            await self.engine_loop.drop_documents([token_ids], scope)
        return doc

    async def _tokenize(self, as_input: dict[str, str]) -> list[int]:
        token_ids = await run_in_threadpool(encode_document, self.tokenizer, as_input, self.layout, "document")
        if len(token_ids) > self.max_model_len:
            raise ContextTooLongError(
                f"the document has {len(token_ids)} tokens, over the context limit of {self.max_model_len}",
                param="text",
            )
        return token_ids

    async def _encode(self, token_ids: list[int], scope: str | None) -> None:
        await self._prefill([token_ids], scope, RequestOptions(ape_prefix=False))
        first = self.first_segment
        if first is not None and len(first) + len(token_ids) <= self.max_model_len:
            await self._prefill([first, token_ids], scope, RequestOptions(ape_prefix=True))

    async def _prefill(self, segments: list[list[int]], scope: str | None, options: RequestOptions) -> None:
        request = (f"encode-{uuid.uuid4().hex}", RenderedPrompt(segments, []), None)
        stream = await self.engine_loop.submit([request], cache_salt=scope, arrival=time.monotonic(), options=options)
        try:
            async for _ in stream:
                pass
        finally:
            stream.abort()  # a no-op once it finished; frees the pages if the caller went away
