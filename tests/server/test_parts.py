"""The server's pieces without a server: keys, scopes, defaults, error formatting (the registry: test_registry.py)."""

from __future__ import annotations

import pytest

from lazyattn.engine.prompt import DEFAULT_LAYOUT, RenderedPrompt
from lazyattn.errors import AuthenticationError, ContextTooLongError
from lazyattn.model.byte_tokenizer import ByteTokenizer
from lazyattn.server.errors import _param
from lazyattn.server.inputs import Renderer
from lazyattn.server.tenancy import Authenticator, cache_scope


def test_authenticator():
    assert Authenticator([]).tenant(None) == ""  # open server: one tenant
    one = Authenticator(["k"])
    assert one.tenant("Bearer k") == "" and one.tenant("bearer  k ") == ""
    for bad in (None, "", "k", "Bearer", "Basic k", "Bearer kk"):
        with pytest.raises(AuthenticationError):
            one.tenant(bad)
    two = Authenticator(["k1", "k2"])
    t1, t2 = two.tenant("Bearer k1"), two.tenant("Bearer k2")
    assert t1 and t2 and t1 != t2 and "k1" not in t1
    with pytest.raises(ValueError):
        Authenticator(["k", ""])


def test_cache_scopes_never_collide():
    assert cache_scope("", None) is None
    scopes = {cache_scope(t, s) for t in ("", "t1", "t2") for s in (None, "", "x", '", "', "t1")}
    assert len(scopes) == 15


def test_default_max_tokens_is_the_engines_room():
    room = {10: 40, 20: 0}  # final-segment length -> what the engine says fits
    r = Renderer(
        ByteTokenizer(),
        DEFAULT_LAYOUT,
        max_model_len=1000,
        vocab_size=320,
        max_new_tokens=lambda prompt, n, options=None: room[len(prompt.final)] // n,
    )
    prompt = RenderedPrompt([[1] * 50], [2] * 10)
    assert r.max_tokens(7, prompt, 1, "prompt") == 7  # asked for: the engine validates it
    assert r.max_tokens(None, prompt, 1, "prompt") == 40 and r.max_tokens(None, prompt, 4, "prompt") == 10
    with pytest.raises(ContextTooLongError):
        r.max_tokens(None, RenderedPrompt([], [1] * 20), 1, "prompt")


def test_error_param_paths():
    assert _param(("body", "messages", 0, "content")) == "messages[0].content"
    assert _param(("body", "documents", 2, "str")) == "documents[2].str"
    assert _param(("body",)) is None
