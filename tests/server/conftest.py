"""Real uvicorn servers on 127.0.0.1 (a free port each), serving the built-in tiny model on the CPU.

Each server runs in a background thread of the test process and is shut down at the end of the session.
Two are shared by the tests: `server` (open, lazy mode) and `keyed_server` (two API keys, one running sequence
and one waiting slot, so a third concurrent request overflows the queue).
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from lazyattn.engine.config import EngineConfig
from lazyattn.engine.llm_engine import LLMEngine
from lazyattn.server import ServerConfig, create_app

KEYS = ("key-a", "key-b")


@dataclass
class RunningServer:
    url: str
    server: uvicorn.Server
    thread: threading.Thread
    engine: LLMEngine

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """(sample name, labels other than model_name) -> value, from GET /metrics."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
                out[(s.name, labels)] = s.value
        return out

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics().get((name, tuple(sorted(labels.items()))), 0.0)

    def wait_for(self, predicate, timeout: float = 20.0, what: str = "condition") -> dict:
        """Poll /metrics until predicate(metrics) holds."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if predicate(m):
                return m
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out waiting for {what}; metrics: "
                    f"{ {k[0]: v for k, v in m.items() if 'bucket' not in k[0]} }"
                )
            time.sleep(0.05)

    def idle(self, timeout: float = 20.0) -> dict:
        """Wait until nothing runs or waits and every allocated page belongs to the document cache."""
        return self.wait_for(
            lambda m: (
                m[("lazyattn:num_requests_running", ())] == 0
                and m[("lazyattn:num_requests_waiting", ())] == 0
                and m[("lazyattn:kv_cache_pages_used", ())] == m[("lazyattn:document_cache_pages", ())]
            ),
            timeout,
            "an idle engine with only cached pages allocated",
        )


def start_server(engine_options: dict, config: ServerConfig) -> RunningServer:
    engine = LLMEngine(EngineConfig(**{"model": "tiny", "device": "cpu", "progress": False, **engine_options}))
    app = create_app(engine, config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))  # the kernel picks a free port; uvicorn serves on this very socket (no race)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    return RunningServer(f"http://127.0.0.1:{port}", server, thread, engine)


def stop_server(s: RunningServer) -> None:
    s.server.should_exit = True
    s.thread.join(30)
    assert not s.thread.is_alive(), "the test server did not shut down"


# A small KV pool (0.05 GB, ~400 pages of 16 tokens) keeps each engine's allocation light.
_ENGINE = dict(page_size=16, kv_cache_gb=0.05)


@pytest.fixture(scope="session")
def server():
    s = start_server({**_ENGINE, "max_waiting": 64}, ServerConfig(model_name="tiny"))
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def keyed_server():
    s = start_server({**_ENGINE, "max_num_seqs": 1, "max_waiting": 1}, ServerConfig(model_name="tiny", api_keys=KEYS))
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server the tests start themselves (tests/server/postgres.py); skips only where none can start."""
    from tests.server.postgres import postgres_server

    with postgres_server() as (server, reason):
        yield server, reason


@pytest.fixture
def postgres_url(postgres) -> str:
    """A fresh database on that server."""
    server, reason = postgres
    if server is None:
        pytest.skip(reason)
    return server.new_database()
