"""lazy and block: each segment is a cached document, encoded alone at local positions; the run is the final
segment. They differ in how a sequence reads a document placed after position 0: in place, at delta = its logical
start (lazy), or through a private re-rotated copy (block).

- relink (lazy only): the recomputed first rows of each placed document, private to the sequence
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
        return Run(seq.prompt + seq.output, start_pos=seq.context_len)

    def pages_needed(
        self, segment_lens: list[int], run_tokens: int, n: int, page_size: int, relink_tokens: int = 0
    ) -> int:
        documents = sum(cdiv(length, page_size) for length in segment_lens)  # shared by the n samples
        relinks = sum(cdiv(rows, page_size) for rows in relink_rows(segment_lens, relink_tokens))
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


def relink_rows(segment_lens: list[int], relink_tokens: int) -> list[int]:
    """Rows a relinked request recomputes per segment: min(k, length) for each segment after the first (the first
    sits at position 0 with nothing before it: recomputing it would give the same KV)."""
    return [0] + [min(relink_tokens, n) for n in segment_lens[1:]] if relink_tokens else [0] * len(segment_lens)


@dataclass
class LazyState(ModeState):
    """A relinked sequence's recomputed first rows of segments[1:], one run per segment, in private pages."""

    relinks: list[Run] = field(default_factory=list)

    @property
    def runs(self) -> list[Run]:
        return self.relinks

    def private_pages(self) -> list[list[int]]:
        return [r.pages for r in self.relinks]


@dataclass
class BlockState(ModeState):
    """A sequence's private re-rotated copies of its documents placed after position 0, once made."""

    copies: list[int] = field(default_factory=list)
    copied: bool = False

    def private_pages(self) -> list[list[int]]:
        return [self.copies] if self.copies else []


class LazyMode(_DocumentMode):
    """One cached copy of each document, read in place at delta = its logical start (deferred RoPE).

    Relink (docs/design.md): a sequence with relink_tokens = k recomputes the first k rows of each segment after
    the first at their logical positions, in context, into private pages (`LazyState.relinks`, one run per segment),
    and reads the rest of each document from the shared copy, whose first k slots its page table skips."""

    name = "lazy"

    def new_state(self) -> LazyState:
        return LazyState()

    def admit(self, source: DocumentSource, seq: Sequence, acquired: list[Part], state: LazyState) -> Run:
        run = super().admit(source, seq, acquired, state)
        if seq.options.relink_tokens and not seq.prefill_only:
            rows = relink_rows([len(s) for s in seq.segments], seq.options.relink_tokens)
            state.relinks = [
                Run(list(segment[:n]), start_pos=part.start)
                for segment, part, n in zip(seq.segments[1:], acquired[1:], rows[1:])
            ]
        return run

    def context(self, seq: Sequence, page_size: int, upto: int | None = None) -> EntryPages:
        """The pages of the segments before `upto` (default: all): the run's context, or, for `upto` = i, the
        context of segment i's recomputed rows."""
        entry, segment_pages = self._context(seq, page_size, upto)
        return with_ape(entry, seq, segment_pages) if upto is None else entry

    def _context(self, seq: Sequence, page_size: int, upto: int | None) -> tuple[EntryPages, list[int]]:
        """The entry and how many of its pages each segment has, in order."""
        relinks = seq.mode_state.runs
        segment_pages: list[int] = []
        if not relinks:
            pages: list[int] = []
            deltas: list[int] = []
            valid: list[int] = []
            for p in seq.parts[:upto]:
                fill = page_fill(p.length, page_size)
                pages += p.segment.pages
                deltas += [p.start - p.rotated_at] * len(fill)
                valid += fill
                segment_pages.append(len(fill))
            return EntryPages(pages, deltas, valid), segment_pages
        entry = EntryPages([], [], [], [])
        for i, p in enumerate(seq.parts[:upto]):
            before = len(entry.pages)
            skip = 0
            if i:  # the recomputed rows first, at their logical positions (delta 0), then the shared rest
                own = relinks[i - 1]
                skip = len(own.tokens)
                entry = entry.then(own.pages, page_fill(skip, page_size))
            for m, (page, fill) in enumerate(zip(p.segment.pages, page_fill(p.length, page_size))):
                first = min(max(skip - m * page_size, 0), fill)  # pages wholly inside the first k rows drop out
                if fill > first:
                    entry.pages.append(page)
                    entry.deltas.append(p.start - p.rotated_at)
                    entry.valid.append(fill - first)
                    entry.firsts.append(first)
            segment_pages.append(len(entry.pages) - before)
        return entry, segment_pages


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
