"""The deterministic mode's kernels (kernels/invariant.py) and the reference's invariant path: a row's result is the
same bits whatever else is in the launch and however its sequence is cut, and close to the plain definitions.

CPU: TRITON_INTERPRET=1 (tests/conftest.py) at small shapes; `gpu`: the same at Llama-3.1-8B widths in bf16.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lazyattn.kernels import invariant, reference
from lazyattn.kernels.cache_ops import copy_rotate
from lazyattn.kernels.kv_dtype import FP8, quantize
from lazyattn.kernels.paged import EntryPages, PagedBatch, cdiv, page_fill
from lazyattn.kernels.rope import RopeConfig, RopeTables
from tests.kernels.scenario import make_scenario

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DOCS = [37, 20, 16]
REQUESTS = [([0, 1], 21), ([2, 0], 9), ([1], 18)]


def tables_for(head_dim: int) -> RopeTables:
    return RopeTables.build(RopeConfig(head_dim=head_dim), 512, DEVICE)


def scenario(dtype: torch.dtype, head_dim: int = 32, q_heads: int = 6, kv_heads: int = 2, kv_dtype=None):
    """kv_dtype=FP8: the same pages rounded to e4m3 (docs/design.md, "FP8 KV cache"), queries in `dtype`."""
    sc = make_scenario(
        DOCS,
        REQUESTS,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        tables=tables_for(head_dim),
        dtype=dtype,
        device=DEVICE,
    )
    if kv_dtype is None:
        return sc
    from dataclasses import replace

    return replace(sc, k_cache=quantize(sc.k_cache, kv_dtype), v_cache=quantize(sc.v_cache, kv_dtype))


def attention(backend: str, q, sc, batch):
    if backend == "triton":
        return invariant.paged_attention(q, sc.k_cache, sc.v_cache, batch, sc.tables, sc.scale)
    return reference.paged_attention(q, sc.k_cache, sc.v_cache, batch, sc.tables, sc.scale, invariant=True)


def rows_of(batch: PagedBatch, entry: int) -> slice:
    cu = batch.cu_seqlens_q.tolist()
    return slice(cu[entry], cu[entry + 1])


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("kv_dtype", [None, FP8])
def test_transposed_v_pages_give_the_same_bits(backend, kv_dtype):
    """V pages stored transposed (as the pool stores FP8 pages' V): every row the same bits as over V stored as K
    is, prefill and decode, with NaN in every slot the batch does not list (a transposed tile's slots are read
    unmasked, those outside the keys zeroed)."""
    sc = scenario(torch.float32, kv_dtype=kv_dtype)
    for q, batch in (sc.final_prefill(), sc.decode()):
        want = attention(backend, q, sc, batch)
        moved = sc.with_transposed_v()
        moved.poison_unlisted(batch)
        assert torch.equal(attention(backend, q, moved, batch), want)


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("dtype, kv_dtype", [(torch.float32, None), (torch.bfloat16, None), (torch.float32, FP8)])
def test_attention_rows_do_not_depend_on_batch_or_chunking(backend, dtype, kv_dtype):
    """A final segment's rows: in a batch of three, alone, cut in chunks, and its last row as a decode step give the
    same bits (the plain reference does not promise that), and they are close to the dense ground truth (FP8 pages:
    to the plain reference over the same pages)."""
    sc = scenario(dtype, kv_dtype=kv_dtype)
    q, batch = sc.final_prefill()
    whole = attention(backend, q, sc, batch)
    plain = reference.paged_attention(q, sc.k_cache, sc.v_cache, batch, sc.tables, sc.scale)
    for i, r in enumerate(sc.requests):
        want = sc.dense_final(r).to(dtype) if kv_dtype is None else plain[rows_of(batch, i)]
        tol = 2e-2 if dtype == torch.bfloat16 or kv_dtype is not None else 1e-4
        torch.testing.assert_close(whole[rows_of(batch, i)].float(), want.float(), atol=tol, rtol=tol)
    # request 1 alone, then in chunks of 4 and 5 rows, each chunk its own launch beside other requests' chunks
    alone = make_scenario_view(sc, [1])
    q1, b1 = alone.final_prefill()
    assert torch.equal(attention(backend, q1, alone, b1), whole[rows_of(batch, 1)])
    n = sc.requests[1].final.length
    cuts = [(0, 4), (4, 9)]
    got = []
    for lo, hi in cuts:
        chunks = [(lo, hi) if j == 1 else (0, sc.requests[j].final.length) for j in range(len(sc.requests))]
        qc, bc = sc.final_prefill(chunks)
        got.append(attention(backend, qc, sc, bc)[rows_of(bc, 1)])
    assert hi == n
    assert torch.equal(torch.cat(got), whole[rows_of(batch, 1)])
    qd, bd = sc.decode()
    decoded = attention(backend, qd, sc, bd)
    for i in range(len(sc.requests)):
        assert torch.equal(decoded[i], whole[rows_of(batch, i)][-1])


def make_scenario_view(sc, keep: list[int]):
    """The same pool and documents with only the requests `keep`."""
    from dataclasses import replace

    return replace(sc, requests=[sc.requests[i] for i in keep])


@pytest.mark.parametrize("dtype, kv_dtype", [(torch.float32, None), (torch.bfloat16, None), (torch.float32, FP8)])
def test_triton_attention_matches_the_invariant_reference(dtype, kv_dtype):
    sc = scenario(dtype, kv_dtype=kv_dtype)
    q, batch = sc.final_prefill()
    got = invariant.paged_attention(q, sc.k_cache, sc.v_cache, batch, sc.tables, sc.scale)
    want = reference.paged_attention(q, sc.k_cache, sc.v_cache, batch, sc.tables, sc.scale, invariant=True)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_triton_attention_reads_the_engines_padded_tables():
    """The engine's eager steps give the kernel tables that are views of rows padded to 16 int32s
    (engine/graph_inputs.py), without a firsts table: the same rows as PagedBatch.build's dense tables."""
    from lazyattn.engine.graph_inputs import paged_batch

    sc = scenario(torch.float32)
    q, dense = sc.final_prefill()
    entries = [sc.final_entry(r, r.final.length) for r in sc.requests]
    lens = [r.final.length for r in sc.requests]
    padded = paged_batch(entries, lens, [sc.context_len(r) for r in sc.requests], torch.device(DEVICE))
    assert padded.firsts is None and not padded.pages.is_contiguous()
    got = invariant.paged_attention(q, sc.k_cache, sc.v_cache, padded, sc.tables, sc.scale)
    assert torch.equal(got, invariant.paged_attention(q, sc.k_cache, sc.v_cache, dense, sc.tables, sc.scale))


def test_triton_attention_with_relinked_first_slots_matches_the_reference():
    """Relinked entries list shared pages from a first slot other than 0 (kernels/paged.py)."""
    sc = make_scenario(DOCS, REQUESTS, q_heads=6, kv_heads=2, head_dim=32, tables=tables_for(32), relink=5)
    for q, batch in (sc.relink_prefill(), sc.final_prefill()):
        got = invariant.paged_attention(q, sc.k_cache, sc.v_cache, batch, sc.tables, sc.scale)
        want = reference.paged_attention(q, sc.k_cache, sc.v_cache, batch, sc.tables, sc.scale, invariant=True)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, FP8])
