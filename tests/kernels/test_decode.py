"""Triton decode kernel (split-KV, deferred RoPE) against the PyTorch reference and dense attention.

On a CPU the kernels run under TRITON_INTERPRET (set in tests/conftest.py); the gpu-marked tests use
Llama-3.1-8B shapes and run on the device.
"""

import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from lazyattn.kernels import decode, launch, reference
from lazyattn.kernels.decode import ArrivalCounters, DecodeConfig, decode_attention
from lazyattn.kernels.rope import RopeConfig, RopeTables
from tests.kernels.rope_cases import ROPE_CASES, tables
from tests.kernels.scenario import Scenario, make_scenario

# Documents 37 and 16 tokens leave partly filled last pages; document 2 is shared by requests 0 and 1 at
# deltas 53 and 16; request 2 decodes its very first final token.
DOCS = [37, 16, 5]
REQUESTS = [([2, 0, 1], 9), ([1, 2], 20), ([0], 1)]


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def scenario(
    rope="default",
    heads=(4, 1),
    head_dim=64,
    page_size=16,
    dtype=torch.float32,
    seed=0,
    docs=DOCS,
    requests=REQUESTS,
    device="cpu",
) -> Scenario:
    return make_scenario(
        docs,
        requests,
        q_heads=heads[0],
        kv_heads=heads[1],
        head_dim=head_dim,
        page_size=page_size,
        tables=tables(rope, head_dim, device=device),
        dtype=dtype,
        seed=seed,
        device=device,
    )


def dense_decode(s: Scenario) -> torch.Tensor:
    return torch.cat([s.dense_final(r, r.final.length - 1, r.final.length) for r in s.requests])


def run(s: Scenario, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel output (written over a NaN-poisoned buffer) and the reference's."""
    q, batch = s.decode()
    out = torch.full_like(q, float("nan"))
    got = decode_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, out=out, **kw)
    assert got is out and not out.isnan().any(), "every output element must be written"
    return out, reference.paged_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale)


@pytest.mark.parametrize("rope", list(ROPE_CASES))
def test_every_rope_variant(rope):
    s = scenario(rope, seed=1)
    out, ref = run(s, num_splits=3)
    assert rel_err(out, ref) < 1e-5
    assert rel_err(out, dense_decode(s)) < 1e-5


@pytest.mark.parametrize("heads", [(4, 1), (8, 1), (2, 2), (6, 2)])
def test_gqa_groups(heads):
    """GQA 4:1, 8:1, 1:1, and a group of 3 (padded to the 16 rows of the dot)."""
    s = scenario("llama3", heads=heads, seed=2)
    out, ref = run(s, num_splits=3)
    assert rel_err(out, ref) < 1e-5
    assert rel_err(out, dense_decode(s)) < 1e-5


@pytest.mark.parametrize("num_splits", [1, 2, 12])
def test_num_splits(num_splits):
    """One split writes directly; 12 outnumber every entry's pages (4 to 7): empty splits are harmless."""
    s = scenario("linear", heads=(4, 2), seed=2)
    out, ref = run(s, num_splits=num_splits)
    assert rel_err(out, ref) < 1e-5
    assert rel_err(out, dense_decode(s)) < 1e-5


