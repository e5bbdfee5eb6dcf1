"""cache_ops kernels against the PyTorch reference (apply_rope + write_kv, copy_rotate).

On the CPU they run under TRITON_INTERPRET=1 (tests/conftest.py), so shapes stay small; the gpu-marked
tests repeat the checks at Llama-3.1-8B shapes.
"""

import pytest
import torch

from lazyattn.kernels import reference
from lazyattn.kernels.cache_ops import copy_rotate, rope_write_kv
from lazyattn.kernels.rope import apply_rope
from tests.kernels.rope_cases import ROPE_CASES, tables
from tests.kernels.scenario import make_scenario

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


FP8 = torch.float8_e4m3fn


def assert_matches(got: torch.Tensor, want: torch.Tensor, exact_fp8: bool = True) -> None:
    """fp32: tight (FMA contraction on the GPU may move the last bit); bf16/fp16: one rounding step. FP8 pages: the
    same values (the kernel's rounding is the reference's) where the value rounded to FP8 is the same fp32 value
    (`exact_fp8`, the interpreter); else, where the kernel's fp32 or bf16 value may differ in its last bit (FMA on
    the GPU, the interpreter's truncating fp32 -> bf16), one e4m3 step on at most 1% of the elements."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype == FP8:
        g, w = got.float(), want.float()
        if exact_fp8:
            assert torch.equal(g, w)
        else:
            torch.testing.assert_close(g, w, rtol=2**-3, atol=2**-9)
            assert (g != w).float().mean() <= 0.01
    elif want.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-2)


def make_pool(layers, pages, page_size, hkv, dim, dtype, device=DEVICE, pad=0, seed=0):
    """A random pool; pad > 0 makes it a strided view (padded head_dim) to catch stride mistakes."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    big = torch.randn(layers, 2, pages, page_size, hkv, dim + pad, generator=gen).to(dtype).to(device)
    return big[..., :dim]