def test_lazy_reads_the_same_keys_as_a_block_copy(backend, kv_dtype):
    """In the deterministic paths a page read at delta d gives the same bits as block mode's private copy of it
    (rotated by d and rounded to the KV dtype, cache_ops.copy_rotate / reference.copy_rotate) read at delta 0; FP8
    pages under bf16 queries too."""
    dtype = torch.bfloat16
    sc = scenario(dtype, kv_dtype=kv_dtype)
    q, batch = sc.final_prefill()
    lazy = attention(backend, q, sc, batch)
    # Block: every request's documents copied to fresh pages, rotated by their delta.
    pool = torch.cat([sc.k_cache, sc.v_cache.clone()], 0)
    n_pages = sc.k_cache.shape[0]
    src, dst, deltas, entries = [], [], [], []
    fresh = n_pages
    for r in sc.requests:
        pages, valid = [], []
        for d, start in zip(r.docs, sc.doc_starts(r)):
            doc = sc.docs[d]
            for p, n in zip(doc.pages, page_fill(doc.length, sc.page_size)):
                src.append(p)
                dst.append(fresh)
                deltas.append(start)
                pages.append(fresh)
                valid.append(n)
                fresh += 1
        entry = EntryPages(pages, [0] * len(pages), valid)
        entries.append(entry.then(r.final.pages, page_fill(r.final.length, sc.page_size)))
    kv = torch.zeros(1, 2, fresh, *sc.k_cache.shape[1:], dtype=kv_dtype, device=DEVICE)
    kv[0, 0, :n_pages], kv[0, 1, :n_pages] = sc.k_cache, sc.v_cache
    as_tensor = [torch.tensor(x, dtype=torch.int32, device=DEVICE) for x in (src, dst, deltas)]
    if backend == "triton":
        copy_rotate(kv, *as_tensor, sc.tables)
    else:
        reference.copy_rotate(kv, *as_tensor, sc.tables)
    del pool
    lens = [r.final.length for r in sc.requests]
    starts = [sc.context_len(r) for r in sc.requests]
    block_batch = PagedBatch.build(entries, lens, starts, DEVICE)
    if backend == "triton":
        block = invariant.paged_attention(q, kv[0, 0], kv[0, 1], block_batch, sc.tables, sc.scale)
    else:
        block = reference.paged_attention(q, kv[0, 0], kv[0, 1], block_batch, sc.tables, sc.scale, invariant=True)
    assert torch.equal(lazy, block)
    # The plain reference rotates in fp32 without rounding: it differs from the copy (the difference removed here).
    plain = reference.paged_attention(q, sc.k_cache, sc.v_cache, batch, sc.tables, sc.scale)
    assert not torch.equal(plain, reference.paged_attention(q, kv[0, 0], kv[0, 1], block_batch, sc.tables, sc.scale))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_matmul_rows_do_not_depend_on_the_number_of_rows(dtype, bias):
    gen = torch.Generator().manual_seed(0)
    k, n = 96, 80  # ragged against the 64-wide tiles
    x = torch.randn(70, k, generator=gen).to(dtype).to(DEVICE)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(DEVICE)
    b = torch.randn(n, generator=gen).to(dtype).to(DEVICE) if bias else None
    full = invariant.matmul(x, w, b)
    want = F.linear(x.float(), w.float(), None if b is None else b.float()).to(dtype)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(full.float(), want.float(), atol=tol, rtol=tol)
    for lo, hi in [(0, 1), (5, 6), (3, 20), (64, 70), (1, 66)]:
        assert torch.equal(invariant.matmul(x[lo:hi], w, b), full[lo:hi])


