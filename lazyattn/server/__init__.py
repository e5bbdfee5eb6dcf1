"""OpenAI-compatible HTTP server with documents as first-class inputs (`lazyattn serve`, docs/server.md)."""

from lazyattn.server.app import ServerConfig, create_app

__all__ = ["ServerConfig", "create_app"]
