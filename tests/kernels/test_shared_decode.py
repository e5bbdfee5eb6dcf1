"""Shared-document decode (kernels/shared_decode.py): the host planner, and the kernels against the reference.

On a CPU the kernels run under TRITON_INTERPRET (tests/conftest.py); the gpu-marked test uses Llama-3.1-8B
shapes and compares with the plain decode kernel on the device.
"""

import dataclasses
import random

import numpy as np
import pytest
import torch

from lazyattn.kernels import reference
from lazyattn.kernels.decode import decode_attention
from lazyattn.kernels.paged import EntryPages, PagedBatch, page_fill
from lazyattn.kernels.shared_decode import job_width, shared_decode_attention, shared_plan, worth_sharing
from tests.kernels.rope_cases import tables
from tests.kernels.scenario import Scenario, make_scenario

# Document 0 (37 tokens: 3 pages of 16, the last partial) is listed by four requests at four deltas, document 2
# by three; request 4 shares nothing (document 3 is its own).
DOCS = [37, 16, 5, 21]
REQUESTS = [([0, 2], 9), ([1, 0, 2], 20), ([2, 0], 1), ([0, 1], 17), ([3], 6)]


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def scenario(heads=(4, 1), rope="llama3", dtype=torch.float32, page_size=16, relink=0, seed=0, requests=REQUESTS):
    return make_scenario(
        DOCS,
        requests,
        q_heads=heads[0],
        kv_heads=heads[1],
        head_dim=64,
        page_size=page_size,
        tables=tables(rope, 64),
        dtype=dtype,
        seed=seed,
        relink=relink,
    )


def decode_entries(s: Scenario) -> list[EntryPages]:
    return [s.final_entry(r, r.final.length) for r in s.requests]


def run(s: Scenario, entries=None, group_rows=16, chunk_pages=8, **kw):
    """Shared kernel output (over a NaN-poisoned buffer), the reference's, and the plan."""
    q, batch = s.decode()
    entries = decode_entries(s) if entries is None else entries
    batch = PagedBatch.build(entries, [1] * len(entries), batch.q_start.tolist())
    group = q.shape[1] // s.k_cache.shape[2]
    host = shared_plan(entries, group, group_rows, chunk_pages)
    out = torch.full_like(q, float("nan"))
    got = shared_decode_attention(q, s.k_cache, s.v_cache, batch, host.to("cpu"), s.tables, s.scale, out=out, **kw)
    assert got is out and not out.isnan().any(), "every output element must be written"
    return out, reference.paged_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale), host


# --- planner -----------------------------------------------------------------------------------------


def covered(plan, entries):
    """Per entry, the multiset of (page index, delta) its jobs cover, and the slots its jobs write."""
    m = plan.members
    pages = {b: [] for b in range(len(entries))}
    slots = {b: [] for b in range(len(entries))}
    for row in plan.jobs.tolist():
        src, lo, hi, n = row[:4]
        for j in range(n):
            b, delta, slot = row[4 + j], row[4 + m + j], row[4 + 2 * m + j]
            # the member lists the source's pages (ids, valid, firsts) somewhere: find where
            e, s_e = entries[b], entries[src]
            want = [(s_e.pages[i], s_e.valid[i], (s_e.firsts or [0] * len(s_e.pages))[i]) for i in range(lo, hi)]
            have = [(e.pages[i], e.valid[i], (e.firsts or [0] * len(e.pages))[i]) for i in range(len(e.pages))]
            at = [i for i in range(len(have) - len(want) + 1) if have[i : i + len(want)] == want]
            assert at, f"job pages {want} are not the member's"
            start = next(i for i in at if (i, e.deltas[i]) not in pages[b] and e.deltas[i] == delta)
            pages[b] += [(i, e.deltas[i]) for i in range(start, start + len(want))]
            slots[b].append(slot)
    return pages, slots


