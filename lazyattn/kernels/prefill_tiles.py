"""The bodies of the prefill kernel (kernels/prefill.py, whose module docstring holds the math and the design):
the FlashAttention-2 tile loop over a page range (`attend_pages`), and the two ways a program finds the chunks of
one delta it walks, each chunk with its Q tile rotated once: from scans of the entry's deltas (`kernel_chunks`)
or from the host's plan (`planned_chunks`, kernels/prefill_plan.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

from lazyattn.kernels.page_scan import chunk_bounds, count_runs, pick


@triton.jit
def derotated_q(
    q_rows, row_ok, cos_ptr, sin_ptr, delta, max_position, HEAD_DIM: tl.constexpr, INTERLEAVED: tl.constexpr
):
    """The Q tile rotated by -delta (fp32 math, returned in Q's dtype). q_rows: [BLOCK_M] row pointers."""
    HALF: tl.constexpr = HEAD_DIM // 2
    dims = tl.arange(0, HEAD_DIM)
    if INTERLEAVED:
        pair = dims // 2
        partner = dims ^ 1
        leading = (dims % 2) == 0
    else:
        pair = dims % HALF
        partner = dims ^ HALF
        leading = dims < HALF
    mask = row_ok[:, None]
    q = tl.load(q_rows[:, None] + dims[None, :], mask=mask, other=0.0)
    q_partner = tl.load(q_rows[:, None] + partner[None, :], mask=mask, other=0.0)
    # A delta beyond the table is a caller bug (wrong result); clamping keeps the read in bounds.
    row = tl.minimum(delta, max_position - 1).to(tl.int64) * HALF
    cos = tl.load(cos_ptr + row + pair)
    sin = tl.load(sin_ptr + row + pair)
    # R_{-delta}: a' = a c + b s (leading member), b' = b c - a s (trailing member).
    sin = tl.where(leading, sin, -sin)
    rotated = q.to(tl.float32) * cos[None, :] + q_partner.to(tl.float32) * sin[None, :]
    return rotated.to(q.dtype)


@triton.jit
def load_q_tile(q_src, scratch_rows, row_ok, k_head, HEAD_DIM: tl.constexpr):
    """The Q tile [BLOCK_M, HEAD_DIM] the products take, from q_src (rows of Q's dtype: q, a copy rotated up front,
    or the scratch rows `_chunk_q_src` rotated it into).

    Over pages of Q's dtype, the tile as loaded. Over FP8 pages under a 16-bit q the products run in float16
    (kv_dtype.fp8_tile_dtype): the K/V tiles widen to it exactly, in one conversion per pair of values (to bfloat16
    they go through fp32, and FP8 pages took 1.5-1.7x bf16 pages' time: docs/benchmarks.md, "Kernel constants"),
    and the Q tile is rounded to it. It gets there through the scratch rows, written as float16 and loaded back: a
    loaded tile is what triton keeps in shared memory for the Q·Kᵀ wgmma; converted in registers it is reloaded
    from shared memory on every tile (`_chunk_q_src`). The barriers order the scratch for the whole CTA. Float16
    pages under a bfloat16 q (FP8 pages widened before the kernel, prefill.widened_pages) take the same path: the
    same tiles and products as their FP8 pages'."""
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_src[:, None] + dims[None, :], mask=row_ok[:, None], other=0.0)
    if k_head.dtype.element_ty != q.dtype and q.dtype != tl.float32:
        tile_rows = scratch_rows.to(tl.pointer_type(tl.float16), bitcast=True)
        tl.debug_barrier()
        tl.store(tile_rows[:, None] + dims[None, :], q.to(tl.float16), mask=row_ok[:, None])
        tl.debug_barrier()
        q = tl.load(tile_rows[:, None] + dims[None, :], mask=row_ok[:, None], other=0.0)
    return q


@triton.jit
def _dot(a, b, acc, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # UPCAST: the triton 3.9 interpreter multiplies bf16 as raw uint16 bits; exact products in fp32 instead.
    if UPCAST:
        a, b = a.to(tl.float32), b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=DOT_PRECISION)


