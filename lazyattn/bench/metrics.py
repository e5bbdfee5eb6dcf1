"""Serving metrics of one replayed point, with vLLM's benchmark definitions.

Times are taken on the client side of `engine.step()` (when a token is handed out), relative to the point's
start; a request's arrival is its scheduled arrival, so TTFT includes any time it queued, also the time a
step that was already running when it arrived still took.

- TTFT: first token - arrival. E2EL: last token - arrival.
- TPOT: per request (E2EL - TTFT) / (output tokens - 1), then mean/median/p99 over requests.
- ITL: every gap between consecutive tokens of a request, pooled over requests.
- Duration: first arrival to last token of any request. Throughputs are per that duration.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); inf values (requests that never answered) sort last. nan if empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)]


@dataclass
class RequestRecord:
    index: int
    arrival: float
    token_times: list[float] = field(default_factory=list)
    context_tokens: int = 0  # system + documents + question
    num_docs: int = 0
    doc_hits: float = 0  # documents found in the cache at admission (see replay.document_hits)
    cached_tokens: int = 0
    prefilled_tokens: int = 0  # rows this request computed itself (its final segment; prefix/full: more)
    queue_time: float | None = None  # arrival -> first scheduled, from the engine (None: never scheduled)
    finished: bool = False

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None

    @property
    def e2e(self) -> float | None:
        return self.token_times[-1] - self.arrival if self.finished and self.token_times else None

    @property
    def tpot(self) -> float | None:
        n = len(self.token_times)
        if not self.finished or n < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (n - 1)

    @property
    def itls(self) -> list[float]:
        return np.diff(self.token_times).tolist() if len(self.token_times) > 1 else []


@dataclass(frozen=True)
class EngineCounters:
    """What the engine itself counted during the point (deltas over the point)."""

    rows_computed: int  # every row of every forward pass: documents, prompts, decode steps, recomputation
    preemptions: int
    evictions: int
    peak_kv_bytes: int  # most KV pages in use at once x bytes per page
    pool_bytes: int  # the KV pool the point ran with


@dataclass(frozen=True)
class Stat:
    """Milliseconds."""

    mean: float
    median: float
    p99: float

    @staticmethod
    def of(seconds: list[float]) -> Stat:
        if not seconds:
            return Stat(math.nan, math.nan, math.nan)
        ms = np.asarray(seconds, dtype=np.float64) * 1e3
        return Stat(float(ms.mean()), float(np.percentile(ms, 50)), float(np.percentile(ms, 99)))


@dataclass(frozen=True)
class Summary:
    completed: int
    total: int
    duration_s: float
    input_tokens: int
    output_tokens: int
    request_throughput: float  # completed requests / s
    output_throughput: float  # output tokens / s
    total_token_throughput: float  # (input + output tokens) / s
    ttft: Stat
    tpot: Stat
    itl: Stat
    e2el: Stat
    doc_hit_ratio: float  # documents found cached at admission / documents requested (replay.document_hits)
    token_reuse_ratio: float  # context tokens found cached / context tokens
    prefill_tokens: int  # rows computed for documents and prompts (rows_computed minus decode rows)
    doc_tokens_encoded: int  # rows of documents encoded as cache segments (lazy, block); 0 in prefix/full
    preemptions: int
    evictions: int
    peak_kv_gb: float
    pool_gb: float

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> Summary:
        """Inverse of to_dict after a JSON round trip (which turns NaN into null)."""
        nan = lambda v: math.nan if v is None else v  # noqa: E731
        fields = {k: nan(v) for k, v in d.items()}
        for k in ("ttft", "tpot", "itl", "e2el"):
            fields[k] = Stat(**{f: nan(v) for f, v in d[k].items()})
        return Summary(**fields)


def summarize(records: list[RequestRecord], counters: EngineCounters) -> Summary:
    done = [r for r in records if r.finished]
    output_tokens = sum(len(r.token_times) for r in done)
    input_tokens = sum(r.context_tokens for r in done)
    ends = [r.token_times[-1] for r in records if r.token_times]
    start = min((r.arrival for r in records), default=0.0)
    duration = max(ends) - start if ends else 0.0
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: math.nan)
    docs = sum(r.num_docs for r in records if r.token_times)
    context = sum(r.context_tokens for r in records if r.token_times)
    # A request feeds back every output token but its last: those rows are decode, not prefill.
    decode_rows = sum(max(len(r.token_times) - 1, 0) for r in records)
    own_rows = sum(r.prefilled_tokens for r in records)
    return Summary(
        completed=len(done),
        total=len(records),
        duration_s=duration,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        request_throughput=per_s(len(done)),
        output_throughput=per_s(output_tokens),
        total_token_throughput=per_s(input_tokens + output_tokens),
        ttft=Stat.of([r.ttft for r in records if r.ttft is not None]),
        tpot=Stat.of([r.tpot for r in done if r.tpot is not None]),
        itl=Stat.of([gap for r in done for gap in r.itls]),
        e2el=Stat.of([r.e2e for r in done if r.e2e is not None]),
        doc_hit_ratio=sum(r.doc_hits for r in records if r.token_times) / docs if docs else math.nan,
        token_reuse_ratio=sum(r.cached_tokens for r in records if r.token_times) / context if context else math.nan,
        prefill_tokens=counters.rows_computed - decode_rows,
        doc_tokens_encoded=max(counters.rows_computed - own_rows, 0),
        preemptions=counters.preemptions,
        evictions=counters.evictions,
        peak_kv_gb=counters.peak_kv_bytes / 2**30,
        pool_gb=counters.pool_bytes / 2**30,
    )