def test_rotation_of_each_split():
    """A split rotates q for its first page's delta before the loop, for its last page's delta from rows loaded with
    it, and for any other delta from rows loaded in the loop: splits of one, two and three or more deltas, each
    against the reference."""
    s = scenario("default", heads=(4, 2), seed=9)
    q, batch = s.decode()
    seen = set()
    for num_splits in (1, 2, 3):
        for deltas, n in zip(batch.deltas.tolist(), batch.num_pages.tolist()):
            per = -(-n // num_splits)
            for lo in range(0, n, per):
                seen.add(min(3, len(set(deltas[lo : min(n, lo + per)]))))
        out, ref = run(s, num_splits=num_splits)
        assert rel_err(out, ref) < 1e-5
    assert seen == {1, 2, 3}, "the scenario must give splits of one, two and three or more deltas"


@pytest.mark.parametrize("heads", [(8, 1), (6, 2), (16, 1)])
def test_merge_in_several_rounds(heads):
    """More splits than the merge loads at once (64 // group rows: 8, 16, 4 splits a round), 18 and 20 of them."""
    s = scenario("llama3", heads=heads, seed=3, docs=[100, 90, 40], requests=[([0, 1, 2], 30), ([2, 1, 0], 55)])
    out, ref = run(s, num_splits=32)
    assert rel_err(out, ref) < 1e-5
    assert rel_err(out, dense_decode(s)) < 1e-5


@pytest.mark.parametrize("head_dim", [128, 80])
def test_head_dims(head_dim):
    """128, and 80 (not a power of two: channels padded and masked)."""
    s = scenario("interleaved" if head_dim == 80 else "yarn", heads=(4, 2), head_dim=head_dim, seed=3)
    out, ref = run(s, num_splits=2)
    assert rel_err(out, ref) < 1e-5
    assert rel_err(out, dense_decode(s)) < 1e-5


@pytest.mark.parametrize("page_size,block_n", [(32, 32), (32, 16), (64, 16)])
def test_page_sizes_and_tiles_per_page(page_size, block_n):
    """Pages of 32 as one tile and as two tiles; pages of 64 as four tiles of 16."""
    cfg = DecodeConfig(block_n=block_n, num_warps=4, num_stages=2)
    s = scenario("default", page_size=page_size, seed=4, docs=[70, 33, 5])
    out, ref = run(s, num_splits=3, config=cfg)
    assert rel_err(out, ref) < 1e-5
    assert rel_err(out, dense_decode(s)) < 1e-5


@pytest.mark.parametrize("head_dim", [64, 128])
def test_bf16_within_rounding(head_dim):
    s = scenario("llama3", heads=(8, 2), head_dim=head_dim, dtype=torch.bfloat16, seed=5)
    out, ref = run(s, num_splits=3)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, ref) < 1e-2
    assert rel_err(out, dense_decode(s)) < 1e-2


def test_apply_delta_false_equals_true_when_deltas_are_zero():
    s = scenario("default", seed=6)
    q, batch = s.decode()
    batch.deltas.zero_()
    on = decode_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, num_splits=2)
    off = decode_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, num_splits=2, apply_delta=False)
    no_tables = decode_attention(q, s.k_cache, s.v_cache, batch, None, s.scale, num_splits=2)
    assert torch.equal(on, off) and torch.equal(on, no_tables)
    assert rel_err(on, reference.paged_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale)) < 1e-5


def test_delta_is_applied():
    """Without de-rotation the result must differ: the deltas are really used."""
    s = scenario("default", seed=7)
    q, batch = s.decode()
    off = decode_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, apply_delta=False)
    assert rel_err(off, dense_decode(s)) > 1e-2


def test_page_padding_is_never_read():
    """NaN in every slot past a page's valid keys (and in unused pages) must not reach the output."""
    s = scenario("llama3", heads=(4, 2), seed=8)
    _, batch = s.decode()
    s.poison_unlisted(batch)
    out, _ = run(s, num_splits=2)
    assert rel_err(out, dense_decode(s)) < 1e-5


def test_strided_views_of_the_pool():
    """k_cache/v_cache as views kv[layer, 0/1] of a [layers, 2, pages, page_size, Hkv, D] pool."""
    s = scenario("ntk", heads=(4, 2), seed=9)
    kv = torch.zeros(3, 2, *s.k_cache.shape)
    kv[1, 0], kv[1, 1] = s.k_cache, s.v_cache
    q, batch = s.decode()
    out = decode_attention(q, kv[1, 0], kv[1, 1], batch, s.tables, s.scale, num_splits=2)
    assert rel_err(out, dense_decode(s)) < 1e-5


