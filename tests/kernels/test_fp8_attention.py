"""The Triton attention kernels over FP8 e4m3 pages (docs/design.md, "FP8 KV cache") against the PyTorch reference
over the same pages (which dequantizes them exactly, tests/kernels/test_kv_dtype.py): decode (per-thread and
copy-engine tiles), prefill (split-KV, Q rotated up front or in the kernel, a host plan) and shared-document decode;
the Hopper short prefill's GPU tests over FP8 pages are tests/kernels/test_prefill_hopper.py's.
An fp32 query is held to 1e-5 (the kernels widen each tile exactly, so only the summation order differs), a bf16
one to its rounding. Keys stay cached rotated at their encoding positions; the kernels apply the deltas.

Under the interpreter an FP8 NaN byte reads as ±480 (triton 3.9): the NaN-poisoned page padding then tests that
padding is masked, not that NaN is; the GPU tests read real NaN."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from lazyattn.kernels import decode, prefill, reference
from lazyattn.kernels.decode import DecodeConfig, decode_attention
from lazyattn.kernels.kv_dtype import FP8, fp8_tile_dtype, quantize
from lazyattn.kernels.paged import EntryPages, PagedBatch
from lazyattn.kernels.prefill import prefill_attention, widened_pages
from lazyattn.kernels.prefill_plan import with_plan
from lazyattn.kernels.shared_decode import shared_decode_attention, shared_plan
from tests.kernels.rope_cases import tables
from tests.kernels.scenario import Scenario, make_scenario
from tests.kernels.test_decode import gpu_scenario

DOCS = [37, 16, 5, 21]
REQUESTS = [([2, 0, 1], 9), ([1, 2], 20), ([0], 1), ([0, 3], 17)]


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def fp8_scenario(rope="llama3", heads=(4, 1), head_dim=64, page_size=16, dtype=torch.float32, seed=0, **kw):
    """A scenario whose pages are FP8 (the keys rotated at their encoding positions, then rounded), queries in
    `dtype`. Values up to ~8: e4m3's normal range, with its subnormals near 0."""
    s = make_scenario(
        kw.pop("docs", DOCS),
        kw.pop("requests", REQUESTS),
        q_heads=heads[0],
        kv_heads=heads[1],
        head_dim=head_dim,
        page_size=page_size,
        tables=tables(rope, head_dim, **({"device": kw["device"]} if "device" in kw else {})),
        dtype=dtype,
        seed=seed,
        **kw,
    )
    return dataclasses.replace(s, k_cache=quantize(s.k_cache * 2, FP8), v_cache=quantize(s.v_cache * 2, FP8))


def reference_of(s: Scenario, q: torch.Tensor, batch: PagedBatch) -> torch.Tensor:
    return reference.paged_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale)


def decoded(s: Scenario, q, batch, **kw) -> torch.Tensor:
    out = torch.full_like(q, float("nan"))
    got = decode_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, out=out, **kw)
    assert got is out and not out.isnan().any()
    return out


def prefilled(s: Scenario, q, batch, **kw) -> torch.Tensor:
    out = torch.full_like(q, float("nan"))
    prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, out=out, **kw)
    assert not out.isnan().any()
    return out


# --- decode ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rope", ["default", "llama3", "interleaved"])
@pytest.mark.parametrize("heads", [(4, 1), (6, 2)])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_over_fp8_pages_equals_the_reference_fp32_tight(rope, heads, num_splits):
    s = fp8_scenario(rope, heads, seed=1)
    q, batch = s.decode()
    assert rel_err(decoded(s, q, batch, num_splits=num_splits), reference_of(s, q, batch)) < 1e-5


def test_decode_bf16_queries_over_fp8_pages_within_bf16_rounding():
    s = fp8_scenario("llama3", (8, 2), head_dim=128, dtype=torch.bfloat16, seed=2)
    q, batch = s.decode()
    out = decoded(s, q, batch, num_splits=2)
    assert out.dtype == torch.bfloat16 and rel_err(out, reference_of(s, q, batch)) < 1e-2


