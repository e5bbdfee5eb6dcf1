"""Token ids of document texts, kept so that a document that recurs is tokenised once.

Popular documents come back in request after request (their KV is cached once: docs/design.md, "The document
cache"), yet each request carries them as text. Tokenising a request's documents takes more host time than a
cached request's whole time to first token on a GPU (docs/benchmarks.md, "Documents sent as text: tokenised
once"). `encode_document` (engine/prompt.py) looks each formatted document up here first.

A cache belongs to one tokenizer object (`TokenizerBase.cache`), so the key need not name the tokenizer: it is
the formatted text and whether special-token text in it is read as control tokens. The ids are stored as a
tuple and every caller gets a new list, so whatever a caller does to its list never reaches the cache.

Thread-safe: the server renders requests in worker threads. The lock covers the dictionary only, never the
tokenisation, so two threads that miss on the same text both tokenise it (the same ids) and one entry remains.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

# Texts this short are not kept. A hit would still save tokenising time (docs/benchmarks.md, "Documents sent as
# text"), but a budget counted in tokens would let many tiny entries, each with ~200 bytes of dictionary overhead
# beside its few ids, take far more memory than it says; RAG documents are rarely this short.
MIN_CHARS = 64
# The cost of an entry in tokens is at least its text's length / CHARS_PER_TOKEN, so the text a key holds is
# bounded by the budget too, even for text that tokenises into very few tokens (long runs of one character).
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class TokenizerCacheStats:
    hits: int
    misses: int  # lookups that found nothing (texts under MIN_CHARS are not looked up)
    entries: int
    tokens: int  # what the entries are charged, at most max_tokens
    max_tokens: int


class TokenizerCache:
    """A least-recently-used map (text, parse_special_tokens) -> token ids, holding at most `max_tokens`."""

    def __init__(self, max_tokens: int) -> None:
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[str, bool], tuple[int, ...]] = OrderedDict()
        self._tokens = 0
        self._hits = 0
        self._misses = 0
        self._lock = threading.Lock()

    def get(self, text: str, parse_special_tokens: bool) -> list[int] | None:
        """The ids stored for this text (a new list), or None."""
        if len(text) < MIN_CHARS or not self.max_tokens:
            return None
        key = (text, parse_special_tokens)
        with self._lock:
            ids = self._entries.get(key)
            if ids is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
        return list(ids)

    def put(self, text: str, parse_special_tokens: bool, ids: list[int]) -> None:
        """Store a copy of `ids`, evicting the least recently used entries to stay within `max_tokens`."""
        cost = _cost(text, ids)
        if len(text) < MIN_CHARS or cost > self.max_tokens:
            return
        key = (text, parse_special_tokens)
        stored = tuple(ids)  # immutable, and it shares the list's ints: at most ~36 bytes a token (config.py)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:  # another thread stored it meanwhile
                self._tokens -= _cost(text, old)
            self._entries[key] = stored
            self._tokens += cost
            while self._tokens > self.max_tokens:
                (old_text, _), old_ids = self._entries.popitem(last=False)
                self._tokens -= _cost(old_text, old_ids)

    def stats(self) -> TokenizerCacheStats:
        with self._lock:
            return TokenizerCacheStats(self._hits, self._misses, len(self._entries), self._tokens, self.max_tokens)


def _cost(text: str, ids: tuple[int, ...] | list[int]) -> int:
    return max(len(ids), len(text) // CHARS_PER_TOKEN)
