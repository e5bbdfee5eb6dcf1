"""The pieces of a decode tile step that decode.py's kernel and shared_decode.py's share: the channel pairing and
the rotation by -delta of a query tile, a masked K/V tile load, one tile of the online softmax, and the merge of
split partials.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Finite start for the running max: a tile with no valid key then gives exp2(-inf - NEG_BIG) = 0 and
# alpha = exp2(0) = 1 instead of the NaN of exp2(-inf - -inf).
NEG_BIG = tl.constexpr(-1.0e30)
# The Triton types of the query dtypes the decode kernels take.
TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit
def pair_layout(HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Per channel d: its pair partner, its pair index j (cos/sin column) and the sign of the sin term."""
    d = tl.arange(0, BLOCK_D)
    if INTERLEAVED:
        partner = d ^ 1
        pair = d // 2
        first = (d % 2) == 0
    else:
        half: tl.constexpr = HEAD_DIM // 2
        first = d < half
        partner = tl.where(first, d + half, d - half)
        pair = tl.where(first, d, d - half)
    sign = tl.where(first, 1.0, -1.0)
    return partner, pair, sign


@triton.jit
def masked_tile(base, page, stride_page, slot, stride_slot, d, tile_mask):
    """A page's [BLOCK_N, BLOCK_D] tile of K or V by per-thread loads: masked slots read as 0, so the page padding
    is never read."""
    return tl.load(base + page * stride_page + slot[:, None] * stride_slot + d[None, :], mask=tile_mask, other=0.0)


