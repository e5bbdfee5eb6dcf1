"""Two `tiny` replicas on a local Ray instance behind the ingress (lazyattn/cluster): one Ray instance and two
Serve applications for the whole module, a document-affinity one with two tenants and a round-robin one.

Order matters only for the last test, which kills a replica of the round-robin application.
"""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest
import ray
from ray import serve

from lazyattn.cluster.app import ClusterConfig, build_app
from lazyattn.cluster.ingress import REASON_HEADER, REPLICA_HEADER
from lazyattn.engine.llm import LLM
from lazyattn.engine.prompt import DEFAULT_LAYOUT
from lazyattn.engine.sampling import SamplingParams

KEYS = ("key-a", "key-b")
ENGINE = dict(model="tiny", device="cpu", page_size=16, kv_cache_gb=0.05, max_waiting=64)
DOCS = ["Paris is the capital of France. " * 6, "The Nile flows north through Egypt. " * 6]
GREEDY = dict(max_tokens=6, temperature=0.0, ignore_eos=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def registry_url(tmp_path_factory) -> str:
    """The round-robin application's registry: a SQLite file, as `lazyattn serve --replicas` keeps by default."""
    return f"sqlite:///{tmp_path_factory.mktemp('state')}/registry.sqlite"


@pytest.fixture(scope="module")
def cluster(registry_url):
    port = _free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        server = dict(model_name="tiny", layout=DEFAULT_LAYOUT)
        # Half a CPU each: four engine replicas fit the two CPUs this instance is given (CI has two cores).
        common = dict(engine_options=ENGINE, replicas=2, cpus_per_replica=0.5)
        serve.run(
            build_app(ClusterConfig(server={**server, "api_keys": KEYS}, policy="document-affinity", **common)),
            name="affinity",
            route_prefix="/affinity",
        )
        serve.run(
            build_app(ClusterConfig(server={**server, "registry_url": registry_url}, policy="round-robin", **common)),
            name="rr",
            route_prefix="/rr",
        )
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def client(base: str, app: str, key: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=f"{base}/{app}", headers=headers, timeout=60)


def complete(c: httpx.Client, documents, prompt: str = "Answer:", **kw) -> httpx.Response:
    r = c.post("/v1/completions", json={"prompt": prompt, "documents": documents, **GREEDY, **kw})
    assert r.status_code == 200, r.text
    return r


def cached(r: httpx.Response) -> int:
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_same_answers_as_one_engine(cluster):
    llm = LLM(model="tiny", device="cpu", progress=False, page_size=16, kv_cache_gb=0.05)
    want = llm.generate(["Answer:"], SamplingParams(**GREEDY), documents=[DOCS])[0]
    for app, key in (("affinity", KEYS[0]), ("rr", None)):
        c = client(cluster, app, key)
        for _ in range(2):  # on both replicas of the round-robin app
            body = complete(c, DOCS).json()
            assert body["choices"][0]["text"] == want.text
            assert body["usage"]["prompt_tokens"] == want.num_document_tokens + len(want.prompt_token_ids)
    # Streaming through the ingress: the same text, in chunks, ending with [DONE].
    with client(cluster, "affinity", KEYS[0]).stream(
        "POST", "/v1/completions", json={"prompt": "Answer:", "documents": DOCS, "stream": True, **GREEDY}
    ) as r:
        assert r.status_code == 200 and r.headers[REPLICA_HEADER]
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == want.text
    # The ingress renders, so its tokenizer keeps the documents' ids: the round-robin app's second request hit both.
    metrics = client(cluster, "rr").get("/metrics").text
    assert 'lazyattn:tokenizer_cache_hits_total{model_name="tiny"} 2.0' in metrics
    # A request's APE options travel with it to the replica that serves it.
    ape = dict(ape_prefix=True, ape_temperature=0.5)
    want_ape = llm.generate(["Answer:"], SamplingParams(**GREEDY), documents=[DOCS], **ape)[0]
    assert want_ape.text != want.text
    assert complete(client(cluster, "rr"), DOCS, **ape).json()["choices"][0]["text"] == want_ape.text


def test_affinity_hits_where_round_robin_misses(cluster):
    docs = ["A document only this test uses, about lighthouses. " * 5]
    aff = [complete(client(cluster, "affinity", KEYS[0]), docs) for _ in range(3)]
    rr = [complete(client(cluster, "rr"), docs) for _ in range(3)]
    assert len({r.headers[REPLICA_HEADER] for r in aff}) == 1  # where the document is cached
    assert "cached here" in aff[1].headers[REASON_HEADER]
    replicas = [r.headers[REPLICA_HEADER] for r in rr]
    assert replicas[0] != replicas[1] and replicas[2] == replicas[0]  # round-robin alternates
    # The document's tokens: what the second request hits under affinity and not under round-robin.
    assert cached(aff[0]) < cached(aff[1]) == cached(aff[2])
    assert cached(rr[1]) < cached(aff[1])
    assert cached(rr[2]) == cached(aff[1])  # back on the replica that encoded it


def test_registry_and_tenants_hold_across_replicas(cluster, registry_url):
    from lazyattn.server.registry import DocumentRegistry

    text = "Registered once, readable from every replica. " * 20
    rr = client(cluster, "rr")
    doc = rr.post("/v1/documents", json={"text": text}).json()
    stored = DocumentRegistry(registry_url)  # the ingress keeps it in the database it was given
    assert stored.get(None, doc["id"]).text == text
    stored.close()
    served = {complete(rr, [{"id": doc["id"]}]).headers[REPLICA_HEADER] for _ in range(2)}
    assert len(served) == 2  # the id worked on both replicas

    a, b = client(cluster, "affinity", KEYS[0]), client(cluster, "affinity", KEYS[1])
    doc_a = a.post("/v1/documents", json={"text": text}).json()
    assert b.post("/v1/completions", json={"prompt": "x", "documents": [{"id": doc_a["id"]}]}).status_code == 404
    hit_a = complete(a, [{"id": doc_a["id"]}])
    assert cached(hit_a) >= doc_a["num_tokens"]  # pre-encoded at registration
    miss_b = complete(b, [text])  # the same text from the other tenant: never tenant a's cache entry
    assert cached(miss_b) < doc_a["num_tokens"]
    assert a.delete(f"/v1/documents/{doc_a['id']}").status_code == 200
    assert a.post("/v1/completions", json={"prompt": "x", "documents": [{"id": doc_a["id"]}]}).status_code == 404
    assert a.get("/v1/models").json()["data"][0]["mode"] == "lazy"
    metrics = httpx.get(f"{cluster}/affinity/metrics").text
    hits = next(line for line in metrics.splitlines() if line.startswith("lazyattn:document_cache_hits_total"))
    assert float(hits.split()[-1]) > 0


def _stream(base: str, out: dict, i: int, started: threading.Event) -> None:
    body = {
        "prompt": f"Request {i}:",
        "documents": DOCS,
        "stream": True,
        "max_tokens": 400,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    with client(base, "rr").stream("POST", "/v1/completions", json=body) as r:
        out[i] = {"replica": r.headers.get(REPLICA_HEADER), "events": []}
        for line in r.iter_lines():
            if line.startswith("data: "):
                out[i]["events"].append(line[6:])
                started.set()


def test_killed_replica_fails_its_requests_cleanly_and_the_rest_serve_on(cluster):
    out: dict[int, dict] = {}
    started = [threading.Event() for _ in range(4)]
    threads = [threading.Thread(target=_stream, args=(cluster, out, i, started[i])) for i in range(4)]
    for t in threads:
        t.start()
    for e in started:
        assert e.wait(60)
    victim = out[0]["replica"]
    name = next(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].endswith(f"#{victim}"))
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
    for t in threads:
        t.join(120)
        assert not t.is_alive()
    assert {o["replica"] for o in out.values()} == {
        victim,
        next(o["replica"] for o in out.values() if o["replica"] != victim),
    }
    for o in out.values():
        assert o["events"][-1] == "[DONE]"
        last = json.loads(o["events"][-2])
        if o["replica"] == victim:  # cut off: an error event, then [DONE]
            assert last["error"]["type"] == "replica_failed"
        else:  # untouched
            assert last["choices"][0]["finish_reason"] == "length"
    # New requests go to live replicas only (Serve starts a replacement; the dead one is never chosen again).
    rr = client(cluster, "rr")
    after = [complete(rr, DOCS).headers[REPLICA_HEADER] for _ in range(4)]
    assert victim not in after


def test_serve_config_file_builds_the_application():
    """docs/serve.yaml is a valid Serve config, and its args build the application (no cluster needed)."""
    from pathlib import Path

    import yaml
    from ray.serve.schema import ServeDeploySchema

    from lazyattn.cluster.app import app_builder

    config = yaml.safe_load((Path(__file__).parents[2] / "docs" / "serve.yaml").read_text())
    ServeDeploySchema.model_validate(config)
    args = config["applications"][0]["args"]
    assert isinstance(app_builder({**args, "model": "tiny"}), serve.Application)
    # every per-request APE option has its server default there too
    assert isinstance(app_builder({**args, "model": "tiny", "ape_tilt": 1.0, "ape_parallel": True}), serve.Application)
    # and the answer strategy of requests that name none (`lazyattn serve --answer`)
    assert isinstance(app_builder({**args, "model": "tiny", "answer": "both-placements"}), serve.Application)
    both = {"answer": "both-placements", "confidence_tokens": 4}  # with its first tokens (--confidence-tokens)
    assert isinstance(app_builder({**args, "model": "tiny", **both}), serve.Application)
    with pytest.raises(ValueError, match="unknown option"):
        app_builder({**args, "replica": 3})


def test_metrics_sum_the_replicas_counters():
    """/metrics on the ingress: each replica's engine counters added up (hand-computed), sizes kept."""
    import dataclasses

    from lazyattn.cache.document_cache import CacheStats
    from lazyattn.cluster.ingress import _empty_stats, _sum_stats

    base = _empty_stats()
    a = dataclasses.replace(base, cache=CacheStats(3, 2, 1, 0, 100, 5, 2), num_pages=10, running=1, page_bytes=8)
    b = dataclasses.replace(base, cache=CacheStats(4, 1, 3, 1, 50, 6, 3), num_pages=20, waiting=2, page_bytes=8)
    total = _sum_stats([a, b])
    assert total.cache == CacheStats(7, 3, 4, 1, 150, 11, 5)
    assert (total.num_pages, total.running, total.waiting, total.page_bytes, total.host) == (30, 1, 2, 8, None)