def qkv_inputs(t, hq, hkv, dim, dtype, device=DEVICE, seed=1):
    """q, k, v as slices of one fused projection output, like the model produces them (strided views)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    fused = torch.randn(t, (hq + 2 * hkv) * dim, generator=gen).to(dtype).to(device)
    q, k, v = fused.split([hq * dim, hkv * dim, hkv * dim], dim=1)
    return q.view(t, hq, dim), k.view(t, hkv, dim), v.view(t, hkv, dim)


def check_rope_write_kv(
    rope, dtype, hq, hkv, dim, t, page_size=8, pages=6, pad=0, seed=0, index_views=False, cache_dtype=None
):
    tab = tables(rope, dim, max_position=2048, device=DEVICE)
    q, k, v = qkv_inputs(t, hq, hkv, dim, dtype, seed=seed)
    gen = torch.Generator(device="cpu").manual_seed(seed + 7)
    positions = torch.randint(0, 2048, (t,), generator=gen, dtype=torch.int32).to(DEVICE)
    slots = torch.randperm(pages * page_size, generator=gen)[:t].to(DEVICE)
    slots[::3] = -1
    if index_views:  # int64 positions and int32 slots, both strided views
        positions = torch.stack([positions.long(), positions.long()], 1)[:, 0]
        slots = torch.stack([slots, slots], 1).int()[:, 1]
    pool = make_pool(2, pages, page_size, hkv, dim, cache_dtype or dtype, pad=pad, seed=seed)
    want_pool = pool.clone()
    want_q = apply_rope(q, positions, tab)
    reference.write_kv(apply_rope(k, positions, tab), v, slots, want_pool[1, 0], want_pool[1, 1])

    got_q = rope_write_kv(q, k, v, positions, slots, pool[1, 0], pool[1, 1], tab)
    assert_matches(got_q, want_q)
    exact = DEVICE == "cpu" and dtype == torch.float32
    assert_matches(pool, want_pool, exact)  # layer 0 untouched, -1 slots untouched, the rest written


@pytest.mark.parametrize("rope", list(ROPE_CASES))
def test_rope_write_kv_every_rope_fp32(rope):
    check_rope_write_kv(rope, torch.float32, hq=4, hkv=2, dim=64, t=11)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [(8, 2), (3, 3), (6, 1)])
@pytest.mark.parametrize("dim", [64, 128])
def test_rope_write_kv_gqa_dims_dtypes(dtype, heads, dim):
    check_rope_write_kv("llama3", dtype, heads[0], heads[1], dim, t=9, pad=8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rope", ["llama3", "interleaved"])
def test_rope_write_kv_into_fp8_pages(dtype, rope):
    """FP8 pages: k rotated then rounded to e4m3 and v rounded, as reference.write_kv stores them."""
    check_rope_write_kv(rope, dtype, hq=4, hkv=2, dim=64, t=11, pad=8, cache_dtype=FP8)


def test_fp8_writes_saturate_and_round_subnormals_like_torch():
    """Keys far beyond ±448 and values in e4m3's subnormal range, through the kernel's own rounding."""
    tab = tables("default", 64, device=DEVICE)
    q, k, v = qkv_inputs(6, 2, 2, 64, torch.float32)
    k, v = k * 400, v * 1e-3
    slots = torch.arange(6, device=DEVICE)
    pool = torch.zeros(1, 2, 2, 4, 2, 64, dtype=FP8, device=DEVICE)
    want = pool.clone()
    reference.write_kv(apply_rope(k, slots, tab), v, slots, want[0, 0], want[0, 1])
    rope_write_kv(q, k, v, slots, slots, pool[0, 0], pool[0, 1], tab)
    assert want.float().abs().max() == 448 and (want[0, 1].float().abs() < 2**-6).float().mean() > 0.5
    assert_matches(pool, want, exact_fp8=DEVICE == "cpu")


def test_rope_write_kv_interleaved_bf16_odd_head_dim():
    # head_dim 96: 48 pairs, not a power of two, so the pair masks are exercised.
    check_rope_write_kv("interleaved", torch.bfloat16, hq=2, hkv=1, dim=96, t=5)


def test_rope_write_kv_index_views_and_empty():
    tab = tables("default", 64, device=DEVICE)
    q, k, v = qkv_inputs(0, 2, 1, 64, torch.float32)
    pool = make_pool(1, 2, 4, 1, 64, torch.float32)
    empty = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    assert rope_write_kv(q, k, v, empty, empty, pool[0, 0], pool[0, 1], tab).shape == (0, 2, 64)
    check_rope_write_kv("default", torch.float32, hq=2, hkv=1, dim=64, t=4, index_views=True)


def test_rope_write_kv_rejects_mismatched_cache():
    tab = tables("default", 64, device=DEVICE)
    q, k, v = qkv_inputs(3, 4, 2, 64, torch.float32)
    pool = make_pool(1, 2, 4, 1, 64, torch.float32)
    pos = torch.zeros(3, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="k_cache"):
        rope_write_kv(q, k, v, pos, pos, pool[0, 0], pool[0, 1], tab)


def check_copy_rotate(rope, dtype, hkv, dim, layers=3, pages=10, page_size=8, n=4, pad=0, seed=0):
    """dtype: the pool's (FP8 pages: the rotated key rounded by the kernel's rule, V copied as bytes)."""
    tab = tables(rope, dim, max_position=4096, device=DEVICE)
    kv = make_pool(layers, pages, page_size, hkv, dim, dtype, pad=pad, seed=seed)
    gen = torch.Generator(device="cpu").manual_seed(seed + 3)
    perm = torch.randperm(pages, generator=gen)
    src, dst = perm[:n].to(DEVICE), perm[n : 2 * n].to(DEVICE, torch.int32)
    deltas = torch.randint(0, 4096, (n,), generator=gen).to(DEVICE)
    want = kv.clone()
    reference.copy_rotate(want, src, dst, deltas, tab)
    copy_rotate(kv, src, dst, deltas, tab)
    assert_matches(kv, want, exact_fp8=DEVICE == "cpu")


@pytest.mark.parametrize("rope", list(ROPE_CASES))
def test_copy_rotate_every_rope_fp32(rope):
    check_copy_rotate(rope, torch.float32, hkv=2, dim=64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, FP8])
@pytest.mark.parametrize("dim", [64, 128])
def test_copy_rotate_dims_dtypes_strided(dtype, dim):
    check_copy_rotate("llama3", dtype, hkv=3, dim=dim, pad=16)


def test_copy_rotate_in_place_and_partial_row_block():
    # page_size * Hkv = 80 rows: the second row block of each page is partly masked.
    tab = tables("yarn", 64, device=DEVICE)
    kv = make_pool(2, 4, 16, 5, 64, torch.float32)
    pages = torch.tensor([2, 0], device=DEVICE)
    deltas = torch.tensor([5, 1000], device=DEVICE, dtype=torch.int32)
    want = kv.clone()
    reference.copy_rotate(want, pages, pages, deltas, tab)
    copy_rotate(kv, pages, pages, deltas, tab)
    assert_matches(kv, want)


def test_copy_rotate_then_attend_equals_lazy():
    """The copy attended with delta 0 equals attending the original pages with their deltas."""
    tab = tables("default", 32)
    s = make_scenario([40, 23], [([1, 0], 8)], head_dim=32, tables=tab, seed=4, spare_pages=8)
    q, batch = s.final_prefill()
    want = reference.paged_attention(q, s.k_cache, s.v_cache, batch, tab, s.scale)
    kv = torch.stack([s.k_cache, s.v_cache])[None].clone()
    used = set(batch.pages[0, : int(batch.num_pages[0])].tolist())
    free = [p for p in range(kv.shape[2]) if p not in used]
    n_doc = len(s.docs[0].pages) + len(s.docs[1].pages)
    dst = torch.tensor(free[:n_doc], dtype=torch.int32)
    copy_rotate(kv, batch.pages[0, :n_doc].clone(), dst, batch.deltas[0, :n_doc].clone(), tab)
    batch.pages[0, :n_doc] = dst
    batch.deltas.zero_()
    got = reference.paged_attention(q, kv[0, 0], kv[0, 1], batch, tab, s.scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# --- real shapes on the GPU ---------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("rope", ["llama3", "interleaved"])
@pytest.mark.parametrize("t", [1, 64, 4133])
def test_rope_write_kv_gpu_llama8b(rope, t):
    check_rope_write_kv(rope, torch.bfloat16, hq=32, hkv=8, dim=128, t=t, page_size=64, pages=80)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 4133])
def test_rope_write_kv_fp8_gpu_llama8b(t):
    check_rope_write_kv("llama3", torch.bfloat16, hq=32, hkv=8, dim=128, t=t, page_size=64, pages=80, cache_dtype=FP8)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, FP8])
def test_copy_rotate_gpu_llama8b(dtype):
    check_copy_rotate("llama3", dtype, hkv=8, dim=128, layers=32, pages=400, page_size=64, n=160)