@pytest.mark.parametrize("tma", [1, 2])
@pytest.mark.parametrize("layout", ["token", "head"])
def test_copy_engine_tiles(tma, layout):
    """K (tma=1) or K and V (tma=2) by tensor-descriptor loads, from per-layer views of a pool in either page layout
    (cache/page_pool.py), with NaN in every slot past a page's keys: the loads read them, the kernel must not let
    them through (masked scores; V rows zeroed in tiles with masked slots)."""
    from lazyattn.cache.page_pool import allocate_kv

    s = scenario("llama3", heads=(4, 2), seed=8, docs=[37, 16, 5, 64])
    q, batch = s.decode()
    s.poison_unlisted(batch)
    pages, page_size, hkv, d = s.k_cache.shape
    kv = allocate_kv(2, pages, page_size, hkv, d, s.k_cache.dtype, "cpu", layout)
    kv[1, 0], kv[1, 1] = s.k_cache, s.v_cache
    assert decode.tile_descriptors(kv[1, 0], kv[1, 1], 16) is not None
    config = DecodeConfig(block_n=16, num_warps=4, num_stages=2, tma=tma)
    out = torch.full_like(q, float("nan"))
    decode_attention(q, kv[1, 0], kv[1, 1], batch, s.tables, s.scale, num_splits=3, config=config, out=out)
    assert rel_err(out, dense_decode(s)) < 1e-5


@pytest.mark.parametrize("page_size,block_n", [(16, 16), (32, 16)])
@pytest.mark.parametrize("tma", [0, 1, 2])
def test_transposed_v_pages(tma, page_size, block_n):
    """V pages stored transposed give dense attention's result, by per-thread loads and by copy-engine tiles
    ([channels, slots] rows), with NaN in every slot past a page's keys (masked tiles reload V, zeroed)."""
    s = scenario("llama3", heads=(4, 2), page_size=page_size, seed=8, docs=[37, 16, 5, 64])
    q, batch = s.decode()
    s.poison_unlisted(batch)
    v_t = s.with_transposed_v().v_cache
    assert decode.v_transposed(v_t) and not decode.v_transposed(s.v_cache)
    assert torch.equal(v_t.nan_to_num(7.0), s.v_cache.nan_to_num(7.0))
    if tma:
        assert decode.tile_descriptors(s.k_cache, v_t, block_n) is not None
    config = DecodeConfig(block_n=block_n, num_warps=4, num_stages=2, tma=tma)
    for num_splits in (1, 3):
        out = torch.full_like(q, float("nan"))
        decode_attention(q, s.k_cache, v_t, batch, s.tables, s.scale, num_splits=num_splits, config=config, out=out)
        assert rel_err(out, dense_decode(s)) < 1e-5


def test_fp8_tile_rules():
    """Over FP8 pages decode takes copy-engine tiles at every grid size; over V pages stored transposed (as the pool
    stores FP8 pages' V) three stages, else as many as its buffers; a V cache with neither head_dim nor slots
    contiguous is refused."""
    from lazyattn.kernels.kv_dtype import FP8

    for per_sm in (0.5, 1.9, 3.9):
        transposed = decode.decode_config(128, FP8, 64, per_sm, copy_engine=True, v_transposed=True)
        assert (transposed.num_stages, transposed.tma) == (3, 2)
        as_k = decode.decode_config(128, FP8, 64, per_sm, copy_engine=True)
        assert as_k.tma == 2 and as_k.num_stages == 5  # four buffers of a 64-slot K and V tile pair (16 KiB)
    s = scenario("llama3", heads=(4, 2), seed=8)
    q, batch = s.decode()
    pages, page_size, hkv, d = s.v_cache.shape
    neither = torch.zeros(pages, page_size, hkv, 2 * d)[..., ::2]
    with pytest.raises(ValueError, match="contiguous"):
        decode_attention(q, s.k_cache, neither, batch, s.tables, s.scale)