@triton.jit
def _tile_meta(
    pages_row,
    valid_row,
    starts_row,
    firsts_row,
    t,
    n_tiles,
    page_lo,
    page_hi,
    q_first,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_FIRST: tl.constexpr,
):
    """Where tile t of the page range [page_lo, page_hi) lives: (page0, page1, slot_lo, lo0, n0, lo1, n1, pos0,
    masked).

    A tile is the slots [slot_lo, slot_lo + BLOCK_N) of page0 (BLOCK_N <= PAGE_SIZE), or the whole pages
    page0 and page1 (BLOCK_N = 2 * PAGE_SIZE; page1 holds keys only inside the range). Keys sit in the tile's
    slots [lo0, n0) counted from slot_lo (page0), and in page1's slots [lo1, n1); lo0 and lo1 are the pages'
    first-slot offsets (0 without HAS_FIRST). pos0: logical position of the tile's first slot (of slot 0 of
    page0 for two-page tiles); masked: the tile holds padding or skipped slots or crosses the block's causal
    diagonal (first query position q_first), so scores need the mask. Past the last tile every tile reads as
    empty."""
    live = t < n_tiles
    if BLOCK_N <= PAGE_SIZE:
        TILES_PER_PAGE: tl.constexpr = PAGE_SIZE // BLOCK_N
        p = page_lo + t // TILES_PER_PAGE
        slot_lo = (t % TILES_PER_PAGE) * BLOCK_N
        page0 = tl.load(pages_row + p, mask=live, other=0)
        if HAS_FIRST:  # noqa: SIM108 - a compile-time branch
            first0 = tl.load(firsts_row + p, mask=live, other=0)
        else:
            first0 = 0 * t
        n0 = first0 + tl.load(valid_row + p, mask=live, other=0) - slot_lo
        lo0 = first0 - slot_lo
        pos0 = tl.load(starts_row + p, mask=live, other=0) - first0 + slot_lo
        page1 = page0
        lo1 = lo0
        n1 = n0
        full = (n0 >= BLOCK_N) & (lo0 <= 0)
    else:
        p = page_lo + 2 * t
        second = live & (p + 1 < page_hi)
        slot_lo = 0 * t
        page0 = tl.load(pages_row + p, mask=live, other=0)
        if HAS_FIRST:
            lo0 = tl.load(firsts_row + p, mask=live, other=0)
            lo1 = tl.load(firsts_row + p + 1, mask=second, other=0)
        else:
            lo0 = 0 * t
            lo1 = 0 * t
        n0 = lo0 + tl.load(valid_row + p, mask=live, other=0)
        pos0 = tl.load(starts_row + p, mask=live, other=0) - lo0
        page1 = tl.load(pages_row + p + 1, mask=second, other=0)
        n1 = lo1 + tl.load(valid_row + p + 1, mask=second, other=0)
        full = (n0 == PAGE_SIZE) & (n1 == PAGE_SIZE) & (lo0 == 0) & (lo1 == 0)
    masked = (not full) | (pos0 + BLOCK_N - 1 > q_first)
    return page0, page1, slot_lo, lo0, n0, lo1, n1, pos0, masked


