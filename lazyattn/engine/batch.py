"""One step as plain data flowing one way (docs/design.md, "One step"): the scheduler's `StepPlan` (what the forward
pass computes: chunks of runs, block mode's copies, and the prefill-only sequences whose documents are then cached),
the executor's `StepOutput` (the sampled ids and the failures per request), and the scheduler's `StepUpdate` (what
its `update` changed, for the engine's outputs)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from lazyattn.cache.document_cache import Segment
from lazyattn.engine.graph_inputs import FedBack
from lazyattn.engine.sampling import SampleResult
from lazyattn.engine.sequence import Run, Sequence
from lazyattn.kernels.paged import EntryPages


@dataclass
class SegmentJob:
    """Encoding one cached document alone, at local positions, shared by every sequence that needs it."""

    segment: Segment
    run: Run
    # ape_prefix: the first segment this document is encoded after (visible to its rows, at delta 0); its
    # run then starts at that segment's length
    prefix: Segment | None = None


@dataclass  # not frozen only because it is made per sequence per step (a frozen init costs ~3x): never changed
class Work:
    """Rows [lo, hi) of a run, attending to `context` and then the run's own pages."""

    run: Run
    lo: int
    hi: int
    context: EntryPages
    seq: Sequence | None = None  # the sequence whose run this is (None: a segment job)
    job: SegmentJob | None = None
    samples: bool = False  # the chunk ends a sequence's run: it samples its next token from the last row

    @property
    def prefill_rows(self) -> int:
        return self.run.prefill_rows(self.lo, self.hi)


@dataclass(frozen=True)
class Copy:
    seq_id: int
    src: list[int]
    dst: list[int]
    deltas: list[int]


@dataclass(frozen=True)
class StepPlan:
    """What one step computes, decided by `Scheduler.schedule` and never changed afterwards. Decode rows come
    first, then, in admission order, document encodes and prefill chunks."""

    works: tuple[Work, ...] = ()
    copies: tuple[Copy, ...] = ()
    encoded: tuple[Sequence, ...] = ()  # prefill-only sequences whose documents are cached once this step has run
    index: int = 0  # the scheduler's count of plans made before this one
    # Every work decodes a sequence of the step in flight from the token that step sampled, not yet read
    # (overlapped scheduling): the executor feeds those ids back on the device (`fed_back`).
    continues: bool = False
    fed_back: FedBack | None = None  # the executor's, when it launches a continuing plan

    @property
    def samples(self) -> list[Sequence]:
        """The sequences that sample a token in this step, in row order."""
        return [w.seq for w in self.works if w.samples]

    @property
    def decodes(self) -> list[Sequence]:
        """The sequences that decode one generated token in this step."""
        return [w.seq for w in self.works if w.seq is not None and w.hi - w.lo == 1 and not w.prefill_rows]

    @property
    def chunks(self) -> list[Work]:
        """The sequences' prefill chunks (prompts, relinked rows, recomputation after a preemption)."""
        return [w for w in self.works if w.seq is not None and w.prefill_rows]

    @property
    def encodes(self) -> list[SegmentJob]:
        """The document encodes with rows in this step."""
        return [w.job for w in self.works if w.job is not None]

    @property
    def is_decode(self) -> bool:
        return all(w.hi - w.lo == 1 and w.samples for w in self.works)

    @property
    def num_tokens(self) -> int:
        return sum(w.hi - w.lo for w in self.works)

    @property
    def prefill_rows(self) -> int:
        """Rows computing known tokens (documents, prompts, recomputation); the others decode a generated one."""
        return sum(w.prefill_rows for w in self.works)

    def written_pages(self, page_size: int) -> set[int]:
        """Pages the forward pass writes: the rows of each work, and block mode's copies."""
        pages = {p for c in self.copies for p in c.dst}
        for w in self.works:
            f = w.run.first_slot
            pages.update(w.run.pages[(f + w.lo) // page_size : -(-(f + w.hi) // page_size)])
        return pages


Sampled = tuple[SampleResult, int]  # a result on the host and the row of it that is this sequence's


@dataclass(frozen=True)
class StepOutput:
    """What the executor gives back for a plan once its step has completed."""

    # seq_id -> its sampled token, for each sequence of `plan.samples` not failed; None: its row could not be sampled
    sampled: Mapping[int, Sampled | None] = field(default_factory=dict)
    failed: Mapping[str, str] = field(default_factory=dict)  # request id -> why the step failed it (isolation)
    failed_encodes: tuple[Segment, ...] = ()  # documents whose encode failed: aborted by the update


@dataclass(frozen=True)
class StepUpdate:
    """What `Scheduler.update` changed: the requests that got a token or ended, in that order, and why those
    that failed did."""

    touched: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)
