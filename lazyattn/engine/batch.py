"""What the scheduler hands the model runner for one forward pass: chunks of runs (works), block mode's copies,
and the prefill-only sequences whose documents are now cached."""

from __future__ import annotations

from dataclasses import dataclass, field

from lazyattn.cache.document_cache import Segment
from lazyattn.engine.graph_inputs import FedBack
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


@dataclass
class Work:
    """Rows [lo, hi) of a run, attending to `context` and then the run's own pages."""

    run: Run
    lo: int
    hi: int
    context: EntryPages
    seq: Sequence | None = None  # the sequence whose run this is (None: a segment job)
    job: SegmentJob | None = None
    samples: bool = False  # the chunk ends a sequence's run: it samples its next token from the last row


@dataclass
class Copy:
    seq_id: int
    src: list[int]
    dst: list[int]
    deltas: list[int]


@dataclass
class ScheduledBatch:
    works: list[Work] = field(default_factory=list)
    copies: list[Copy] = field(default_factory=list)
    encoded: list[Sequence] = field(default_factory=list)  # prefill-only sequences whose documents are cached
    # overlapped scheduling: input tokens the previous step sampled, still on the device (engine/overlap.py)
    fed_back: FedBack | None = None

    @property
    def is_decode(self) -> bool:
        return all(w.hi - w.lo == 1 and w.samples for w in self.works)

    def written_pages(self, page_size: int) -> set[int]:
        """Pages the forward pass writes: the rows of each work, and block mode's copies."""
        pages = {p for c in self.copies for p in c.dst}
        for w in self.works:
            pages.update(w.run.pages[w.lo // page_size : -(-w.hi // page_size)])
        return pages

    @property
    def num_tokens(self) -> int:
        return sum(w.hi - w.lo for w in self.works)
