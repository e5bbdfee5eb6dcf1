"""Priming the document cache before the steady-state points: the state a long-running server keeps it in.

After the engine's warm-up the cache is empty, and a point's warm-up (capped by the budget) may end while the cache
still fills: that point is then measured on a colder cache than every later one. Priming serves, unmeasured and at
saturation, requests of the trace's shape whose documents walk the pool's most popular documents, as many as fit
the KV pages (less the room that a few running requests need), so every point starts with them cached.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np

from lazyattn.bench.workload import Load, Trace, TraceRequest, WorkloadSpec
from lazyattn.bench.workloads import MEMBOUND_REQUESTS

_PRIME = 9  # the priming questions' random stream (workload.py and steady.py use 0..8)
# Requests in flight while priming: the engine is saturated, and only this many requests' own KV (block mode's
# private copies included) competes with the cached documents, the room `priming_documents` leaves them.
PRIME_CONCURRENCY = MEMBOUND_REQUESTS


@dataclass
class Primed:
    seconds: float
    documents: int  # pool documents the priming requests placed, the most popular ones
    requests: int
    kv_gib: float  # KV the document cache holds afterwards
    timed_out: bool = False  # the deadline stopped it before every request was served

    def to_dict(self) -> dict:
        return asdict(self)


def priming_documents(spec: WorkloadSpec, num_pages: int, page_size: int) -> int:
    """How many of the pool's documents the cache can hold next to PRIME_CONCURRENCY running requests' own KV
    (their documents included, for block mode's copies) and the system segment, each rounded up to whole pages."""

    def pages(tokens: int) -> int:
        return -(-tokens // page_size)

    doc_pages = pages(spec.doc_len)
    system = pages(spec.system_len + 1)
    request = spec.docs_per_request * doc_pages + system + pages(spec.question_len + spec.output_len)
    room = num_pages - system - PRIME_CONCURRENCY * request
    return max(0, min(spec.num_docs, room // doc_pages))


def priming_requests(spec: WorkloadSpec, count: int, vocab_high: int) -> list[TraceRequest]:
    """Requests of the spec's shape covering documents 0..count-1 (doc id = popularity rank - 1) in chunks of
    docs_per_request, the least popular chunk first: a long-running server's LRU order, the most popular documents
    the most recently used. The last chunk is filled up with the most popular documents it lacks."""
    if count <= 0:
        return []
    k = spec.docs_per_request
    rng = np.random.default_rng([spec.seed, _PRIME])
    chunks = []
    for start in range(0, count, k):
        chunk = list(range(start, min(start + k, count)))
        chunk += [d for d in range(spec.num_docs) if d not in chunk][: k - len(chunk)]
        chunks.append(chunk)
    return [
        TraceRequest(i, tuple(chunk), rng.integers(0, vocab_high, spec.question_len).tolist(), 0.0)
        for i, chunk in enumerate(reversed(chunks))
    ]


def prime_cache(engine, trace: Trace, vocab_high: int, *, deadline: float = math.inf) -> Primed:
    """Serve the priming requests on `engine` as its cache stands (nothing measured); stop at `deadline`
    (time.monotonic())."""
    from lazyattn.bench.replay import replay

    spec = trace.spec
    count = priming_documents(spec, engine.num_pages, engine.config.page_size)
    requests = priming_requests(spec, count, vocab_high)
    t0 = time.monotonic()
    timed_out = False
    if requests:
        load = Load(concurrency=PRIME_CONCURRENCY)
        run = replay(
            engine,
            Trace(spec, load, trace.system, trace.documents, requests),
            max_seconds=max(0.0, deadline - t0),
            cache="as_is",
        )
        timed_out = run.timed_out
    stats = engine.stats()
    return Primed(
        seconds=time.monotonic() - t0,
        documents=count,
        requests=len(requests),
        kv_gib=stats.cache.pages_in_use * stats.page_bytes / 2**30,
        timed_out=timed_out,
    )
