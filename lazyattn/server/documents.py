"""The document registry: documents registered ahead of requests and referred to by id.

Registration tokenises a document once (with the same `encode_document` a request uses, so the ids are the
cache key a request would produce) and the server pre-encodes its KV. The registry keeps the text and token
ids, not the KV: the KV lives in the document cache and may be evicted like any other; a request that uses
the id after an eviction re-encodes it (a miss), it never fails.

Every entry belongs to a scope (`tenancy.cache_scope`). An id is only found in its own scope: another tenant
gets the same 404 as for an id that never existed, so ids reveal nothing across tenants. Ids are derived from
the scope and the content, so registering the same document twice in a scope gives the same id.

Used from the event loop only (no lock).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass

from lazyattn.errors import QueueFullError, UnknownDocumentError


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
