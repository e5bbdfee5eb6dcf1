"""The seeded RAG workload (docs/design.md, Benchmark protocol): a document pool, requests that each retrieve a
few documents, and their arrival times.

Every random draw comes from its own stream of one seed (documents, requests, arrivals, warm-up), so changing
the arrival process does not change which documents a request retrieves, and two modes replaying the same
spec see token-for-token the same trace. Requests are token-level (`RenderedPrompt`): a shared system
segment (BOS + `system_len` tokens), the retrieved documents as segments, a random question as the final
segment.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from lazyattn.engine.prompt import RenderedPrompt

# Independent random streams of one seed.
_DOCUMENTS, _REQUESTS, _ARRIVALS, _WARMUP = range(4)


@dataclass(frozen=True)
class WorkloadSpec:
    num_docs: int = 100  # the document pool
    doc_len: int = 2048  # tokens per document
    docs_per_request: int = 5
    zipf_alpha: float | None = 2.1  # popularity of the document of rank r is r**-alpha; None: uniform
    shuffle: bool = True  # each request's documents in random order; False: in pool order (doc id)
    question_len: int = 32
    output_len: int = 16  # exact: EOS is ignored
    num_requests: int = 60
    system_len: int = 0  # tokens after BOS in the system segment every request starts with
    seed: int = 0

    def __post_init__(self) -> None:
        if (
            min(
                self.num_docs,
                self.doc_len,
                self.docs_per_request,
                self.question_len,
                self.output_len,
                self.num_requests,
            )
            < 1
        ):
            raise ValueError("document, request, question and output counts and lengths must be >= 1")
        if self.docs_per_request > self.num_docs:
            raise ValueError(f"docs_per_request {self.docs_per_request} exceeds the pool of {self.num_docs}")
        if self.zipf_alpha is not None and self.zipf_alpha <= 0:
            raise ValueError(f"zipf_alpha must be positive (or None for uniform), got {self.zipf_alpha}")
        if self.system_len < 0 or self.system_len + 1 >= self.doc_len:
            # Document hits are recovered from cached token counts (replay.document_hits), which needs the
            # system segment to be shorter than a document.
            raise ValueError("system_len must be >= 0 and the system segment shorter than a document")

    @property
    def popularity(self) -> str:
        return "uniform" if self.zipf_alpha is None else f"zipf {self.zipf_alpha:g}"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Load:
    """How requests arrive: Poisson at `rate` req/s, all at t=0 (rate inf: saturation), or a closed loop
    keeping `concurrency` requests in flight."""

    rate: float = math.inf
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if not self.rate > 0:
            raise ValueError(f"rate must be positive, got {self.rate}")

    @property
    def label(self) -> str:
        if self.concurrency is not None:
            return f"concurrency {self.concurrency}"
        return "saturation" if math.isinf(self.rate) else f"rate {self.rate:g}"

    def to_dict(self) -> dict:
        return {
            "rate": None if math.isinf(self.rate) else self.rate,
            "concurrency": self.concurrency,
            "label": self.label,
        }


@dataclass(frozen=True)
class TraceRequest:
    index: int
    doc_ids: tuple[int, ...]  # in prompt order
    question: list[int]
    arrival: float  # seconds after the start; 0 for saturation and closed-loop loads


@dataclass
class Trace:
    spec: WorkloadSpec
    load: Load
    system: list[int]  # the first segment ([BOS] + system tokens); empty without BOS and system tokens
    documents: list[list[int]]
    requests: list[TraceRequest] = field(default_factory=list)

    def prompt(self, request: TraceRequest) -> RenderedPrompt:
        segments = ([list(self.system)] if self.system else []) + [self.documents[d] for d in request.doc_ids]
        return RenderedPrompt(segments, list(request.question))

    @property
    def system_len(self) -> int:
        return len(self.system)


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream])


def popularity_weights(num_docs: int, zipf_alpha: float | None) -> np.ndarray:
    """Retrieval probability of each document (doc id = popularity rank - 1), summing to 1."""
    if zipf_alpha is None:
        return np.full(num_docs, 1.0 / num_docs)
    w = np.arange(1, num_docs + 1, dtype=np.float64) ** -zipf_alpha
    return w / w.sum()


def token_range(vocab_size: int, bos: int | None, eos: tuple[int, ...] | list[int] = ()) -> int:
    """Upper bound (exclusive) for random token ids: below the special tokens when they sit at the top of
    the vocabulary (Llama-3: 128000+, tiny: 256+), so documents never contain BOS or EOS."""
    specials = [t for t in (bos, *eos) if t is not None and t >= vocab_size // 2]
    return min([vocab_size, *specials])


def token_space(model_config) -> tuple[int, int | None]:
    """(exclusive upper bound for random token ids, BOS id) of a lazyattn ModelConfig."""
    return token_range(
        model_config.vocab_size, model_config.bos_token_id, model_config.eos_token_ids
    ), model_config.bos_token_id


def random_documents(count: int, length: int, high: int, rng: np.random.Generator) -> list[list[int]]:
    return rng.integers(0, high, size=(count, length)).tolist()


def make_trace(spec: WorkloadSpec, load: Load, vocab_high: int, bos: int | None) -> Trace:
    """The seeded trace of `spec` under `load` (token ids in [0, vocab_high), `bos` opening the system
    segment). The same spec gives the same documents and requests under every load."""
    docs = random_documents(spec.num_docs, spec.doc_len, vocab_high, _rng(spec.seed, _DOCUMENTS))
    rng = _rng(spec.seed, _REQUESTS)
    system = ([bos] if bos is not None else []) + rng.integers(0, vocab_high, spec.system_len).tolist()
    weights = popularity_weights(spec.num_docs, spec.zipf_alpha)
    picks = []
    for _ in range(spec.num_requests):
        chosen = rng.choice(spec.num_docs, size=spec.docs_per_request, replace=False, p=weights)
        order = rng.permutation(chosen) if spec.shuffle else np.sort(chosen)
        picks.append((tuple(int(d) for d in order), rng.integers(0, vocab_high, spec.question_len).tolist()))
    arrivals = arrival_times(spec.num_requests, load, spec.seed)
    requests = [TraceRequest(i, d, q, a) for i, ((d, q), a) in enumerate(zip(picks, arrivals))]
    return Trace(spec, load, system, docs, requests)


def arrival_times(n: int, load: Load, seed: int) -> list[float]:
    """Poisson arrivals: cumulative exponential gaps of mean 1/rate, the first request at t=0. The unit
    gaps are drawn once per seed and scaled by 1/rate, so every rate replays the same pattern, stretched."""
    if load.concurrency is not None or math.isinf(load.rate):
        return [0.0] * n
    gaps = _rng(seed, _ARRIVALS).exponential(1.0, n)
    gaps[0] = 0.0
    return (np.cumsum(gaps) / load.rate).tolist()


def warmup_trace(spec: WorkloadSpec, num_requests: int, vocab_high: int, bos: int | None) -> Trace:
    """Requests of the spec's shapes over documents outside the pool (their own stream): they compile and
    autotune kernels without warming the document cache for the measured trace."""
    rng = _rng(spec.seed, _WARMUP)
    docs = random_documents(num_requests * spec.docs_per_request, spec.doc_len, vocab_high, rng)
    system = ([bos] if bos is not None else []) + rng.integers(0, vocab_high, spec.system_len).tolist()
    k = spec.docs_per_request
    requests = [
        TraceRequest(i, tuple(range(i * k, (i + 1) * k)), rng.integers(0, vocab_high, spec.question_len).tolist(), 0.0)
        for i in range(num_requests)
    ]
    return Trace(spec, Load(), system, docs, requests)
