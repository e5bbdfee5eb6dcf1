"""lazy and block: each segment is a cached document, encoded alone at local positions; the run is the final
segment. They differ in how a sequence reads a document placed after position 0: in place, at delta = its logical
start (lazy), or through a private re-rotated copy (block).

- relink (lazy only): the recomputed first and last rows of each placed document, private to the sequence
  (docs/design.md, "Relink");
- APE (lazy and block): the final segment's attention temperature, scale and tilt on the pages of every segment
  after the first, carried by its page table (`with_ape`; docs/design.md, "APE").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lazyattn.engine.modes.base import DocumentSource, Mode
from lazyattn.engine.request_options import document_log_scales
from lazyattn.engine.sequence import ModeState, Part, Run, Sequence
from lazyattn.kernels.paged import EntryPages, cdiv, page_fill


class _DocumentMode(Mode):
    """What lazy and block share: the documents acquired (and encoded if missing), the run, the page count."""

    caches_documents = True

    def admit(self, source: DocumentSource, seq: Sequence, acquired: list[Part], state: ModeState) -> Run:
        source.acquire_documents(seq.segments, seq.salt, acquired, seq.segment_keys, seq.options.ape_prefix)
        return Run(seq.prompt + seq.output, start_pos=seq.context_len, rope_shift=final_shift(seq))

    def pages_needed(
        self, segment_lens: list[int], run_tokens: int, n: int, page_size: int, relink: tuple[int, int] = (0, 0)
    ) -> int:
        documents = sum(cdiv(length, page_size) for length in segment_lens)  # shared by the n samples
        relinks = cdiv(sum(first + last for first, last in relink_rows(segment_lens, *relink)), page_size)  # packed
        return documents + n * (self._private_copies(segment_lens, page_size) + relinks + cdiv(run_tokens, page_size))

    def _private_copies(self, segment_lens: list[int], page_size: int) -> int:
        return 0

    def reused_documents(self, cached_tokens: int, system_len: int, doc_len: int, num_docs: int) -> float:
        # cached = (system_len if the system segment hit) + hits * doc_len, and system_len < doc_len.
        return min(cached_tokens // doc_len, num_docs)


def with_ape(entry: EntryPages, seq: Sequence, segment_pages: list[int]) -> EntryPages:
    """The final segment's context with the sequence's temperature T, scale S and tilt on the pages of the segments
    after the first (docs/design.md, "APE"): 1/T and ln S_i per page (kernels/paged.py), where `segment_pages` counts
    the entry's pages of each segment in order. The first segment's pages (the system prompt and BOS, the attention
    sink) come first in every context and stay as they are."""
    (t, s), tilt = seq.options.ape, seq.options.ape_tilt
    if (t, s, tilt) == (1.0, 1.0, 0.0) or not seq.parts:
        return entry
    assert sum(segment_pages) == len(entry.pages), "segment_pages counts every page of the entry"
    first, documents = segment_pages[0], segment_pages[1:]
    biases = document_log_scales(s, tilt, len(documents))
    entry.inv_temps = [1.0] * first + [1.0 / t] * sum(documents)
    entry.log_scales = [0.0] * first + [b for b, n in zip(biases, documents) for _ in range(n)]
    return entry


def _parallel(seq: Sequence) -> bool:
    """Whether the sequence reads documents in parallel (`ape_parallel`): with one segment or none, in order is the
    same."""
    return seq.options.ape_parallel and len(seq.segments) > 1


def rotary_starts(seq: Sequence) -> list[int]:
    """Where each placed segment's keys are read, in RoPE positions: its logical start, or with `ape_parallel`
    the first segment's length for every segment after the first (docs/design.md, "APE")."""
    if not _parallel(seq):
        return [p.start for p in seq.parts]
    first = len(seq.segments[0])
    return [0] + [first] * (len(seq.segments) - 1)


def final_shift(seq: Sequence) -> int:
    """The final segment's RoPE position minus its token position: with `ape_parallel` it starts right after the
    longest document, L_0 + max L_i, instead of after all of them; 0 otherwise."""
    if not _parallel(seq):
        return 0
    return len(seq.segments[0]) + max(len(s) for s in seq.segments[1:]) - seq.context_len


