"""Triton kernels that move KV into and around the page pool.

- `rope_write_kv`: the per-layer step before attention. Rotates q and k at their own positions (R_p times
  the magnitude factor, rope.apply_rope), stores rotated k and raw v at their cache slots, returns rotated q.
  One launch instead of three (rope q, rope k, scatter): every byte is read once and written once.
  `rope_write_kv_runs` also writes the copies of q that short prefill calls take rotated up front, one per
  run of equal delta (kernels/prefill.py, "Where delta is applied"): the same copies as prefill's
  _rotate_runs_kernel, bit for bit (the same rounded q, the same fp32 expression), without its launch.
- `copy_rotate`: Block-Attention's private copy for `block` mode (docs/design.md): K[dst] = R_delta K[src],
  V[dst] = V[src] for every layer in one launch. It is the baseline lazy mode is measured against, so it
  is built to run at copy bandwidth: one program per (page, row block, layer), 16-byte loads along D.

Both gather cos/sin rows from the fp32 RopeTables (never a bf16 table, see rope.py) and do the rotation in
fp32, rounding once at the store. The pairing of channels (half-split or interleaved, rope.py) is a
compile-time choice; either way the rows are read with contiguous vector loads (_load_pairs).

All offsets are int64: pools of tens of GiB overflow int32 element offsets.

FP8 pages (docs/design.md, "FP8 KV cache"): every value stored into the pool goes through `to_cache`, which rounds to
e4m3 in fp32 arithmetic (saturating at ±448, nearest even) before the conversion, so that the conversion only meets
values it represents exactly. The Triton interpreter's own fp32 -> fp8 conversion rounds wrongly (31.2 -> 16, seen
with triton 3.9); the GPU's (cvt.rn.satfinite) gives the same bytes as `to_cache`. kernels/kv_dtype.py `quantize`
is the same rule in PyTorch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lazyattn.kernels.launch import pdl_options, wait_for_producers
from lazyattn.kernels.page_scan import BLOCK_B, BLOCK_P, entry_of_row, pick, run_deltas, run_starts
from lazyattn.kernels.paged import PagedBatch, cdiv
from lazyattn.kernels.rope import RopeTables

# rope_write_kv_runs launches a program per (token, run copy) up to this many tokens, and one per token, writing
# every copy, beyond: on an H100 the engine's RAG question (32 tokens) is faster with a program per copy, while 256
# tokens (RAG at batch 8) are slower with 2304 programs each scanning its entry's pages (docs/benchmarks.md,
# "Kernel constants").
_COPY_PROGRAMS_MAX_TOKENS = 64


@triton.jit
def to_cache(x, TY: tl.constexpr):
    """x rounded to the pool's dtype TY. FP8 (e4m3fn): saturated to ±448, then rounded to nearest even on its grid
    in fp32 (a power-of-two ulp from x's exponent, at least 2^-9 below the normal range; the add-and-subtract of
    1.5 * 2^23 rounds x / ulp, at most 16 here, to an integer, ties to even), then converted exactly."""
    if TY == tl.float8e4nv:  # noqa: SIM300 (TY is the argument, a compile-time dtype)
        x = tl.minimum(tl.maximum(x.to(tl.float32), -448.0), 448.0)
        e = tl.maximum(((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)  # x's exponent; -6 for subnormals
        ulp = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)  # 2^(e-3): three mantissa bits
        inv_ulp = ((127 - e + 3) << 23).to(tl.float32, bitcast=True)
        x = ((x * inv_ulp + 12582912.0) - 12582912.0) * ulp
    return x.to(TY)


@triton.jit
def _load_pairs(rows, s_d, row_ok, BLOCK_HALF: tl.constexpr, HALF: tl.constexpr, INTERLEAVED: tl.constexpr):
    """The two members (a, b) [R, BLOCK_HALF] of each rotation pair of rows [R, 1] (pointers to channel 0).

    Half-split pairs are two contiguous half rows. Interleaved rows are loaded whole, contiguously, and
    de-interleaved in registers (reshape + split), so both pairings get full-width vector loads.
    """
    if INTERLEAVED:
        d = tl.arange(0, 2 * BLOCK_HALF)[None, :]
        x = tl.load(rows + d * s_d, mask=row_ok & (d < 2 * HALF), other=0.0)
        a, b = tl.split(tl.reshape(x, [x.shape[0], BLOCK_HALF, 2]))
    else:
        j = tl.arange(0, BLOCK_HALF)[None, :]
        a = tl.load(rows + j * s_d, mask=row_ok & (j < HALF), other=0.0)
        b = tl.load(rows + (j + HALF) * s_d, mask=row_ok & (j < HALF), other=0.0)
    return a, b


@triton.jit
def _store_pairs(rows, s_d, row_ok, a, b, BLOCK_HALF: tl.constexpr, HALF: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Inverse of _load_pairs."""
    if INTERLEAVED:
        d = tl.arange(0, 2 * BLOCK_HALF)[None, :]
        x = tl.reshape(tl.join(a, b), [a.shape[0], 2 * BLOCK_HALF])
        tl.store(rows + d * s_d, x, mask=row_ok & (d < 2 * HALF))
    else:
        j = tl.arange(0, BLOCK_HALF)[None, :]
        tl.store(rows + j * s_d, a, mask=row_ok & (j < HALF))
        tl.store(rows + (j + HALF) * s_d, b, mask=row_ok & (j < HALF))


