"""The steady-state protocol: open-loop Poisson traffic held at one rate until the document hit ratio holds steady,
then a measured window; the cold-start curve of an empty cache.

A point never stops its traffic between phases: warm-up, window and drain are labels on one continuous stream of
arrivals, as a server sees them. The warm-up ends when the document hit ratio of two consecutive blocks of
completed requests differs by at most `warmup_tol` (after `warmup_min_s`), or at `warmup_max_s` (recorded as not
steady). The window then lasts `window_s` or `window_requests` arrivals, whichever is longer. Arrivals go on after it
while the window's requests finish (at most `drain_s`); a window request without a first token by then counts as an
infinite TTFT, so a queue that grows shows up in the percentiles, not as a missing row.

Percentiles are nearest-rank (the smallest value with at least q % of the requests at or below it): an SLO reading
that stays defined when some requests never answered.

A request is idle when it had the server to itself from its arrival to its first token: no other request of the
point was in flight at any moment of that span (`idle_flags`). Queueing and batching can only delay a first token,
so idle requests' TTFTs are the floor every rate's TTFTs stand on (search.py's unreachable targets).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from lazyattn.bench.metrics import RequestRecord, percentile
from lazyattn.bench.replay import _settle, step_records
from lazyattn.bench.workload import (
    Trace,
    TraceRequest,
    WorkloadSpec,
    _rng,
    popularity_weights,
    random_documents,
)
from lazyattn.engine.llm_engine import LLMEngine
from lazyattn.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from lazyattn.bench.trace import TraceRecorder

KEEP_UP_SLACK = 2  # requests
_DOCUMENTS, _STEADY = 0, 8  # workload.py's document stream (same pool as `make_trace`), and this module's own


@dataclass(frozen=True)
class PhaseConfig:
    """How long each phase of a point lasts; the budget planner (search.py) shortens these per point."""

    window_s: float = 60.0
    window_requests: int = 1000
    warmup_min_s: float = 10.0
    warmup_max_s: float = 120.0
    warmup_block: int = 100  # completed requests per hit-ratio block of the steadiness test
    warmup_tol: float = 0.02  # largest change of the hit ratio between two blocks that counts as steady
    drain_s: float = 30.0  # most time the window's requests get to finish after the window closes
    warmup: bool = True  # False: the window starts at t=0 (the cold-start curve)

    def window_length(self, rate: float) -> float:
        """Seconds of arrivals the window needs at `rate`: window_s or window_requests, whichever is longer."""
        return max(self.window_s, self.window_requests / rate)


def base_trace(spec: WorkloadSpec, vocab_high: int, bos: int | None) -> Trace:
    """The spec's document pool and system segment, without requests (they come from `request_stream`)."""
    docs = random_documents(spec.num_docs, spec.doc_len, vocab_high, _rng(spec.seed, _DOCUMENTS))
    system = ([bos] if bos is not None else []) + _rng(spec.seed, _STEADY).integers(
        0, vocab_high, spec.system_len
    ).tolist()
    return Trace(spec, None, system, docs)  # type: ignore[arg-type]


def request_stream(spec: WorkloadSpec, rate: float, vocab_high: int, point: int) -> Iterator[TraceRequest]:
    """Endless Poisson arrivals at `rate` of requests drawn like `make_trace`'s, seeded per (spec seed, point)."""
    rng = np.random.default_rng([spec.seed, _STEADY, point])
    weights = popularity_weights(spec.num_docs, spec.zipf_alpha)
    t, i = 0.0, 0
    while True:
        chosen = rng.choice(spec.num_docs, size=spec.docs_per_request, replace=False, p=weights)
        order = rng.permutation(chosen) if spec.shuffle else np.sort(chosen)
        question = rng.integers(0, vocab_high, spec.question_len).tolist()
        yield TraceRequest(i, tuple(int(d) for d in order), question, t)
        t += rng.exponential(1.0 / rate)
        i += 1


def steady_block(hits: list[float], block: int, tol: float) -> bool:
    """True when the last two full blocks of per-request hit ratios (completion order) differ by at most tol."""
    if len(hits) < 2 * block:
        return False
    n = len(hits) - len(hits) % block
    last, prev = hits[n - block : n], hits[n - 2 * block : n - block]
    return abs(sum(last) / block - sum(prev) / block) <= tol