def test_plan_shares_equal_runs_and_covers_every_page_once():
    s = scenario()
    entries = decode_entries(s)
    plan = shared_plan(entries, group=4, group_rows=16, chunk_pages=8)
    assert plan.members == 4 and plan.jobs.shape[1] == job_width(4)
    pages, slots = covered(plan, entries)
    for b, e in enumerate(entries):
        assert sorted(pages[b]) == [(i, d) for i, d in enumerate(e.deltas)], f"entry {b}: every page exactly once"
        lo, hi = plan.slot_start[b], plan.slot_start[b + 1]
        assert sorted(slots[b]) == list(range(lo, hi)), "an entry's slots are contiguous and each written once"
    # document 0 is listed by 4 requests (one job of 4 members), document 2 by 3, document 1 by 2
    sizes = sorted(row[3] for row in plan.jobs.tolist())
    doc_jobs = sorted(n for n in sizes if n > 1)
    assert doc_jobs == [2, 3, 4]
    assert plan.shared_jobs == 3 and worth_sharing(plan)
    # every request's own run; request 4's document sits at delta 0, so it and the own pages are one run
    assert sizes.count(1) == len(REQUESTS)


def test_plan_splits_large_groups_and_long_runs():
    s = scenario()
    entries = decode_entries(s)
    plan = shared_plan(entries, group=4, group_rows=8, chunk_pages=2)  # M = 2; document 0's 3 pages: chunks 2 + 1
    assert plan.members == 2
    rows = plan.jobs.tolist()
    assert all(r[2] - r[1] <= 2 and 1 <= r[3] <= 2 for r in rows)
    doc0 = s.docs[0].pages
    # four members of each of document 0's two chunks, in two jobs of two
    for chunk in (doc0[:2], doc0[2:]):
        jobs = [r for r in rows if list(entries[r[0]].pages[r[1] : r[2]]) == chunk]
        assert sorted(r[3] for r in jobs) == [2, 2]
    pages, _ = covered(plan, entries)
    for b, e in enumerate(entries):
        assert sorted(pages[b]) == [(i, d) for i, d in enumerate(e.deltas)]


def test_plan_keeps_different_firsts_and_temperatures_apart():
    a = EntryPages([5, 6, 9], [3, 3, 0], [16, 4, 2])
    b = EntryPages([5, 6, 8], [7, 7, 0], [16, 4, 3])
    c = EntryPages([5, 6, 7], [1, 1, 0], [16, 4, 1], firsts=[2, 0, 0])  # relinked: skips 2 slots of page 5
    d = EntryPages([5, 6, 4], [9, 9, 0], [16, 4, 1], inv_temps=[0.5, 0.5, 1.0], log_scales=[0.1, 0.1, 0.0])
    plan = shared_plan([a, b, c, d], group=1, group_rows=16)
    shared = [r for r in plan.jobs.tolist() if r[3] > 1]
    assert len(shared) == 1 and sorted(shared[0][4:6]) == [0, 1]
    assert sorted(shared[0][4 + 16 : 6 + 16]) == [3, 7]  # each member with its own delta
    assert plan.num_jobs == 1 + 2 + 4  # the shared document, c's and d's copies of it, four own pages


def test_plan_shares_runs_without_offsets_of_relinked_entries():
    """A relinked entry (offsets on another document's pages) shares its runs without offsets with plain entries."""
    plain = EntryPages([5, 6, 9], [3, 3, 0], [16, 4, 2])
    relinked = EntryPages([7, 8, 5, 6, 4], [0, 0, 20, 20, 0], [16, 14, 16, 4, 1], firsts=[0, 2, 0, 0, 0])
    plan = shared_plan([plain, relinked], group=1)
    shared = [r for r in plan.jobs.tolist() if r[3] == 2]
    assert len(shared) == 1 and shared[0][1:3] == [0, 2] and sorted(shared[0][4 + 16 : 6 + 16]) == [3, 20]


def test_plan_shares_a_prefix_that_runs_on_into_own_pages():
    """Prefix mode: a shared prefix (pages 1-5, delta 0) followed by each entry's own pages at delta 0 too is one
    run per entry; its whole chunks of prefix pages are shared, the chunk holding own pages is not."""
    prefix = EntryPages([1, 2, 3, 4, 5], [0] * 5, [16] * 5)
    entries = [prefix.then([10 + i], [3 + i]) for i in range(3)]
    plan = shared_plan(entries, group=1, group_rows=16, chunk_pages=2)
    rows = plan.jobs.tolist()
    shared = sorted((r[1], r[2]) for r in rows if r[3] == 3)
    assert shared == [(0, 2), (2, 4)]
    assert sorted((r[0], r[1], r[2]) for r in rows if r[3] == 1) == [(0, 4, 6), (1, 4, 6), (2, 4, 6)]
    pages, _ = covered(plan, entries)
    for b, e in enumerate(entries):
        assert sorted(pages[b]) == [(i, d) for i, d in enumerate(e.deltas)]