@triton.jit
def _rotate(a, b, cos, sin):
    """(a, b) rotated by the angle whose cos/sin are given, in fp32; same expression as rope.rotate."""
    a = a.to(tl.float32)
    b = b.to(tl.float32)
    return a * cos - b * sin, b * cos + a * sin


@triton.jit
def _rope_pairs(
    src,
    s_h,
    s_d,
    cos,
    sin,
    mscale,
    n_heads,
    OUT_TY: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ROUND_TY: tl.constexpr,
):
    """The rotation pairs of n_heads heads of one token (strided src rows), rotated and rounded to ROUND_TY then
    OUT_TY.

    The double rounding is apply_rope's (to the input dtype) followed by the cache write's (to the cache
    dtype): the reference rounds twice when k's dtype differs from the cache's, and so must we.
    """
    h = tl.arange(0, BLOCK_H)[:, None]
    a, b = _load_pairs(src + h.to(tl.int64) * s_h, s_d, h < n_heads, BLOCK_HALF, HALF, INTERLEAVED)
    ra, rb = _rotate(a, b, cos[None, :], sin[None, :])
    ra = to_cache((ra * mscale).to(ROUND_TY), OUT_TY)
    rb = to_cache((rb * mscale).to(ROUND_TY), OUT_TY)
    return ra, rb


@triton.jit
def _rope_heads(
    src,
    s_h,
    s_d,
    dst,
    d_h,
    d_d,
    cos,
    sin,
    mscale,
    n_heads,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ROUND_TY: tl.constexpr,
):
    """Rotate n_heads heads of one token (strided src rows) into dst rows (_rope_pairs, then stored)."""
    h = tl.arange(0, BLOCK_H)[:, None]
    ra, rb = _rope_pairs(
        src, s_h, s_d, cos, sin, mscale, n_heads, dst.dtype.element_ty, HALF, BLOCK_H, BLOCK_HALF, INTERLEAVED, ROUND_TY
    )
    _store_pairs(dst + h.to(tl.int64) * d_h, d_d, h < n_heads, ra, rb, BLOCK_HALF, HALF, INTERLEAVED)
    return ra, rb


@triton.jit
def _run_delta(deltas_row, n_pages, run, BLOCK_P: tl.constexpr):
    """Delta of run `run` of an entry's pages (runs counted from its first page, as page_scan.run_deltas counts
    them), 0 past its last run: one vector scan, no [runs, pages] table."""
    first = n_pages
    seen = 0
    for lo in range(0, n_pages, BLOCK_P):
        i = lo + tl.arange(0, BLOCK_P)
        new_run = run_starts(deltas_row, i, n_pages)
        index = seen + tl.cumsum(new_run.to(tl.int32), 0) - 1
        first = tl.minimum(first, tl.min(tl.where(new_run & (index == run), i, n_pages), axis=0))
        seen += tl.sum(new_run.to(tl.int32), axis=0)
    return tl.load(deltas_row + first, mask=first < n_pages, other=0)