@dataclass
class PointResult:
    """One mode at one offered rate: the window's statistics (ms, req/s) and what the point actually ran."""

    mode: str
    rate: float
    window_start_s: float = math.nan  # after the point's first arrival
    window_s: float = 0.0  # length of the window actually measured
    window_requests: int = 0  # arrivals inside it
    warmup_s: float = 0.0
    warmup_steady: bool = False
    shortened: bool = False  # the budget cut the window below window_s / window_requests
    hit_ratio: float = math.nan  # documents found cached / documents requested, window requests
    warmup_hit_ratio: float = math.nan  # the warm-up's last block
    offered_rate: float = math.nan  # arrivals in the window / its length
    achieved_rate: float = math.nan  # completions (any request) in the window / its length
    unanswered: int = 0  # window requests without a first token when the point ended
    ttft_ms: dict = field(default_factory=dict)  # p50 / p90 / p99
    tpot_ms: dict = field(default_factory=dict)
    e2el_ms: dict = field(default_factory=dict)
    output_throughput: float = math.nan  # output tokens handed out in the window / its length
    peak_kv_gb: float = math.nan
    preemptions: int = 0
    wall_s: float = 0.0
    window_ttfts_ms: list = field(default_factory=list)  # every window request's TTFT, arrival order (inf: none)
    idle_ttfts_ms: list = field(default_factory=list)  # the TTFTs of the window's idle requests (idle_flags)
    # per request of the point, arrival order: arrival, ttft, finish (None: never finished), idle, hit ratio
    timeline: dict = field(default_factory=dict)

    @property
    def keep_up(self) -> float:
        return self.achieved_rate / self.offered_rate if self.offered_rate > 0 else math.nan

    def goodput(self, target_ms: float) -> float:
        """Window requests answered within target_ms, per second of window."""
        ok = sum(1 for t in self.window_ttfts_ms if t <= target_ms)
        return ok / self.window_s if self.window_s > 0 else math.nan

    def meets(self, target_ms: float, keep_up: float) -> bool:
        """p99 TTFT within the target, and completions keeping up with arrivals (the queue does not grow): at least
        `keep_up` of them, less KEEP_UP_SLACK requests (in a short window a couple of requests in flight at its end
        are noise, not a growing queue)."""
        return self.ttft_ms.get("p99", math.nan) <= target_ms and self.keeps_up(keep_up)

    def keeps_up(self, keep_up: float) -> bool:
        """The window completed at least `keep_up` of its arrivals, less KEEP_UP_SLACK requests."""
        arrived, completed = self.offered_rate * self.window_s, self.achieved_rate * self.window_s
        return self.window_requests > 0 and completed + KEEP_UP_SLACK >= keep_up * arrived

    def to_dict(self, timeline: bool = False) -> dict:
        d = asdict(self)
        d["keep_up"] = self.keep_up
        if not timeline:
            d.pop("timeline")
        return d

    @staticmethod
    def from_dict(d: dict) -> PointResult:
        known = {k: v for k, v in d.items() if k in PointResult.__dataclass_fields__}
        nan = lambda v: math.nan if v is None else v  # noqa: E731
        for k in ("window_start_s", "hit_ratio", "warmup_hit_ratio", "offered_rate", "achieved_rate"):
            if k in known:
                known[k] = nan(known[k])
        for k in ("ttft_ms", "tpot_ms", "e2el_ms"):
            known[k] = {q: (math.inf if v is None else v) for q, v in known.get(k, {}).items()}
        for k in ("window_ttfts_ms", "idle_ttfts_ms"):
            known[k] = [math.inf if v is None else v for v in known.get(k, [])]
        return PointResult(**known)


def idle_flags(arrival: list[float], first_token: list[float], finish: list[float]) -> list[bool]:
    """Per request (any order, seconds on one clock; inf: never happened): True when no other request was in flight
    at any moment from its arrival to its first token. Request j is in flight from its arrival to its finish (inf
    when it never finished: aborted or still running when the point ended, so in flight to the end). A request that
    arrived before i overlaps it when it finished after i arrived; one that arrived after i, when it arrived before
    i's first token. Equal arrivals overlap."""
    if not arrival:
        return []
    a, f, e = (np.asarray(v, dtype=np.float64) for v in (arrival, first_token, finish))
    order = np.argsort(a, kind="stable")
    a, f, e = a[order], f[order], e[order]
    busy_until = np.concatenate(([-np.inf], np.maximum.accumulate(e)[:-1]))  # latest finish of the earlier arrivals
    next_arrival = np.concatenate((a[1:], [np.inf]))
    idle = (busy_until <= a) & (next_arrival >= f) & (next_arrival > a)
    flags = np.empty(len(a), dtype=bool)
    flags[order] = idle
    return flags.tolist()


