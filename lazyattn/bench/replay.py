"""Replaying a trace through one engine in real time, and the engine's life around it.

One loop drives the engine the way a server's background thread does: add every request whose arrival time
has passed (with that arrival time, so TTFT counts queueing), call `engine.step()`, timestamp the tokens it
hands out. Saturation submits everything at t=0; a closed loop keeps N requests in flight and a request
"arrives" when it is sent. Each point starts from an empty document cache, so every mode and every point
sees the same cold start.
"""

from __future__ import annotations

import gc
import math
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tqdm import tqdm

from lazyattn.bench.metrics import EngineCounters, RequestRecord, Summary, summarize
from lazyattn.bench.workload import Load, Trace, WorkloadSpec
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.llm_engine import LLMEngine
from lazyattn.engine.outputs import RequestOutput
from lazyattn.engine.sampling import SamplingParams


@dataclass
class PointRun:
    mode: str
    spec: WorkloadSpec
    load: Load
    records: list[RequestRecord]
    counters: EngineCounters
    wall_s: float
    timed_out: bool = False

    @property
    def summary(self) -> Summary:
        return summarize(self.records, self.counters)


def document_hits(mode: str, cached_tokens: int, system_len: int, doc_len: int, num_docs: int) -> float:
    """Documents of a request found in the cache, from the engine's count of cached context tokens.

    lazy/block cache whole segments: cached = (system_len if the system segment hit) + hits * doc_len, and
    system_len < doc_len, so the floor division is exact. prefix reuses a token prefix in whole pages, which
    may end inside a document (always, once BOS shifts documents off page boundaries): its hits are the
    reused share of the document tokens, in documents.
    """
    if mode in ("lazy", "block"):
        return min(cached_tokens // doc_len, num_docs)
    if mode == "prefix":
        return max(0.0, min(float(num_docs), (cached_tokens - system_len) / doc_len))
    return 0


def make_engine(options: dict, mode: str) -> LLMEngine:
    return LLMEngine(EngineConfig(**{**options, "mode": mode, "progress": False}))


def free_device_memory() -> None:
    """Call after dropping the last reference to an engine, before building the next one."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def reset(engine: LLMEngine) -> None:
    """Empty the document cache and restart the peak-memory count (the engine must be idle)."""
    if engine.has_unfinished():
        raise RuntimeError("the engine still has requests; a point must start from an idle engine")
    engine.cache.clear()
    engine.pool.reset_high_water()


@contextmanager
def kv_budget(engine: LLMEngine, num_pages: int) -> Iterator[None]:
    """Run with only `num_pages` pages of the engine's pool usable: the rest are taken out of the pool up
    front, as if the pool were that small. The scheduler and the cache see exactly a smaller pool (they only
    ever allocate free pages), without loading the model again for every budget."""
    reset(engine)
    if not 0 < num_pages <= engine.pool.num_pages:
        raise ValueError(f"a budget of {num_pages} pages does not fit the pool of {engine.pool.num_pages}")
    held = engine.pool.allocate(engine.pool.num_pages - num_pages)
    try:
        yield
    finally:
        if not engine.has_unfinished():
            reset(engine)
        engine.pool.free(held)


def warm_up(engine: LLMEngine, trace: Trace) -> None:
    """The first request alone, then the rest together (kernels compiled and autotuned for single and batched
    shapes, block mode's copies included), then an empty cache."""
    first = Trace(trace.spec, trace.load, trace.system, trace.documents, trace.requests[:1])
    rest = Trace(trace.spec, trace.load, trace.system, trace.documents, trace.requests[1:])
    for part in (first, rest):
        if part.requests:
            replay(engine, part)
    reset(engine)


def replay(engine: LLMEngine, trace: Trace, *, max_seconds: float = math.inf, progress: bool = False,
           desc: str = "") -> PointRun:
    """Serve `trace` on `engine` in real time. Requests still running after `max_seconds` are aborted and
    left unfinished (the run is marked timed out)."""
    reset(engine)
    spec, load, mode = trace.spec, trace.load, engine.config.mode
    base_used = engine.pool.num_used  # pages held outside the cache (kv_budget)
    before = engine.stats()
    params = SamplingParams(max_tokens=spec.output_len, temperature=0.0, ignore_eos=True)
    records = {r.index: RequestRecord(r.index, r.arrival, num_docs=len(r.doc_ids),
                                      context_tokens=trace.system_len + len(r.doc_ids) * spec.doc_len
                                      + len(r.question))
               for r in trace.requests}
    pending = deque(sorted(trace.requests, key=lambda r: r.arrival))
    in_flight: dict[str, int] = {}
    timed_out = False
    bar = tqdm(total=len(records), desc=desc or f"{mode} {load.label}", disable=not progress, dynamic_ncols=True,
               leave=False)
    t0 = time.monotonic()
    try:
        while pending or in_flight:
            now = time.monotonic() - t0
            if now > max_seconds:
                timed_out = True
                for rid, i in list(in_flight.items()):
                    _settle(records[i], engine.abort(rid), mode, trace)
                break
            while pending and (len(in_flight) < load.concurrency if load.concurrency is not None
                               else pending[0].arrival <= now):
                req = pending.popleft()
                if load.concurrency is not None:
                    records[req.index].arrival = now  # closed loop: a request arrives when it is sent
                rid = f"bench-{req.index}"
                engine.add_request(rid, trace.prompt(req), params, arrival=t0 + records[req.index].arrival)
                in_flight[rid] = req.index
            if not in_flight:
                time.sleep(max(0.0, min(pending[0].arrival, max_seconds) - now))
                continue
            outs = engine.step()
            t = time.monotonic() - t0
            for out in outs:
                i = in_flight.get(out.request_id)
                if i is None:
                    continue
                rec = records[i]
                rec.token_times += [t] * (len(out.outputs[0].token_ids) - len(rec.token_times))
                if out.finished:
                    _settle(rec, out, mode, trace)
                    del in_flight[out.request_id]
                    bar.update(1)
    except BaseException:
        for rid in in_flight:
            engine.abort(rid)
        raise
    finally:
        bar.close()
    wall = time.monotonic() - t0
    after = engine.stats()
    counters = EngineCounters(
        rows_computed=after.prefilled_tokens - before.prefilled_tokens,
        preemptions=after.preemptions - before.preemptions,
        evictions=after.cache.evictions - before.cache.evictions,
        peak_kv_bytes=(engine.pool.high_water - base_used) * engine.page_bytes,
        pool_bytes=(engine.pool.num_pages - base_used) * engine.page_bytes,
    )
    return PointRun(mode, spec, load, list(records.values()), counters, wall, timed_out)


def _settle(rec: RequestRecord, out: RequestOutput | None, mode: str, trace: Trace) -> None:
    if out is None:
        return
    rec.finished = out.finished and out.finish_reason != "abort"
    if out.metrics is not None:
        rec.cached_tokens = out.metrics.cached_tokens
        rec.prefilled_tokens = out.metrics.prefilled_tokens
        rec.doc_hits = document_hits(mode, rec.cached_tokens, trace.system_len, trace.spec.doc_len, rec.num_docs)
