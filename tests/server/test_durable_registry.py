"""Registered documents that outlive the server: `kill -9` in a burst, a restart on the same state directory, and
two servers on one registry (a SQLite file, a PostgreSQL database)."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import sqlalchemy as sa

from lazyattn.server import ServerConfig
from lazyattn.server.registry import SCHEMA_VERSION
from tests.server.conftest import start_server, stop_server
from tests.server.test_cli import _free_port, start_serve

QUESTION = [{"role": "user", "content": "What does it say?"}]
GREEDY = {"max_tokens": 6, "temperature": 0.0, "ignore_eos": True}


def text_of(i: int, run: str) -> str:
    return f"Document {i} of run {run}: page tables map logical pages to physical ones, number {i * 7919 % 1000}."


def chat(url: str, documents: list, **extra) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions", json={"messages": QUESTION, **GREEDY, "documents": documents, **extra}, timeout=60
    )


def answer(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def cached_tokens(r: httpx.Response) -> int:
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(30)


def test_acknowledged_documents_survive_kill_9(tmp_path):
    state = tmp_path / "state"
    run = uuid.uuid4().hex[:8]
    proc, url = start_serve("--state-dir", str(state))
    acked: dict[str, str] = {}  # id -> text, once the server answered 200
    outputs: dict[str, str] = {}  # id -> greedy answer by id, before the crash
    sent: set[str] = set()
    try:
        # Before the burst: two documents with their answers, and one registered then deleted.
        for i in range(2):
            doc = httpx.post(f"{url}/v1/documents", json={"text": text_of(i, run)}, timeout=60).json()
            acked[doc["id"]] = text_of(i, run)
            outputs[doc["id"]] = answer(chat(url, [{"id": doc["id"]}]))
        deleted = httpx.post(f"{url}/v1/documents", json={"text": "deleted " + run}, timeout=60).json()["id"]
        assert httpx.delete(f"{url}/v1/documents/{deleted}", timeout=60).status_code == 200

        # The burst: four clients register new documents, and ask about each one they got back.
        lock, stop = threading.Lock(), threading.Event()
        counter = iter(range(2, 10_000))

        def client() -> None:
            with httpx.Client(timeout=60) as http:
                while not stop.is_set():
                    with lock:
                        i = next(counter)
                        sent.add(text_of(i, run))
                    try:
                        r = http.post(f"{url}/v1/documents", json={"text": text_of(i, run)})
                        if r.status_code != 200:
                            continue
                        with lock:
                            acked[r.json()["id"]] = text_of(i, run)
                        if i % 2 == 0:
                            out = answer(
                                http.post(
                                    f"{url}/v1/chat/completions",
                                    json={"messages": QUESTION, **GREEDY, "documents": [{"id": r.json()["id"]}]},
                                )
                            )
                            with lock:
                                outputs[r.json()["id"]] = out
                    except (httpx.TransportError, AssertionError):
                        return  # the server is gone

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(acked) < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        kill(proc)  # with requests in flight: the clients never stopped sending
        stop.set()
        for t in threads:
            t.join(60)
        assert len(acked) >= 10, "the burst did not get going"
    finally:
        kill(proc)

    proc, url = start_serve("--state-dir", str(state))
    try:
        listed = {d["id"]: d for d in httpx.get(f"{url}/v1/documents", timeout=60).json()["data"]}
        assert set(acked) <= set(listed), "an acknowledged document was lost"
        assert deleted not in listed and httpx.get(f"{url}/v1/documents/{deleted}").status_code == 404
        for doc_id in listed:  # anything else there was sent (its registration was cut off after the commit)
            got = httpx.get(f"{url}/v1/documents/{doc_id}", timeout=60).json()
            assert got["text"] in sent | set(acked.values())
            if doc_id in acked:
                assert got["text"] == acked[doc_id]
        # No KV survived the process: the first use re-encodes the document from its stored text...
        first_id = next(iter(outputs))
        first = chat(url, [{"id": first_id}])
        assert cached_tokens(first) == 0
        assert cached_tokens(chat(url, [{"id": first_id}])) >= listed[first_id]["num_tokens"]
        # ...and every answer given before the crash is given again.
        assert len(outputs) >= 3
        for doc_id, before in outputs.items():
            assert answer(chat(url, [{"id": doc_id}])) == before, doc_id
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            kill(proc)


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/shared/registry.sqlite"
    return request.getfixturevalue("postgres_url")


def test_two_servers_share_one_registry(shared_url):
    engine = dict(page_size=16, kv_cache_gb=0.05)
    a = start_server(engine, ServerConfig(model_name="tiny", registry_url=shared_url))
    b = start_server(engine, ServerConfig(model_name="tiny", registry_url=shared_url))
    try:
        doc = httpx.post(f"{a.url}/v1/documents", json={"title": "Shared", "text": "Registered on A."}, timeout=60)
        assert doc.status_code == 200, doc.text
        doc_id = doc.json()["id"]
        # B sees it: listed, readable, usable by id (encoded there on first use), with A's answer.
        assert [d["id"] for d in httpx.get(f"{b.url}/v1/documents").json()["data"]] == [doc_id]
        assert httpx.get(f"{b.url}/v1/documents/{doc_id}").json()["text"] == "Registered on A."
        on_b = chat(b.url, [{"id": doc_id}])
        assert cached_tokens(on_b) == 0 and answer(on_b) == answer(chat(a.url, [{"id": doc_id}]))
        # Scopes hold across servers: another cache_salt does not see it on either.
        assert httpx.get(f"{b.url}/v1/documents/{doc_id}", params={"cache_salt": "other"}).status_code == 404
        # Registering the same document on B gives A's id, one entry; deleting it on B deletes it for A.
        again = httpx.post(f"{b.url}/v1/documents", json={"title": "Shared", "text": "Registered on A."}, timeout=60)
        assert again.json()["id"] == doc_id and len(httpx.get(f"{a.url}/v1/documents").json()["data"]) == 1
        assert httpx.delete(f"{b.url}/v1/documents/{doc_id}", timeout=60).status_code == 200
        assert httpx.get(f"{a.url}/v1/documents/{doc_id}").status_code == 404
        assert chat(a.url, [{"id": doc_id}]).status_code == 404
        assert a.metric("lazyattn:registered_documents") == 0
    finally:
        stop_server(a)
        stop_server(b)


def test_serve_refuses_a_registry_from_a_newer_release_before_loading(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    engine = sa.create_engine(f"sqlite:///{state}/registry.sqlite")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE schema_version (version INTEGER NOT NULL)"))
        conn.execute(sa.text("INSERT INTO schema_version VALUES (:v)"), {"v": SCHEMA_VERSION + 1})
    engine.dispose()
    # A model that does not exist: the registry is checked first, so the error is the registry's.
    cmd = [sys.executable, "-m", "lazyattn", "serve", "--model", "/nonexistent/model", "--device", "cpu"]
    run = subprocess.run(
        [*cmd, "--port", str(_free_port()), "--state-dir", str(state)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 1, run.stderr
    assert f"has schema version {SCHEMA_VERSION + 1}, newer than this lazyattn knows" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_locked_database_does_not_stall_the_server(tmp_path):
    # Registry calls run in worker threads: while another process holds the SQLite write lock, a registration waits
    # for it and everything else is served meanwhile.
    path = tmp_path / "registry.sqlite"
    s = start_server(
        dict(page_size=16, kv_cache_gb=0.05), ServerConfig(model_name="tiny", registry_url=f"sqlite:///{path}")
    )
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # the write lock, as a second server in a long write would hold it
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(httpx.post, f"{s.url}/v1/documents", json={"text": "waits for the lock"}, timeout=60)
            time.sleep(1.0)  # time to tokenise, encode and reach the lock
            assert httpx.get(f"{s.url}/health", timeout=10).status_code == 200
            assert httpx.get(f"{s.url}/v1/documents", timeout=10).json()["data"] == []  # readers do not wait (WAL)
            assert answer(chat(s.url, ["an inline document"]))
            assert not pending.done()  # it cannot commit while the lock is held
            holder.execute("COMMIT")
            r = pending.result(60)
        assert r.status_code == 200, r.text
        assert [d["id"] for d in httpx.get(f"{s.url}/v1/documents").json()["data"]] == [r.json()["id"]]
    finally:
        holder.close()
        stop_server(s)