def relink_rows(segment_lens: list[int], first: int, last: int = 0) -> list[tuple[int, int]]:
    """Rows a relinked request recomputes per segment, (first, last): min(first, L) of its start and
    min(last, L - those) of its end, for each segment after the first (the first sits at position 0 with nothing
    before it: recomputing it would give the same KV)."""
    rows = []
    for i, n in enumerate(segment_lens):
        k = min(first, n) if i else 0
        rows.append((k, min(last, n - k) if i else 0))
    return rows


@dataclass
class LazyState(ModeState):
    """A relinked sequence's recomputed rows of segments[1:], in private pages: `relinks[i]`, segment i's first
    rows and `tails[i]`, its last rows (None where it recomputes none; index 0, the first segment, always None)."""

    relinks: list[Run | None] = field(default_factory=list)
    tails: list[Run | None] = field(default_factory=list)
    # every run, in the order they are computed and read (each segment's first rows, then its last rows): made once
    # at admission, since the scheduler reads it every step
    ordered: list[Run] = field(default_factory=list)
    # Once every run holds its pages: the whole context as lists (pages, deltas, valid, firsts), how many of its
    # pages each segment has, and where each run's rows start in it (id(run) -> page index). A run's context is a
    # prefix of it: the scheduler asks for one per run it schedules, so it is made once (LazyMode._relinked).
    layout: tuple[tuple[list[int], ...], list[int], dict[int, int]] | None = None

    @property
    def runs(self) -> list[Run]:
        return self.ordered

    def private_pages(self) -> list[list[int]]:
        # the runs are packed one after another into shared pages (Scheduler._schedule_relinks): each page once
        return [list(dict.fromkeys(p for r in self.ordered for p in r.pages))] if self.ordered else []


@dataclass
class BlockState(ModeState):
    """A sequence's private re-rotated copies of its documents placed after position 0, once made."""

    copies: list[int] = field(default_factory=list)
    copied: bool = False

    def private_pages(self) -> list[list[int]]:
        return [self.copies] if self.copies else []


