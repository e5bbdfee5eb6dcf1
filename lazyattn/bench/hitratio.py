"""Document-cache hit ratio versus KV budget, simulated: the trace's requests go one after another (concurrency
1) through the engine's own `DocumentCache` and `PagePool`, with the page accounting of the real model and no
model at all. So a sweep over budgets, skews and modes costs seconds of CPU at any model size.

The simulation takes the engine's steps for one request, in the engine's order (scheduler.py), so that it
matches a real engine run at concurrency 1 exactly (tests/bench checks this):
- lazy, block: acquire each segment (a miss allocates its pages, evicting LRU unreferenced segments);
  block then allocates private copies of every segment placed after position 0; then the final segment's
  pages; at the end release the segments last to first and free the private pages.
- prefix: acquire the prompt's full pages under chained keys until the first miss (pages from there on are
  computed by the request and cached too, unless an orphaned later page is found), then the rest privately.

What "KV budget" means. At Llama-3.1-8B in bf16 a token's KV is 128 KiB: one request of 5 x 2048-token
documents holds 1.25 GiB while it runs, 2.5 GiB in block mode (its private copies), so a 1 GB pool cannot
serve a single request. Two readings, both with the same pool for every mode (one GPU's memory):
- "pool": the pool is the budget (the engine's kv_cache_gb). A mode whose one request does not fit is N/A.
- "pool_plus_request": the pool is the budget plus one block request's working set (the most any mode needs
  for one request). Lazy and prefix keep as cached documents what block spends on its copies.

With a host tier (`host_gb`, docs/design.md "The host tier") evicted segments demote to host memory and a miss
that finds them there is a host hit: the hit ratio is then the effective one (GPU + host), split in the rows.
With a disk tier (`disk_gb`, docs/design.md "The disk tier"; lazy and block mode, as in the engine) every encoded
document is also written to disk, and a miss on the GPU and the host that finds it there is a disk hit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from lazyattn.bench.disk_sim import SimulatedDiskTier
from lazyattn.bench.workload import Load, Trace, WorkloadSpec, make_trace
from lazyattn.cache.document_cache import DocumentCache, Segment, segment_key
from lazyattn.cache.host_tier import HostTier
from lazyattn.cache.page_pool import PagePool, bytes_per_page
from lazyattn.engine.modes import make_mode
from lazyattn.kernels.paged import cdiv

POLICIES = ("pool", "pool_plus_request")
SIM_MODES = ("lazy", "block", "prefix")


@dataclass(frozen=True)
class PageAccounting:
    page_size: int
    page_bytes: int  # one page across all layers, K and V

    @property
    def token_bytes(self) -> int:
        return self.page_bytes // self.page_size


def page_accounting(model_config, page_size: int, dtype) -> PageAccounting:
    """The engine's page size in bytes for a lazyattn ModelConfig at `dtype` (Llama-3.1-8B in bf16: 128 KiB
    per token, 8 MiB per 64-token page)."""
    mc = model_config
    return PageAccounting(page_size, bytes_per_page(mc.num_layers, mc.num_kv_heads, mc.head_dim, page_size, dtype))


def working_set_pages(mode: str, spec: WorkloadSpec, system_len: int, page_size: int) -> int:
    """Pages one request of `spec` holds while it runs: its mode's page count (the engine's own formula)."""
    segment_lens = ([system_len] if system_len else []) + [spec.doc_len] * spec.docs_per_request
    return make_mode(mode).pages_needed(segment_lens, spec.question_len + spec.output_len, 1, page_size)


def pool_pages(budget_bytes: int, policy: str, spec: WorkloadSpec, system_len: int, acct: PageAccounting) -> int:
    """The KV pool (pages) every mode runs with at `budget_bytes` under `policy` (module docstring)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    pages = budget_bytes // acct.page_bytes
    if policy == "pool_plus_request":
        pages += working_set_pages("block", spec, system_len, acct.page_size)
    return pages


@dataclass(frozen=True)
class SimResult:
    mode: str
    num_pages: int
    requests: int
    docs: int
    doc_hits: float
    context_tokens: int
    cached_tokens: int
    evictions: int
    host_pages: int = 0
    host_doc_hits: float = 0.0  # of doc_hits, those served by the host tier
    disk_pages: int = 0
    disk_doc_hits: float = 0.0  # of doc_hits, those served by the disk tier

    @property
    def doc_hit_ratio(self) -> float:
        """Documents reused, from any tier."""
        return self.doc_hits / self.docs if self.docs else 0.0

    @property
    def host_hit_ratio(self) -> float:
        return self.host_doc_hits / self.docs if self.docs else 0.0

    @property
    def disk_hit_ratio(self) -> float:
        return self.disk_doc_hits / self.docs if self.docs else 0.0

    @property
    def gpu_hit_ratio(self) -> float:
        return self.doc_hit_ratio - self.host_hit_ratio - self.disk_hit_ratio

    @property
    def token_reuse_ratio(self) -> float:
        return self.cached_tokens / self.context_tokens if self.context_tokens else 0.0

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "doc_hit_ratio": self.doc_hit_ratio,
            "token_reuse_ratio": self.token_reuse_ratio,
            "gpu_hit_ratio": self.gpu_hit_ratio,
            "host_hit_ratio": self.host_hit_ratio,
            "disk_hit_ratio": self.disk_hit_ratio,
        }