def test_plan_of_entries_extending_kept_contexts():
    """Decode steps' entries made by `then` from contexts kept across steps (the engine's) plan as the same entries
    as plain lists do, step after step as the own pages grow (the contexts' runs are derived once and reused); every
    page is covered once at its delta, each entry's slots are its own."""
    docs = {0: [1, 2, 3], 1: [4, 5], 2: [6, 7, 8, 9]}
    ape = dict(inv_temps=[1.0, 0.5, 0.5, 0.5], log_scales=[0.0, 0.2, 0.2, 0.2])
    contexts = [
        EntryPages([0, *docs[0], *docs[1]], [0, 10, 10, 10, 58, 58], [16, 16, 16, 16, 16, 5]),
        EntryPages([0, *docs[1], *docs[0]], [0, 10, 10, 31, 31, 31], [16, 16, 5, 16, 16, 16]),
        EntryPages([0, *docs[0]], [0, 10, 10, 10], [16] * 4, **ape),  # a temperature on the document
        EntryPages([0, *docs[0]], [0, 10, 10, 10], [16] * 4, firsts=[0, 3, 0, 0]),  # relinked
        EntryPages([0, *docs[2]], [0, 0, 0, 0, 0], [16] * 5),  # delta 0 into the own pages: one run (prefix mode)
        EntryPages([], [], []),
    ]
    own = [[20 + 3 * b, 21 + 3 * b] for b in range(len(contexts))]
    for upto in (1, 16, 17, 30):
        n = -(-upto // 16)
        entries = [c.then(p[:n], page_fill(upto, 16)) for c, p in zip(contexts, own)]
        plain = [
            EntryPages(list(e.pages), list(e.deltas), list(e.valid), e.firsts, e.inv_temps, e.log_scales)
            for e in entries
        ]
        for group, group_rows, chunk_pages in ((1, 16, 8), (4, 8, 2)):
            plan = shared_plan(entries, group, group_rows, chunk_pages)
            want = shared_plan(plain, group, group_rows, chunk_pages)
            assert np.array_equal(plan.jobs, want.jobs) and np.array_equal(plan.slot_start, want.slot_start)
            assert (plan.shared_jobs, plan.read_pages) == (want.shared_jobs, want.read_pages)
            pages, slots = covered(plan, entries)
            for b, e in enumerate(entries):
                assert sorted(pages[b]) == [(i, d) for i, d in enumerate(e.deltas)]
                assert sorted(slots[b]) == list(range(plan.slot_start[b], plan.slot_start[b + 1]))
    assert contexts[0].derived is not None and "shared_runs" in contexts[0].derived
    assert contexts[4].derived is None  # no run ends with the context: nothing of it is reused


def test_plan_without_sharing():
    entries = [EntryPages([1, 2], [0, 0], [16, 3]), EntryPages([3], [0], [5])]
    plan = shared_plan(entries, group=2)
    assert not worth_sharing(plan) and plan.num_jobs == 2
    assert plan.slot_start.tolist() == [0, 1, 2]


def test_pages_read_and_worth():
    """read_pages counts the jobs' pages, listed_pages the entries'; one shared system page among many private
    pages is not worth a plan, a shared document is."""
    system = EntryPages([0], [0], [16])
    private = [
        EntryPages([0, *range(10 * i + 1, 10 * i + 10)], [0] + [16] * 9, [16] * 10).then([100 + i], [1])
        for i in range(4)
    ]
    plan = shared_plan(private, group=4, chunk_pages=4)
    assert plan.listed_pages == 44 and plan.read_pages == 1 + 4 * 10
    assert plan.read_pages == sum(r[2] - r[1] for r in plan.jobs.tolist())
    assert plan.shared_jobs == 1 and not worth_sharing(plan)
    doc = system.then([50, 51, 52], [16, 16, 4])
    shared = [EntryPages(doc.pages, [0, 16, 16, 16], doc.valid).then([100 + i], [1]) for i in range(4)]
    plan = shared_plan(shared, group=4, chunk_pages=4)
    assert plan.listed_pages == 20 and plan.read_pages == 1 + 3 + 4
    assert worth_sharing(plan)


# --- kernels against the reference ---------------------------------------------------------------------


@pytest.mark.parametrize("heads", [(4, 1), (4, 2), (4, 4), (6, 2)])
def test_gqa_groups_fp32(heads):
    """G = 4, 2, 1 and 3 (padded rows): every request's decode row against the reference."""
    s = scenario(heads=heads, seed=1)
    out, ref, plan = run(s)
    assert plan.shared_jobs == 3
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("rope", ["default", "interleaved"])
def test_rope_layouts(rope):
    out, ref, _ = run(scenario(rope=rope, seed=2))
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("group_rows,chunk_pages", [(4, 1), (8, 2), (32, 8)])
def test_jobs_split_by_members_and_pages(group_rows, chunk_pages):
    """Groups larger than M members (several jobs read a chunk) and runs longer than a chunk."""
    s = scenario(seed=3)
    out, ref, plan = run(s, group_rows=group_rows, chunk_pages=chunk_pages)
    assert rel_err(out, ref) < 1e-5
    assert max(r[2] - r[1] for r in plan.jobs.tolist()) <= chunk_pages


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit(dtype):
    """16-bit caches: within rounding of the reference and of the plain decode kernel."""
    s = scenario(dtype=dtype, seed=4)
    out, ref, _ = run(s)
    q, batch = s.decode()
    plain = decode_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, num_splits=2)
    assert rel_err(out, ref) < 1e-2
    assert rel_err(out, plain) < 1e-2


