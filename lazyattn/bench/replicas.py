"""Replicas behind a router, simulated: the trace's requests arrive (Poisson), a routing policy picks a
replica, and each replica is the engine's own `DocumentCache` and `PagePool` (as in bench/hitratio.py, one
request at a time), so a sweep over 1-64 replicas and every policy costs seconds of CPU.

The policies are the ones the Ray Serve router runs (`lazyattn.cluster.policy`): same objects, same inputs
(`RouteKey`s, loads in requests in flight), same view of what each replica caches.

Load. Each replica serves its requests in arrival order, each taking `fixed_s + miss_tokens * token_s`: a
cost model of one GPU (defaults: ~10 ms of question prefill and decode per request, 25 us per re-encoded
document token, about an 8B model's prefill on an H100). A replica's load, as the router sees it, is the
number of its requests not yet finished. Load imbalance is the busiest replica's busy time over the mean.
The model only decides loads, hence what the load bound does; the hit ratios come from the caches.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from lazyattn.bench.hitratio import PageAccounting, TraceKeys, _segment_request, simulate, working_set_pages
from lazyattn.bench.workload import Load, Trace, WorkloadSpec, make_trace
from lazyattn.cache.document_cache import DocumentCache
from lazyattn.cache.page_pool import PagePool
from lazyattn.cluster.keys import prefix_keys
from lazyattn.cluster.policy import DEFAULT_LOAD_MARGIN, POLICIES, RoutedDocument, RouteKey, make_policy
from lazyattn.engine.modes import make_mode

# name -> (Zipf alpha or None for uniform, documents shuffled per request)
VARIANTS = {
    "paper": (2.1, True),  # docs/design.md, Benchmark protocol
    "zipf-1.1": (1.1, True),  # a flatter popularity: more distinct documents in play
    "uniform": (None, True),  # no hot documents at all
    "pool-order": (2.1, False),  # documents in a fixed order: the case token-prefix routing is built for
}


@dataclass(frozen=True)
class CostModel:
    fixed_s: float = 0.010
    token_s: float = 25e-6

    def service_s(self, miss_tokens: int) -> float:
        return self.fixed_s + miss_tokens * self.token_s


@dataclass(frozen=True)
class ReplicaSimResult:
    variant: str
    replicas: int
    policy: str
    requests: int
    doc_hit_ratio: float
    token_reuse_ratio: float
    busy_imbalance: float  # max / mean busy time over replicas
    request_imbalance: float  # max / mean requests over replicas
    mean_latency_s: float  # arrival to finish, in the cost model
    single_engine_hit_ratio: float  # one engine with the cluster's total KV, same trace

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def route_keys(trace: Trace, keys: TraceKeys, page_tokens: int) -> list[RouteKey]:
    """The trace's RouteKeys, built from the same segment keys the simulated caches use (one tenant)."""
    out = []
    for i, req in enumerate(trace.requests):
        docs = tuple(RoutedDocument(k, n) for k, n in keys.segments[i])
        out.append(RouteKey(docs, prefix_keys(None, trace.prompt(req).token_ids, page_tokens), page_tokens))
    return out


