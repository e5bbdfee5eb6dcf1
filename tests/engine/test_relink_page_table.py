"""A relinked sequence's page tables (engine/modes/documents.py, `LazyMode.context`), for any segment lengths, page
size and relinked first and last rows: expanded key by key, the table lists every row of every segment exactly once,
in logical order, each from where docs/design.md ("Relink") says it is read (the recomputed first rows and last rows
from the sequence's private pages at delta 0, packed one run after another, the rest from the shared copy at the
part's delta), and a recomputed run's context is that table cut just before its own rows. The expectation is built
from the semantics, row by row, not from the table's code."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from lazyattn.engine.modes.documents import LazyMode, relink_rows
from lazyattn.engine.request_options import OFF
from lazyattn.engine.sampling import SamplingParams
from lazyattn.engine.sequence import Part, Sequence
from lazyattn.kernels.paged import EntryPages, cdiv


class Source:
    """Each segment as a cached document with pages of its own (ids from 1000 up), at its logical start."""

    def __init__(self, page_size: int, rotated_at: int) -> None:
        self.page_size, self.rotated_at, self.next_page = page_size, rotated_at, 1000

    def acquire_documents(self, segments, salt, acquired, keys, prefix) -> None:
        start = 0
        for i, seg in enumerate(segments):
            pages = list(range(self.next_page, self.next_page + cdiv(len(seg), self.page_size)))
            self.next_page += len(pages)
            rotated = self.rotated_at if i else 0  # a document encoded after the first segment (ape_prefix)
            acquired.append(Part(SimpleNamespace(pages=pages), start, len(seg), rotated_at=rotated))
            start += len(seg)


def expand(entry: EntryPages, page_size: int) -> list[tuple[int, int, int]]:
    """(page, slot, delta) of every key the table lists, in order."""
    firsts = entry.firsts or [0] * len(entry.pages)
    return [
        (page, slot, delta)
        for page, delta, valid, first in zip(entry.pages, entry.deltas, entry.valid, firsts)
        for slot in range(first, first + valid)
    ]


@settings(max_examples=300, deadline=None)
@given(
    lens=st.lists(st.integers(1, 70), min_size=1, max_size=6),
    page_size=st.sampled_from([16, 32]),
    first=st.integers(0, 40),
    last=st.integers(0, 40),
    rotated_at=st.integers(0, 9),
)
def test_every_row_is_listed_once_in_order_from_where_it_is_read(lens, page_size, first, last, rotated_at):
    segments = [[7] * n for n in lens]
    options = OFF.__class__(**{**OFF.__dict__, "relink_tokens": first, "relink_last_tokens": last})
    seq = Sequence(0, "r", 0, segments, [1, 2], SamplingParams(max_tokens=1), options=options)
    mode = LazyMode()
    state = mode.new_state()
    seq.mode_state = state
    acquired: list[Part] = []
    seq.run = mode.admit(Source(page_size, rotated_at), seq, acquired, state)
    seq.parts = acquired
    # The runs packed one after another into private pages 1, 2, ... (ids below the shared ones), as the scheduler
    # packs them: a run's row r sits in private slot `at[id(run)] + r`, page (that // page_size) + 1.
    at: dict[int, int] = {}
    slot = 0
    for run in state.runs:
        at[id(run)] = slot
        run.first_slot = slot % page_size
        run.pages = list(range(slot // page_size + 1, cdiv(slot + len(run.tokens), page_size) + 1))
        slot += len(run.tokens)

    def private(run, r):
        return (at[id(run)] + r) // page_size + 1, (at[id(run)] + r) % page_size, 0

    # Where each row of each segment must come from, by the semantics alone: (page, slot, delta).
    rows = relink_rows(lens, first, last)
    want: list[tuple[int, int, int]] = []
    starts: dict[int, int] = {}  # id(run) -> its first row's index in `want`
    for i, (part, (k, m)) in enumerate(zip(acquired, rows)):
        # no relink at all: no runs listed (plain lazy mode)
        head, tail = (state.relinks[i], state.tails[i]) if state.relinks else (None, None)
        assert (head is None) == (k == 0) and (tail is None) == (m == 0)
        if head is not None:
            assert head.tokens == segments[i][:k] and head.start_pos == part.start
            starts[id(head)] = len(want)
            want += [private(head, r) for r in range(k)]
        delta = part.start - part.rotated_at
        want += [(part.segment.pages[r // page_size], r % page_size, delta) for r in range(k, lens[i] - m)]
        if tail is not None:
            assert tail.tokens == segments[i][lens[i] - m :] and tail.start_pos == part.start + lens[i] - m
            starts[id(tail)] = len(want)
            want += [private(tail, r) for r in range(m)]
    assert len(want) == sum(lens)
    assert expand(mode.context(seq, page_size), page_size) == want
    assert (state.layout is not None) == bool(state.runs)  # made once, every run's context cut from it
    for run in state.runs:
        assert expand(mode.context(seq, page_size, before=run), page_size) == want[: starts[id(run)]]
    # every private page once, as many as the packed rows need
    assert state.private_pages() == ([list(range(1, cdiv(slot, page_size) + 1))] if state.runs else [])
    assert cdiv(sum(k + m for k, m in rows), page_size) == sum(map(len, state.private_pages()))