def test_relinked_firsts():
    """Relinked requests skip the shared copy's first rows (firsts): those runs are not shared with the others,
    the unrelinked first documents still are."""
    s = scenario(relink=5, seed=5)
    q, batch = s.decode()
    assert batch.firsts is not None
    out, ref, plan = run(s)
    assert plan.shared_jobs >= 1
    assert rel_err(out, ref) < 1e-5


def test_transposed_v_pages():
    """V pages stored transposed (a page's slots contiguous for each kv head and channel, as the pool stores FP8
    pages' V) give the reference's result over V stored as K is, relinked firsts included, with NaN in every slot
    the entries do not list (the kernel reads a transposed tile's slots unmasked and zeroes those outside the keys)."""
    for s in (scenario(heads=(4, 2), seed=3), scenario(relink=5, seed=5)):
        want = run(s)[1]
        t = s.with_transposed_v()
        entries = decode_entries(t)
        t.poison_unlisted(PagedBatch.build(entries, [1] * len(entries), t.decode()[1].q_start.tolist()))
        out, _, plan = run(t)
        assert plan.shared_jobs >= 1
        assert rel_err(out, want) < 1e-5


def test_ape_temperatures():
    """Per-page 1/T and ln S, equal for every member of a shared document (set by the document, as the engine)."""
    s = scenario(seed=6)
    entries = []
    for r, e in zip(s.requests, decode_entries(s)):
        by_page = {}
        for d in r.docs:
            for p in s.docs[d].pages:
                by_page[p] = (1.0 / (1.0 + 0.3 * d), 0.2 * d - 0.1)
        temps = [by_page.get(p, (1.0, 0.0)) for p in e.pages]
        entries.append(dataclasses.replace(e, inv_temps=[t for t, _ in temps], log_scales=[c for _, c in temps]))
    out, ref, plan = run(s, entries=entries)
    assert plan.shared_jobs == 3
    plain_ref = reference.paged_attention(*s.decode()[:1], s.k_cache, s.v_cache, s.decode()[1], s.tables, s.scale)
    assert rel_err(ref, plain_ref) > 1e-3, "the temperatures change the result"
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("chunk_pages", [1, 2])
def test_prefix_mode_tables(chunk_pages):
    """Prefix mode's tables (a shared prefix and own pages, all at delta 0; a partial last prefix page) against the
    reference. (A chunk that takes in own pages is not shared: with chunks of 8 pages nothing is, here.)"""
    g = torch.Generator().manual_seed(9)
    k_cache, v_cache = (torch.randn(16, 16, 2, 64, generator=g) for _ in range(2))
    prefix = EntryPages([7, 2, 9, 4], [0] * 4, [16, 16, 16, 11])
    entries = [prefix.then([10 + i], [2 + 3 * i]) for i in range(4)]
    q_starts = [59 + 2 + 3 * i for i in range(4)]
    batch = PagedBatch.build(entries, [1] * 4, q_starts)
    q = torch.randn(4, 4, 64, generator=g)
    tab = tables("llama3", 64)
    plan = shared_plan(entries, group=2, group_rows=4, chunk_pages=chunk_pages)
    assert plan.shared_jobs >= 2  # the prefix's chunks, each read by two jobs of two members
    out = shared_decode_attention(q, k_cache, v_cache, batch, plan.to("cpu"), tab, 0.125)
    assert rel_err(out, reference.paged_attention(q, k_cache, v_cache, batch, tab, 0.125)) < 1e-5