def test_copy_engine_rule(monkeypatch, kernel_settings):
    """decode_config takes copy-engine tiles below two programs per SM where the launcher allows them: a Hopper GPU
    (capability >= 9.0), not the interpreter, LAZYATTN_DECODE_TMA not 0."""
    for per_sm, want in ((0.97, 2), (1.94, 2), (2.0, 0), (3.9, 0)):
        assert decode.decode_config(128, torch.bfloat16, 64, per_sm, copy_engine=True).tma == want
        assert decode.decode_config(128, torch.bfloat16, 64, per_sm).tma == 0
    assert not decode.copy_engine_tiles(torch.device("cpu"))
    monkeypatch.setattr(launch, "interpreting", lambda: False)
    gpu = torch.device("cuda", 0)
    for capability, env, want in (
        ((9, 0), None, True),
        ((10, 0), "1", True),
        ((9, 0), "0", False),
        ((8, 0), None, False),
    ):
        monkeypatch.setattr(launch, "_capability_of", lambda index, c=capability: c)
        kernel_settings() if env is None else kernel_settings(LAZYATTN_DECODE_TMA=env)
        assert decode.copy_engine_tiles(gpu) == want


def test_copy_engine_falls_back_where_strides_do_not_allow_it():
    """head_dim 80 (no power-of-two box) and a V cache strided unlike K take per-thread copies, with the same result."""
    s = scenario("interleaved", heads=(4, 2), head_dim=80, seed=3)
    assert decode.tile_descriptors(s.k_cache, s.v_cache, 16) is None
    out, ref = run(s, num_splits=2, config=DecodeConfig(block_n=16, num_warps=4, num_stages=2, tma=2))
    assert rel_err(out, ref) < 1e-5
    s = scenario("llama3", heads=(4, 2), seed=3)
    v_wide = torch.zeros(*s.v_cache.shape[:-1], 2 * s.v_cache.shape[-1])
    v_wide[..., : s.v_cache.shape[-1]] = s.v_cache
    v = v_wide[..., : s.v_cache.shape[-1]]
    assert decode.tile_descriptors(s.k_cache, v, 16) is None
    q, batch = s.decode()
    out = decode_attention(
        q,
        s.k_cache,
        v,
        batch,
        s.tables,
        s.scale,
        num_splits=2,
        config=DecodeConfig(block_n=16, num_warps=4, num_stages=2, tma=2),
    )
    assert rel_err(out, dense_decode(s)) < 1e-5


def test_deltas_beyond_2_pow_20():
    """Same pages at a delta past 2^20 (and past the context): gathered from a long cos/sin table."""
    big = 1 << 20
    t = RopeTables.build(RopeConfig(head_dim=16, base=500000.0), big + 64)
    s = make_scenario([20, 9], [([0, 1], 5)], q_heads=2, kv_heads=1, head_dim=16, tables=t, seed=10)
    q, batch = s.decode()
    batch.deltas[batch.deltas > 0] += big
    out = decode_attention(q, s.k_cache, s.v_cache, batch, t, s.scale, num_splits=2)
    ref = reference.paged_attention(q, s.k_cache, s.v_cache, batch, t, s.scale)
    assert rel_err(out, ref) < 1e-5


def test_split_heuristic():
    # H100: 132 SMs, Llama-3.1-8B's 8 kv heads, pages of 64.
    assert decode.pick_num_splits(1, 8, 512, 132) >= 32  # batch 1 x 32K fills every SM
    assert decode.pick_num_splits(64, 8, 64, 132) == 1  # batch 64 x 4K is wide enough already
    assert decode.pick_num_splits(8, 8, 64, 132) == 4  # two programs per SM
    assert decode.pick_num_splits(1, 8, 3, 132) == 1  # too few pages to split
    assert decode.pick_num_splits(1, 8, 161, 132) == 15  # batch 1 x 10K: one program per SM (16, 15 with pages)
    assert decode.pick_num_splits(2, 8, 100, 132) == 8  # batch 2 x 6K: likewise
    assert decode.pick_num_splits(2, 8, 161, 132) == 15  # batch 2 x 10K: splits of 20 pages: two per SM


