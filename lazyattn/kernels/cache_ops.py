"""Triton kernels that move KV into and around the page pool.

- `rope_write_kv`: the per-layer step before attention. Rotates q and k at their own positions (R_p times
  the magnitude factor, DESIGN.md §2), stores rotated k and raw v at their cache slots, returns rotated q.
  One launch instead of three (rope q, rope k, scatter): every byte is read once and written once.
- `copy_rotate`: Block-Attention's private copy for `block` mode (DESIGN.md §4): K[dst] = R_delta K[src],
  V[dst] = V[src] for every layer in one launch. It is the baseline lazy mode is measured against, so it
  is built to run at copy bandwidth: one program per (page, row block, layer), 16-byte loads along D.

Both gather cos/sin rows from the fp32 RopeTables (never a bf16 table, see rope.py) and do the rotation in
fp32, rounding once at the store. Pairing of channels (half-split or interleaved) is a compile-time choice:
pair j is (x[j * PAIR_STEP], x[j * PAIR_STEP + PARTNER]). The two halves are loaded as two tiles; for
interleaved pairs those are stride-2 loads that hit the same cache lines, which only costs L1 traffic.

All offsets are int64: pools of tens of GiB overflow int32 element offsets.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lazyattn.kernels.rope import RopeTables


@triton.jit
def _pair_offsets(BLOCK_HALF: tl.constexpr, HALF: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Channel offsets of the two members of each rotation pair, and the mask of real pairs."""
    j = tl.arange(0, BLOCK_HALF)
    if INTERLEAVED:
        first = 2 * j
        second = 2 * j + 1
    else:
        first = j
        second = j + HALF
    return first, second, j < HALF


@triton.jit
def _rotate(a, b, cos, sin):
    """(a, b) rotated by the angle whose cos/sin are given, in fp32; same expression as rope.rotate."""
    a = a.to(tl.float32)
    b = b.to(tl.float32)
    return a * cos - b * sin, b * cos + a * sin


@triton.jit
def _rope_heads(
    src, s_h, s_d, dst, d_h, d_d, cos, sin, mscale, n_heads,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    INTERLEAVED: tl.constexpr, ROUND_TY: tl.constexpr,
):
    """Rotate n_heads heads of one token (strided src rows) into dst rows, rounding to ROUND_TY then dst's.

    The double rounding matches apply_rope (to the input dtype) followed by the cache write (to the
    cache dtype), so the result is bit-identical to the reference when the dtypes differ.
    """
    h = tl.arange(0, BLOCK_H)
    first, second, pair_ok = _pair_offsets(BLOCK_HALF, HALF, INTERLEAVED)
    mask = (h[:, None] < n_heads) & pair_ok[None, :]
    src_rows = src + h[:, None].to(tl.int64) * s_h
    dst_rows = dst + h[:, None].to(tl.int64) * d_h
    a = tl.load(src_rows + first[None, :] * s_d, mask=mask, other=0.0)
    b = tl.load(src_rows + second[None, :] * s_d, mask=mask, other=0.0)
    ra, rb = _rotate(a, b, cos[None, :], sin[None, :])
    ra = (ra * mscale).to(ROUND_TY).to(dst.dtype.element_ty)
    rb = (rb * mscale).to(ROUND_TY).to(dst.dtype.element_ty)
    tl.store(dst_rows + first[None, :] * d_d, ra, mask=mask)
    tl.store(dst_rows + second[None, :] * d_d, rb, mask=mask)