@triton.jit
def attend_pages(
    acc,
    l_i,
    m_i,
    q,
    q_pos,
    q_first,
    k_head,
    v_head,
    pages_row,
    valid_row,
    starts_row,
    firsts_row,
    ape_row,
    ape_gap,
    page_lo,
    page_hi,
    stride_kp,
    stride_ks,
    stride_vp,
    stride_vs,
    stride_vd,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    HAS_FIRST: tl.constexpr,
    HAS_APE: tl.constexpr,
    V_T: tl.constexpr,
):
    """Online-softmax accumulation over the K/V tiles of pages [page_lo, page_hi) (FlashAttention-2).

    The page metadata of tile t + 1 is loaded during tile t and carried in registers. Loaded in the same
    iteration, the page id makes the K/V loads indirect and triton 3.6 pipelines the id as a 4-byte async
    copy with a wait for all copies every tile (2 K/V buffers, under one tile of prefetch: seen in the
    sm_90 TTGIR). Carried, the K/V loads get num_stages buffers, as in a walk over contiguous K/V."""
    n = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    if BLOCK_N <= PAGE_SIZE:  # noqa: SIM108 - a compile-time branch reads clearer in a kernel
        n_tiles = (page_hi - page_lo) * (PAGE_SIZE // BLOCK_N)
    else:
        n_tiles = (page_hi - page_lo + 1) // 2
    page0, page1, slot_lo, lo0, n0, lo1, n1, pos0, masked = _tile_meta(
        pages_row,
        valid_row,
        starts_row,
        firsts_row,
        0,
        n_tiles,
        page_lo,
        page_hi,
        q_first,
        PAGE_SIZE,
        BLOCK_N,
        HAS_FIRST,
    )
    for t in range(0, n_tiles):
        t_page0, t_page1, t_slot_lo, t_n0, t_n1, t_pos0, t_masked = page0, page1, slot_lo, n0, n1, pos0, masked
        t_lo0, t_lo1 = lo0, lo1
        page0, page1, slot_lo, lo0, n0, lo1, n1, pos0, masked = _tile_meta(
            pages_row,
            valid_row,
            starts_row,
            firsts_row,
            t + 1,
            n_tiles,
            page_lo,
            page_hi,
            q_first,
            PAGE_SIZE,
            BLOCK_N,
            HAS_FIRST,
        )
        # int64 page offsets: page * stride overflows int32 on big pools.
        if BLOCK_N <= PAGE_SIZE:
            slot = t_slot_lo + n
            k_rows = k_head + t_page0.to(tl.int64) * stride_kp + slot * stride_ks
            v_rows = v_head + t_page0.to(tl.int64) * stride_vp + slot * stride_vs
            if HAS_FIRST:  # noqa: SIM108 - a compile-time branch
                in_page = (n >= t_lo0) & (n < t_n0)
            else:
                in_page = n < t_n0
            key_pos = t_pos0 + n
        else:
            first = n < PAGE_SIZE
            slot = n % PAGE_SIZE
            page = tl.where(first, t_page0, t_page1).to(tl.int64)
            k_rows = k_head + page * stride_kp + slot * stride_ks
            v_rows = v_head + page * stride_vp + slot * stride_vs
            if HAS_FIRST:  # noqa: SIM108 - a compile-time branch
                in_page = (slot >= tl.where(first, t_lo0, t_lo1)) & (slot < tl.where(first, t_n0, t_n1))
            else:
                in_page = slot < tl.where(first, t_n0, t_n1)
            # page1's slot 0 sits right after page0's last key, shifted back by page1's own offset
            key_pos = tl.where(first, t_pos0, t_pos0 + t_n0 - t_lo1 - PAGE_SIZE) + n
        # Masked loads: slots past `valid` may hold anything (NaN * 0 would poison the P @ V dot). Pages narrower than
        # q (FP8, docs/design.md "FP8 KV cache") are widened to q's dtype, exactly, as they load.
        k = tl.load(k_rows[:, None] + dims[None, :], mask=in_page[:, None], other=0.0).to(q.dtype)
        if V_T:
            # V pages stored transposed (kernels/paged.py): the tile is loaded as [HEAD_DIM, BLOCK_N], contiguous
            # along the slots, and transposed in registers. Unmasked (every slot of a listed page, or of page 0 past
            # the last tile, is in the pool), so the loads stay vector copies; slots outside the keys are zeroed.
            v_t = tl.load(v_rows[None, :] + dims[:, None] * stride_vd)
            v = tl.trans(tl.where(in_page[None, :], v_t.to(q.dtype), 0.0))
        else:
            v = tl.load(v_rows[:, None] + dims[None, :] * stride_vd, mask=in_page[:, None], other=0.0).to(q.dtype)
        qk = _dot(q, tl.trans(k), None, DOT_PRECISION, UPCAST)
        if t_masked:
            visible = in_page[None, :] & (key_pos[None, :] <= q_pos[:, None])
            qk = tl.where(visible, qk, float("-inf"))
        if HAS_APE:
            # The pages' temperature and scale (kernels/paged.py): s / T + ln S, in log2 units. Masked scores
            # stay -inf (1/T > 0). Scalar loads from the entry's row, which stays in L1.
            if BLOCK_N <= PAGE_SIZE:
                ap = page_lo + t // (PAGE_SIZE // BLOCK_N)
                inv_temp = tl.load(ape_row + ap)
                bias = tl.load(ape_row + ape_gap + ap) * 1.4426950408889634
            else:
                ap = page_lo + 2 * t
                second = ap + 1 < page_hi
                in_first = n < PAGE_SIZE
                log_row = ape_row + ape_gap
                inv_temp = tl.where(in_first, tl.load(ape_row + ap), tl.load(ape_row + ap + 1, mask=second, other=1.0))
                bias = tl.where(in_first, tl.load(log_row + ap), tl.load(log_row + ap + 1, mask=second, other=0.0))
                inv_temp = inv_temp[None, :]
                bias = bias[None, :] * 1.4426950408889634
            s = qk * (qk_scale * inv_temp) + bias
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_ref[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(qk, axis=1) * qk_scale)
            # Rows with nothing visible yet keep m = -inf; subtracting 0 instead avoids inf - inf = NaN.
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(qk * qk_scale - m_ref[:, None])
        alpha = tl.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        acc = _dot(p.to(v.dtype), v, acc, DOT_PRECISION, UPCAST)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _chunk_q_src(
    q_rows,
    rot_rows,
    rot_run_stride,
    scratch_rows,
    row_ok,
    Cos,
    Sin,
    delta,
    run,
    max_position,
    HEAD_DIM: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ROTATED_RUNS: tl.constexpr,
):
    """Where a chunk of delta `delta`, in the entry's run `run`, loads its Q tile from: q itself (delta 0), the
    run's copy rotated up front (the first ROTATED_RUNS runs), or the program's scratch rows, which get Q
    rotated here.

    Rotated here, the tile goes through the scratch rows and is loaded back: a loaded Q is what triton keeps in
    shared memory for the QK^T wgmma. Computed in registers, Q stays a register operand, reloaded from shared
    memory on every tile at 255 registers: a slower tile loop (sm_90; docs/benchmarks.md, "Kernel constants").
    The barriers order the scratch for the whole CTA."""
    q_src = q_rows
    if delta != 0:
        if run < ROTATED_RUNS:
            q_src = rot_rows + run * rot_run_stride
        else:
            dims = tl.arange(0, HEAD_DIM)
            q = derotated_q(q_rows, row_ok, Cos, Sin, delta, max_position, HEAD_DIM, INTERLEAVED)
            tl.debug_barrier()
            tl.store(scratch_rows[:, None] + dims[None, :], q, mask=row_ok[:, None])
            tl.debug_barrier()
            q_src = scratch_rows
    return q_src


@triton.jit
def _attend_chunk(
    acc,
    l_i,
    m_i,
    q_rows,
    rot_rows,
    rot_run_stride,
    scratch_rows,
    row_ok,
    q_pos,
    q_first,
    Cos,
    Sin,
    max_position,
    k_head,
    v_head,
    pages,
    deltas,
    valid,
    starts,
    firsts,
    ape,
    ape_gap,
    table,
    page_lo,
    page_hi,
    run,
    stride_kp,
    stride_ks,
    stride_vp,
    stride_vs,
    stride_vd,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    HAS_FIRST: tl.constexpr,
    HAS_APE: tl.constexpr,
    V_T: tl.constexpr,
    APPLY_DELTA: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ROTATED_RUNS: tl.constexpr,
):
    """Attend the pages [page_lo, page_hi) of one delta (run `run` of the entry) with the Q tile rotated for it;
    returns the running softmax state."""
    q_src = q_rows
    if APPLY_DELTA:
        q_src = _chunk_q_src(
            q_rows,
            rot_rows,
            rot_run_stride,
            scratch_rows,
            row_ok,
            Cos,
            Sin,
            tl.load(deltas + table + page_lo),
            run,
            max_position,
            HEAD_DIM,
            INTERLEAVED,
            ROTATED_RUNS,
        )
    q = load_q_tile(q_src, scratch_rows, row_ok, k_head, HEAD_DIM)
    return attend_pages(
        acc,
        l_i,
        m_i,
        q,
        q_pos,
        q_first,
        k_head,
        v_head,
        pages + table,
        valid + table,
        starts + table,
        firsts + table,
        ape + table,
        ape_gap,
        page_lo,
        page_hi,
        stride_kp,
        stride_ks,
        stride_vp,
        stride_vs,
        stride_vd,
        qk_scale,
        HEAD_DIM,
        PAGE_SIZE,
        BLOCK_N,
        DOT_PRECISION,
        UPCAST,
        HAS_FIRST,
        HAS_APE,
        V_T,
    )


@triton.jit
def _walk_chunks(
    acc,
    l_i,
    m_i,
    q_rows,
    rot_rows,
    rot_run_stride,
    scratch_rows,
    row_ok,
    q_pos,
    q_first,
    Cos,
    Sin,
    max_position,
    k_head,
    v_head,
    pages,
    deltas,
    valid,
    starts,
    firsts,
    ape,
    ape_gap,
    table,
    first,
    last,
    c,
    step,
    chunk_len,
    stride_kp,
    stride_ks,
    stride_vp,
    stride_vs,
    stride_vd,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    HAS_FIRST: tl.constexpr,
    HAS_APE: tl.constexpr,
    V_T: tl.constexpr,
    APPLY_DELTA: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ROTATED_RUNS: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """Chunks c, c + step, ... of the pages [first, last) (chunk_bounds: cut at delta changes and every chunk_len
    pages), each with its own Q tile and tile loop; returns the running softmax state and whether the program had
    a chunk at all."""
    page_lo, page_hi, n_chunks = chunk_bounds(deltas + table, first, last, c, chunk_len, BLOCK_P)
    has_chunk = c < n_chunks
    # The entry's first ROTATED_RUNS runs come rotated up front: each chunk needs its run. With step 1
    # (balanced ranges) consecutive chunks are consecutive runs, so one scan finds the first chunk's.
    run = tl.full([], ROTATED_RUNS, tl.int32)  # a tensor: the loop carries it
    if APPLY_DELTA and ROTATED_RUNS > 0:
        run = count_runs(deltas + table, page_lo + 1, BLOCK_P) - 1
    while c < n_chunks:
        if APPLY_DELTA and ROTATED_RUNS > 0:  # noqa: SIM102 - a compile-time branch around a runtime one
            if step != 1:
                run = count_runs(deltas + table, page_lo + 1, BLOCK_P) - 1
        acc, l_i, m_i = _attend_chunk(
            acc,
            l_i,
            m_i,
            q_rows,
            rot_rows,
            rot_run_stride,
            scratch_rows,
            row_ok,
            q_pos,
            q_first,
            Cos,
            Sin,
            max_position,
            k_head,
            v_head,
            pages,
            deltas,
            valid,
            starts,
            firsts,
            ape,
            ape_gap,
            table,
            page_lo,
            page_hi,
            run,
            stride_kp,
            stride_ks,
            stride_vp,
            stride_vs,
            stride_vd,
            qk_scale,
            HEAD_DIM,
            PAGE_SIZE,
            BLOCK_N,
            DOT_PRECISION,
            UPCAST,
            HAS_FIRST,
            HAS_APE,
            V_T,
            APPLY_DELTA,
            INTERLEAVED,
            ROTATED_RUNS,
        )
        c += step
        run += 1
        page_lo, page_hi, n_chunks = chunk_bounds(deltas + table, first, last, c, chunk_len, BLOCK_P)
    return acc, l_i, m_i, has_chunk


@triton.jit
def kernel_chunks(
    acc,
    l_i,
    m_i,
    q_rows,
    rot_rows,
    rot_run_stride,
    scratch_rows,
    row_ok,
    q_pos,
    q_first,
    Cos,
    Sin,
    max_position,
    k_head,
    v_head,
    pages,
    deltas,
    valid,
    starts,
    firsts,
    ape,
    ape_gap,
    table,
    n_vis,
    split,
    stride_kp,
    stride_ks,
    stride_vp,
    stride_vs,
    stride_vd,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    HAS_FIRST: tl.constexpr,
    HAS_APE: tl.constexpr,
    V_T: tl.constexpr,
    APPLY_DELTA: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ROTATED_RUNS: tl.constexpr,
    SPLIT_KV: tl.constexpr,
    SPLIT_BY_RUNS: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """The chunks of this program's pages found in the kernel, from scans of the entry's deltas (what a call
    without a host plan does); returns the running softmax state and whether the program had a chunk."""
    # A program walks chunks of its pages, one delta per chunk, so the rotation is a prologue of each
    # chunk's tile loop. With more splits than runs, chunks are the runs cut to about n_vis / (S - runs)
    # pages and split s takes chunk s alone (no second tile loop). With fewer, split s takes the s-th of
    # S balanced page ranges and walks the runs in it. Without splits: every run, in order. The chunks do
    # not depend on APPLY_DELTA: without rotation the kernel keeps the same structure.
    if SPLIT_KV:
        num_splits = tl.num_programs(2)
        if SPLIT_BY_RUNS:  # noqa: SIM108 - a compile-time branch
            runs = count_runs(deltas + table, n_vis, BLOCK_P)
        else:
            runs = num_splits  # balanced page ranges: no program rotates Q for each of its chunks
        if num_splits > runs:
            first = 0
            last = n_vis
            c = split
            step = num_splits
            chunk_len = tl.cdiv(n_vis, num_splits - runs)
        else:
            first = split * n_vis // num_splits
            last = (split + 1) * n_vis // num_splits
            c = 0
            step = 1
            chunk_len = last - first
    else:
        first = 0
        last = n_vis
        c = 0
        step = 1
        chunk_len = n_vis
    chunk_len = tl.maximum(chunk_len, 1)
    c = c + n_vis * 0  # a tensor in every case: _walk_chunks' loop carries it
    acc, l_i, m_i, has_chunk = _walk_chunks(
        acc,
        l_i,
        m_i,
        q_rows,
        rot_rows,
        rot_run_stride,
        scratch_rows,
        row_ok,
        q_pos,
        q_first,
        Cos,
        Sin,
        max_position,
        k_head,
        v_head,
        pages,
        deltas,
        valid,
        starts,
        firsts,
        ape,
        ape_gap,
        table,
        first,
        last,
        c,
        step,
        chunk_len,
        stride_kp,
        stride_ks,
        stride_vp,
        stride_vs,
        stride_vd,
        qk_scale,
        HEAD_DIM,
        PAGE_SIZE,
        BLOCK_N,
        DOT_PRECISION,
        UPCAST,
        HAS_FIRST,
        HAS_APE,
        V_T,
        APPLY_DELTA,
        INTERLEAVED,
        ROTATED_RUNS,
        BLOCK_P,
    )
    return acc, l_i, m_i, has_chunk


@triton.jit
def planned_chunks(
    acc,
    l_i,
    m_i,
    fields,
    count,
    q_rows,
    rot_rows,
    rot_run_stride,
    scratch_rows,
    row_ok,
    q_pos,
    q_first,
    Cos,
    Sin,
    max_position,
    k_head,
    v_head,
    pages,
    deltas,
    valid,
    starts,
    firsts,
    ape,
    ape_gap,
    table,
    n_vis,
    stride_kp,
    stride_ks,
    stride_vp,
    stride_vs,
    stride_vd,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    HAS_FIRST: tl.constexpr,
    HAS_APE: tl.constexpr,
    V_T: tl.constexpr,
    APPLY_DELTA: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ROTATED_RUNS: tl.constexpr,
    PLAN_WIDTH: tl.constexpr,
):
    """The pieces the host planned for this (entry, split) (`split_plan`): `count` pieces of one delta each, piece
    i the pages [lo, hi) of run `run` at fields 1 + 3i, 2 + 3i, 3 + 3i, cut to the block's visible pages. No scan:
    the record is one load, issued beside the visible-page count."""
    for i in range(0, count):
        lo = tl.minimum(pick(fields, 1 + 3 * i, PLAN_WIDTH), n_vis)
        hi = tl.minimum(pick(fields, 2 + 3 * i, PLAN_WIDTH), n_vis)
        run = pick(fields, 3 + 3 * i, PLAN_WIDTH)
        if lo < hi:
            acc, l_i, m_i = _attend_chunk(
                acc,
                l_i,
                m_i,
                q_rows,
                rot_rows,
                rot_run_stride,
                scratch_rows,
                row_ok,
                q_pos,
                q_first,
                Cos,
                Sin,
                max_position,
                k_head,
                v_head,
                pages,
                deltas,
                valid,
                starts,
                firsts,
                ape,
                ape_gap,
                table,
                lo,
                hi,
                run,
                stride_kp,
                stride_ks,
                stride_vp,
                stride_vs,
                stride_vd,
                qk_scale,
                HEAD_DIM,
                PAGE_SIZE,
                BLOCK_N,
                DOT_PRECISION,
                UPCAST,
                HAS_FIRST,
                HAS_APE,
                V_T,
                APPLY_DELTA,
                INTERLEAVED,
                ROTATED_RUNS,
            )
    return acc, l_i, m_i, count > 0