def test_split_rule_per_entry():
    """Hand-computed: an H100 (132 SMs), batch 1, 8 kv heads. A graph captured for 128K keys (2048 pages) has a
    grid of 33 splits; a 10K-key entry (161 pages) takes the 15 of one program per SM, a 1-page entry one."""
    rule = decode.split_rule(1, 8, 132)
    assert rule.unrounded(2048) == 33
    assert [rule.splits(n) for n in (0, 1, 7, 8, 161, 256, 257, 2048)] == [1, 1, 1, 2, 15, 16, 33, 33]


@triton.jit
def _entry_splits_probe(n_pages_ptr, out_ptr, num_splits, min_pages, short_pages, short_cap, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    n_pages = tl.load(n_pages_ptr + i)
    tl.store(out_ptr + i, decode._entry_splits(n_pages, num_splits, min_pages, short_pages, short_cap))


@pytest.mark.parametrize("batch_size, kv_heads", [(1, 8), (2, 8), (1, 2), (16, 8), (64, 8)])
def test_kernel_split_count_is_the_rule(batch_size, kv_heads):
    """The kernel's per-entry arithmetic (_entry_splits, grid sized for the longest entry) equals SplitRule."""
    rule = decode.split_rule(batch_size, kv_heads, 132)
    n_pages = torch.tensor(list(range(0, 300)) + [511, 512, 513, 1000, 2047], dtype=torch.int32)
    grid = rule.unrounded(int(n_pages.max()))
    out = torch.zeros(512, dtype=torch.int32)
    padded = torch.zeros(512, dtype=torch.int32)
    padded[: len(n_pages)] = n_pages
    _entry_splits_probe[(1,)](padded, out, grid, rule.min_pages, rule.short_pages, rule.short_cap, BLOCK=512)
    assert out[: len(n_pages)].tolist() == [rule.splits(int(n)) for n in n_pages]


def widened(batch, width: int):
    """The same batch in a page table `width` pages wide (zero columns past each entry's pages), as a CUDA graph
    captured for longer contexts holds it."""
    pad = width - batch.max_pages

    def grow(t):
        return torch.nn.functional.pad(t, (0, pad))

    return dataclasses.replace(
        batch,
        pages=grow(batch.pages),
        deltas=grow(batch.deltas),
        valid=grow(batch.valid),
        starts=grow(batch.starts),
        max_kv=width * 16,
        firsts=None if batch.firsts is None else grow(batch.firsts),
    )


def test_wide_grid_splits_each_entry_by_its_own_pages():
    """A grid sized for 40-page contexts over entries of 7 and 2 pages (a graph replaying short requests): every
    entry takes the splits of its own length, so the output has the bits of the launch sized for this batch,
    and matches the reference."""
    s = scenario("llama3", heads=(4, 1), seed=12, docs=[37, 16, 5, 30], requests=[([0, 3, 1], 9), ([2], 3)])
    q, batch = s.decode()
    rule = decode._default_rule(q, 1)
    assert [rule.splits(int(n)) for n in batch.num_pages] == [3, 1]  # a merge of 3 splits, a direct write
    assert rule.unrounded(40) > rule.unrounded(batch.max_pages)
    fitted = decode_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale)
    wide = decode_attention(q, s.k_cache, s.v_cache, widened(batch, 40), s.tables, s.scale)
    assert torch.equal(wide, fitted)
    assert rel_err(wide, dense_decode(s)) < 1e-5


def test_rejects_mismatched_shapes():
    s = scenario(seed=11)
    q, batch = s.decode()
    with pytest.raises(ValueError, match="one query row per entry"):
        decode_attention(q[:2], s.k_cache, s.v_cache, batch, s.tables, s.scale)
    with pytest.raises(ValueError, match="multiple of the tile"):
        decode_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, config=DecodeConfig(32, 4, 2))