def test_nothing_shared():
    s = scenario(requests=[([0], 3), ([1, 2], 5), ([3], 2)], seed=7)
    out, ref, plan = run(s)
    assert not worth_sharing(plan)
    assert rel_err(out, ref) < 1e-5


def test_padded_plan_and_entries():
    """A CUDA graph's shape: a job table of larger capacity (garbage past the job count), fewer or more programs than
    jobs, a scratch larger than the slots, and a padding entry without slots (gets zeros)."""
    s = scenario(seed=8)
    q, batch = s.decode()
    host = shared_plan(decode_entries(s), group=4)
    qp = torch.cat([q, torch.randn(1, *q.shape[1:])])
    ref = reference.paged_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale)
    for programs in (3, host.num_jobs + 4):
        plan = host.to("cpu")
        plan.jobs = torch.cat([plan.jobs, torch.full((5, plan.jobs.shape[1]), 7, dtype=torch.int32)])
        plan.slot_start = torch.cat([plan.slot_start, plan.slot_start[-1:]])
        plan.num_slots += 3
        plan.programs = programs
        out = shared_decode_attention(qp, s.k_cache, s.v_cache, batch, plan, s.tables, s.scale)
        assert rel_err(out[:-1], ref) < 1e-5
        assert torch.equal(out[-1], torch.zeros_like(out[-1]))


def test_plan_slot_start_too_short():
    s = scenario()
    q, batch = s.decode()
    plan = shared_plan(decode_entries(s)[:2], group=4).to("cpu")
    with pytest.raises(ValueError, match="slot_start"):
        shared_decode_attention(q, s.k_cache, s.v_cache, batch, plan, s.tables, s.scale)


def test_random_batches():
    """Random lazy-like batches: documents drawn with repeats, random finals, G = 2."""
    rng = random.Random(11)
    for seed in range(2):
        requests = [(rng.sample(range(len(DOCS)), rng.randint(1, 3)), rng.randint(1, 20)) for _ in range(6)]
        s = scenario(heads=(4, 2), requests=requests, seed=20 + seed)
        out, ref, _ = run(s, group_rows=int(rng.choice([4, 8])), chunk_pages=rng.choice([1, 2, 3]))
        assert rel_err(out, ref) < 1e-5


def test_host_plan_arrays():
    s = scenario()
    plan = shared_plan(decode_entries(s), group=4)
    assert plan.jobs.dtype == np.int32 and plan.slot_start.dtype == np.int32
    assert plan.num_slots == plan.jobs[:, 3].sum()


# --- GPU, real shapes (Llama-3.1-8B: 32/8 heads, d=128, bf16, pages of 64) -----------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("group_rows", [16, 32])
def test_gpu_llama8b_against_plain_decode(group_rows):
    docs = [2048, 2048, 1500, 2048, 777, 2048, 2048]
    rng = random.Random(3)
    requests = [(rng.sample([0, 0, 0, 1, 1, 2, 3, 4, 5, 6], 1) + rng.sample(range(1, 7), 3), 40) for _ in range(16)]
    requests = [(list(dict.fromkeys(order)), n) for order, n in requests]
    s = make_scenario(
        docs,
        requests,
        q_heads=32,
        kv_heads=8,
        head_dim=128,
        page_size=64,
        tables=tables("llama3", 128, max_position=20000, device="cuda"),
        dtype=torch.bfloat16,
        device="cuda",
        seed=12,
    )
    q, batch = s.decode()
    s.poison_unlisted(batch)
    plan = shared_plan(decode_entries(s), group=4, group_rows=group_rows)
    assert worth_sharing(plan)
    out = shared_decode_attention(q, s.k_cache, s.v_cache, batch, plan.to("cuda"), s.tables, s.scale)
    plain = decode_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale)
    ref = reference.paged_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale)
    assert rel_err(out, ref) < 1e-2
    assert rel_err(out, plain) < 1e-2