def test_every_e4m3_value_widens_exactly_to_the_decode_tiles_dtype():
    """The decode kernel widens FP8 tiles to fp8_tile_dtype (float16 under a 16-bit q) and rounds q and P to it: exact
    for all 256 codes, and never coarser than q's own dtype."""
    codes = torch.arange(256, dtype=torch.uint8).view(FP8)
    finite = codes.float().isfinite()
    for q_dtype in (torch.bfloat16, torch.float16, torch.float32):
        tile = fp8_tile_dtype(q_dtype)
        assert torch.finfo(tile).eps <= torch.finfo(q_dtype).eps
        assert torch.equal(codes.to(tile).float()[finite], codes.float()[finite])


def test_the_kernels_read_the_rounded_pages():
    """The FP8 pages' result differs from the unrounded pages' by far more than the kernel's error."""
    s = make_scenario(DOCS, REQUESTS, q_heads=4, kv_heads=1, head_dim=64, page_size=16, tables=tables("default", 64))
    s = dataclasses.replace(s, k_cache=s.k_cache * 2, v_cache=s.v_cache * 2)
    s8 = dataclasses.replace(s, k_cache=quantize(s.k_cache, FP8), v_cache=quantize(s.v_cache, FP8))
    q, batch = s.decode()
    out8 = decoded(s8, q, batch, num_splits=2)
    assert rel_err(out8, reference_of(s8, q, batch)) < 1e-5
    assert rel_err(out8, reference_of(s, q, batch)) > 1e-3


@pytest.mark.parametrize("tma", [1, 2])
@pytest.mark.parametrize("layout", ["token", "head"])
def test_decode_copy_engine_tiles_over_fp8_pages(tma, layout):
    from lazyattn.cache.page_pool import allocate_kv

    s = fp8_scenario("llama3", (4, 2), seed=8, docs=[37, 16, 5, 64])
    q, batch = s.decode()
    s.poison_unlisted(batch)
    pages, page_size, hkv, d = s.k_cache.shape
    kv = allocate_kv(2, pages, page_size, hkv, d, FP8, "cpu", layout)
    kv[1, 0], kv[1, 1] = s.k_cache, s.v_cache
    assert decode.tile_descriptors(kv[1, 0], kv[1, 1], 16) is not None
    config = DecodeConfig(block_n=16, num_warps=4, num_stages=2, tma=tma)
    out = decode_attention(q, kv[1, 0], kv[1, 1], batch, s.tables, s.scale, num_splits=3, config=config)
    assert rel_err(out, reference_of(s, q, batch)) < 1e-5


def test_page_padding_of_fp8_pages_is_never_read():
    s = fp8_scenario("llama3", (4, 2), seed=9)
    q, batch = s.decode()
    want = reference_of(s, q, batch)
    s.poison_unlisted(batch)
    assert rel_err(decoded(s, q, batch, num_splits=2), want) < 1e-5


def test_decode_refuses_pages_wider_than_q_or_of_another_16_bit_dtype():
    s = make_scenario(DOCS, REQUESTS, q_heads=4, kv_heads=1, head_dim=64, page_size=16, tables=tables("default", 64))
    q, batch = s.decode()
    with pytest.raises(ValueError, match="q of torch.bfloat16 over K/V pages of torch.float16"):
        decode_attention(q.bfloat16(), s.k_cache.half(), s.v_cache.half(), batch, s.tables, s.scale)
    with pytest.raises(ValueError, match="q of torch.bfloat16 over K/V pages of torch.float32"):
        decode_attention(q.bfloat16(), s.k_cache, s.v_cache, batch, s.tables, s.scale)


def test_decode_fp32_queries_over_bf16_pages_equal_the_reference():
    """kv_cache_dtype=bfloat16 under a float32 model: tiles widened to fp32, q never rounded to bf16."""
    s = make_scenario(DOCS, REQUESTS, q_heads=4, kv_heads=1, head_dim=64, page_size=16, tables=tables("llama3", 64))
    s = dataclasses.replace(s, k_cache=s.k_cache.bfloat16(), v_cache=s.v_cache.bfloat16())
    q, batch = s.decode()
    assert rel_err(decoded(s, q, batch, num_splits=2), reference_of(s, q, batch)) < 1e-5


