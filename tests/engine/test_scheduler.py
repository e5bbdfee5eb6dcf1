"""The scheduler on its own: admission per mode, the chunked-prefill budget, preemption and eviction under
page pressure, and page accounting after aborts. No model runs; `scheduler_bench` stands in for the engine.

Expectations are worked out by hand from token counts (PAGE = 16 tokens a page): a document of 37 tokens
owns 3 pages holding 16, 16 and 5 keys; in a request [A(37), B(20), prompt] A starts at logical position
0, B at 37 and the prompt at 57.
"""

from __future__ import annotations

import pytest

from lazyattn.engine.sequence import Status
from lazyattn.errors import OutOfPagesError
from tests.engine.scheduler_bench import PAGE, SAMPLED, make_bench, page_count, tokens

MODES = ["lazy", "block", "prefix", "full"]


def prefix_block_keys(bench, toks: list[int], n_blocks: int) -> list[str]:
    """Prefix mode's chained page keys: page b's key covers its tokens and the key of page b - 1."""
    keys: list[str] = []
    for b in range(n_blocks):
        keys.append(bench.key(toks[b * PAGE : (b + 1) * PAGE], parent=keys[-1] if keys else None))
    return keys


def all_pages_idle(bench) -> bool:
    """Every page in use belongs to a cached document nobody holds (evictable), and the cache accounts
    for all of them."""
    used = bench.pool.num_used
    return bench.cache.evictable_pages() == used == bench.cache.stats().pages_in_use


# -- admission per mode --------------------------------------------------------------------------------


def test_lazy_encodes_each_missing_document_once_and_attends_to_it_at_its_logical_start():
    b = make_bench("lazy")
    a, bb = b.doc("A", 37, 1), b.doc("B", 20, 2)
    s1 = b.add("s1", [a, bb], tokens(9, 50))
    batch = b.step()

    stats = b.cache.stats()
    assert (stats.lookups, stats.misses, stats.hits) == (2, 2, 0)
    # Lazy attends to a document in the same step as its last encode chunk.
    assert b.plan(batch) == [("A", 0, 37), ("B", 0, 20), ("s1", 0, 9)]
    seg_a, seg_b = b.segment(a), b.segment(bb)
    assert (len(seg_a.pages), len(seg_b.pages)) == (3, 2)
    assert seg_a.ready and seg_b.ready and not b.scheduler.jobs
    ctx = batch.works[-1].context
    assert list(ctx.pages) == [*seg_a.pages, *seg_b.pages]
    assert list(ctx.deltas) == [0, 0, 0, 37, 37]
    assert list(ctx.valid) == [16, 16, 5, 16, 4]
    assert s1.run.start_pos == 57 and len(s1.run.pages) == 1
    assert s1.output == [SAMPLED]
    assert b.pool.num_used == 3 + 2 + 1


def test_lazy_reordered_documents_hit_and_move_only_their_deltas():
    b = make_bench("lazy")
    a, bb = b.doc("A", 37, 1), b.doc("B", 20, 2)
    b.add("s1", [a, bb], tokens(9, 50), max_tokens=1)
    b.step()
    s2 = b.add("s2", [bb, a], tokens(5, 51))
    batch = b.step()

    stats = b.cache.stats()
    assert (stats.lookups, stats.misses, stats.hits) == (4, 2, 2)
    assert b.plan(batch) == [("s2", 0, 5)]
    ctx = batch.works[0].context
    assert list(ctx.pages) == [*b.segment(bb).pages, *b.segment(a).pages]
    assert list(ctx.deltas) == [0, 0, 20, 20, 20]
    assert list(ctx.valid) == [16, 4, 16, 16, 5]
    assert s2.metrics.cached_tokens == 57 and s2.run.start_pos == 57


def test_two_sequences_missing_the_same_document_share_one_encode():
    b = make_bench("lazy")
    a = b.doc("A", 37, 1)
    s1 = b.add("s1", [a], tokens(5, 50))
    s2 = b.add("s2", [a], tokens(7, 51))
    batch = b.step()

    stats = b.cache.stats()
    assert (stats.misses, stats.hits) == (1, 1)
    assert b.plan(batch) == [("A", 0, 37), ("s1", 0, 5), ("s2", 0, 7)]
    seg = b.segment(a)
    assert seg.refcount == 2
    assert list(batch.works[1].context.pages) == list(batch.works[2].context.pages) == list(seg.pages)
    assert (s1.metrics.cached_tokens, s2.metrics.cached_tokens) == (0, 37)


def test_a_document_placed_twice_in_one_request_is_encoded_once_and_attended_at_both_starts():
    b = make_bench("lazy")
    a = b.doc("A", 37, 1)
    s1 = b.add("s1", [a, a], tokens(3, 50), max_tokens=1)
    batch = b.step()

    assert b.plan(batch) == [("A", 0, 37), ("s1", 0, 3)]
    seg = b.segment(a)
    ctx = batch.works[-1].context
    assert list(ctx.pages) == [*seg.pages, *seg.pages]
    assert list(ctx.deltas) == [0, 0, 0, 37, 37, 37]
    assert s1.is_finished and seg.refcount == 0 and b.pool.num_used == 3


def test_block_waits_for_ready_documents_then_copies_those_placed_after_position_zero():
    b = make_bench("block")
    sys_, a, bb = b.doc("S", 10, 1), b.doc("A", 37, 2), b.doc("B", 20, 3)
    s1 = b.add("s1", [sys_, a, bb], tokens(5, 50), max_tokens=1)

    first = b.step()  # block attends only to ready documents: the encodes run alone
    assert b.plan(first) == [("S", 0, 10), ("A", 0, 37), ("B", 0, 20)]
    assert first.copies == () and s1.output == []

    second = b.step()
    assert b.plan(second) == [("s1", 0, 5)]
    (copy,) = second.copies
    seg_s, seg_a, seg_b = b.segment(sys_), b.segment(a), b.segment(bb)
    assert copy.src == [*seg_a.pages, *seg_b.pages]
    assert copy.deltas == [10, 10, 10, 47, 47]
    assert len(copy.dst) == 5
    assert not set(copy.dst) & {*seg_s.pages, *seg_a.pages, *seg_b.pages}
    ctx = second.works[0].context
    assert list(ctx.pages) == [*seg_s.pages, *copy.dst]
    assert list(ctx.deltas) == [0] * 6
    assert list(ctx.valid) == [10, 16, 16, 5, 16, 4]
    # Finished after one token: the private copies and the run's page are free again, the documents stay.
    assert s1.is_finished and b.pool.num_used == 1 + 3 + 2
    assert not any(b.pool.is_used(p) for p in copy.dst)


def test_block_attends_in_place_to_a_document_at_position_zero():
    b = make_bench("block")
    a = b.doc("A", 37, 1)
    b.add("s1", [a], tokens(5, 50))
    b.step()
    batch = b.step()

    assert b.plan(batch) == [("s1", 0, 5)]
    assert all(c.dst == [] for c in batch.copies)
    ctx = batch.works[0].context
    assert list(ctx.pages) == list(b.segment(a).pages) and list(ctx.deltas) == [0, 0, 0]
    assert b.pool.num_used == 3 + 1


def test_block_copies_are_private_to_each_sequence_and_freed_with_it():
    b = make_bench("block")
    sys_, a = b.doc("S", 10, 1), b.doc("A", 37, 2)
    s1 = b.add("s1", [sys_, a], tokens(5, 50))
    s2 = b.add("s2", [sys_, a], tokens(6, 51))
    b.step()
    batch = b.step()

    assert b.plan(batch) == [("s1", 0, 5), ("s2", 0, 6)]
    c1, c2 = batch.copies
    assert (c1.seq_id, c2.seq_id) == (s1.seq_id, s2.seq_id)
    assert c1.src == c2.src == list(b.segment(a).pages) and c1.deltas == c2.deltas == [10, 10, 10]
    assert not set(c1.dst) & set(c2.dst)
    assert b.pool.num_used == (1 + 3) + 2 * (3 + 1)
    b.abort(s1)
    assert b.pool.num_used == (1 + 3) + (3 + 1)
    assert not any(b.pool.is_used(p) for p in c1.dst) and all(b.pool.is_used(p) for p in c2.dst)
    assert s2.status is Status.RUNNING


@pytest.mark.parametrize(("n_tokens", "n_blocks"), [(16, 0), (17, 1), (32, 1), (33, 2), (66, 4)])
def test_prefix_caches_every_full_page_except_one_holding_the_last_token(n_tokens, n_blocks):
    """The last prompt token's logits are needed, so the page holding it is never taken from the cache."""
    b = make_bench("prefix")
    prompt = tokens(n_tokens, 50)
    s1 = b.add("s1", [], prompt)
    batch = b.step()

    assert b.cache.stats().misses == n_blocks == len(b.cache)
    assert b.plan(batch) == [("s1", 0, n_tokens)]
    assert list(batch.works[0].context.pages) == []
    segs = [b.cache.lookup(k) for k in prefix_block_keys(b, prompt, n_blocks)]
    assert all(s is not None and s.ready for s in segs)
    assert s1.run.start_pos == 0 and s1.run.owned == n_blocks
    assert s1.run.pages[:n_blocks] == [p for s in segs for p in s.pages]
    assert len(s1.run.pages) == page_count(n_tokens)


def test_prefix_reuses_an_exact_token_prefix_only():
    b = make_bench("prefix")
    a, bb = b.doc("A", 37, 1), b.doc("B", 20, 2)
    b.add("s1", [a, bb], tokens(9, 50), max_tokens=1)
    b.step()
    first = prefix_block_keys(b, a + bb + tokens(9, 50), 4)

    # Same documents, another question: pages 0-2 (tokens 0-47) match, page 3 holds question tokens.
    s2 = b.add("s2", [a, bb], tokens(9, 51), max_tokens=1)
    batch = b.step()
    stats = b.cache.stats()
    assert (stats.hits, stats.misses) == (3, 4 + 1)
    whole = a + bb + tokens(9, 51)
    assert b.plan(batch) == [("s2", 0, 66 - 48)]
    work = batch.works[0]
    assert work.run.tokens[: 66 - 48] == whole[48:] and work.run.start_pos == 48 and work.run.owned == 1
    assert list(work.context.pages) == [p for k in first[:3] for p in b.cache.lookup(k).pages]
    assert list(work.context.deltas) == [0, 0, 0] and list(work.context.valid) == [16, 16, 16]
    assert s2.metrics.cached_tokens == 48

    # The same documents in another order share no prefix: every page misses.
    s3 = b.add("s3", [bb, a], tokens(9, 50))
    b.step()
    assert b.cache.stats().misses == 5 + 4 and b.cache.stats().hits == 3
    assert s3.run.start_pos == 0 and s3.metrics.cached_tokens == 0


def test_prefix_waits_for_pages_another_sequence_is_computing():
    b = make_bench("prefix")
    whole = tokens(66, 50)
    s1 = b.add("s1", [], whole)
    s2 = b.add("s2", [], whole)

    first = b.step()
    assert b.plan(first) == [("s1", 0, 66)]
    assert (b.cache.stats().misses, b.cache.stats().hits) == (4, 4)
    assert s2.run.start_pos == 64 and s2.run.tokens == whole[64:] and s2.run.owned == 0
    second = b.step()
    assert b.plan(second) == [("s1", 66, 67), ("s2", 0, 2)]
    assert list(second.works[1].context.pages) == s1.run.pages[:4]


def test_prefix_does_not_reuse_pages_whose_parent_page_is_gone():
    b = make_bench("prefix")
    whole = tokens(66, 50)
    b.add("s1", [], whole, max_tokens=1)
    b.step()
    keys = prefix_block_keys(b, whole, 4)
    assert b.cache.remove(keys[0])

    s2 = b.add("s2", [], whole)
    b.step()
    # Page 0 is computed again; pages 1-3 are still cached but hang from the old page 0: the sequence
    # computes everything after page 0 privately rather than acquiring them.
    assert s2.run.start_pos == 0 and s2.run.owned == 1 and len(s2.run.pages) == 5
    assert [b.cache.lookup(k).refcount for k in keys[1:]] == [0, 0, 0]
    assert b.pool.num_used == 3 + 5


def test_full_mode_caches_nothing():
    b = make_bench("full")
    a, bb = b.doc("A", 37, 1), b.doc("B", 20, 2)
    s1 = b.add("s1", [a, bb], tokens(9, 50), max_tokens=2)
    batch = b.step()

    assert b.cache.stats().lookups == 0 and len(b.cache) == 0
    assert b.plan(batch) == [("s1", 0, 66)]
    assert s1.run.tokens[:66] == a + bb + tokens(9, 50) and s1.run.start_pos == 0
    assert list(batch.works[0].context.pages) == []
    assert b.pool.num_used == 5
    b.step()
    assert s1.is_finished and b.pool.num_used == 0


def test_salted_documents_are_cached_per_tenant():
    b = make_bench("lazy")
    a = b.doc("A", 37, 1)
    s1 = b.add("s1", [a], tokens(4, 50))
    s2 = b.add("s2", [a], tokens(4, 51), salt="tenant-b")
    b.step()
    assert b.cache.stats().misses == 2 and b.cache.stats().hits == 0
    assert set(s1.parts[0].segment.pages).isdisjoint(s2.parts[0].segment.pages)


# -- the chunked-prefill budget ------------------------------------------------------------------------


def test_a_long_prompt_is_computed_in_budget_sized_chunks():
    b = make_bench("full", max_num_batched_tokens=32)
    s1 = b.add("s1", [], tokens(70, 50), max_tokens=3)

    plans, pages, outputs = [], [], []
    for _ in range(4):
        plans += b.plan(b.step())
        pages.append(len(s1.run.pages))
        outputs.append(len(s1.output))
    assert plans == [("s1", 0, 32), ("s1", 32, 64), ("s1", 64, 70), ("s1", 70, 71)]
    assert pages == [2, 4, 5, 5]  # pages are reserved chunk by chunk, not for the whole prompt at once
    assert outputs == [0, 0, 1, 2]


def test_document_encodes_come_before_the_sequences_own_chunk_in_one_budget():
    b = make_bench("lazy", max_num_batched_tokens=32)
    a = b.doc("A", 37, 1)
    b.add("s1", [a], tokens(20, 50))
    assert [b.plan(b.step()) for _ in range(3)] == [
        [("A", 0, 32)],
        [("A", 32, 37), ("s1", 0, 20)],
        [("s1", 20, 21)],
    ]


def test_decode_rows_come_before_prefill_chunks():
    """s1 was admitted first but waits a step for its document (block mode); s2 overtakes it, and from
    then on its decode row is scheduled ahead of s1's prefill."""
    b = make_bench("block", max_num_batched_tokens=40)
    d = b.doc("D", 30, 1)
    b.add("s1", [d], tokens(8, 50))
    b.add("s2", [], tokens(4, 51))
    assert b.plan(b.step()) == [("D", 0, 30), ("s2", 0, 4)]
    assert [r.request_id for r in b.scheduler.running] == ["s1", "s2"]
    assert b.plan(b.step()) == [("s2", 4, 5), ("s1", 0, 8)]


def test_a_step_packs_decode_rows_and_gives_prefill_the_rest_of_the_budget():
    b = make_bench("lazy", max_num_batched_tokens=8)
    b.add("s1", [], tokens(4, 50), max_tokens=10)
    b.add("s2", [], tokens(20, 51))
    plans = [b.plan(b.step()) for _ in range(4)]
    assert plans == [
        [("s1", 0, 4), ("s2", 0, 4)],
        [("s1", 4, 5), ("s2", 4, 11)],
        [("s1", 5, 6), ("s2", 11, 18)],
        [("s1", 6, 7), ("s2", 18, 20)],
    ]


def test_admission_stops_once_pending_prefill_fills_a_step():
    b = make_bench("lazy", max_num_batched_tokens=32)
    b.add("s1", [], tokens(40, 50))
    b.add("s2", [], tokens(4, 51))
    assert b.plan(b.step()) == [("s1", 0, 32)]
    assert [s.request_id for s in b.scheduler.waiting] == ["s2"]
    assert b.plan(b.step()) == [("s1", 32, 40), ("s2", 0, 4)]


def test_max_num_seqs_caps_the_running_sequences():
    b = make_bench("lazy", max_num_seqs=2)
    b.add("s1", [], tokens(4, 50), max_tokens=1)
    b.add("s2", [], tokens(4, 51))
    b.add("s3", [], tokens(4, 52))
    assert b.plan(b.step()) == [("s1", 0, 4), ("s2", 0, 4)]
    assert [s.request_id for s in b.scheduler.waiting] == ["s3"]
    assert b.plan(b.step()) == [("s2", 4, 5), ("s3", 0, 4)]  # s1 finished: its slot goes to s3


def test_admission_waits_for_pages_while_something_runs_and_raises_when_nothing_could_free_them():
    b = make_bench("full", num_pages=4)
    r = b.add("r", [], tokens(48, 50), max_tokens=2)
    b.step()
    w = b.add("w", [], tokens(32, 51))
    assert b.plan(b.step()) == [("r", 48, 49)]  # w needs 2 pages, 1 is free: it waits
    assert r.is_finished and w.status is Status.WAITING
    assert b.plan(b.step()) == [("w", 0, 32)]

    never = make_bench("full", num_pages=4)
    never.add("big", [], tokens(5 * PAGE, 52))
    with pytest.raises(OutOfPagesError):
        never.step()


def test_a_sequence_short_of_pages_holds_back_admission_of_later_ones():
    b = make_bench("full", num_pages=4)
    s1 = b.add("s1", [], tokens(40, 50), max_tokens=2)
    s2 = b.add("s2", [], tokens(40, 51))
    assert b.plan(b.step()) == [("s1", 0, 40)]  # both admitted; s2 finds no pages for its prefill
    assert s2.status is Status.RUNNING and s2.run.pages == []
    s3 = b.add("s3", [], tokens(8, 52))
    assert b.plan(b.step()) == [("s1", 40, 41)]
    # One page is free and s3 needs only one, but it must not take pages s2 is waiting for.
    assert s1.is_finished and s3.status is Status.WAITING
    assert b.plan(b.step()) == [("s2", 0, 40)]
    assert b.plan(b.step()) == [("s2", 40, 41), ("s3", 0, 8)]


# -- preemption and eviction under page pressure --------------------------------------------------------


def preempting_bench():
    """Three sequences of one page each filling a 6-page pool as they decode; s4 waits (max_num_seqs 3).
    A run of 16 prompt tokens needs its third page to compute token 32, on step 18."""
    b = make_bench("full", num_pages=6, max_num_seqs=3)
    seqs = [b.add(f"s{i}", [], tokens(16, 50 + i), max_tokens=20) for i in (1, 2, 3)]
    b.steps(17)
    seqs.append(b.add("s4", [], tokens(16, 54)))
    assert b.scheduler.num_preemptions == 0 and b.pool.num_used == 6
    return b, seqs


def test_page_pressure_preempts_the_newest_sequence_to_the_front_of_the_queue():
    b, (s1, s2, s3, s4) = preempting_bench()
    batch = b.step()

    assert b.plan(batch) == [("s1", 32, 33), ("s2", 32, 33)]
    assert b.scheduler.num_preemptions == 1
    assert s3.status is Status.WAITING and s3.run is None and s3.parts == []
    assert list(b.scheduler.waiting) == [s3, s4]
    assert len(s3.output) == 17  # its output is kept for recomputation
    assert b.pool.num_used == 3 + 3


def test_a_preempted_sequence_recomputes_its_prompt_and_output():
    b, (s1, s2, s3, s4) = preempting_bench()
    b.steps(3)  # s1 and s2 reach max_tokens at step 20; s3 cannot come back before (3 pages, none free)
    assert s1.is_finished and s2.is_finished and s3.status is Status.WAITING

    batch = b.step()
    assert b.plan(batch) == [("s3", 0, 33), ("s4", 0, 16)]
    assert s3.run.tokens[:33] == tokens(16, 53) + [SAMPLED] * 17
    assert s3.metrics.prefilled_tokens == (16 + 16) + 33
    assert len(s3.output) == 18


def test_unreferenced_documents_are_evicted_least_recently_used_first_before_any_preemption():
    b = make_bench("lazy", num_pages=6)
    d1, d2 = b.doc("D1", 32, 1), b.doc("D2", 32, 2)
    for name, doc in (("a", d1), ("b", d2), ("c", d1)):  # c touches D1 again: D2 is now the oldest
        b.add(name, [doc], tokens(4, 50 + len(name)), max_tokens=1)
        b.step()
    y = b.add("y", [], tokens(8, 60), max_tokens=20)
    b.step()
    assert b.pool.num_used == 2 + 2 + 1 and b.cache.evictable_pages() == 4

    x = b.add("x", [], tokens(48, 61), max_tokens=20)
    assert b.plan(b.step()) == [("y", 8, 9), ("x", 0, 48)]
    assert b.segment(d2) is None and b.segment(d1) is not None
    assert b.cache.stats().evictions == 1 and b.scheduler.num_preemptions == 0

    assert b.plan(b.step()) == [("y", 9, 10), ("x", 48, 49)]  # x's fourth page: D1 goes too
    assert b.segment(d1) is None
    assert b.cache.stats().evictions == 2 and b.scheduler.num_preemptions == 0
    assert x.status is y.status is Status.RUNNING


def test_a_sequence_whose_prefix_encoder_aborts_restarts_as_the_encoder():
    b = make_bench("prefix", max_num_batched_tokens=34)
    decoders = [b.add(f"r{i}", [], tokens(4, 40 + i), max_tokens=20) for i in range(3)]
    b.step()
    whole = tokens(33, 50)  # pages 0 and 1 cacheable
    s1 = b.add("s1", [], whole)
    s2 = b.add("s2", [], whole)
    batch = b.step()
    # Three decode rows leave 31 rows: s1 completes page 0 only; s2 waits for both pages s1 computes.
    assert b.plan(batch)[3:] == [("s1", 0, 31)]
    page0, page1 = (b.cache.lookup(k) for k in prefix_block_keys(b, whole, 2))
    assert page0.ready and not page1.ready and page1.refcount == 2

    b.abort(s1)
    assert page1.failed and b.cache.lookup(page1.key) is None
    b.step()  # s2 finds its page 1 failed: it lets go of everything and queues again
    assert b.scheduler.num_preemptions == 1 and s2.status is Status.WAITING
    assert page1.refcount == 0 and not b.pool.is_used(page1.pages[0])
    batch = b.step()
    assert b.plan(batch)[3:] == [("s2", 0, 17)]
    assert s2.run.start_pos == 16 and s2.run.owned == 1
    assert list(batch.works[3].context.pages) == list(page0.pages)
    assert all(r.status is Status.RUNNING for r in decoders)


# -- page accounting after aborts and finishes ----------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_abort_while_waiting_changes_nothing(mode):
    b = make_bench(mode)
    s1 = b.add("s1", [b.doc("A", 37, 1)], tokens(9, 50))
    b.abort(s1)
    assert s1.is_finished and not b.scheduler.waiting and not (b.scheduler.waiting or b.scheduler.running)
    assert b.pool.num_used == 0 and b.cache.stats().lookups == 0
    assert b.step().works == ()


