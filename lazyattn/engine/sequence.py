"""Per-request state: what a sequence holds while it waits, runs and finishes."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from functools import cached_property

import torch

from lazyattn.cache.document_cache import Segment
from lazyattn.engine.request_options import OFF, RequestOptions
from lazyattn.engine.sampling import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"  # queued, holds nothing
    RUNNING = "running"  # admitted: holds its cached parts and private pages
    FINISHED = "finished"


@dataclass
class Run:
    """Tokens whose K/V one party computes into `pages`, at positions `start_pos + i`; rotated at
    `start_pos + rope_shift + i` (a final segment read after parallel documents, `ape_parallel`, sits nearer to them
    than their token count: the attention kernels mask by `start_pos`, RoPE rotates by the shifted position).

    A sequence's run is its final segment (lazy, block), or everything past the cached prefix blocks it
    did not compute (prefix, full); a segment job's run is one document. `pages[:owned]` belong to cache
    segments this run fills (prefix mode); the rest are private to the sequence. Row i sits in slot
    `first_slot + i` of the pages (0 but for relinked rows, packed one run after another into shared pages).
    """

    tokens: list[int]
    start_pos: int
    pages: list[int] = field(default_factory=list)
    rope_shift: int = 0
    num_computed: int = 0  # tokens whose K/V is in the cache
    owned: int = 0
    first_slot: int = 0
    # Tokens known at admission (prompt, documents, output recomputed after a preemption): rows past it are
    # decode rows, one per sampled token.
    prefill_len: int = -1

    def __post_init__(self) -> None:
        if self.prefill_len < 0:
            self.prefill_len = len(self.tokens)

    def prefill_rows(self, lo: int, hi: int) -> int:
        """How many of rows [lo, hi) are prefill rows."""
        return max(0, min(hi, self.prefill_len) - lo)

    @property
    def pending(self) -> int:
        return len(self.tokens) - self.num_computed


@dataclass
class Part:
    """A cached segment a sequence attends to, placed at logical position `start`."""

    segment: Segment
    start: int
    length: int
    # Position its keys were cached rotated from: 0, or the first segment's length for a document encoded after it
    # (ape_prefix). The part's delta is start - rotated_at.
    rotated_at: int = 0
    hit: bool = False  # found in the cache at admission (pending or ready)


class ModeState:
    """A sequence's state private to its mode, created by the mode at admission (engine/modes/: LazyState,
    BlockState, PrefixState); this one when its mode keeps none. The scheduler sees only the runs the sequence
    computes before its own run (`runs`, in order), the private pages to free when it ends (`private_pages`) and
    the cache segments its own run fills (`filled_segments`)."""

    @property
    def runs(self) -> list[Run]:
        return []

    def private_pages(self) -> list[list[int]]:
        """The private pages the sequence holds through its mode, one list per allocation, in order."""
        return []

    def filled_segments(self) -> list[Segment]:
        """The cache segments the sequence's own run fills, one per page of its run from the first, in order: it
        holds them, they are ready once the run has computed their page, and one not computed yet is aborted when
        the sequence lets go of it. They are not among its parts (what it reads as others computed it)."""
        return []


@dataclass
class Metrics:
    arrival: float = field(default_factory=time.monotonic)
    scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    cached_tokens: int = 0  # context tokens found in the cache at admission
    prefilled_tokens: int = 0  # tokens this sequence computed itself (its run, incl. recomputation)

    @property
    def queue_time(self) -> float | None:
        return None if self.scheduled is None else self.scheduled - self.arrival

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def decode_time(self) -> float | None:
        if self.first_token is None or self.finished is None:
            return None
        return self.finished - self.first_token


@dataclass(eq=False)  # identity: a sequence is found and removed by identity, never by comparing its fields
class Sequence:
    """One sample of one request. Requests with n > 1 hold n sequences sharing their documents."""

    seq_id: int
    request_id: str
    index: int
    segments: list[list[int]]  # documents (incl. the system segment), lazy/block semantics
    prompt: list[int]  # final segment's prompt (prefix/full: the whole prompt after the segments)
    params: SamplingParams | None  # None: a prefill-only request (documents encoded ahead, nothing sampled)
    salt: str | None = None
    segment_keys: list[str] | None = None  # the segments' cache keys (lazy/block), computed once at add_request
    # The request's relink rows and APE options, resolved (engine/request_options.py): what admission, the modes and
    # the page tables the kernels read take from it.
    options: RequestOptions = OFF
    output: list[int] = field(default_factory=list)
    logprobs: list[dict] = field(default_factory=list)
    first_token_logprobs: torch.Tensor | None = None  # SamplingParams.first_token_logprobs: the first token's row
    status: Status = Status.WAITING
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    text: str = ""  # released output text (complete characters, stop strings cut off)
    metrics: Metrics = field(default_factory=Metrics)
    generator: torch.Generator | None = None
    # while running
    parts: list[Part] = field(default_factory=list)
    run: Run | None = None
    mode_state: ModeState = field(default_factory=ModeState)  # what its mode keeps for it (engine/modes/)
    detokenizer: object | None = None  # model.detokenizer.IncrementalDecoder
    guide: object | None = None  # engine.guided.ChoiceGuide of params.guided_choice; None: unconstrained

    @property
    def prefill_only(self) -> bool:
        """Encodes its segments and finishes once they are cached: no final segment, nothing sampled."""
        return self.params is None

    @property
    def all_tokens(self) -> list[int]:
        """The whole prompt and output as one causal sequence (prefix and full mode)."""
        return [t for s in self.segments for t in s] + self.prompt + self.output

    @cached_property
    def context_len(self) -> int:
        """Tokens of the segments (fixed with the sequence; read per sequence every step: summed once)."""
        return sum(len(s) for s in self.segments)

    @property
    def total_len(self) -> int:
        return self.context_len + len(self.prompt) + len(self.output)

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED
