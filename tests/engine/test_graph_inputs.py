"""engine/graph_inputs.py's fill_tables for entries that extend a context kept across steps (EntryPages.then):
the tables it writes from the context's converted record equal PagedBatch.build's (an independent construction),
step after step as the entries' own pages grow."""

from __future__ import annotations

import hypothesis
import torch
from hypothesis import strategies as st

from lazyattn.engine.graph_inputs import TABLES, fill_tables, paged_batch, table_views
from lazyattn.kernels.paged import EntryPages, PagedBatch, page_fill

PAGE = 16
WIDTH = 12


def assert_tables_equal_build(tables: torch.Tensor, entries: list[EntryPages]) -> None:
    built = PagedBatch.build(entries, [1] * len(entries), [0] * len(entries))
    width = built.max_pages
    firsts = built.firsts if built.firsts is not None else torch.zeros_like(built.pages)
    got = table_views(tables[: len(entries)])
    for name, mine, want in zip(
        ("pages", "deltas", "valid", "starts", "firsts"),
        got,
        (built.pages, built.deltas, built.valid, built.starts, firsts),
    ):
        assert torch.equal(mine[:, :width], want), name
    assert not got[0][:, width:].any()


def test_fill_tables_from_kept_contexts_as_own_pages_grow():
    contexts = [
        EntryPages([3, 1, 4], [0, 7, 7], [16, 16, 5], [0, 2, 0]),  # relinked: first slots
        EntryPages([9, 8], [0, 40], [12, 16]),
        EntryPages([], [], []),  # nothing before the run's own pages
    ]
    own = [[20, 21, 22], [30, 31, 32], [40, 41, 42]]
    tables = torch.full((4, TABLES, WIDTH), 99, dtype=torch.int32)
    for upto in (1, 15, 16, 17, 33):  # keys of the run: its pages fill, a page is added
        n = -(-upto // PAGE)
        entries = [c.then(p[:n], page_fill(upto, PAGE)) for c, p in zip(contexts, own)]
        assert all(e.base is c for e, c in zip(entries, contexts))
        fill_tables(tables.numpy(), entries)
        assert_tables_equal_build(tables, entries)
        # The same entries without their context (a plain list each) give the same tables.
        plain = [EntryPages(list(e.pages), list(e.deltas), list(e.valid), e.firsts) for e in entries]
        again = torch.full_like(tables, 99)
        fill_tables(again.numpy(), plain)
        assert torch.equal(again[:3], tables[:3])
    assert "tables" in contexts[0].derived and contexts[2].derived is None  # converted once; an empty one never


def test_own_pages_from_a_first_slot():
    """A run packed after another run's rows (relinked rows, docs/design.md "Relink"): its pages hold its rows from
    slot `first` of the first one, by hand."""
    assert page_fill(20, PAGE, 5) == [11, 9] and page_fill(3, PAGE, 6) == [3] and page_fill(11, PAGE, 5) == [11]
    assert page_fill(20, PAGE, 0) == page_fill(20, PAGE) == [16, 4]
    context = EntryPages([3], [7], [16])
    entry = context.then([20, 21], [11, 9], 5)
    assert (entry.pages, entry.deltas, entry.valid, entry.firsts) == ([3, 20, 21], [7, 0, 0], [16, 11, 9], [0, 5, 0])
    assert entry.base is context and context.then([20], [4]).firsts is None  # no offset: no firsts
    relinked = EntryPages([3, 1], [0, 7], [16, 5], [0, 2]).then([22, 23], [16, 1])
    assert relinked.firsts == [0, 2, 0, 0]


def assert_same_batch(got: PagedBatch, want: PagedBatch) -> None:
    for name in ("cu_seqlens_q", "q_start", "num_pages", "pages", "deltas", "valid", "starts"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert (got.max_q, got.max_kv) == (want.max_q, want.max_kv)
    for name in ("firsts", "inv_temps", "log_scales"):
        mine, theirs = getattr(got, name), getattr(want, name)
        assert (mine is None) == (theirs is None), name
        if mine is not None:  # past an entry's pages the kernels read nothing: compare what they read
            listed = torch.arange(mine.shape[1])[None, :] < want.num_pages[:, None]
            assert torch.equal(mine[listed], theirs[listed]), name
            assert mine.stride() == got.pages.stride()
    tables = (got.pages, got.deltas, got.valid, got.starts)
    assert not got.pages.numel() or all(t.stride() == (got.pages.stride(0), 1) for t in tables)
    if got.inv_temps is not None:
        got.ape_gap  # noqa: B018 -- raises unless both are views of one buffer with the pages' row stride


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(widths=st.lists(st.integers(0, 11), min_size=1, max_size=9), ape=st.booleans(), firsts=st.booleans())
def test_every_table_of_a_paged_batch_starts_16_byte_aligned(widths, ape, firsts):
    """Triton specialises a kernel on each pointer's 16-byte alignment and each integer's divisibility by 16: were a
    table's start or row stride to depend on the batch's size and width, a batch of another shape would compile a new
    kernel variant mid-serving. Whatever the entries, every tensor the kernels take starts aligned, every row stride
    is a multiple of 16, and the batch still reads as build's."""
    entries = [
        EntryPages(
            list(range(w)),
            [0] * w,
            [PAGE] * w,
            [1] * w if firsts and w else None,
            [0.5] * w if ape and w else None,
            [0.1] * w if ape and w else None,
        )
        for w in widths
    ]
    q_lens, q_starts = [2] * len(entries), [7] * len(entries)
    got = paged_batch(entries, q_lens, q_starts, torch.device("cpu"))
    assert_same_batch(got, PagedBatch.build(entries, q_lens, q_starts))
    for name in ("cu_seqlens_q", "q_start", "num_pages", "pages", "deltas", "valid", "starts", "firsts", "inv_temps"):
        t = getattr(got, name)
        assert t is None or t.data_ptr() % 16 == 0, name
        assert t is None or t.dim() == 1 or t.stride(0) % 16 == 0, name  # and a row stride Triton sees as one


def test_paged_batch_is_what_build_makes():
    """The eager step's batch from fill_tables equals PagedBatch.build's (an independent construction): plain
    entries, entries extending a kept context, relinked first slots, temperatures and scales, an empty entry."""
    context = EntryPages([3, 1, 4], [0, 7, 7], [16, 16, 5])
    cases = [
        [EntryPages([9], [0], [12]), context.then([20, 21], page_fill(17, PAGE)), EntryPages([], [], [])],
        [context.then([20], [1]), EntryPages([3, 1, 4], [0, 7, 7], [16, 16, 5], [0, 2, 0]).then([22], [3])],
        [context.then([20, 21], page_fill(20, PAGE, 5), 5), EntryPages([9], [0], [12]).then([22], [3], 13)],
        [
            EntryPages([5, 6], [0, 9], [16, 4], inv_temps=[1.0, 0.5], log_scales=[0.0, 0.3]).then([30], [2]),
            EntryPages([5], [0], [16]),
        ],
        [],
    ]
    for entries in cases:
        q_lens = [1 + i for i in range(len(entries))]
        q_starts = [40 + i for i in range(len(entries))]
        for _ in range(2):  # the second time from the kept contexts' converted tables
            got = paged_batch(entries, q_lens, q_starts, torch.device("cpu"))
            assert_same_batch(got, PagedBatch.build(entries, q_lens, q_starts))


def test_a_long_question_over_placed_documents_is_not_counted_as_a_prompt():
    """PagedBatch.max_prompt_q, hand-counted: an entry is a question over placed documents when it reads at least as
    many keys at nonzero deltas as it has rows. The engine's eager batch counts only entries longer than the Hopper
    kernel's longest question (256 rows); PagedBatch.build counts every entry."""
    documents = EntryPages([3, 1, 4], [0, 7, 7], [64, 64, 40])  # 104 keys at delta 7
    own = EntryPages([5, 6, 8, 9, 10], [0] * 5, [64] * 5)  # a prompt's own earlier rows: delta 0
    assert documents.reads_documents(104) and not documents.reads_documents(105)
    assert not own.reads_documents(1) and EntryPages([], [], []).reads_documents(0)
    long_docs = documents.then([20, 21, 22, 23, 24], [64] * 5)  # 320 keys of its own, 104 shifted
    many_docs = EntryPages([3, 1, 4, 2, 7, 11], [9] * 6, [64] * 6).then([20] * 5, [64] * 5)  # 384 shifted
    cases = [
        ([documents, own], [100, 200], 0, 200),  # short entries: the engine counts none
        ([many_docs, own], [300, 200], 0, 200),  # 384 shifted keys >= 300 rows: a question
        ([long_docs, own], [300, 10], 300, 300),  # 104 shifted keys < 300 rows: a prompt
        ([many_docs, own.then([30] * 4, [64] * 4)], [300, 500], 500, 500),
    ]
    for entries, q_lens, engine, built in cases:
        assert paged_batch(entries, q_lens, [0, 0], torch.device("cpu")).max_prompt_q == engine
        assert PagedBatch.build(entries, q_lens, [0, 0]).max_prompt_q == built