# Documents A(37) + B(20) and a 40-token prompt under a 32-token budget. Worked out per mode: how many
# steps reach the stage, and the pages the cache legitimately keeps once the sequence is aborted.
#   lazy:   [A 0-32] [A 32-37, B, s 0-7] [s 7-39] [s 39-40, samples] [decode]   keeps A + B = 5
#   block:  [A 0-32] [A 32-37, B] [copy B, s 0-32] [s 32-40, samples] [decode]   keeps A + B = 5
#   prefix: 97 tokens, pages 0-5 cacheable; [0-32] [32-64] [64-96] [96-97] [decode]  keeps 4, then 6
#   full:   [0-32] ... [decode]                                                  keeps 0
ABORT_CASES = [
    ("lazy", "prefill", 2, 5),
    ("block", "prefill", 3, 5),
    ("prefix", "prefill", 2, 4),
    ("full", "prefill", 1, 0),
    ("lazy", "decode", 5, 5),
    ("block", "decode", 5, 5),
    ("prefix", "decode", 5, 6),
    ("full", "decode", 5, 0),
]


@pytest.mark.parametrize(("mode", "stage", "n_steps", "kept"), ABORT_CASES)
def test_abort_returns_every_page_but_the_ready_cached_ones(mode, stage, n_steps, kept):
    b = make_bench(mode, max_num_batched_tokens=32)
    s1 = b.add("s1", [b.doc("A", 37, 1), b.doc("B", 20, 2)], tokens(40, 50), max_tokens=8)
    b.steps(n_steps)
    assert s1.status is Status.RUNNING
    if stage == "prefill":
        assert 0 < s1.run.num_computed < len(s1.run.tokens) and s1.output == []
    else:
        assert len(s1.output) == 2
    # Pages that must come free: the run's private pages, block's copies, prefix pages not yet computed.
    unfinished = [p for seg in s1.mode_state.filled_segments() if not seg.ready for p in seg.pages]
    private = [p for pages in s1.mode_state.private_pages() for p in pages]
    transient = s1.run.pages[s1.run.owned :] + private + unfinished
    assert transient and all(b.pool.is_used(p) for p in transient)
    if mode == "block":
        assert len(s1.mode_state.copies) == 2

    b.abort(s1)
    assert not b.scheduler.running and not b.scheduler.jobs
    assert b.pool.num_used == kept and all_pages_idle(b)
    assert not any(b.pool.is_used(p) for p in transient)
    b.cache.clear()
    assert b.pool.num_used == 0


def test_aborting_one_of_two_waiters_keeps_their_shared_encode_going():
    b = make_bench("lazy", max_num_batched_tokens=40)
    d = b.doc("D", 64, 1)
    s1 = b.add("s1", [d], tokens(4, 50))
    s2 = b.add("s2", [d], tokens(6, 51))
    assert b.plan(b.step()) == [("D", 0, 40)]

    b.abort(s1)
    assert b.segment(d).refcount == 1 and b.pool.num_used == 4
    assert b.plan(b.step()) == [("D", 40, 64), ("s2", 0, 6)]
    assert b.segment(d).ready
    b.abort(s2)
    assert b.segment(d).refcount == 0 and b.pool.num_used == 4 and all_pages_idle(b)
    b.cache.clear()
    assert b.pool.num_used == 0


def test_aborting_the_only_waiter_mid_encode_drops_the_document():
    b = make_bench("lazy", max_num_batched_tokens=40)
    d = b.doc("D", 64, 1)
    s1 = b.add("s1", [d], tokens(4, 50))
    b.step()
    seg = b.segment(d)

    b.abort(s1)
    assert b.segment(d) is None and seg.refcount == 0 and b.pool.num_used == 0
    assert b.step().works == () and not b.scheduler.jobs
    b.add("s2", [d], tokens(4, 51))
    assert b.plan(b.step()) == [("D", 0, 40)]  # encoded afresh from its first token
    assert b.cache.stats().misses == 2


def test_aborting_a_preempted_sequence_frees_nothing_more():
    b, (s1, s2, s3, s4) = preempting_bench()
    b.step()
    b.abort(s3)
    assert list(b.scheduler.waiting) == [s4] and s3.is_finished
    assert b.pool.num_used == 3 + 3
    b.abort(s1)
    b.abort(s2)
    assert b.pool.num_used == 0