def _quantiles(values: list[float]) -> dict:
    return {f"p{q}": percentile(values, q) for q in (50, 90, 99)}


def run_point(
    engine: LLMEngine,
    trace: Trace,
    rate: float,
    phases: PhaseConfig,
    vocab_high: int,
    *,
    point: int = 0,
    deadline: float = math.inf,
    shortened: bool = False,
    recorder: TraceRecorder | None = None,
    label: str = "",
) -> PointResult:
    """Serve Poisson traffic at `rate` on `engine` as it stands (its cache is not reset) through warm-up, window and
    drain; abort whatever is left. Question tokens are drawn below `vocab_high` (workload.token_space).
    `deadline` (time.monotonic()) ends the point early: the window closes `drain_s` before it (marked shortened),
    so that its last requests get the same time to answer as in a full point. `recorder`: traces the window and
    its drain (bench/trace.py) as `label`."""
    spec = trace.spec
    params = SamplingParams(max_tokens=spec.output_len, temperature=0.0, ignore_eos=True)
    stream = request_stream(spec, rate, vocab_high, point)
    upcoming = next(stream)
    records: dict[int, RequestRecord] = {}
    in_flight: dict[str, int] = {}
    done_hits: list[float] = []  # per completed warm-up request, completion order
    completions: list[float] = []
    token_times: list[tuple[float, int]] = []
    result = PointResult(engine.mode.name, rate, shortened=shortened)
    window_start = 0.0 if not phases.warmup else math.inf
    first_in_window = 0  # index of the first request arriving in the window
    window_end = math.inf
    window_len = phases.window_length(rate)
    engine.pool.reset_high_water()  # this point's peak: the cache carried in, plus what its traffic adds
    preemptions = engine.stats().preemptions
    t0 = time.monotonic()
    window_deadline = deadline - t0 - phases.drain_s
    if recorder is not None and window_start == 0.0:
        recorder.start(engine, t0)
    try:
        while True:
            now = time.monotonic() - t0
            if t0 + now > deadline:
                break
            if window_end < math.inf:
                waiting = [i for i in in_flight.values() if window_start <= records[i].arrival < window_end]
                if not waiting or now > window_end + phases.drain_s:
                    break
            elif window_start < math.inf:
                arrived = upcoming.index - first_in_window
                if now - window_start >= window_len and arrived >= phases.window_requests:
                    window_end = now
                elif now >= window_deadline:  # close early, so that the window's requests get their drain
                    window_end, result.shortened = now, True
            elif now >= phases.warmup_max_s or (
                now >= phases.warmup_min_s and steady_block(done_hits, phases.warmup_block, phases.warmup_tol)
            ):
                window_start, first_in_window = now, upcoming.index
                if recorder is not None:
                    recorder.start(engine, t0)
                result.warmup_steady = now < phases.warmup_max_s
                result.warmup_s = now
            while upcoming.arrival <= now:
                rec = RequestRecord(
                    upcoming.index,
                    upcoming.arrival,
                    num_docs=len(upcoming.doc_ids),
                    context_tokens=trace.system_len + len(upcoming.doc_ids) * spec.doc_len + spec.question_len,
                )
                records[upcoming.index] = rec
                rid = f"steady-{point}-{upcoming.index}"
                engine.add_request(rid, trace.prompt(upcoming), params, arrival=t0 + upcoming.arrival)
                in_flight[rid] = upcoming.index
                upcoming = next(stream)
            if not in_flight:
                time.sleep(max(0.0, min(upcoming.arrival - now, 0.05)))
                continue
            t, read = step_records(engine, t0, in_flight, records, trace)
            for rec, new, finished in read:
                token_times.append((t, new))
                if finished:
                    completions.append(t)
                    if rec.arrival < window_start:
                        done_hits.append(rec.doc_hits / rec.num_docs)
    finally:
        for rid in list(in_flight):
            _settle(records[in_flight[rid]], engine.abort(rid), engine.mode, trace)
        if recorder is not None:
            recorder.stop(engine)
    wall = time.monotonic() - t0
    stats = engine.stats()
    result.wall_s = wall
    result.peak_kv_gb = stats.pages_high_water * stats.page_bytes / 2**30
    result.preemptions = stats.preemptions - preemptions
    if window_start == math.inf or not records:
        return result  # the deadline came before the window (or before any arrival): no window
    if window_end == math.inf:
        window_end = min(wall, max(r.arrival for r in records.values()) + 1e-9)
        result.shortened = True
    _window_stats(result, records, completions, token_times, window_start, window_end, phases, done_hits)
    if recorder is not None:
        recorder.add_window(label or f"{result.mode} {rate:g} req/s", records, window_start, window_end)
    return result