def test_kept_arrival_counters_are_reused_and_left_zero():
    """Split launches count on the caller's counters and hand them back zeroed, so the next launch (or a
    CUDA graph replay) can count again."""
    s = scenario("llama3", heads=(4, 2), seed=13)
    counters = ArrivalCounters()
    first, ref = run(s, num_splits=3, counters=counters)
    buf = counters.get(s.k_cache.device, 1)
    assert buf.dtype == torch.int32 and not buf.any()
    again, _ = run(s, num_splits=3, counters=counters)
    assert counters.get(s.k_cache.device, 1) is buf and not buf.any()
    assert torch.equal(first, again) and rel_err(first, ref) < 1e-5


def test_arrival_counters_grow_zeroed():
    counters = ArrivalCounters()
    small = counters.get(torch.device("cpu"), 6)
    assert small.numel() >= 6 and counters.get(torch.device("cpu"), small.numel()) is small
    big = counters.get(torch.device("cpu"), small.numel() + 1)
    assert big is not small and big.numel() > small.numel() and not big.any()


# --- GPU, real shapes (Llama-3.1-8B: 32/8 heads, d=128, bf16) ------------------------------------------


def gpu_scenario(docs, requests, page_size=64, dtype=torch.bfloat16) -> Scenario:
    return make_scenario(
        docs,
        requests,
        q_heads=32,
        kv_heads=8,
        head_dim=128,
        page_size=page_size,
        tables=tables("llama3", 128, max_position=40000, device="cuda"),
        dtype=dtype,
        device="cuda",
        seed=12,
    )


@pytest.mark.gpu
def test_gpu_batch1_32k():
    # Five documents and a final segment: 32K keys, ragged pages, five deltas.
    s = gpu_scenario([6000, 7001, 5555, 8190, 5000], [([3, 0, 4, 1, 2], 1022)])
    for n in (None, 1, 7):
        out, ref = run(s, num_splits=n)
        assert rel_err(out, ref) < 1e-2
    assert rel_err(out, dense_decode(s)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [16, 64, 256])
@pytest.mark.parametrize("tma", [0, 1, 2])
def test_gpu_batch8_4k(page_size, tma):
    """Ragged documents at their deltas, NaN past every page's keys; per-thread copies and the copy engine."""
    docs = [1500, 1024, 777, 2048, 900, 1300]
    requests = [([i % 6, (i + 2) % 6], 4096 - docs[i % 6] - docs[(i + 2) % 6]) for i in range(8)]
    s = gpu_scenario(docs, requests, page_size=page_size)
    _, batch = s.decode()
    s.poison_unlisted(batch)
    for n in (None, 1, 3):
        config = dataclasses.replace(decode.decode_config(128, torch.bfloat16, page_size), tma=tma)
        out, ref = run(s, num_splits=n, config=config)
        assert rel_err(out, ref) < 1e-2
    assert rel_err(out, dense_decode(s)) < 1e-2


@pytest.mark.gpu
def test_gpu_fp32_tight():
    s = gpu_scenario([700, 300], [([0, 1], 100), ([1], 60)], dtype=torch.float32)
    out, ref = run(s)
    assert rel_err(out, ref) < 1e-5
    assert rel_err(out, dense_decode(s)) < 1e-5


@pytest.mark.gpu
def test_gpu_page_offsets_beyond_int32():
    """Pages past 2^31 elements of the pool (page id x page stride overflows int32)."""
    s = gpu_scenario([300, 200], [([0, 1], 50), ([1, 0], 70)])
    q, batch = s.decode()
    shift = (1 << 31) // s.k_cache[0].numel() + 1
    k_big = torch.empty(shift + s.k_cache.shape[0], *s.k_cache.shape[1:], dtype=s.k_cache.dtype, device="cuda")
    v_big = torch.empty_like(k_big)
    k_big[shift:], v_big[shift:] = s.k_cache, s.v_cache
    batch.pages += shift
    out = decode_attention(q, k_big, v_big, batch, s.tables, s.scale, num_splits=2)
    assert rel_err(out, dense_decode(s)) < 1e-2