@triton.jit
def _rope_write_kv_kernel(
    q_ptr, k_ptr, v_ptr, q_out_ptr, pos_ptr, slot_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr,
    sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, sv_t, sv_h, sv_d, so_t, so_h,
    skc_p, skc_s, skc_h, skc_d, svc_p, svc_s, svc_h, svc_d,
    s_tab, mscale, page_size,
    HQ: tl.constexpr, HKV: tl.constexpr, HEAD_DIM: tl.constexpr, HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_D: tl.constexpr,
    INTERLEAVED: tl.constexpr,
):
    # One program per token: all its q, k and v heads (a few KiB) in one pass.
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cos_ptr + pos * s_tab + j, mask=j < HALF, other=1.0)
    sin = tl.load(sin_ptr + pos * s_tab + j, mask=j < HALF, other=0.0)

    _rope_heads(q_ptr + t * sq_t, sq_h, sq_d, q_out_ptr + t * so_t, so_h, 1, cos, sin, mscale, HQ,
                HALF, BLOCK_HQ, BLOCK_HALF, INTERLEAVED, q_ptr.dtype.element_ty)

    slot = tl.load(slot_ptr + t).to(tl.int64)
    store = slot >= 0
    # Slot -1 (K/V already cached): zero heads to store; page/offset 0 keep the masked addresses in range.
    n_kv = tl.where(store, HKV, 0)
    page = tl.where(store, slot // page_size, 0)
    offset = tl.where(store, slot % page_size, 0)
    k_dst = k_cache_ptr + page * skc_p + offset * skc_s
    _rope_heads(k_ptr + t * sk_t, sk_h, sk_d, k_dst, skc_h, skc_d, cos, sin, mscale, n_kv,
                HALF, BLOCK_HKV, BLOCK_HALF, INTERLEAVED, k_ptr.dtype.element_ty)

    h = tl.arange(0, BLOCK_HKV)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    v_mask = (h < n_kv) & (d < HEAD_DIM)
    v = tl.load(v_ptr + t * sv_t + h.to(tl.int64) * sv_h + d * sv_d, mask=v_mask, other=0.0)
    v_dst = v_cache_ptr + page * svc_p + offset * svc_s + h.to(tl.int64) * svc_h + d * svc_d
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=v_mask)


def _check_cache(name: str, cache: torch.Tensor, heads: int, head_dim: int) -> None:
    if cache.dim() != 4 or cache.shape[2] != heads or cache.shape[3] != head_dim:
        want = f"[num_pages, page_size, {heads}, {head_dim}]"
        raise ValueError(f"{name} must be {want} to match k/v, got {tuple(cache.shape)}")