# --- prefill ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rope", ["default", "llama3", "interleaved"])
@pytest.mark.parametrize("splits", [None, 3])
def test_prefill_over_fp8_pages_equals_the_reference_fp32_tight(rope, splits):
    s = fp8_scenario(rope, seed=3)
    q, batch = s.final_prefill()
    assert rel_err(prefilled(s, q, batch, num_splits=splits), reference_of(s, q, batch)) < 1e-5


@pytest.mark.parametrize("rotated", [0, 8])
def test_prefill_runs_rotated_up_front_and_a_host_plan_over_fp8_pages(rotated):
    s = fp8_scenario("llama3", seed=4)
    q, batch = s.final_prefill()
    want = reference_of(s, q, batch)
    assert rel_err(prefilled(s, q, batch, num_splits=4, rotated_runs=rotated), want) < 1e-5
    assert rel_err(prefilled(s, q, with_plan(batch, 4, 2), rotated_runs=rotated), want) < 1e-5


def test_prefill_of_a_document_and_chunks_over_fp8_pages():
    s = fp8_scenario("default", (4, 2), seed=5)
    q, batch = s.doc_prefill([(0, 0, 37), (3, 5, 21)])
    assert rel_err(prefilled(s, q, batch), reference_of(s, q, batch)) < 1e-5
    q, batch = s.final_prefill([(0, 4), (3, 20), (0, 1), (10, 17)])
    s.poison_unlisted(batch)
    assert rel_err(prefilled(s, q, batch, num_splits=2), reference_of(s, q, batch)) < 1e-5


def test_prefill_bf16_queries_over_fp8_pages_within_bf16_rounding():
    s = fp8_scenario("interleaved", (4, 1), dtype=torch.bfloat16, seed=6)
    q, batch = s.final_prefill()
    out = prefilled(s, q, batch)
    assert out.dtype == torch.bfloat16 and rel_err(out, reference_of(s, q, batch)) < 1e-2


def test_widened_pages_are_the_listed_pages_widened():
    """Each (entry, page) of the call's tables gets its page, widened exactly, at entry * width + page; a page
    listed by two entries is there twice."""
    s = fp8_scenario("llama3", (4, 2), dtype=torch.bfloat16, seed=9)
    _, batch = s.final_prefill()
    wide_k, wide_v, wide = widened_pages(s.k_cache, s.v_cache, batch, torch.float16)
    entries, width = batch.pages.shape
    assert wide_k.dtype == wide_v.dtype == torch.float16 and wide_k.shape[0] == entries * width
    listed = 0
    for b in range(entries):
        for i in range(int(batch.num_pages[b])):
            page = int(batch.pages[b, i])
            assert int(wide.pages[b, i]) == b * width + i
            assert torch.equal(wide_k[b * width + i].float(), s.k_cache[page].float())
            assert torch.equal(wide_v[b * width + i].float(), s.v_cache[page].float())
            listed += 1
    assert listed > len(set(batch.pages.flatten().tolist()) - {0})  # documents shared by several entries
    assert torch.equal(wide.valid, batch.valid) and torch.equal(wide.deltas, batch.deltas)


@pytest.mark.parametrize("splits, rotated", [(1, 0), (3, 0), (2, 8)])
def test_prefill_widened_first_gives_the_same_bits(splits, rotated):
    """A bf16 q over FP8 pages: widening the pages before the kernel reads the same float16 tiles as widening each
    tile as it loads, so the output is the same to the bit, and within bf16 rounding of the reference. Questions
    over documents (Q rotated up front or in the kernel, split and not), and a chunked prefill whose later entries
    skip the first slots of a page (firsts) over NaN-poisoned padding."""
    for chunks in (None, [(0, 4), (3, 20), (0, 1), (10, 17)]):
        s = fp8_scenario("llama3", (4, 2), dtype=torch.bfloat16, seed=10)  # unpoisoned
        q, batch = s.final_prefill(chunks)
        want = reference_of(s, q, batch)
        s.poison_unlisted(batch)
        kept = prefilled(s, q, batch, num_splits=splits, rotated_runs=rotated, widen=False)
        widened = prefilled(s, q, batch, num_splits=splits, rotated_runs=rotated, widen=True)
        assert torch.equal(widened, kept)
        assert rel_err(widened, want) < 1e-2