def _window_stats(
    result: PointResult,
    records: dict[int, RequestRecord],
    completions: list[float],
    token_times: list[tuple[float, int]],
    start: float,
    end: float,
    phases: PhaseConfig,
    done_hits: list[float],
) -> None:
    length = end - start
    window = [r for r in records.values() if start <= r.arrival < end]
    result.window_start_s, result.window_s, result.window_requests = start, length, len(window)
    if phases.warmup:
        want = phases.window_length(result.rate)
        result.shortened = result.shortened or length < want * 0.999
    if done_hits:
        block = done_hits[-phases.warmup_block :]
        result.warmup_hit_ratio = sum(block) / len(block)
    answered = [r for r in window if r.token_times]
    result.unanswered = len(window) - len(answered)
    docs = sum(r.num_docs for r in answered)
    result.hit_ratio = sum(r.doc_hits for r in answered) / docs if docs else math.nan
    result.offered_rate = len(window) / length if length > 0 else math.nan
    result.achieved_rate = sum(1 for t in completions if start <= t < end) / length if length > 0 else math.nan
    result.output_throughput = sum(n for t, n in token_times if start <= t < end) / length if length > 0 else math.nan
    ttfts = [r.ttft * 1e3 if r.ttft is not None else math.inf for r in window]
    result.window_ttfts_ms = ttfts
    ordered = sorted(records.values(), key=lambda r: r.arrival)
    finish = [r.token_times[-1] if r.finished and r.token_times else math.inf for r in ordered]
    idle = idle_flags(
        [r.arrival for r in ordered], [r.token_times[0] if r.token_times else math.inf for r in ordered], finish
    )
    result.idle_ttfts_ms = [
        r.ttft * 1e3 if r.ttft is not None else math.inf
        for r, alone in zip(ordered, idle)
        if alone and start <= r.arrival < end
    ]
    result.ttft_ms = _quantiles(ttfts)
    result.tpot_ms = _quantiles([r.tpot * 1e3 for r in window if r.tpot is not None])
    result.e2el_ms = _quantiles([r.e2e * 1e3 if r.e2e is not None else math.inf for r in window])
    result.timeline = {
        "arrival_s": [round(r.arrival, 4) for r in ordered],
        "ttft_ms": [None if r.ttft is None else round(r.ttft * 1e3, 3) for r in ordered],
        "finish_s": [None if math.isinf(t) else round(t, 4) for t in finish],
        "idle": idle,
        "hit_ratio": [r.doc_hits / r.num_docs if r.token_times else None for r in ordered],
    }


def cold_start_bins(point: PointResult, bin_s: float) -> list[dict]:
    """The cold-start curve: per `bin_s` seconds of arrivals, requests, TTFT p50 / p99 and the document hit ratio."""
    tl = point.timeline
    if not tl:
        return []
    rows = []
    end = max(tl["arrival_s"], default=0.0)
    for k in range(int(end // bin_s) + 1):
        sel = [i for i, a in enumerate(tl["arrival_s"]) if k * bin_s <= a < (k + 1) * bin_s]
        ttfts = [math.inf if tl["ttft_ms"][i] is None else tl["ttft_ms"][i] for i in sel]
        hits = [tl["hit_ratio"][i] for i in sel if tl["hit_ratio"][i] is not None]
        rows.append(
            {
                "t_s": k * bin_s,
                "requests": len(sel),
                "ttft_p50_ms": percentile(ttfts, 50),
                "ttft_p99_ms": percentile(ttfts, 99),
                "hit_ratio": sum(hits) / len(hits) if hits else math.nan,
            }
        )
    return rows
