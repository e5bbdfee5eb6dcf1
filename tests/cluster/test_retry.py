"""The ingress when a replica dies (cluster/ingress.py), without a Ray cluster: the real ingress app and
`RemoteEngineLoop` over two real `EngineReplica`s (tiny engines on the CPU), reached through a stand-in for Serve's
deployment handle that sends each call to the replica the test's routing names, and makes one replica die (Ray's
`RayActorError`) at a chosen point of its stream.

- died before it accepted the request, or after accepting and before any output: the request is sent once more,
  reaches the other replica, and the client gets the answer one engine gives, with no error;
- died after the client got output: that client gets a `replica_failed` error event, the others finish normally.
"""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import httpx
import pytest
from ray import serve
from ray.exceptions import RayActorError

from lazyattn.cluster.ingress import REASON_HEADER, REPLICA_HEADER, RemoteEngineLoop, RouteHeaders
from lazyattn.cluster.replica import EngineReplica
from lazyattn.engine.llm import LLM
from lazyattn.engine.prompt import DEFAULT_LAYOUT
from lazyattn.engine.sampling import SamplingParams
from lazyattn.server.app import ServerConfig, create_app

ENGINE = dict(model="tiny", device="cpu", page_size=16, kv_cache_gb=0.05, max_waiting=64)
DOCS = ["Paris is the capital of France. " * 6, "The Nile flows north through Egypt. " * 6]
GREEDY = dict(max_tokens=8, temperature=0.0, ignore_eos=True)


class DyingStream:
    """A replica's update stream (what `handle.generate.remote` returns) that dies after `updates_before_death`
    updates: the first update is the replica's 'accepted', later ones carry outputs. None: never dies."""

    def __init__(self, updates, updates_before_death: int | None) -> None:
        self.updates = updates
        self.left = updates_before_death
        self.cancelled = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.left is not None:
            if self.left == 0:
                await self.updates.aclose()  # the actor is gone: its generator (and its engine requests) with it
                raise RayActorError()
            self.left -= 1
        return await self.updates.__anext__()

    def cancel(self) -> None:
        self.cancelled = True
        asyncio.ensure_future(self.updates.aclose())


class Handle:
    """Serve's deployment handle, as the ingress uses it: `options(stream=True)`, `generate.remote(job)`,
    `info.remote()`. `route` lists, per call of generate, (replica name, updates before death or None)."""

    def __init__(self, replicas: dict[str, EngineReplica], route: list[tuple[str, int | None]]) -> None:
        self.replicas = replicas
        self.route = route
        self.sent: list[str] = []
        self.generate = SimpleNamespace(remote=self._generate)

    def options(self, **_) -> Handle:
        return self

    def _generate(self, job) -> DyingStream:
        name, death = self.route.pop(0)
        self.sent.append(name)
        return DyingStream(self.replicas[name].generate(job), death)


@pytest.fixture
def replicas():
    """Fresh replicas per test: a test's dead stream leaves nothing in the next test's engines."""
    made = {}
    patch = pytest.MonkeyPatch()
    try:
        for name in ("dying", "healthy"):
            context = SimpleNamespace(replica_id=SimpleNamespace(unique_id=name))
            patch.setattr(serve, "get_replica_context", lambda context=context: context)
            made[name] = EngineReplica(ENGINE)
        yield made
    finally:
        patch.undo()
        for replica in made.values():
            replica.loop.stop()


@pytest.fixture(scope="module")
def want() -> str:
    llm = LLM(model="tiny", device="cpu", progress=False, page_size=16, kv_cache_gb=0.05)
    try:
        return llm.generate(["Answer:"], SamplingParams(**GREEDY), documents=[DOCS])[0].text
    finally:
        llm.shutdown()


def ingress(replicas, route) -> tuple[httpx.AsyncClient, Handle]:
    handle = Handle(replicas, route)
    loop = RemoteEngineLoop(handle, replicas["healthy"].info())
    app = create_app(loop, ServerConfig(model_name="tiny", layout=DEFAULT_LAYOUT))
    app.add_middleware(RouteHeaders)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ingress", timeout=60)
    return client, handle


def body(**kw) -> dict:
    return {"prompt": "Answer:", "documents": DOCS, **GREEDY, **kw}


def events(response: httpx.Response) -> list[str]:
    return [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize(
    "death, where",
    [(0, "before it accepted the request"), (1, "after accepting it, before any output")],
)
def test_replica_dying_before_it_answered_is_retried_on_another(replicas, want, death, where):
    async def run():
        client, handle = ingress(replicas, [("dying", death), ("healthy", None)])
        async with client:
            r = await client.post("/v1/completions", json=body())
        return r, handle

    r, handle = asyncio.run(run())
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == want  # the answer of one engine, as if nothing had happened
    assert handle.sent == ["dying", "healthy"]  # sent once more, to the other replica
    assert r.headers[REPLICA_HEADER] == "healthy"
    if death == 1:  # the stream had started (accepted): the response says it was sent again
        assert r.headers[REASON_HEADER] == "sent again: replica dying failed before answering"


def test_replica_dying_after_output_fails_its_client_only(replicas, want):
    """Two streams at once; the dying replica's dies after its first output: that client gets a replica_failed
    error event and [DONE] (no retry: it already has tokens), the other one the whole answer. The cut request is sent
    first and the other only once the ingress has routed it (the replicas are taken in the order requests reach
    them), and it asks for many tokens (2000) from an engine that steps at most one token every 20 ms, so that however
    late a loaded machine reads the stream, the update before the death is not the request's last."""
    engine = replicas["dying"].engine
    step = engine.step

    def slow_step():
        time.sleep(0.02)
        return step()

    engine.step = slow_step

    async def run():
        client, handle = ingress(replicas, [("dying", 2), ("healthy", None)])
        async with client:
            cut = asyncio.create_task(client.post("/v1/completions", json=body(stream=True, max_tokens=2000)))
            while not handle.sent:  # the cut request has reached the dying replica
                await asyncio.sleep(0.001)
            whole = await client.post("/v1/completions", json=body(stream=True))
            return await cut, whole, handle

    cut, whole, handle = asyncio.run(run())
    assert handle.sent == ["dying", "healthy"]  # no retry of the cut stream
    assert cut.status_code == whole.status_code == 200
    cut_events, whole_events = events(cut), events(whole)
    assert cut_events[-1] == whole_events[-1] == "[DONE]"
    assert json.loads(cut_events[-2])["error"]["type"] == "replica_failed"
    assert json.loads(cut_events[0])["choices"][0]["text"]  # it had streamed output before the failure
    text = "".join(json.loads(e)["choices"][0]["text"] for e in whole_events[:-1])
    assert text == want
    assert json.loads(whole_events[-2])["choices"][0]["finish_reason"] == "length"


def test_no_replica_left_is_a_503(replicas):
    """Both replicas die before accepting: no third attempt, a 503 the client can retry later."""

    async def run():
        client, handle = ingress(replicas, [("dying", 0), ("dying", 0)])
        async with client:
            r = await client.post("/v1/completions", json=body())
        return r, handle

    r, handle = asyncio.run(run())
    assert r.status_code == 503
    assert r.json()["error"]["type"] == "replica_failed"
    assert handle.sent == ["dying", "dying"]
