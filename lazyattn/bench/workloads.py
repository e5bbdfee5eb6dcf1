"""The named workloads of the steady-state protocol (docs/benchmarks.md, "Steady state"). Plain Python: the CLI
reads the names while building its parser, before torch is imported."""

from __future__ import annotations

import math

# name: (num_docs, doc_len, docs_per_request, zipf_alpha); the smoke shapes fit the tiny model's 4096 tokens.
WORKLOADS = {
    "paper": (100, 2048, 5, 2.1),  # the published LazyAttention protocol
    "wide": (200, 512, 10, 1.5),  # many short documents, flatter popularity
    "long": (20, 16384, 2, 2.1),  # few long documents
}
SMOKE_WORKLOADS = {"paper": (20, 64, 5, 2.1), "wide": (40, 32, 10, 1.5), "long": (8, 512, 2, 2.1)}
MEMBOUND = "-membound"
# A memory-bound budget holds this share of the pool's documents, plus room for this many requests' own KV
# (their documents included: block mode's private copies).
MEMBOUND_POOL_SHARE = 0.25
MEMBOUND_REQUESTS = 4


def workload_names() -> list[str]:
    return [n + suffix for n in WORKLOADS for suffix in ("", MEMBOUND)]


def named_workload(name: str, smoke: bool = False) -> tuple[int, int, int, float]:
    """(num_docs, doc_len, docs_per_request, zipf_alpha) of a named workload ('-membound' variants included)."""
    base = name.removesuffix(MEMBOUND)
    table = SMOKE_WORKLOADS if smoke else WORKLOADS
    if base not in table:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(workload_names())}")
    return table[base]


def membound_kv_gb(spec, token_bytes: int, page_size: int) -> float:
    """A KV budget (GiB) small enough that memory binds: MEMBOUND_POOL_SHARE of the pool's documents plus
    MEMBOUND_REQUESTS requests' whole context, each segment rounded up to whole pages as the cache stores it."""

    def pages(tokens: int) -> int:
        return -(-tokens // page_size)

    doc_pages = pages(spec.doc_len)
    own = pages(spec.system_len + 1) + pages(spec.question_len + spec.output_len)
    request_pages = spec.docs_per_request * doc_pages + own
    total = math.ceil(MEMBOUND_POOL_SHARE * spec.num_docs) * doc_pages + MEMBOUND_REQUESTS * request_pages
    return total * page_size * token_bytes / 2**30