@triton.jit
def _write_run_copy(
    q_src,
    sq_h,
    sq_d,
    cos,
    sin,
    mscale,
    t,
    run,
    cu_ptr,
    deltas_ptr,
    num_pages_ptr,
    cos_ptr,
    sin_ptr,
    q_rot_ptr,
    batch_size,
    total_q,
    s_table,
    s_tab,
    max_position,
    HQ: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """q_rot[run, t] = token t's q (q_src rows) rotated at its position (cos/sin) and rounded as rope_write_kv
    stores it, then rotated by -delta of run `run` of its entry, if that delta is nonzero; nothing is read
    otherwise (prefill._rotate_runs_kernel's copies, same expression as prefill_tiles.derotated_q:
    a' = a c + b s, b' = b c - a s)."""
    entry = entry_of_row(cu_ptr, batch_size, t, BLOCK_B)
    deltas_row = deltas_ptr + entry.to(tl.int64) * s_table
    delta = _run_delta(deltas_row, tl.load(num_pages_ptr + entry), run, BLOCK_P)
    if delta != 0:
        ty = q_rot_ptr.dtype.element_ty
        a, b = _rope_pairs(
            q_src, sq_h, sq_d, cos, sin, mscale, HQ, ty, HALF, BLOCK_HQ, BLOCK_HALF, INTERLEAVED, q_src.dtype.element_ty
        )
        _store_derotated(
            a.to(tl.float32),
            b.to(tl.float32),
            delta,
            run,
            t,
            cos_ptr,
            sin_ptr,
            q_rot_ptr,
            total_q,
            s_tab,
            max_position,
            HQ,
            HEAD_DIM,
            HALF,
            BLOCK_HQ,
            BLOCK_HALF,
            INTERLEAVED,
        )


@triton.jit
def _store_derotated(
    a,
    b,
    delta,
    run,
    t,
    cos_ptr,
    sin_ptr,
    q_rot_ptr,
    total_q,
    s_tab,
    max_position,
    HQ: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    INTERLEAVED: tl.constexpr,
):
    """q_rot[run, t] = the fp32 q pairs (a, b) rotated by -delta (same expression as prefill_tiles.derotated_q:
    a' = a c + b s, b' = b c - a s), rounded to q_rot's dtype."""
    h = tl.arange(0, BLOCK_HQ)[:, None]
    j = tl.arange(0, BLOCK_HALF)
    # A delta beyond the table is a caller bug (wrong result); clamping keeps the read in bounds.
    row = tl.minimum(delta, max_position - 1).to(tl.int64) * s_tab
    cos = tl.load(cos_ptr + row + j, mask=j < HALF, other=1.0)[None, :]
    sin = tl.load(sin_ptr + row + j, mask=j < HALF, other=0.0)[None, :]
    ra = a * cos + b * sin
    rb = b * cos + a * -sin
    dst = q_rot_ptr + ((run * total_q + t) * HQ + h.to(tl.int64)) * HEAD_DIM
    ty = q_rot_ptr.dtype.element_ty
    _store_pairs(dst, 1, h < HQ, ra.to(ty), rb.to(ty), BLOCK_HALF, HALF, INTERLEAVED)


@triton.jit
def _write_run_copies(
    a,
    b,
    t,
    cu_ptr,
    deltas_ptr,
    num_pages_ptr,
    cos_ptr,
    sin_ptr,
    q_rot_ptr,
    batch_size,
    total_q,
    s_table,
    s_tab,
    max_position,
    HQ: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    RUNS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """q_rot[r, t] = the rotated q pairs (a, b) of token t rotated by -delta of run r of its entry, for the
    runs of nonzero delta among its first RUNS (prefill._rotate_runs_kernel's copies, same expression as
    prefill_tiles.derotated_q: a' = a c + b s, b' = b c - a s)."""
    entry = entry_of_row(cu_ptr, batch_size, t, BLOCK_B)
    deltas_row = deltas_ptr + entry.to(tl.int64) * s_table
    deltas_of_runs = run_deltas(deltas_row, tl.load(num_pages_ptr + entry), BLOCK_R, BLOCK_P)
    a = a.to(tl.float32)
    b = b.to(tl.float32)
    for r in tl.static_range(RUNS):
        delta = pick(deltas_of_runs, r, BLOCK_R)
        if delta != 0:
            _store_derotated(
                a,
                b,
                delta,
                r,
                t,
                cos_ptr,
                sin_ptr,
                q_rot_ptr,
                total_q,
                s_tab,
                max_position,
                HQ,
                HEAD_DIM,
                HALF,
                BLOCK_HQ,
                BLOCK_HALF,
                INTERLEAVED,
            )


@triton.jit(do_not_specialize=["batch_size", "total_q", "max_position"])
def _rope_write_kv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    q_out_ptr,
    pos_ptr,
    slot_ptr,
    k_cache_ptr,
    v_cache_ptr,
    cos_ptr,
    sin_ptr,
    sq_t,
    sq_h,
    sq_d,
    sk_t,
    sk_h,
    sk_d,
    sv_t,
    sv_h,
    sv_d,
    so_t,
    so_h,
    skc_p,
    skc_s,
    skc_h,
    skc_d,
    svc_p,
    svc_s,
    svc_h,
    svc_d,
    s_tab,
    mscale,
    page_size,
    cu_ptr,
    deltas_ptr,
    num_pages_ptr,
    q_rot_ptr,
    batch_size,
    total_q,
    s_table,
    max_position,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HKV: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    RUNS: tl.constexpr,
    COPY_PROGRAMS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_P: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # Program (t, 0): all q, k and v heads of token t (a few KiB) in one pass. The per-run copies of
    # rope_write_kv_runs (RUNS > 0) come from q rotated and rounded exactly as program (t, 0) stores it (what
    # prefill would load): with COPY_PROGRAMS, program (t, 1 + r) writes copy r, so that a launch of a few tokens
    # writes its copies in parallel; otherwise program (t, 0) writes them all after its q.
    t = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    wait_for_producers(USE_PDL)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cos_ptr + pos * s_tab + j, mask=j < HALF, other=1.0)
    sin = tl.load(sin_ptr + pos * s_tab + j, mask=j < HALF, other=0.0)
    if COPY_PROGRAMS:  # noqa: SIM102 - a compile-time branch around a runtime one
        if part > 0:
            _write_run_copy(
                q_ptr + t * sq_t,
                sq_h,
                sq_d,
                cos,
                sin,
                mscale,
                t,
                part - 1,
                cu_ptr,
                deltas_ptr,
                num_pages_ptr,
                cos_ptr,
                sin_ptr,
                q_rot_ptr,
                batch_size,
                total_q,
                s_table,
                s_tab,
                max_position,
                HQ,
                HEAD_DIM,
                HALF,
                BLOCK_HQ,
                BLOCK_HALF,
                INTERLEAVED,
                BLOCK_B,
                BLOCK_P,
            )
            return

    qa, qb = _rope_heads(
        q_ptr + t * sq_t,
        sq_h,
        sq_d,
        q_out_ptr + t * so_t,
        so_h,
        1,
        cos,
        sin,
        mscale,
        HQ,
        HALF,
        BLOCK_HQ,
        BLOCK_HALF,
        INTERLEAVED,
        q_ptr.dtype.element_ty,
    )
    if RUNS > 0 and not COPY_PROGRAMS:
        _write_run_copies(
            qa,
            qb,
            t,
            cu_ptr,
            deltas_ptr,
            num_pages_ptr,
            cos_ptr,
            sin_ptr,
            q_rot_ptr,
            batch_size,
            total_q,
            s_table,
            s_tab,
            max_position,
            HQ,
            HEAD_DIM,
            HALF,
            BLOCK_HQ,
            BLOCK_HALF,
            INTERLEAVED,
            RUNS,
            BLOCK_R,
            BLOCK_B,
            BLOCK_P,
        )

    slot = tl.load(slot_ptr + t).to(tl.int64)
    store = slot >= 0
    # Slot -1 (K/V already cached): zero heads to store; page/offset 0 keep the masked addresses in range.
    n_kv = tl.where(store, HKV, 0)
    page = tl.where(store, slot // page_size, 0)
    offset = tl.where(store, slot % page_size, 0)
    k_dst = k_cache_ptr + page * skc_p + offset * skc_s
    _rope_heads(
        k_ptr + t * sk_t,
        sk_h,
        sk_d,
        k_dst,
        skc_h,
        skc_d,
        cos,
        sin,
        mscale,
        n_kv,
        HALF,
        BLOCK_HKV,
        BLOCK_HALF,
        INTERLEAVED,
        k_ptr.dtype.element_ty,
    )

    h = tl.arange(0, BLOCK_HKV)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    v_mask = (h < n_kv) & (d < HEAD_DIM)
    v = tl.load(v_ptr + t * sv_t + h.to(tl.int64) * sv_h + d * sv_d, mask=v_mask, other=0.0)
    v_dst = v_cache_ptr + page * svc_p + offset * svc_s + h.to(tl.int64) * svc_h + d * svc_d
    tl.store(v_dst, to_cache(v, v_cache_ptr.dtype.element_ty), mask=v_mask)


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
    return _launch(q, k, v, positions, slot_mapping, k_cache, v_cache, tables, None, 0)[0]


def rope_write_kv_runs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: RopeTables,
    batch: PagedBatch,
    runs: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """rope_write_kv, plus the copies of q rotated per run that prefill_attention takes as `rotated_q`.

    Returns (q, q_rot): q_rot [runs, T, Hq, D] holds in copy r each row of rotated q rotated again by -delta
    of run r of its entry in `batch` (the attention launch's PagedBatch, whose packing q follows); copies of
    delta-0 runs and of runs an entry does not have are left unwritten (prefill reads q there).
    """
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    return _launch(q, k, v, positions, slot_mapping, k_cache, v_cache, tables, batch, runs)


def _launch(
    q, k, v, positions, slot_mapping, k_cache, v_cache, tables: RopeTables, batch: PagedBatch | None, runs: int
) -> tuple[torch.Tensor, torch.Tensor]:
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
    q_rot = torch.empty((runs, t, hq, dim), dtype=q.dtype, device=q.device) if runs else q_out
    if t == 0:
        return q_out, q_rot
    positions, slot_mapping = positions.contiguous(), slot_mapping.contiguous()  # indexed as flat arrays
    if batch is None:  # placeholders, compiled out with RUNS=0
        cu, deltas, num_pages, batch_size, s_table = positions, positions, positions, 0, 0
    else:
        if batch.deltas.stride(1) != 1:
            raise ValueError("PagedBatch deltas must be contiguous along pages")
        cu, deltas, num_pages = batch.cu_seqlens_q, batch.deltas, batch.num_pages
        batch_size, s_table = batch.batch_size, batch.deltas.stride(0)
    half = dim // 2
    copy_programs = runs > 0 and t <= _COPY_PROGRAMS_MAX_TOKENS
    _rope_write_kv_kernel[(t, 1 + runs if copy_programs else 1)](
        q,
        k,
        v,
        q_out,
        positions,
        slot_mapping,
        k_cache,
        v_cache,
        tables.cos,
        tables.sin,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        q_out.stride(0),
        q_out.stride(1),
        *k_cache.stride(),
        *v_cache.stride(),
        tables.cos.stride(0),
        float(tables.mscale),
        k_cache.shape[1],
        cu,
        deltas,
        num_pages,
        q_rot,
        batch_size,
        t,
        s_table,
        tables.cos.shape[0],
        HQ=hq,
        HKV=hkv,
        HEAD_DIM=dim,
        HALF=half,
        BLOCK_HQ=triton.next_power_of_2(hq),
        BLOCK_HKV=triton.next_power_of_2(hkv),
        BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_D=triton.next_power_of_2(dim),
        INTERLEAVED=tables.interleaved,
        RUNS=runs,
        COPY_PROGRAMS=copy_programs,
        BLOCK_R=triton.next_power_of_2(max(runs, 1)),
        BLOCK_B=BLOCK_B,
        BLOCK_P=BLOCK_P,
        num_warps=4,
        **pdl_options(q.device, "rope"),
    )
    return q_out, q_rot


@triton.jit
def _copy_rotate_kernel(
    kv_ptr,
    src_ptr,
    dst_ptr,
    delta_ptr,
    cos_ptr,
    sin_ptr,
    s_layer,
    s_kv,
    s_page,
    s_slot,
    s_head,
    s_d,
    s_tab,
    ROWS: tl.constexpr,
    HKV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCKS_PER_PAGE: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INTERLEAVED: tl.constexpr,
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

    # Both loads are issued before any store (the compiler cannot reorder them across a possibly aliasing
    # store): K and V tiles in flight together.
    a, b = _load_pairs(k_src, s_d, row_ok[:, None], BLOCK_HALF, HALF, INTERLEAVED)
    d = tl.arange(0, BLOCK_D)[None, :]
    v_mask = row_ok[:, None] & (d < HEAD_DIM)
    v = tl.load(k_src + s_kv + d * s_d, mask=v_mask)

    # K: pure rotation by delta (no magnitude factor: the cached keys already carry it). V: a copy.
    j = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cos_ptr + delta * s_tab + j, mask=j < HALF, other=1.0)[None, :]
    sin = tl.load(sin_ptr + delta * s_tab + j, mask=j < HALF, other=0.0)[None, :]
    ra, rb = _rotate(a, b, cos, sin)
    ty = kv_ptr.dtype.element_ty
    _store_pairs(k_dst, s_d, row_ok[:, None], to_cache(ra, ty), to_cache(rb, ty), BLOCK_HALF, HALF, INTERLEAVED)
    tl.store(k_dst + s_kv + d * s_d, v, mask=v_mask)


def copy_rotate(
    kv: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    deltas: torch.Tensor,
    tables: RopeTables,
    *,
    block_rows: int = 64,
    num_warps: int = 4,
) -> None:
    """Block-Attention's private copy, every layer in one launch: K[dst] = R_delta K[src], V[dst] = V[src].

    kv is the whole pool [layers, 2, num_pages, page_size, Hkv, D]; src, dst, deltas are [n] (int) per
    page. Equals `reference.copy_rotate` provided no dst page is another entry's src (the kernel streams
    page by page; the reference gathers everything first). dst == src (rotating in place) is fine.

    block_rows/num_warps are launch knobs, swept by `python -m benchmarks.kernels`. Default: 64 rows x 128 channels
    x 2 bytes = 16 KiB of K plus 16 KiB of V in flight per program (136 registers/thread, no spills on
    sm_90: 3 programs, ~96 KiB in flight per SM), thousands of programs for a handful of pages.
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
    src, dst, deltas = src.contiguous(), dst.contiguous(), deltas.contiguous()  # indexed as flat arrays
    rows = page_size * hkv
    block_rows = min(triton.next_power_of_2(block_rows), triton.next_power_of_2(rows))
    blocks_per_page = cdiv(rows, block_rows)
    s_layer, s_kv, s_page, s_slot, s_head, s_d = kv.stride()
    _copy_rotate_kernel[(n * blocks_per_page, layers)](
        kv,
        src,
        dst,
        deltas,
        tables.cos,
        tables.sin,
        s_layer,
        s_kv,
        s_page,
        s_slot,
        s_head,
        s_d,
        tables.cos.stride(0),
        ROWS=rows,
        HKV=hkv,
        HEAD_DIM=dim,
        HALF=dim // 2,
        BLOCKS_PER_PAGE=blocks_per_page,
        BLOCK_ROWS=block_rows,
        BLOCK_HALF=triton.next_power_of_2(dim // 2),
        BLOCK_D=triton.next_power_of_2(dim),
        INTERLEAVED=tables.interleaved,
        num_warps=num_warps,
    )
