"""The engine-client protocol (engine/client.py) and its two implementations: the in-process `EngineLoop`
(server/engine_loop.py) and the loop over Ray Serve replicas, `RemoteEngineLoop` (cluster/ingress.py). Each must
offer every member the protocol declares with the protocol's signature, and both must describe the same engine
alike (what the server renders and validates with)."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from lazyattn.engine.client import EngineClient, OutputStream
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.llm_engine import LLMEngine
from lazyattn.engine.prompt import RenderedPrompt
from lazyattn.engine.request_options import RequestOptions
from lazyattn.server.engine_loop import EngineLoop, LocalStream


def declared(protocol: type) -> dict[str, object]:
    """The protocol's members: name -> its definition (a function, a property, or None for an annotated field)."""
    members: dict[str, object] = {name: None for name in protocol.__annotations__}
    members.update({k: v for k, v in vars(protocol).items() if not k.startswith("_") or k == "__aiter__"})
    return {k: v for k, v in members.items() if k != "__annotations__"}


def check_implements(protocol: type, impl: object) -> None:
    assert isinstance(impl, protocol), f"{type(impl).__name__} is not an {protocol.__name__}"
    for name, member in declared(protocol).items():
        assert hasattr(impl, name), f"{type(impl).__name__} lacks {name}"
        if not inspect.isfunction(member):
            continue  # a property or a field: present is what it takes
        got = getattr(type(impl), name)
        assert inspect.isfunction(got), f"{type(impl).__name__}.{name} is not a method"
        assert inspect.iscoroutinefunction(got) == inspect.iscoroutinefunction(member), name
        want_params = [(p.name, p.kind, p.default) for p in inspect.signature(member).parameters.values()]
        got_params = [(p.name, p.kind, p.default) for p in inspect.signature(got).parameters.values()]
        assert got_params == want_params, f"{type(impl).__name__}.{name}{inspect.signature(got)}"


@pytest.fixture(scope="module")
def engine():
    engine = LLMEngine(
        EngineConfig(model="tiny", device="cpu", page_size=16, kv_cache_gb=0.05, relink_tokens=4, relink_last_tokens=2)
    )
    yield engine
    engine.shutdown()


def test_the_in_process_loop_is_an_engine_client(engine):
    loop = EngineLoop(engine)
    check_implements(EngineClient, loop)
    stream = LocalStream(loop, asyncio.new_event_loop(), ["a"])
    check_implements(OutputStream, stream)


def test_the_loop_over_replicas_is_an_engine_client_that_describes_the_same_engine(engine):
    pytest.importorskip("ray")
    from lazyattn.cluster.ingress import RemoteEngineLoop, RemoteStream
    from lazyattn.cluster.replica import EngineInfo, EngineJob

    class Handle:
        def options(self, **_):
            return self

    info = EngineInfo(
        model="tiny",
        mode=engine.mode.name,
        max_model_len=engine.max_model_len,
        vocab_size=engine.model_config.vocab_size,
        num_pages=engine.num_pages,
        page_size=engine.config.page_size,
        relink_tokens=engine.config.relink_tokens,
        relink_last_tokens=engine.config.relink_last_tokens,
        random_weights=False,
        tokenizer_cache_tokens=engine.config.tokenizer_cache_tokens,
    )
    remote, local = RemoteEngineLoop(Handle(), info), EngineLoop(engine)
    check_implements(EngineClient, remote)
    check_implements(
        OutputStream, RemoteStream(remote, EngineJob("j", [("a", RenderedPrompt([], [1]), None)]), None, 0)
    )
    assert type(remote.tokenizer) is type(local.tokenizer)
    assert (remote.mode.name, remote.max_model_len, remote.vocab_size) == (
        local.mode.name,
        local.max_model_len,
        local.vocab_size,
    )
    prompt = RenderedPrompt([[1] + [5] * 40, [6] * 300], [7] * 10)
    options_tried = [RequestOptions(), RequestOptions(relink_tokens=0), RequestOptions(relink_last_tokens=30)]
    for n, options in [(1, options_tried[0]), (3, options_tried[0]), (2, options_tried[1]), (2, options_tried[2])]:
        assert remote.max_new_tokens(prompt, n, options) == local.max_new_tokens(prompt, n, options)
