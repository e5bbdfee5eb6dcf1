"""Replaying a trace through one engine in real time, and the engine's life around it.

One loop drives the engine the way a server's background thread does: add every request whose arrival time
has passed (with that arrival time, so TTFT counts queueing), call `engine.step()`, timestamp the tokens it
hands out. Saturation submits everything at t=0; a closed loop keeps N requests in flight and a request
"arrives" when it is sent. Each point starts from an empty document cache, so every mode and every point
sees the same cold start; with cache="warm" a point first serves its trace once unmeasured and is measured
on the cache that pass left (the steady state of a server whose documents are already cached).
"""

from __future__ import annotations

import gc
import math
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tqdm import tqdm

from lazyattn.bench.metrics import EngineCounters, RequestRecord, Summary, summarize
from lazyattn.bench.workload import Load, Trace, WorkloadSpec
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.llm_engine import LLMEngine
from lazyattn.engine.modes import Mode
from lazyattn.engine.outputs import RequestOutput
from lazyattn.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from lazyattn.bench.trace import TraceRecorder


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


@contextmanager
def kv_budget(engine: LLMEngine, num_pages: int) -> Iterator[None]:
    """Run with only `num_pages` pages of the engine's pool usable (LLMEngine.set_kv_budget), then all again."""
    engine.set_kv_budget(num_pages)
    try:
        yield
    finally:
        if not engine.has_unfinished():
            engine.set_kv_budget(None)


def warm_up(engine: LLMEngine, trace: Trace) -> None:
    """The benchmark protocol's discarded requests: the first alone, then the rest together, then an empty cache.
    (The engine compiled its kernels and captured its graphs at start-up; these settle what depends on the
    workload's own shapes, such as the allocator's pools, before anything is measured.)"""
    first = Trace(trace.spec, trace.load, trace.system, trace.documents, trace.requests[:1])
    rest = Trace(trace.spec, trace.load, trace.system, trace.documents, trace.requests[1:])
    for part in (first, rest):
        if part.requests:
            replay(engine, part)
    engine.reset_cache()


def replay(
    engine: LLMEngine,
    trace: Trace,
    *,
    max_seconds: float = math.inf,
    progress: bool = False,
    desc: str = "",
    cache: str = "cold",
    recorder: TraceRecorder | None = None,
) -> PointRun:
    """Serve `trace` on `engine` in real time. Requests still running after `max_seconds` are aborted and
    left unfinished (the run is marked timed out). The document cache starts `cold` (empty), `warm` (as one
    unmeasured pass of the same trace left it) or `as_is` (whatever it holds: documents registered ahead,
    `python -m benchmarks.host_tier`). `recorder`: traces the measured pass (bench/trace.py)."""
    if cache not in ("cold", "warm", "as_is"):
        raise ValueError(f"cache must be 'cold', 'warm' or 'as_is', not {cache!r}")
    if cache != "as_is":
        engine.reset_cache()
    if cache == "warm":
        _serve(engine, trace, max_seconds, False, f"{desc} (warming the cache)")
    return _serve(engine, trace, max_seconds, progress, desc, recorder)


def _serve(
    engine: LLMEngine,
    trace: Trace,
    max_seconds: float,
    progress: bool,
    desc: str,
    recorder: TraceRecorder | None = None,
) -> PointRun:
    spec, load, mode = trace.spec, trace.load, engine.mode
    before = engine.stats()
    params = SamplingParams(max_tokens=spec.output_len, temperature=0.0, ignore_eos=True)
    records = {
        r.index: RequestRecord(
            r.index,
            r.arrival,
            num_docs=len(r.doc_ids),
            context_tokens=trace.system_len + len(r.doc_ids) * spec.doc_len + len(r.question),
        )
        for r in trace.requests
    }
    pending = deque(sorted(trace.requests, key=lambda r: r.arrival))
    in_flight: dict[str, int] = {}
    timed_out = False
    bar = tqdm(
        total=len(records),
        desc=desc or f"{mode.name} {load.label}",
        disable=not progress,
        dynamic_ncols=True,
        leave=False,
    )
    t0 = time.monotonic()
    if recorder is not None:
        recorder.start(engine, t0)
    try:
        while pending or in_flight:
            now = time.monotonic() - t0
            if now > max_seconds:
                timed_out = True
                for rid, i in list(in_flight.items()):
                    _settle(records[i], engine.abort(rid), mode, trace)
                break
            while pending and (
                len(in_flight) < load.concurrency if load.concurrency is not None else pending[0].arrival <= now
            ):
                req = pending.popleft()
                if load.concurrency is not None:
                    records[req.index].arrival = now  # closed loop: a request arrives when it is sent
                rid = f"bench-{req.index}"
                engine.add_request(rid, trace.prompt(req), params, arrival=t0 + records[req.index].arrival)
                in_flight[rid] = req.index
            if not in_flight:
                time.sleep(max(0.0, min(pending[0].arrival, max_seconds) - now))
                continue
            _, read = step_records(engine, t0, in_flight, records, trace)
            bar.update(sum(finished for _, _, finished in read))
    except BaseException:
        for rid in in_flight:
            engine.abort(rid)
        raise
    finally:
        bar.close()
        if recorder is not None:
            recorder.stop(engine)
    wall = time.monotonic() - t0
    if recorder is not None:
        recorder.add_window(f"{mode.name} {load.label}", records, 0.0, wall)
    after = engine.stats()
    counters = EngineCounters(
        rows_computed=after.prefilled_tokens + after.decoded_tokens - before.prefilled_tokens - before.decoded_tokens,
        preemptions=after.preemptions - before.preemptions,
        evictions=after.cache.evictions - before.cache.evictions,
        peak_kv_bytes=after.pages_high_water * after.page_bytes,
        pool_bytes=after.num_pages * after.page_bytes,
    )
    return PointRun(mode.name, spec, load, list(records.values()), counters, wall, timed_out)


def step_records(
    engine: LLMEngine, t0: float, in_flight: dict[str, int], records: dict[int, RequestRecord], trace: Trace
) -> tuple[float, list[tuple[RequestRecord, int, bool]]]:
    """One engine step, read into the records of the requests in flight (request id -> record index): each one's new
    tokens stamped with the step's end (seconds since t0), finished ones settled and taken out of `in_flight`.
    Returns that time and (record, new tokens, finished) per request the step answered."""
    outs = engine.step()
    t = time.monotonic() - t0
    read = []
    for out in outs:
        i = in_flight.get(out.request_id)
        if i is None:
            continue
        rec = records[i]
        new = len(out.outputs[0].token_ids) - len(rec.token_times)
        rec.token_times += [t] * new
        if out.finished:
            _settle(rec, out, engine.mode, trace)
            del in_flight[out.request_id]
        read.append((rec, new, out.finished))
    return t, read


def _settle(rec: RequestRecord, out: RequestOutput | None, mode: Mode, trace: Trace) -> None:
    if out is None:
        return
    rec.finished = out.finished and out.finish_reason != "abort"
    if out.metrics is not None:
        rec.cached_tokens = out.metrics.cached_tokens
        rec.prefilled_tokens = out.metrics.prefilled_tokens
        rec.queue_time = out.metrics.queue_time
        rec.doc_hits = mode.reused_documents(rec.cached_tokens, trace.system_len, trace.spec.doc_len, rec.num_docs)