@pytest.mark.parametrize("mode", MODES)
def test_finished_requests_leave_only_ready_unreferenced_documents(mode):
    b = make_bench(mode, num_pages=32, max_num_batched_tokens=48)
    a, bb, c = b.doc("A", 37, 1), b.doc("B", 20, 2), b.doc("C", 16, 3)
    seqs = [
        b.add("s1", [a, bb], tokens(9, 50), 3),
        b.add("s2", [bb, a, c], tokens(5, 51), 5),
        b.add("s3", [c], tokens(12, 52), 2),
        b.add("s4", [a, bb], tokens(9, 50), 4),
    ]
    for _ in range(40):
        b.step()
    assert all(s.is_finished for s in seqs)
    assert not (b.scheduler.waiting or b.scheduler.running or b.scheduler.jobs)
    assert all_pages_idle(b)
    b.cache.clear()
    assert b.pool.num_used == 0


# -- documents registered ahead of requests --------------------------------------------------------------


def test_a_registration_is_a_prefill_only_sequence():
    b = make_bench("lazy", max_num_batched_tokens=32)
    b.add("s1", [], tokens(20, 50))
    assert b.plan(b.step()) == [("s1", 0, 20)]
    d = b.doc("D", 40, 1)
    reg = b.add_encode("reg", [d])
    batch = b.step()  # admitted like any request: its document's encode after s1's decode, in the budget left
    assert b.plan(batch) == [("s1", 20, 21), ("D", 0, 31)] and batch.encoded == ()
    assert b.pool.num_used == 2 + 3
    batch = b.step()
    assert b.plan(batch) == [("s1", 21, 22), ("D", 31, 40)] and batch.encoded == (reg,)
    assert reg.is_finished and b.segment(d).ready and b.segment(d).refcount == 0
    assert b.cache.evictable_pages() == 3


def test_a_registration_of_cached_documents_is_done_without_a_forward_pass():
    b = make_bench("block")
    d = b.doc("D", 40, 1)
    b.add("s1", [d], tokens(5, 50), max_tokens=1)
    b.steps(3)
    reg = b.add_encode("reg", [d])
    batch = b.step()
    assert batch.works == () and batch.copies == () and batch.encoded == (reg,) and reg.is_finished
    assert all_pages_idle(b)


# -- found while writing these tests ---------------------------------------------------------------------


def test_a_sequence_that_can_never_fit_raises_even_when_it_brought_new_documents():
    b = make_bench("lazy", num_pages=4)
    b.add("big", [b.doc("D", 32, 1)], tokens(48, 50))  # D takes 2 of 4 pages; the prompt needs 3 more
    with pytest.raises(OutOfPagesError):
        b.step()


def test_a_running_sequence_keeps_its_context_and_a_readmitted_one_gets_a_new_one():
    """The context a sequence's chunks attend to is made once per admission (not per step) and equals the mode's
    context for it; preempted and re-admitted, the sequence's new run gets a context made afresh. Three sequences
    over document A (1 page) fill a 7-page pool as they decode: s3 is preempted on step 18 (as preempting_bench)."""
    b = make_bench("lazy", num_pages=7, max_num_seqs=3)
    a = b.doc("A", 16, 1)
    seqs = [b.add(f"s{i}", [a], tokens(16, 50 + i), max_tokens=20) for i in (1, 2, 3)]
    first = b.step()
    contexts = {w.seq.seq_id: w.context for w in first.works if w.seq is not None}
    for batch in b.steps(16):
        for w in batch.works:
            assert w.context is contexts[w.seq.seq_id]
            assert w.context == b.scheduler.mode.context(w.seq, PAGE)
    s3 = seqs[2]
    before = contexts[s3.seq_id]
    b.step()
    assert s3.status is Status.WAITING and b.scheduler.num_preemptions == 1
    b.steps(3)
    batch = b.step()
    (work,) = [w for w in batch.works if w.seq is s3]
    assert work.context is not before and work.context == b.scheduler.mode.context(s3, PAGE)
    assert work.context.pages == list(b.segment(a).pages)