def simulate_cluster(
    trace: Trace,
    keys: TraceKeys,
    routes: Sequence[RouteKey],
    policy_name: str,
    replicas: int,
    pages_per_replica: int,
    cost: CostModel = CostModel(),
    load_margin: int = DEFAULT_LOAD_MARGIN,
    variant: str = "",
    single_engine_hit_ratio: float = math.nan,
) -> ReplicaSimResult:
    """Replay `trace` over `replicas` simulated lazy-mode engines of `pages_per_replica` pages each."""
    mode = make_mode("lazy")
    spec = trace.spec
    page_size = keys.page_size
    policy = make_policy(policy_name, load_margin)
    names = [f"replica-{i}" for i in range(replicas)]
    caches, pools = {}, {}
    for name in names:
        pools[name] = PagePool(pages_per_replica)
        caches[name] = DocumentCache(pools[name], page_size)
        policy.set_capacity(name, pages_per_replica * page_size)
    finishing: dict[str, list[float]] = {n: [] for n in names}  # finish times of requests not yet done
    free_at = dict.fromkeys(names, 0.0)
    busy = dict.fromkeys(names, 0.0)
    served = dict.fromkeys(names, 0)
    run_tokens = spec.question_len + spec.output_len - 1
    docs = context = cached_total = 0
    hits = latency = 0.0
    for i, req in enumerate(trace.requests):
        now = req.arrival
        for n in names:
            while finishing[n] and finishing[n][0] <= now:
                heapq.heappop(finishing[n])
        decision = policy.choose(routes[i], {n: len(finishing[n]) for n in names})
        r = decision.replica
        policy.routed(routes[i], r)
        cached = _segment_request(caches[r], pools[r], keys.segments[i], run_tokens, False)
        service = cost.service_s(keys.prompt_len[i] - cached)
        start = max(now, free_at[r])
        free_at[r] = start + service
        heapq.heappush(finishing[r], free_at[r])
        busy[r] += service
        served[r] += 1
        latency += free_at[r] - now
        docs += len(req.doc_ids)
        hits += mode.reused_documents(cached, trace.system_len, spec.doc_len, len(req.doc_ids))
        context += keys.prompt_len[i]
        cached_total += cached
    n_req = len(trace.requests)
    mean_busy = sum(busy.values()) / replicas
    return ReplicaSimResult(
        variant=variant,
        replicas=replicas,
        policy=policy_name,
        requests=n_req,
        doc_hit_ratio=hits / docs if docs else 0.0,
        token_reuse_ratio=cached_total / context if context else 0.0,
        busy_imbalance=max(busy.values()) / mean_busy if mean_busy else 1.0,
        request_imbalance=max(served.values()) / (n_req / replicas) if n_req else 1.0,
        mean_latency_s=latency / n_req if n_req else 0.0,
        single_engine_hit_ratio=single_engine_hit_ratio,
    )


def sweep_replicas(
    spec: WorkloadSpec,
    variants: Sequence[str],
    replica_counts: Sequence[int],
    policies: Sequence[str],
    kv_gb_per_replica: float,
    acct: PageAccounting,
    vocab_high: int,
    bos: int | None,
    rate_per_replica: float = 8.0,
    cost: CostModel = CostModel(),
    load_margin: int = DEFAULT_LOAD_MARGIN,
) -> list[dict]:
    """Every (variant, replica count, policy); Poisson arrivals at `rate_per_replica` x replicas. GB are GiB.
    The pool of each replica: the budget plus one request's working set (bench/hitratio.py, pool_plus_request),
    so that a budget below one request's size still runs."""
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        raise ValueError(f"unknown routing policy {', '.join(bad)}; choose from {', '.join(POLICIES)}")
    rows = []
    for variant in variants:
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
        alpha, shuffle = VARIANTS[variant]
        vspec = replace(spec, zipf_alpha=alpha, shuffle=shuffle)
        base = make_trace(vspec, Load(rate=1.0), vocab_high, bos)  # arrivals rescaled per replica count below
        keys = TraceKeys(base, acct.page_size)
        routes = route_keys(base, keys, acct.page_size)
        pages = int(kv_gb_per_replica * 2**30) // acct.page_bytes + working_set_pages(
            "lazy", vspec, base.system_len, acct.page_size
        )
        for n in replica_counts:
            rate = rate_per_replica * n
            trace = Trace(
                base.spec,
                Load(rate=rate),
                base.system,
                base.documents,
                [replace(r, arrival=r.arrival / rate) for r in base.requests],
            )
            single = simulate(trace, "lazy", pages * n, acct.page_size, keys).doc_hit_ratio
            for policy in policies:
                rows.append(
                    simulate_cluster(
                        trace, keys, routes, policy, n, pages, cost, load_margin, variant, single
                    ).to_dict()
                )
    return rows


REPLICA_COLUMNS = [
    ("variant", "variant", "{}"),
    ("replicas", "replicas", "{}"),
    ("policy", "policy", "{}"),
    ("hit %", "doc_hit_ratio_pct", "{:.1f}"),
    ("1 engine, same KV %", "single_pct", "{:.1f}"),
    ("busy max/mean", "busy_imbalance", "{:.2f}"),
    ("requests max/mean", "request_imbalance", "{:.2f}"),
    ("latency ms", "latency_ms", "{:.0f}"),
]


def table_rows(rows: Sequence[dict]) -> list[dict]:
    return [
        {
            **r,
            "doc_hit_ratio_pct": 100 * r["doc_hit_ratio"],
            "single_pct": 100 * r["single_engine_hit_ratio"],
            "latency_ms": 1000 * r["mean_latency_s"],
        }
        for r in rows
    ]