class TraceKeys:
    """Cache keys of a trace's requests, computed once and shared by every budget and mode: per request, its
    segments' keys (lazy, block) and its prompt's chained page keys (prefix). Content-addressed like the
    engine's keys, so equal documents get equal keys and nothing else does."""

    def __init__(self, trace: Trace, page_size: int) -> None:
        self.page_size = page_size
        by_tokens: dict[tuple[int, ...], str] = {}
        self.segments: list[list[tuple[str, int]]] = []  # (key, tokens) per segment
        self.pages: list[list[str]] = []  # chained key of each full prompt page but the one holding the last token
        self.prompt_len: list[int] = []
        for req in trace.requests:
            prompt = trace.prompt(req)
            keys = []
            for seg in prompt.segments:
                t = tuple(seg)
                if t not in by_tokens:
                    by_tokens[t] = segment_key("sim", "rope", None, t)
                keys.append((by_tokens[t], len(seg)))
            self.segments.append(keys)
            tokens = prompt.token_ids
            chain, parent = [], None
            for b in range((len(tokens) - 1) // page_size):  # the last token is never cached: its logits are needed
                parent = segment_key("sim", "rope", None, tokens[b * page_size : (b + 1) * page_size], parent)
                chain.append(parent)
            self.pages.append(chain)
            self.prompt_len.append(len(tokens))


def simulate(
    trace: Trace,
    mode: str,
    num_pages: int,
    page_size: int,
    keys: TraceKeys | None = None,
    host_pages: int = 0,
    disk_pages: int = 0,
) -> SimResult:
    """Replay `trace` one request at a time through a cache of `num_pages` pages, with a host tier of `host_pages`
    pages behind it and a disk tier of `disk_pages` pages below that (0: none; lazy and block mode only)."""
    if mode not in SIM_MODES:
        raise ValueError(f"mode must be one of {SIM_MODES}, got {mode!r}")
    m = make_mode(mode)
    keys = keys if keys is not None and keys.page_size == page_size else TraceKeys(trace, page_size)
    pool = PagePool(num_pages)
    # Bookkeeping only (no mover): a promotion lands at the next poll. Bytes are not reported here.
    disk_pages = disk_pages if m.caches_documents else 0  # the engine's disk tier holds position-free KV only
    disk = SimulatedDiskTier(disk_pages) if disk_pages else None
    cache = DocumentCache(pool, page_size, HostTier(host_pages, page_bytes=1) if host_pages else None, disk)
    spec = trace.spec
    fed_back = spec.output_len - 1  # output tokens fed back as decode rows (the last one is not)
    docs = context = cached_total = 0
    hits = host_hits = disk_hits = 0.0
    for i, req in enumerate(trace.requests):
        before = cache.stats()
        if m.caches_documents:
            cached = _segment_request(cache, pool, keys.segments[i], spec.question_len + fed_back, m.copies)
        else:
            cached = _prefix_request(cache, pool, keys.pages[i], keys.prompt_len[i], fed_back)
        after = cache.stats()
        from_host = after.host_tokens_reused - before.host_tokens_reused
        from_disk = after.disk_tokens_reused - before.disk_tokens_reused
        n = len(req.doc_ids)
        reused = m.reused_documents(cached, trace.system_len, spec.doc_len, n)
        below_gpu = m.reused_documents(cached - from_host, trace.system_len, spec.doc_len, n)
        docs += n
        hits += reused
        host_hits += reused - below_gpu
        disk_hits += below_gpu - m.reused_documents(cached - from_host - from_disk, trace.system_len, spec.doc_len, n)
        context += keys.prompt_len[i]
        cached_total += cached
    return SimResult(
        mode,
        num_pages,
        len(trace.requests),
        docs,
        hits,
        context,
        cached_total,
        cache.stats().evictions,
        host_pages,
        host_hits,
        disk_pages,
        disk_hits,
    )


def _segment_request(
    cache: DocumentCache, pool: PagePool, segments: list[tuple[str, int]], run_tokens: int, block: bool
) -> int:
    held: list[tuple[Segment, int]] = []
    start = cached = 0
    for key, n in segments:
        seg, is_new = cache.acquire(key, n)
        if is_new:
            cache.mark_ready(seg)  # its encode finishes before the request does
        else:
            cached += n
        held.append((seg, start))
        start += n
    cache.poll()  # promotions from the host tier land, as in the scheduler's step
    copies = cache.allocate(sum(len(s.pages) for s, at in held if at > 0)) if block else []
    own = cache.allocate(cdiv(run_tokens, cache.page_size))
    for seg, _ in reversed(held):
        cache.release(seg)
    pool.free(own)
    pool.free(copies)
    return cached


def _prefix_request(cache: DocumentCache, pool: PagePool, chain: list[str], prompt_len: int, fed_back: int) -> int:
    ps = cache.page_size
    parts: list[tuple[Segment, bool]] = []
    first_owned = None
    for b, page_key in enumerate(chain):
        if first_owned is not None and cache.contains(page_key):
            break  # an orphan left after its parent was evicted: the rest stays private
        seg, is_new = cache.acquire(page_key, ps)
        parts.append((seg, is_new))
        if is_new and first_owned is None:
            first_owned = b
    cache.poll()
    start = (first_owned if first_owned is not None else len(parts)) * ps
    owned = sum(1 for _, is_new in parts if is_new)
    own = cache.allocate(cdiv(prompt_len - start + fed_back, ps) - owned)
    for seg, is_new in parts:
        if is_new:
            cache.mark_ready(seg)
    for seg, _ in reversed(parts):
        cache.release(seg)
    pool.free(own)
    return sum(ps for _, is_new in parts if not is_new)


def sweep(
    spec: WorkloadSpec,
    alphas: Sequence[float | None],
    budgets_gb: Sequence[float],
    acct: PageAccounting,
    vocab_high: int,
    bos: int | None,
    modes: Sequence[str] = SIM_MODES,
    policies: Sequence[str] = POLICIES,
    host_gb: float = 0.0,
    disk_gb: float = 0.0,
) -> list[dict]:
    """Simulated hit ratio of every (policy, alpha, budget, mode); one trace per alpha (None: uniform).
    GB are GiB (2**30 bytes), as the engine's kv_cache_gb; `host_gb` is the host tier behind every GPU budget,
    `disk_gb` the disk tier below it.
    A pool too small for one request: ratio None."""
    host_pages = int(host_gb * 2**30) // acct.page_bytes
    disk_pages = int(disk_gb * 2**30) // acct.page_bytes
    rows = []
    for alpha in alphas:
        trace = make_trace(replace(spec, zipf_alpha=alpha), Load(concurrency=1), vocab_high, bos)
        keys = TraceKeys(trace, acct.page_size)
        for policy in policies:
            for budget in budgets_gb:
                pages = pool_pages(int(budget * 2**30), policy, spec, trace.system_len, acct)
                for mode in modes:
                    row = {
                        "policy": policy,
                        "alpha": alpha,
                        "budget_gb": budget,
                        "pool_gb": pages * acct.page_bytes / 2**30,
                        "host_gb": host_gb,
                        "disk_gb": disk_gb,
                        "mode": mode,
                        "doc_hit_ratio": None,
                        "token_reuse_ratio": None,
                        "gpu_hit_ratio": None,
                        "host_hit_ratio": None,
                        "disk_hit_ratio": None,
                    }
                    if pages >= working_set_pages(mode, spec, trace.system_len, acct.page_size):
                        row.update(simulate(trace, mode, pages, acct.page_size, keys, host_pages, disk_pages).to_dict())
                    rows.append(row)
    return rows


def pivot(rows: Sequence[dict], modes: Sequence[str] = SIM_MODES) -> list[dict]:
    """One row per (policy, alpha, budget) with each mode's hit ratio and pool, for the tables."""
    out: dict[tuple, dict] = {}
    for r in rows:
        key = (r["policy"], r["alpha"], r["budget_gb"])
        row = out.setdefault(
            key,
            {
                "policy": r["policy"],
                "skew": "uniform" if r["alpha"] is None else f"zipf {r['alpha']:g}",
                "budget_gb": r["budget_gb"],
            },
        )
        row["pool_gb"] = r["pool_gb"]
        for column, field in (
            ("hit", "doc_hit_ratio"),
            ("gpu", "gpu_hit_ratio"),
            ("host", "host_hit_ratio"),
            ("disk", "disk_hit_ratio"),
        ):
            value = r.get(field)
            row[f"{r['mode']}_{column}"] = None if value is None else 100 * value
    return list(out.values())


HIT_COLUMNS = [
    ("policy", "policy", "{}"),
    ("skew", "skew", "{}"),
    ("budget GB", "budget_gb", "{:g}"),
    ("pool GiB", "pool_gb", "{:.3g}"),
] + [(f"{m} hit %", f"{m}_hit", "{:.2f}") for m in SIM_MODES]
# With a host tier: per mode the GPU hits, the host hits and the effective ratio (their sum).
HOST_HIT_COLUMNS = HIT_COLUMNS[:4] + [
    (f"{m} {what} %", f"{m}_{key}", "{:.2f}")
    for m in SIM_MODES
    for what, key in (("GPU", "gpu"), ("host", "host"), ("eff", "hit"))
]
# With a disk tier too: per mode the GPU, host and disk hits and the effective ratio.
DISK_HIT_COLUMNS = HIT_COLUMNS[:4] + [
    (f"{m} {what} %", f"{m}_{key}", "{:.2f}")
    for m in SIM_MODES
    for what, key in (("GPU", "gpu"), ("host", "host"), ("disk", "disk"), ("eff", "hit"))
]