def test_linear_off_cuda_is_one_call_per_row():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(9, 48, generator=gen)
    w = torch.randn(40, 48, generator=gen)
    got = invariant.linear(x, w)
    assert torch.equal(got[4:5], F.linear(x[4:5], w))
    assert torch.equal(invariant.linear(x[2:7], w), got[2:7])


def test_invariant_reference_attends_each_row_to_its_visible_keys_only():
    """Hand-checked: one entry of two pages (4 + 2 keys at positions 0..5), a query at position 3 sees keys 0..3."""
    d = 16
    gen = torch.Generator().manual_seed(2)
    k_cache = torch.randn(3, 16, 1, d, generator=gen)
    v_cache = torch.randn(3, 16, 1, d, generator=gen)
    batch = PagedBatch.build([EntryPages([2, 0], [0, 0], [4, 2])], [1], [3])
    q = torch.randn(1, 1, d, generator=gen)
    got = reference.paged_attention(q, k_cache, v_cache, batch, None, 0.25, invariant=True)
    keys, values = k_cache[2, :4, 0], v_cache[2, :4, 0]
    want = torch.softmax(keys @ q[0, 0] * 0.25, 0) @ values
    torch.testing.assert_close(got[0, 0], want)
    assert cdiv(6, 4) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_8b_widths_are_batch_invariant():
    """Llama-3.1-8B's qkv product and attention heads (32 q, 8 kv, 128 channels) in bf16: batches 1..64 rows."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4096, generator=gen).to(torch.bfloat16).cuda()
    w = (torch.randn(6144, 4096, generator=gen) / 64).to(torch.bfloat16).cuda()
    full = invariant.matmul(x, w)
    for m in (1, 2, 3, 8, 16, 31, 63):
        assert torch.equal(invariant.matmul(x[:m], w), full[:m])
    sc = make_scenario(
        [300, 128, 77],
        [([0, 1, 2], 40), ([2, 0], 33), ([1], 64)],
        q_heads=32,
        kv_heads=8,
        head_dim=128,
        page_size=64,
        tables=RopeTables.build(RopeConfig(head_dim=128, base=500000.0), 2048, "cuda"),
        dtype=torch.bfloat16,
        device="cuda",
    )
    q, batch = sc.final_prefill()
    whole = invariant.paged_attention(q, sc.k_cache, sc.v_cache, batch, sc.tables, sc.scale)
    qd, bd = sc.decode()
    decoded = invariant.paged_attention(qd, sc.k_cache, sc.v_cache, bd, sc.tables, sc.scale)
    for i in range(len(sc.requests)):
        assert torch.equal(decoded[i], whole[rows_of(batch, i)][-1])