@triton.jit
def v_tile(
    base,
    page,
    stride_page,
    slot,
    stride_slot,
    d,
    stride_d,
    key_mask,
    d_mask,
    TY: tl.constexpr,
    V_T: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """A page's [BLOCK_N, BLOCK_D] V tile by per-thread loads, in dtype TY, slots outside key_mask read as 0.

    V_T: V's pages stored transposed (kernels/paged.py, v_transposed: a page's slots contiguous for each channel). The
    tile is then loaded as [BLOCK_D, BLOCK_N] rows along the slots, without a slot mask, and transposed in registers:
    masked along its contiguous dimension, an FP8 tile is read byte by byte (docs/design.md, "FP8 KV cache"). Every
    slot of a listed page is in the pool; those outside the keys may hold anything, NaN included, and are zeroed."""
    if V_T:
        rows = base + page * stride_page + slot[None, :] * stride_slot + d[:, None] * stride_d
        if HEAD_DIM == BLOCK_D:  # noqa: SIM108 (a compile-time branch reads clearer in a kernel)
            v_t = tl.load(rows)
        else:
            v_t = tl.load(rows, mask=d_mask[:, None], other=0.0)
        return tl.trans(tl.where(key_mask[None, :], v_t.to(TY), 0.0))
    tile_mask = load_mask(key_mask, d_mask, HEAD_DIM, BLOCK_D)
    return masked_tile(base, page, stride_page, slot, stride_slot, d * stride_d, tile_mask).to(TY)


@triton.jit
def rotation_rows(cos_ptr, sin_ptr, stride_tab, delta, pair, sign, d_mask):
    """The cos and signed sin of R_{-delta} per channel [D], from the fp32 tables' rows at delta."""
    row = delta.to(tl.int64) * stride_tab
    c = tl.load(cos_ptr + row + pair, mask=d_mask, other=1.0)
    s = tl.load(sin_ptr + row + pair, mask=d_mask, other=0.0) * sign
    return c, s


@triton.jit
def rotate(q, q_partner, c, s):
    """q [G, D] (fp32) rotated by the cos and signed sin rows c, s [D] of rotation_rows."""
    return q * c[None, :] + q_partner * s[None, :]


@triton.jit
def derotate(q, q_partner, cos_ptr, sin_ptr, stride_tab, delta, pair, sign, d_mask):
    """R_{-delta} q in fp32 for a [G, D] tile, from the fp32 cos/sin rows at delta."""
    c, s = rotation_rows(cos_ptr, sin_ptr, stride_tab, delta, pair, sign, d_mask)
    return rotate(q, q_partner, c, s)


@triton.jit
def load_mask(key_mask, d_mask, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """The [BLOCK_N, BLOCK_D] load mask of a tile's keys."""
    if HEAD_DIM == BLOCK_D:  # noqa: SIM108 (a compile-time branch reads clearer in a kernel)
        mask = key_mask[:, None]  # a row-only mask keeps 16-byte vector loads along D
    else:
        mask = key_mask[:, None] & d_mask[None, :]
    return mask


@triton.jit
def tile_scores(
    q_dot,
    k,
    key_mask,
    ape,
    ape_gap,
    qk_scale,
    HAS_APE: tl.constexpr,
    DOT_TY: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """A tile's scores of q_dot against k in log2 units, keys outside key_mask at -inf."""
    s = tl.dot(q_dot, tl.trans(k.to(DOT_TY)), input_precision=DOT_PRECISION) * qk_scale
    if HAS_APE:
        # The page's temperature and scale (kernels/paged.py; `ape` points at the page's entry of the temperature
        # row): s / T + ln S, in log2 units like s. Masked scores stay -inf below (1/T > 0).
        s = s * tl.load(ape) + tl.load(ape + ape_gap) * 1.4426950408889634
    return tl.where(key_mask[None, :], s, float("-inf"))


@triton.jit
def softmax_tile(
    q_dot,
    k,
    v,
    key_mask,
    ape,
    ape_gap,
    qk_scale,
    m_i,
    l_i,
    HAS_APE: tl.constexpr,
    DOT_TY: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One K/V tile of the online softmax (log2 units), for the decode kernels (decode.py, shared_decode.py):
    scores of q_dot against k, keys outside key_mask at -inf. Returns the tile's P @ V, P as the dot takes it
    (decode's copy-engine path multiplies it again), the factor that rescales the running sums, and the new l and
    m; the caller adds P @ V to its rescaled accumulator."""
    s = tile_scores(q_dot, k, key_mask, ape, ape_gap, qk_scale, HAS_APE, DOT_TY, DOT_PRECISION)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    prob = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(prob, 1)
    p_dot = prob.to(k.dtype).to(DOT_TY)  # k's dtype: the tile's as loaded (the cache's; an FP8 page's widened to q's)
    pv = tl.dot(p_dot, v.to(DOT_TY), input_precision=DOT_PRECISION)
    return pv, p_dot, alpha, l_i, m_new


@triton.jit
def merge_group(
    acc_ptr,
    m_ptr,
    l_ptr,
    first,
    num_splits,
    splits,
    o_row,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """out_h = sum_s 2^(m_hs - M_h) acc_hs / sum_s 2^(m_hs - M_h) l_hs for the GROUP query heads of one (entry,
    kv head), over its `splits` splits: partial (head h, split s) is scratch row first + h * num_splits + s.

    All heads' partials come in one load per BLOCK_S splits (at most one round trip in the usual case: the
    merger is the last program of its kv head, so its latency is the kernel's tail), with a running max, so any
    split count fits in registers. Empty splits carry m = NEG_BIG, l = 0, acc = 0 and add nothing. Loads bypass L1
    (.cg): other programs wrote the partials."""
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, None, :]
    h_mask = h < GROUP
    m_run = tl.full([BLOCK_H], NEG_BIG, tl.float32)
    total = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for s0 in range(0, splits, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)[None, :]
        mask = h_mask & (s < splits)
        row = first + h * num_splits + s
        m = tl.load(m_ptr + row, mask=mask, other=float("-inf"), cache_modifier=".cg")
        l = tl.load(l_ptr + row, mask=mask, other=0.0, cache_modifier=".cg")
        part = tl.load(
            acc_ptr + row[:, :, None] * HEAD_DIM + d,
            mask=mask[:, :, None] & (d < HEAD_DIM),
            other=0.0,
            cache_modifier=".cg",
        )
        m_new = tl.maximum(m_run, tl.max(m, 1))
        old = tl.exp2(m_run - m_new)
        w = tl.exp2(m - m_new[:, None])
        total = total * old + tl.sum(l * w, 1)
        acc = acc * old[:, None] + tl.sum(part * w[:, :, None], 1)
        m_run = m_new
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    dd = tl.arange(0, BLOCK_D)[None, :]
    tl.store(o_row + h.to(tl.int64) * stride_oh + dd, out.to(o_row.dtype.element_ty), mask=h_mask & (dd < HEAD_DIM))


# ---------------------------------------------------------------------------------------------------
# launcher
