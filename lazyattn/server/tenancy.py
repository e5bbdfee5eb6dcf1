"""API keys and tenant isolation.

A tenant's documents must not be hit, nor timed, by another tenant: a cache hit is visibly faster than a miss,
so a shared cache tells anyone who can send a document whether someone else sent it recently. The document
cache's key hashes a salt (docs/design.md, The document cache), so each tenant gets its own salt and never
shares an entry.

The salt of a request is built from two parts:
- the API key, when several are configured: each key is its own tenant. With one key (or none) every client
  is the same tenant, as with a single-tenant OpenAI key.
- the request's `cache_salt`, for applications that separate their own users behind one key.

The same value scopes the document registry, so a registered id is only visible in the scope it was made in.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence

from lazyattn.errors import AuthenticationError


class Authenticator:
    """Checks `Authorization: Bearer <key>` and names the tenant the key belongs to."""

    def __init__(self, api_keys: Sequence[str]) -> None:
        # Stripped as the header's token is: a key configured as " k1 " is sent as "Bearer k1".
        keys = [k.strip() for k in api_keys]
        if not all(keys):
            raise ValueError("an API key must not be empty (or only spaces)")
        self._keys = [k.encode() for k in dict.fromkeys(keys)]
        self._per_key_tenants = len(self._keys) > 1

    @property
    def enabled(self) -> bool:
        """Keys are configured: /v1 routes need one (and the OpenAPI schema says so)."""
        return bool(self._keys)

    def tenant(self, authorization: str | None) -> str:
        """The tenant of a request: "" (the only tenant) or a digest of its key. Raises AuthenticationError."""
        if not self._keys:
            return ""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthenticationError("missing API key: send the header 'Authorization: Bearer <key>'")
        given = token.strip().encode()
        # Compare against every key, in constant time each, so timing tells nothing about which one is close.
        matched = None
        for key in self._keys:
            if hmac.compare_digest(given, key):
                matched = key
        if matched is None:
            raise AuthenticationError("invalid API key")
        if not self._per_key_tenants:
            return ""
        # A digest, so the key itself never becomes part of a cache key or shows up in the registry.
        return hashlib.sha256(b"lazyattn-tenant\x00" + matched).hexdigest()[:32]


def cache_scope(tenant: str, cache_salt: str | None) -> str | None:
    """The engine's cache salt (and the registry's scope) for a tenant and a request's cache_salt.

    None when neither is set, so an unsalted server shares its cache with the offline `LLM` API. Otherwise an
    unambiguous encoding of both parts: no choice of cache_salt by one tenant can equal another tenant's scope.
    """
    if not tenant and cache_salt is None:
        return None
    return json.dumps([tenant, cache_salt])
