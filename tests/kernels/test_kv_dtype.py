"""The FP8 KV cache's PyTorch side (kernels/kv_dtype.py, kernels/reference.py) against an independent decoding of
the e4m3fn bytes: the rounding rule (nearest, ties to even, saturating at ±448), the reference backend's writes,
its attention over FP8 pages, and block mode's copy of an FP8 page."""

from __future__ import annotations

import math

import pytest
import torch

from lazyattn.kernels import reference
from lazyattn.kernels.kv_dtype import FP8, FP8_MAX, quantize, resolve
from lazyattn.kernels.paged import EntryPages, PagedBatch
from lazyattn.kernels.rope import RopeConfig, RopeTables, rotate


def e4m3_value(code: int) -> float:
    """The value of one e4m3fn byte, from its bit fields (OCP FP8: bias 7, no infinities, S.1111.111 is NaN)."""
    sign = -1.0 if code & 0x80 else 1.0
    exp, mant = (code >> 3) & 0xF, code & 0x7
    if exp == 0xF and mant == 0x7:
        return math.nan
    if exp == 0:
        return sign * mant / 8 * 2.0**-6
    return sign * (1 + mant / 8) * 2.0 ** (exp - 7)


VALUES = torch.tensor([e4m3_value(c) for c in range(256)], dtype=torch.float64)


def decode(t: torch.Tensor) -> torch.Tensor:
    """FP8 tensor -> float64, through the table above (not torch's conversion)."""
    return VALUES[t.view(torch.uint8).long()]


def nearest_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even onto the finite e4m3 values, saturating: the rule the cache stores by."""
    finite = [c for c in range(256) if not math.isnan(VALUES[c]) and c != 0x80]  # +0 stands for both zeros
    values = VALUES[finite]
    x = x.double().clamp(-FP8_MAX, FP8_MAX)
    dist = (x[:, None] - values[None, :]).abs()
    best = dist.min(dim=1, keepdim=True).values
    ties = dist == best
    # of two equally near values, the one with an even mantissa (its code's last bit clear)
    even = torch.tensor([c & 1 == 0 for c in finite])
    pick = torch.where((ties & even[None, :]).any(1, keepdim=True), ties & even[None, :], ties)
    return values[pick.float().argmax(1)]


def test_every_code_decodes_as_torch_reads_it():
    codes = torch.arange(256, dtype=torch.uint8).view(FP8)
    ours, theirs = decode(codes), codes.double()
    assert torch.equal(ours.isnan(), theirs.isnan())
    assert torch.equal(ours.nan_to_num(0.0), theirs.nan_to_num(0.0))


def test_quantize_rounds_to_nearest_even_and_saturates():
    g = torch.Generator().manual_seed(0)
    x = torch.cat(
        [
            torch.randn(4000, generator=g) * scale
            for scale in (1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0, 1000.0)  # subnormals to beyond 448
        ]
        + [VALUES[[c for c in range(1, 0x7F)]].float(), torch.tensor([448.0, 464.0, 1e6, -1e6, 2**-10, 3 * 2**-10])]
    )
    # midpoints between neighbouring values: the ties
    grid = VALUES[:0x7F].float()
    x = torch.cat([x, (grid[1:] + grid[:-1]) / 2, -(grid[1:] + grid[:-1]) / 2])
    got = decode(quantize(x, FP8))
    assert torch.equal(got, nearest_e4m3(x))
    assert decode(quantize(torch.tensor([math.nan]), FP8)).isnan().all()


def test_resolve_names_the_pool_dtype():
    assert resolve("auto", torch.float32) == torch.float32
    assert resolve("bfloat16", torch.float32) == torch.bfloat16
    assert resolve("fp8_e4m3", torch.bfloat16) == FP8
    with pytest.raises(ValueError, match="kv_cache_dtype must be"):
        resolve("fp8", torch.bfloat16)


def random_cache(pages: int, page_size: int, heads: int, dim: int, seed: int, scale: float = 2.0):
    g = torch.Generator().manual_seed(seed)
    full = torch.randn(2, pages, page_size, heads, dim, generator=g) * scale
    return quantize(full, FP8)


@pytest.mark.parametrize("rope", [RopeConfig(16), RopeConfig(16, base=500.0, interleaved=True)])
def test_reference_attention_over_fp8_pages_is_attention_over_their_values(rope):
    """The reference dequantizes pages exactly: attention over an FP8 pool equals attention over a float64-decoded
    float32 copy of the same pool, with deltas and a partly filled page."""
    dim, heads_kv, heads_q, ps = 16, 2, 4, 8
    kv8 = random_cache(6, ps, heads_kv, dim, 1)
    kv32 = decode(kv8).float()
    tables = RopeTables.build(rope, 256, "cpu")
    entries = [
        EntryPages([3, 0, 5], [0, 11, 20], [8, 5, 7]),
        EntryPages([1, 4], [0, 0], [8, 3]),
    ]
    q_lens, q_starts = [4, 1], [20, 10]
    batch = PagedBatch.build(entries, q_lens, q_starts, "cpu")
    q = torch.randn(sum(q_lens), heads_q, dim, generator=torch.Generator().manual_seed(2))
    got = reference.paged_attention(q, kv8[0], kv8[1], batch, tables, dim**-0.5)
    want = reference.paged_attention(q, kv32[0], kv32[1], batch, tables, dim**-0.5)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_write_kv_stores_the_rounded_rows():
    ps, heads, dim = 4, 2, 8
    kv = torch.zeros(2, 3, ps, heads, dim, dtype=FP8)
    g = torch.Generator().manual_seed(3)
    k, v = torch.randn(5, heads, dim, generator=g) * 50, torch.randn(5, heads, dim, generator=g) * 1e-2
    slots = torch.tensor([1, 2, -1, 8, 11])
    reference.write_kv(k, v, slots, kv[0], kv[1])
    keep = slots >= 0
    s = slots[keep]
    for cache, x in ((kv[0], k), (kv[1], v)):
        stored = decode(cache[s // ps, s % ps])
        assert torch.equal(stored, nearest_e4m3(x[keep].reshape(-1)).reshape(stored.shape))


def test_block_copy_of_an_fp8_page_rotates_the_decoded_key_and_copies_v_bytes():
    ps, heads, dim = 4, 2, 8
    pool = random_cache(5, ps, heads, dim, 4).unsqueeze(0)  # [layers=1, 2, pages, ps, heads, dim]
    tables = RopeTables.build(RopeConfig(8), 64, "cpu")
    before = pool.clone()
    src, dst, deltas = torch.tensor([1, 3]), torch.tensor([2, 4]), torch.tensor([7, 30])
    reference.copy_rotate(pool, src, dst, deltas, tables)
    for s, d, delta in zip(src.tolist(), dst.tolist(), deltas.tolist()):
        moved = rotate(decode(before[0, 0, s]).float(), tables.cos[delta], tables.sin[delta], False)
        assert torch.equal(decode(pool[0, 0, d]), nearest_e4m3(moved.reshape(-1)).reshape(moved.shape))
        assert torch.equal(pool[0, 1, d].view(torch.uint8), before[0, 1, s].view(torch.uint8))
