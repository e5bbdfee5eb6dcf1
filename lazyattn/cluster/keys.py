"""A request's `RouteKey`: what a routing policy needs to know of it, computed where the prompt is rendered.

Document keys hash the tenant scope with the segment's token ids, like the engine's cache key does with the
cache salt (docs/design.md, The document cache): two tenants' copies of one text get different keys, so a
policy never counts one tenant's cached document as another's hit, and a key says nothing about the text.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Sequence

from lazyattn.cluster.policy import RoutedDocument, RouteKey
from lazyattn.engine.prompt import RenderedPrompt


def _tokens_bytes(tokens: Sequence[int]) -> bytes:
    return array("q", tokens).tobytes()


def document_key(scope: str | None, tokens: Sequence[int]) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps(scope).encode() + b"\x00")
    h.update(_tokens_bytes(tokens))
    return h.hexdigest()


def prefix_keys(scope: str | None, tokens: Sequence[int], page_tokens: int) -> tuple[str, ...]:
    """Chained keys of the full pages of `tokens`: page i's key covers pages 0..i (a prefix cache's keys)."""
    keys, parent = [], json.dumps(scope).encode()
    for start in range(0, len(tokens) - page_tokens + 1, page_tokens):
        parent = hashlib.blake2b(parent + _tokens_bytes(tokens[start : start + page_tokens]), digest_size=16).digest()
        keys.append(parent.hex())
    return tuple(keys)


def route_key(prompt: RenderedPrompt, scope: str | None, page_tokens: int = 0) -> RouteKey:
    """Every segment is a document to the router (the system segment too: it is cached like one). Prefix keys
    only when `page_tokens` > 0 (the prefix-affinity policy's input)."""
    documents = tuple(RoutedDocument(document_key(scope, s), len(s)) for s in prompt.segments)
    if page_tokens <= 0:
        return RouteKey(documents)
    return RouteKey(documents, prefix_keys(scope, prompt.token_ids, page_tokens), page_tokens)