class LazyMode(_DocumentMode):
    """One cached copy of each document, read in place at delta = its logical start (deferred RoPE).

    Relink (docs/design.md): a sequence with relink_tokens = k and relink_last_tokens = m recomputes the first k
    and the last m rows of each segment after the first at their logical positions, in context, into private pages
    (`LazyState`, one run each), and reads the rows between from the shared copy, whose other slots its page table
    skips."""

    name = "lazy"

    def new_state(self) -> LazyState:
        return LazyState()

    def admit(self, source: DocumentSource, seq: Sequence, acquired: list[Part], state: LazyState) -> Run:
        run = super().admit(source, seq, acquired, state)
        if any(seq.options.relink) and not seq.prefill_only:
            rows = relink_rows([len(s) for s in seq.segments], *seq.options.relink)
            for segment, part, (k, m) in zip(seq.segments, acquired, rows):
                state.relinks.append(Run(list(segment[:k]), start_pos=part.start) if k else None)
                end = len(segment) - m  # the last m rows sit at their logical positions from part.start + end
                state.tails.append(Run(list(segment[end:]), start_pos=part.start + end) if m else None)
            state.ordered = [r for pair in zip(state.relinks, state.tails) for r in pair if r is not None]
        return run

    def context(self, seq: Sequence, page_size: int, before: Run | None = None) -> EntryPages:
        """The pages the sequence's run reads before its own, or, for `before` one of its recomputed runs, the
        pages read before that run's rows: every row before them, as this sequence reads it."""
        entry, segment_pages = self._context(seq, page_size, before)
        return with_ape(entry, seq, segment_pages) if before is None else entry

    def _context(self, seq: Sequence, page_size: int, before: Run | None) -> tuple[EntryPages, list[int]]:
        """The entry and how many of its pages each segment has, in order."""
        state = seq.mode_state
        assert isinstance(state, LazyState), "a lazy-mode sequence is admitted by LazyMode"
        if not state.runs:
            pages: list[int] = []
            deltas: list[int] = []
            valid: list[int] = []
            segment_pages: list[int] = []
            for p, start in zip(seq.parts, rotary_starts(seq)):
                fill = page_fill(p.length, page_size)
                pages += p.segment.pages
                deltas += [start - p.rotated_at] * len(fill)
                valid += fill
                segment_pages.append(len(fill))
            return EntryPages(pages, deltas, valid), segment_pages
        layout = state.layout
        if layout is None:
            layout = self._relinked(seq, state, page_size)
            if all(r.pages for r in state.runs):
                state.layout = layout  # the runs' pages stay as they are from here on
        tables, segment_pages, starts = layout
        n = len(tables[0]) if before is None else starts[id(before)]
        return EntryPages(*(t[:n] for t in tables)), segment_pages

    @staticmethod
    def _relinked(
        seq: Sequence, state: LazyState, page_size: int
    ) -> tuple[tuple[list[int], ...], list[int], dict[int, int]]:
        """A relinked sequence's whole context as `LazyState.layout` describes it: per segment its recomputed first
        rows (private, delta 0, from the run's first slot), the shared rows between (the pages holding one, each
        from `first` and holding `valid` of them, at the part's delta), then its recomputed last rows."""
        pages: list[int] = []
        deltas: list[int] = []
        valid: list[int] = []
        firsts: list[int] = []
        segment_pages: list[int] = []
        starts: dict[int, int] = {}

        def own(run: Run) -> None:
            starts[id(run)] = len(pages)
            fill = page_fill(len(run.tokens), page_size, run.first_slot)
            pages.extend(run.pages[: len(fill)])
            deltas.extend([0] * len(fill))
            valid.extend(fill)
            firsts.extend([run.first_slot] + [0] * (len(fill) - 1))

        for p, head, tail in zip(seq.parts, state.relinks, state.tails):
            before_segment = len(pages)
            if head is not None:
                own(head)
            lo = len(head.tokens) if head is not None else 0
            hi = p.length - (len(tail.tokens) if tail is not None else 0)
            delta = p.start - p.rotated_at
            for m, (page, fill) in enumerate(zip(p.segment.pages, page_fill(p.length, page_size))):
                first = min(max(lo - m * page_size, 0), fill)  # the shared rows lo..hi-1 only: pages wholly
                end = min(max(hi - m * page_size, 0), fill)  # outside them drop out
                if end > first:
                    pages.append(page)
                    deltas.append(delta)
                    valid.append(end - first)
                    firsts.append(first)
            if tail is not None:
                own(tail)
            segment_pages.append(len(pages) - before_segment)
        return (pages, deltas, valid, firsts), segment_pages, starts


class BlockMode(_DocumentMode):
    """Published Block-Attention: private copies of the documents placed after position 0, re-rotated into place
    by one fused kernel before the sequence's first chunk, read at delta 0 and freed when it ends."""

    name = "block"
    copies = True
    reads_documents_in_same_step = False

    def moved_parts(self, seq: Sequence) -> list[Part]:
        """The parts that need a copy: a segment at position 0 is already where its keys were rotated."""
        return [p for p in seq.parts if p.start > 0]

    def new_state(self) -> BlockState:
        return BlockState()

    def copies_needed(self, seq: Sequence) -> bool:
        return not self._state(seq).copied

    def copy_sources(self, seq: Sequence) -> tuple[list[int], list[int]]:
        moved = self.moved_parts(seq)
        return [page for p in moved for page in p.segment.pages], [p.start for p in moved for _ in p.segment.pages]

    def set_copies(self, seq: Sequence, pages: list[int]) -> None:
        state = self._state(seq)
        state.copies, state.copied = pages, True

    @staticmethod
    def _state(seq: Sequence) -> BlockState:
        assert isinstance(seq.mode_state, BlockState), "a block-mode sequence is admitted by BlockMode"
        return seq.mode_state

    def context(self, seq: Sequence, page_size: int) -> EntryPages:
        pages: list[int] = []
        valid: list[int] = []
        segment_pages: list[int] = []
        copies = iter(self._state(seq).copies)
        for p in seq.parts:
            fill = page_fill(p.length, page_size)
            pages += [next(copies) for _ in fill] if p.start > 0 else p.segment.pages
            valid += fill
            segment_pages.append(len(fill))
        return with_ape(EntryPages(pages, [0] * len(pages), valid), seq, segment_pages)

    def _private_copies(self, segment_lens: list[int], page_size: int) -> int:
        return sum(cdiv(length, page_size) for length in segment_lens[1:])
