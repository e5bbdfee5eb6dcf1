"""OpenAI-compatible HTTP server with documents as first-class inputs (`lazyattn serve`, docs/server.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["ServerConfig", "create_app"]

if TYPE_CHECKING:
    from lazyattn.server.app import ServerConfig, create_app


def __getattr__(name: str) -> Any:
    # Lazy, so that the CLI can register `serve` without importing FastAPI, torch and the engine.
    if name in __all__:
        from lazyattn.server import app

        return getattr(app, name)
    raise AttributeError(name)
