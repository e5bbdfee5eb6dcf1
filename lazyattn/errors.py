"""Exceptions a user can act on. The server maps each to an HTTP status and an OpenAI-style error body."""

from __future__ import annotations


class LazyAttnError(Exception):
    """Base of every error lazyattn raises on purpose."""

    status_code = 500
    error_type = "internal_error"


class InvalidRequestError(LazyAttnError, ValueError):
    """The request itself is wrong (empty prompt, parameter out of range, token id outside the vocabulary)."""

    status_code = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextTooLongError(InvalidRequestError):
    """Documents + prompt + max_tokens exceed the model's context window or the KV pool."""


class UnknownDocumentError(LazyAttnError, KeyError):
    status_code = 404
    error_type = "not_found_error"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "unknown document"


class CheckpointError(LazyAttnError):
    """A model directory that cannot be loaded (missing or inconsistent files, unsupported architecture)."""

    status_code = 500
    error_type = "checkpoint_error"


class CacheInvariantError(LazyAttnError, AssertionError):
    """The document cache's bookkeeping is broken (a bug, never a user's input): `DocumentCache.check` found an
    invariant broken, or a segment was handed back to a cache that does not hold it."""


class OutOfPagesError(LazyAttnError):
    """The KV page pool cannot satisfy an allocation even after evicting unreferenced segments."""

    status_code = 503
    error_type = "server_overloaded"


class QueueFullError(LazyAttnError):
    """The server is at capacity (waiting queue, registry): retry later. HTTP 429 with Retry-After."""

    status_code = 429
    error_type = "server_overloaded"
    retry_after_s = 1


class AuthenticationError(LazyAttnError):
    status_code = 401
    error_type = "authentication_error"


class TensorParallelError(LazyAttnError):
    """A tensor-parallel worker failed (or exited): the engine stops, since every rank holds part of the model."""

    status_code = 500
    error_type = "internal_error"


class RegistryError(LazyAttnError):
    """The document registry's database cannot be used: unreachable or locked, a bad URL, or written by a newer
    lazyattn (a schema version this one does not know). HTTP 503 while serving; at start-up the server exits."""

    status_code = 503
    error_type = "registry_unavailable"