@pytest.mark.parametrize("splits", [1, 3])
def test_prefill_over_transposed_v_pages(splits):
    """FP8 V pages stored transposed (as the pool stores them): the same bits as V stored as K is, widened first and
    tile by tile, over NaN-poisoned padding."""
    s = fp8_scenario("llama3", (4, 2), dtype=torch.bfloat16, seed=10)
    q, batch = s.final_prefill()
    s.poison_unlisted(batch)
    s_t = s.with_transposed_v()
    for widen in (False, True):
        want = prefilled(s, q, batch, num_splits=splits, widen=widen)
        assert torch.equal(prefilled(s_t, q, batch, num_splits=splits, widen=widen), want)


def test_which_prefill_calls_widen_first(monkeypatch):
    """FP8 pages under a 16-bit q, an entry of at least _WIDEN_MIN_ROWS query rows and _WIDEN_MIN_SCORES rows x
    keys, widened pages of at most _WIDEN_MAX_BYTES; never 16-bit pages or an fp32 q."""
    fp8 = torch.zeros(4, 16, 2, 64, dtype=FP8)  # a page: 16 slots x 2 heads x 64 = 2,048 values, 8 KiB as float16 K+V
    rows = prefill._WIDEN_MIN_ROWS

    def call(q_lens, pages, dtype=torch.bfloat16, cache=fp8):
        entries = [EntryPages([0] * pages, [0] * pages, [16] * pages) for _ in q_lens]
        batch = PagedBatch.build(entries, q_lens, [16 * pages - n for n in q_lens])
        return prefill.widens_first(torch.zeros(sum(q_lens), 8, 64, dtype=dtype), cache, batch)

    for dtype in (torch.bfloat16, torch.float16):
        assert call([rows], 160, dtype) and call([rows, 3], 160, dtype)
        assert not call([rows - 1], 160, dtype) and not call([rows // 2, rows // 2], 160, dtype)
        assert not call([rows], 160, dtype, fp8.to(dtype))
    assert not call([rows], 160, torch.float32)
    keys = prefill._WIDEN_MIN_SCORES // rows
    assert call([rows], keys // 16) and not call([rows], keys // 16 - 1)
    monkeypatch.setattr(prefill, "_WIDEN_MAX_BYTES", 2 * 160 * 8192)  # two entries of 160 pages fit, three do not
    assert call([rows, 1], 160) and not call([rows, 1, 1], 160)


# --- shared-document decode ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_shared_decode_over_fp8_pages_equals_the_reference(dtype, tol):
    s = fp8_scenario("llama3", (4, 1), dtype=dtype, seed=7)
    q, _ = s.decode()
    entries = [s.final_entry(r, r.final.length) for r in s.requests]
    batch = PagedBatch.build(entries, [1] * len(entries), [s.context_len(r) + r.final.length - 1 for r in s.requests])
    plan = shared_plan(entries, 4, 16, 8)
    assert plan.jobs.shape[0] < sum(len(e.pages) for e in entries)  # some pages are read once for several entries
    out = shared_decode_attention(q, s.k_cache, s.v_cache, batch, plan.to("cpu"), s.tables, s.scale)
    assert rel_err(out, reference_of(s, q, batch)) < tol


def test_shared_decode_rounds_q_and_p_as_plain_decode_does():
    """Under a bf16 q, shared decode widens FP8 tiles to float16 and rounds q and P to it, as decode.py does
    (kv_dtype.fp8_tile_dtype): the two kernels then differ by their summation order only, far inside one bf16
    rounding: their bf16 outputs differ by 3.6e-4 (with shared decode rounding to bfloat16 instead, by 3.7e-3)."""
    s = fp8_scenario("llama3", (4, 1), dtype=torch.bfloat16, seed=7)
    q, _ = s.decode()
    entries = [s.final_entry(r, r.final.length) for r in s.requests]
    batch = PagedBatch.build(entries, [1] * len(entries), [s.context_len(r) + r.final.length - 1 for r in s.requests])
    shared = shared_decode_attention(
        q, s.k_cache, s.v_cache, batch, shared_plan(entries, 4, 16, 8).to("cpu"), s.tables, s.scale
    )
    assert rel_err(shared, decoded(s, q, batch)) < 5e-4  # both outputs rounded to bf16 (3.6e-4 measured)


# --- GPU, Llama-3.1-8B shapes (32/8 heads, d=128, bf16 queries) ------------------------------------------


def gpu_fp8_scenario(docs, requests, page_size=64, dtype=torch.bfloat16) -> Scenario:
    """test_decode's GPU scenario with its pages doubled and rounded to e4m3."""
    s = gpu_scenario(docs, requests, page_size, dtype)
    return dataclasses.replace(s, k_cache=quantize(s.k_cache * 2, FP8), v_cache=quantize(s.v_cache * 2, FP8))


@pytest.mark.gpu
@pytest.mark.parametrize("tma", [0, 1, 2])
def test_gpu_fp8_decode_batch8(tma):
    docs = [1500, 1024, 777, 2048, 900, 1300]
    requests = [([i % 6, (i + 2) % 6], 4096 - docs[i % 6] - docs[(i + 2) % 6]) for i in range(8)]
    s = gpu_fp8_scenario(docs, requests)
    q, batch = s.decode()
    want = reference_of(s, q, batch)
    s.poison_unlisted(batch)  # real NaN bytes on the GPU
    for n in (None, 1, 3):
        config = dataclasses.replace(decode.decode_config(128, FP8, 64), tma=tma)
        assert rel_err(decoded(s, q, batch, num_splits=n, config=config), want) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("tma", [0, 2])
def test_gpu_fp8_decode_transposed_v_pages(tma):
    """FP8 V pages stored transposed (decode.v_transposed): equal to the reference with every split count, by
    per-thread loads and by copy-engine tiles, the page padding's NaN bytes kept out."""
    docs = [1500, 1024, 777, 2048, 900, 1300]
    requests = [([i % 6, (i + 2) % 6], 4096 - docs[i % 6] - docs[(i + 2) % 6]) for i in range(8)]
    s = gpu_fp8_scenario(docs, requests)
    q, batch = s.decode()
    want = reference_of(s, q, batch)
    s.poison_unlisted(batch)
    s_t = s.with_transposed_v()
    for n in (None, 1, 3):
        config = dataclasses.replace(decode.decode_config(128, FP8, 64, v_transposed=True), tma=tma)
        assert rel_err(decoded(s_t, q, batch, num_splits=n, config=config), want) < 1e-2
    assert rel_err(decoded(s_t, q, batch), want) < 1e-2  # the launcher's own choice


@pytest.mark.gpu
def test_gpu_fp8_fp32_tight():
    s = gpu_fp8_scenario([700, 300], [([0, 1], 100), ([1], 60)], dtype=torch.float32)
    q, batch = s.decode()
    assert rel_err(decoded(s, q, batch), reference_of(s, q, batch)) < 1e-5
    assert rel_err(decoded(s.with_transposed_v(), q, batch), reference_of(s, q, batch)) < 1e-5
    q, batch = s.final_prefill()
    assert rel_err(prefilled(s, q, batch), reference_of(s, q, batch)) < 1e-5


@pytest.mark.gpu
def test_gpu_fp8_prefill_rag_question():
    s = gpu_fp8_scenario([2048] * 5, [([4, 1, 3, 0, 2], 32), ([0, 2, 4], 32)])
    q, batch = s.final_prefill()
    want = reference_of(s, q, batch)
    s.poison_unlisted(batch)
    for splits in (None, 1, 8):
        assert rel_err(prefilled(s, q, batch, num_splits=splits), want) < 1e-2


@pytest.mark.gpu
def test_gpu_fp8_prefill_beyond_the_hopper_kernels_rows():
    """prefill.py's kernel where it runs over FP8 pages on a Hopper GPU too (float16 tiles, q and P rounded to
    float16): calls of more than 256 query rows, 16 questions of 40 tokens over documents in rotated orders (Q rotated
    in the kernel, split and not), and a document's own causal prefill of 2,048 tokens."""
    s = gpu_fp8_scenario([2048, 1000, 1500, 777], [([i % 4, (i + 1) % 4, (i + 3) % 4], 40) for i in range(16)])
    q, batch = s.final_prefill()
    assert q.shape[0] > 256
    want = reference_of(s, q, batch)
    s.poison_unlisted(batch)
    for splits in (None, 1, 4):
        assert rel_err(prefilled(s, q, batch, num_splits=splits), want) < 1e-2
    q, batch = s.doc_prefill([(0, 0, 2048)])
    want = reference_of(s, q, batch)
    assert rel_err(prefilled(s, q, batch), want) < 1e-2


@pytest.mark.gpu
def test_gpu_fp8_prefill_widened_first_gives_the_same_bits():
    """FP8 pages widened before the kernel (prefill.widens_first: long entries) give the same bits as widening each
    tile in the kernel, on sm_90's wgmma too: a document's causal prefill of 2,048 tokens, and 16 questions of 40
    tokens over documents (Q rotated in the kernel), over NaN page padding."""
    for document in (True, False):
        s = gpu_fp8_scenario([2048, 1000, 1500, 777], [([i % 4, (i + 1) % 4, (i + 3) % 4], 40) for i in range(16)])
        q, batch = s.doc_prefill([(0, 0, 2048)]) if document else s.final_prefill()
        assert prefill.widens_first(q, s.k_cache, batch) == document  # questions of 40 tokens: asked for below
        want = reference_of(s, q, batch)
        s.poison_unlisted(batch)
        widened = prefilled(s, q, batch, widen=True)
        assert torch.equal(widened, prefilled(s, q, batch, widen=False))
        assert rel_err(widened, want) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("transposed", [False, True])
def test_gpu_fp8_shared_decode(transposed):
    """Over V laid out as K's and transposed as the pool stores it, with NaN in every slot the entries do not
    list."""
    docs = [2048, 2048, 1500, 2048, 777]
    rng = random.Random(3)
    requests = [(list(dict.fromkeys(rng.sample([0, 0, 1, 2, 3, 4], 3))), 40) for _ in range(16)]
    s = gpu_fp8_scenario(docs, requests)
    s = s.with_transposed_v() if transposed else s
    q, _ = s.decode()
    entries = [s.final_entry(r, r.final.length) for r in s.requests]
    batch = PagedBatch.build(
        entries, [1] * len(entries), [s.context_len(r) + r.final.length - 1 for r in s.requests], "cuda"
    )
    want = reference_of(s, q, batch)
    s.poison_unlisted(batch)
    plan = shared_plan(entries, 4, 16, 8).to("cuda")
    out = shared_decode_attention(q, s.k_cache, s.v_cache, batch, plan, s.tables, s.scale)
    assert rel_err(out, want) < 1e-2


def test_the_hopper_kernel_takes_fp8_pages_under_16_bit_queries(monkeypatch):
    """The Gluon kernel widens FP8 tiles to float16 itself (its GPU tests: tests/kernels/test_prefill_hopper.py), so
    TritonBackend gives it short prefill calls over FP8 pages under a bf16 or fp16 q, as over 16-bit pages, and a
    graph bucket (which asks `shape_supported` with the pool's dtype) plans for it. It turns away an fp32 q, pages of
    two dtypes, and 16-bit pages of another dtype than q's."""
    from lazyattn.kernels import prefill_hopper

    q = torch.zeros(32, 32, 128, dtype=torch.bfloat16)
    pool = torch.zeros(4, 64, 8, 128, dtype=torch.bfloat16)
    fp8 = pool.to(FP8)
    batch = PagedBatch.build([], [], [])
    monkeypatch.setattr(prefill_hopper, "shape_supported", lambda *args: True)  # as on an H100/H200
    assert prefill_hopper.supports(q, pool, pool, batch)
    assert prefill_hopper.supports(q, fp8, fp8, batch)
    assert prefill_hopper.supports(q.half(), fp8, fp8, batch)
    assert not prefill_hopper.supports(q.float(), fp8, fp8, batch)
    assert not prefill_hopper.supports(q, fp8, pool, batch)
    assert not prefill_hopper.supports(q, pool.half(), pool.half(), batch)