def rope_write_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: RopeTables,
) -> torch.Tensor:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] at positions [T]; store k, v at slot_mapping [T]; return q.

    Equals `apply_rope(q)`, `apply_rope(k)` then `reference.write_kv(...)`. q, k, v and the caches may be
    strided views (e.g. slices of a fused qkv projection, one layer of the pool). Slots of -1 are not
    stored. Positions must lie in [0, tables.max_position): the engine checks lengths at admission, so no
    host sync is spent on it here. The returned q is a new contiguous tensor of q's dtype.
    """
    t, hq, dim = q.shape
    hkv = k.shape[1]
    if k.shape != (t, hkv, dim) or v.shape != k.shape:
        raise ValueError(f"k and v must be [{t}, Hkv, {dim}], got {tuple(k.shape)} and {tuple(v.shape)}")
    if positions.shape != (t,) or slot_mapping.shape != (t,):
        raise ValueError(f"positions and slot_mapping must be [{t}]")
    _check_cache("k_cache", k_cache, hkv, dim)
    _check_cache("v_cache", v_cache, hkv, dim)
    if tables.cos.shape[1] * 2 != dim:
        raise ValueError(f"RoPE tables are for head_dim {tables.cos.shape[1] * 2}, q has {dim}")
    q_out = torch.empty((t, hq, dim), dtype=q.dtype, device=q.device)
    if t == 0:
        return q_out
    half = dim // 2
    _rope_write_kv_kernel[(t,)](
        q, k, v, q_out, positions, slot_mapping, k_cache, v_cache, tables.cos, tables.sin,
        *q.stride(), *k.stride(), *v.stride(), q_out.stride(0), q_out.stride(1),
        *k_cache.stride(), *v_cache.stride(),
        tables.cos.stride(0), float(tables.mscale), k_cache.shape[1],
        HQ=hq, HKV=hkv, HEAD_DIM=dim, HALF=half,
        BLOCK_HQ=triton.next_power_of_2(hq), BLOCK_HKV=triton.next_power_of_2(hkv),
        BLOCK_HALF=triton.next_power_of_2(half), BLOCK_D=triton.next_power_of_2(dim),
        INTERLEAVED=tables.interleaved,
        num_warps=4,
    )
    return q_out


@triton.jit
def _copy_rotate_kernel(
    kv_ptr, src_ptr, dst_ptr, delta_ptr, cos_ptr, sin_ptr,
    s_layer, s_kv, s_page, s_slot, s_head, s_d, s_tab,
    ROWS: tl.constexpr, HKV: tl.constexpr, HEAD_DIM: tl.constexpr, HALF: tl.constexpr,
    BLOCKS_PER_PAGE: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_D: tl.constexpr, INTERLEAVED: tl.constexpr,
):
    # A "row" is one (slot, head) vector of HEAD_DIM channels; a page holds ROWS = page_size * Hkv rows.
    pid = tl.program_id(0)
    i = pid // BLOCKS_PER_PAGE
    rows = (pid % BLOCKS_PER_PAGE) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    layer = tl.program_id(1).to(tl.int64)
    src = tl.load(src_ptr + i).to(tl.int64)
    dst = tl.load(dst_ptr + i).to(tl.int64)
    delta = tl.load(delta_ptr + i).to(tl.int64)
    row_ok = rows < ROWS
    row_off = ((rows // HKV).to(tl.int64) * s_slot + (rows % HKV).to(tl.int64) * s_head)[:, None]
    k_src = kv_ptr + layer * s_layer + src * s_page + row_off
    k_dst = kv_ptr + layer * s_layer + dst * s_page + row_off

    # K: pure rotation by delta (no magnitude factor: the cached keys already carry it).
    first, second, pair_ok = _pair_offsets(BLOCK_HALF, HALF, INTERLEAVED)
    j = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cos_ptr + delta * s_tab + j, mask=j < HALF, other=1.0)[None, :]
    sin = tl.load(sin_ptr + delta * s_tab + j, mask=j < HALF, other=0.0)[None, :]
    mask = row_ok[:, None] & pair_ok[None, :]
    a = tl.load(k_src + first[None, :] * s_d, mask=mask, other=0.0)
    b = tl.load(k_src + second[None, :] * s_d, mask=mask, other=0.0)
    ra, rb = _rotate(a, b, cos, sin)
    tl.store(k_dst + first[None, :] * s_d, ra.to(kv_ptr.dtype.element_ty), mask=mask)
    tl.store(k_dst + second[None, :] * s_d, rb.to(kv_ptr.dtype.element_ty), mask=mask)

    # V: a straight copy of the same rows.
    d = tl.arange(0, BLOCK_D)[None, :]
    v_mask = row_ok[:, None] & (d < HEAD_DIM)
    v = tl.load(k_src + s_kv + d * s_d, mask=v_mask)
    tl.store(k_dst + s_kv + d * s_d, v, mask=v_mask)


# Rows of one program: 64 rows x 128 channels x 2 bytes = 16 KiB of K and 16 KiB of V per program, enough
# bytes in flight per SM with a few programs resident, and thousands of programs for a handful of pages.
_COPY_BLOCK_ROWS = 64


def copy_rotate(
    kv: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, deltas: torch.Tensor, tables: RopeTables
) -> None:
    """Block-Attention's private copy, every layer in one launch: K[dst] = R_delta K[src], V[dst] = V[src].

    kv is the whole pool [layers, 2, num_pages, page_size, Hkv, D]; src, dst, deltas are [n] (int) per
    page. Equals `reference.copy_rotate` provided no dst page is another entry's src (the kernel streams
    page by page; the reference gathers everything first). dst == src (rotating in place) is fine.
    """
    if kv.dim() != 6 or kv.shape[1] != 2:
        raise ValueError(f"kv must be the pool [layers, 2, pages, page_size, Hkv, D], got {tuple(kv.shape)}")
    n = src.numel()
    if dst.numel() != n or deltas.numel() != n:
        raise ValueError("src, dst and deltas must have one element per page")
    layers, _, _, page_size, hkv, dim = kv.shape
    if tables.cos.shape[1] * 2 != dim:
        raise ValueError(f"RoPE tables are for head_dim {tables.cos.shape[1] * 2}, the pool has {dim}")
    if n == 0 or layers == 0:
        return
    rows = page_size * hkv
    block_rows = min(_COPY_BLOCK_ROWS, triton.next_power_of_2(rows))
    blocks_per_page = triton.cdiv(rows, block_rows)
    s_layer, s_kv, s_page, s_slot, s_head, s_d = kv.stride()
    _copy_rotate_kernel[(n * blocks_per_page, layers)](
        kv, src, dst, deltas, tables.cos, tables.sin,
        s_layer, s_kv, s_page, s_slot, s_head, s_d, tables.cos.stride(0),
        ROWS=rows, HKV=hkv, HEAD_DIM=dim, HALF=dim // 2,
        BLOCKS_PER_PAGE=blocks_per_page, BLOCK_ROWS=block_rows,
        BLOCK_HALF=triton.next_power_of_2(dim // 2), BLOCK_D=triton.next_power_of_2(dim),
        INTERLEAVED=tables.interleaved,
        num_warps=4,
    )
