"""Triton prefill attention over paged KV with deferred RoPE (the `lazy` mode's hot path).

Contract: kernels/paged.py; ground truth: kernels/reference.py (`paged_attention`), which this kernel matches.

Deferred RoPE
-------------
The one write-up of the math; kernels/decode.py, kernels/rope.py and docs/design.md point here.

`R_p` rotates each channel pair j by the angle `p * theta_j`; `R_a R_b = R_{a+b}`, `R_a^T = R_{-a}`. A query
arrives rotated at its logical position m. A cached key of local position j was stored as `R_j k`; its
logical position is `delta + j` (delta = its page's delta). Its score is

    <R_m q, R_{delta + j} k> = <R_m q, R_delta R_j k> = <R_{-delta} (R_m q), R_j k>

so rotating the *query* once by -delta replaces rotating every cached key. Per pair (a, b) with
c = cos(delta theta_j), s = sin(delta theta_j): a' = a c + b s, b' = b c - a s. Causality and softmax only
depend on logical positions, which come from `starts`, never from delta. It holds for every RoPE whose angle
is p * theta_j (kernels/rope.py); a magnitude factor (YaRN) is part of q and k, never of the correction.

Both kernels rotate elementwise on full-width tiles, without moving channels between registers: they load
the query twice, once with the column permutation that maps each channel d to its pair partner (j <-> j + D/2
half-split, 2j <-> 2j+1 interleaved), so that with j = pair(d)

    R_{-delta} q [d] = q[d] c_j + sign(d) q[partner(d)] s_j,    sign = +1 leading member, -1 trailing,

and the pairing only changes the partner / pair / sign index vectors. K is always loaded as one contiguous
[BLOCK_N, D] tile (one dot).

Where delta is applied: a program walks *chunks* of its pages, stretches of consecutive pages that share
one delta (a segment, or part of one), each with a FlashAttention-2 tile loop over the chunk's K/V that
takes the chunk's Q tile as it is loaded from memory. Chunks of delta 0 load Q itself. For the others
there are two ways, chosen per call:

- Rotated up front (calls of at most _ROTATE_MAX_ROWS query rows: short questions over cached documents, the
  case where the rotation is a large share of a program's work). _rotate_runs_kernel writes, before the
  attention kernel, one copy of Q per run of equal delta: copy r holds each row rotated by -delta of its
  entry's run r (the first ROTATED_RUNS runs; runs counted from the entry's first page). A chunk counts the
  runs up to its first page and loads its rows of that copy: the same code path as delta 0, no rotation and
  no barrier in the attention kernel. The copies take ROTATED_RUNS x rows x Hq x D elements; their number is
  static, so a CUDA graph captures it like any launch. The engine has the RoPE/KV-write launch write the same
  copies (cache_ops.rope_write_kv_runs, passed as `rotated_q`), which saves this launch (docs/benchmarks.md,
  "Kernel constants"). Runs past the last copy fall back to:
- Rotated in the kernel, at the start of the chunk: the Q tile is de-rotated by -delta in fp32 with the
  cos/sin rows `tables.cos/sin[delta]`, written to the program's scratch rows and loaded back. The round trip
  is what keeps the tile loop the same code as without deltas: triton keeps a *loaded* Q tile in shared
  memory as the QK^T wgmma operand, while a computed one stays a register operand, reloaded from shared
  memory on every tile at 255 registers, a much slower tile loop (docs/benchmarks.md, "Kernel constants").
  Scratch rows: the program's own output rows, or its split's workspace rows, both overwritten by its result
  later.
  (A single tile loop that re-rotates Q when the delta changes lets triton 3.6 pipeline nothing at all.)

Both compute R_{-delta} q in fp32 from the same inputs and round it to Q's dtype, so they give the same tile.

Chunks. Without splits: the runs of equal delta, in order (with APPLY_DELTA=False: one loop over all
pages). With S splits, split s takes the s-th of S balanced page ranges and walks the runs in it: every program
gets the same number of tiles, whatever the runs. When Q is rotated in the kernel, the rotation is kept to one per
program where possible: with more splits than runs, the runs cut into pieces of about (n - runs) / (S - runs)
pages, split s taking piece s alone; with fewer, the balanced ranges. Chunk bounds come from a scan of the visible
pages' deltas (prefill_tiles.kernel_chunks), or from the host's plan where the caller gives one
(kernels/prefill_plan.py; the engine's prefill CUDA graphs do).

FP8 pages (docs/design.md, "FP8 KV cache"): under a 16-bit q the products run in float16 (kv_dtype.fp8_tile_dtype):
K/V tiles widen to it as they load (exact), P rounds to it, and the Q tile, whatever its source, is rounded to it
through the scratch rows (prefill_tiles.load_q_tile, which says why). The pool stores FP8 pages' V transposed
(kernels/paged.py, v_transposed; V_T): a V tile is then loaded as [HEAD_DIM, BLOCK_N] rows, contiguous along the
slots, and transposed in registers (prefill_tiles.attend_pages). Each program widens every tile it reads, so a
long call (a causal prompt: each key read by every later query block) widens each key many times, and on sm_90
triton stores every widened tile back to shared memory for the wgmma. Calls with a long entry (`widens_first`)
therefore widen the pages they read once, before the kernel (`_widen_pages_kernel`, into float16 pages of their own,
one per (entry, page) of the call's tables), and the kernel reads those as it reads 16-bit pages: the same float16
tiles, the same products, the same result bits, at bf16 pages' speed plus one pass over the call's keys
(benchmarks/results/kernels_fp8_prefill_h200.md). Not while a CUDA graph is captured, where the tables' width is the
graph's, not the call's (the scratch would be the graph's whole width).

Where the code lives: this file holds the kernel and its launch; prefill_tiles.py the tile loop and the chunk
walks; page_scan.py the scans of the page tables; prefill_plan.py the host's plan.

Grid, tiling, GQA
-----------------
- One program per (query block, kv head, kv split). The G = Hq/Hkv query heads sharing a kv head are
  packed into the M dimension (row r = query r // G, head r % G), so each K/V tile loaded serves the whole
  head group and BLOCK_M rows cover BLOCK_M // G positions (less causal waste than one head per tile).
- Query blocks of all entries share grid axis 0 without a host sync: entry b owns the slots
  [cu[b] // QB + b, cu[b+1] // QB + b + 1), at least its cdiv(len_b, QB) blocks (an entry costs at most one
  idle slot; a lone entry's grid is its cdiv(len, QB) blocks, `query_slots`). A program finds its entry by
  counting slot starts <= its slot. Slots run in reverse so the long causal blocks (end of a sequence) start
  first.
- Tile loop: a K/V tile is part of one page or two whole pages (BLOCK_N = 2 * page_size). The page ids,
  valid counts and first position of tile t + 1 are loaded during tile t (prefill_tiles.attend_pages says
  why).
- Causal: a block walks only the pages starting at or before its last position. Masks are applied only to
  tiles holding padding slots (past `valid`) or crossing the diagonal; other tiles skip the select.
- Split-KV: when (blocks x kv heads) leaves SMs idle (a 32-token question against 10K cached tokens at
  batch 1), the visible pages are split across grid axis 2; each split writes a normalised partial output
  and its log2-sum-exp, and a second kernel merges them, one program per (query row, head). A program holds
  an SM and its tiles are arithmetic-bound at this shape (128 query rows per K/V tile), so the split count
  aims at one wave of equal programs: the slowest program is the kernel's time.
- Softmax in fp32 with exp2 (log2 e folded into the scale); bf16/fp16 dots accumulate in fp32, fp32 dots
  use ieee precision. Tiles and split counts: prefill_config and _default_splits, measured on an H200 with
  `python -m benchmarks.tune_kernels`; small fixed tiles under TRITON_INTERPRET. Both are launch parameters of
  prefill_attention (num_splits, config) for tests and benchmarks.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lazyattn.kernels.kv_dtype import check_dtypes, fp8_tile_dtype, is_fp8
from lazyattn.kernels.launch import LOG2E, interpreting, pdl_options, sm_count, wait_for_producers
from lazyattn.kernels.page_scan import BLOCK_B, BLOCK_P, count_pages, entry_of_row, find_block, pick, run_deltas
from lazyattn.kernels.paged import PagedBatch, cdiv, v_transposed
from lazyattn.kernels.prefill_plan import PLAN_WIDTH
from lazyattn.kernels.prefill_tiles import attend_pages, derotated_q, kernel_chunks, load_q_tile, planned_chunks
from lazyattn.kernels.rope import RopeTables

_MIN_KEYS_PER_SPLIT = 512  # below this a split's startup latency outweighs its work
_MAX_SPLITS = 32
# Runs of a short call's entries rotated up front (_rotate_runs_kernel), and the calls that qualify: the copies
# take ROTATED_RUNS x total_q x Hq x D elements (16 MiB at 256 rows of 32 x 128 bf16 heads). Further runs, and
# longer calls, whose Q is rotated once per program of many tiles, rotate in the attention kernel.
_ROTATED_RUNS = 8
_ROTATE_MAX_ROWS = 256
# Calls over FP8 pages whose longest entry has at least _WIDEN_MIN_ROWS query rows, and at least _WIDEN_MIN_SCORES
# query rows x keys, widen their pages before the kernel into at most _WIDEN_MAX_BYTES of float16 pages (module
# docstring, "FP8 pages"). Measured on an H200 (`python -m benchmarks.kernels_fp8_prefill`): a causal prompt of 512
# tokens takes the same GPU time either way, one of 1,024 less widened first.
_WIDEN_MIN_ROWS = 512
_WIDEN_MIN_SCORES = 1 << 20
_WIDEN_MAX_BYTES = 256 << 20


@triton.jit(do_not_specialize=["width"])
def _widen_pages_kernel(
    K,
    V,
    WideK,
    WideV,
    pages,
    num_pages,
    width,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vd,
    stride_vh,
    stride_table,
    PAGE_SIZE: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """WideK/WideV[b * width + i, :, h] = K/V[pages[b, i], :, h] widened to WideK's dtype (exact); one program per
    (b * width + i, h). Table slots past an entry's num_pages are left as they are: the kernel never reads them."""
    slot = tl.program_id(0)
    head = tl.program_id(1)
    entry = slot // width
    if slot % width >= tl.load(num_pages + entry):
        return
    page = tl.load(pages + entry.to(tl.int64) * stride_table + slot % width).to(tl.int64)
    rows = tl.arange(0, PAGE_SIZE)[:, None]
    dims = tl.arange(0, HEAD_DIM)[None, :]
    wide = ((slot.to(tl.int64) * PAGE_SIZE + rows) * KV_HEADS + head) * HEAD_DIM + dims
    k = tl.load(K + page * stride_kp + rows * stride_ks + head * stride_kh + dims)
    tl.store(WideK + wide, k.to(WideK.dtype.element_ty))
    v = tl.load(V + page * stride_vp + rows * stride_vs + head * stride_vh + dims * stride_vd)
    tl.store(WideV + wide, v.to(WideV.dtype.element_ty))


@triton.jit(do_not_specialize=["batch_size", "total_q", "max_position"])
def _rotate_runs_kernel(
    Q,
    QRot,
    Cos,
    Sin,
    cu_seqlens_q,
    deltas,
    num_pages,
    batch_size,
    total_q,
    max_position,
    stride_qt,
    stride_qh,
    stride_table,
    NUM_HEADS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """QRot[r, t] = query row t (all heads) rotated by -delta of run r of its entry; one program per (t, r).

    Runs of delta 0 and runs past the entry's last one are not written: the attention kernel reads Q itself
    there. The engine writes the same copies in its RoPE launch instead (cache_ops.rope_write_kv_runs)."""
    token = tl.program_id(0)
    run = tl.program_id(1)
    entry = entry_of_row(cu_seqlens_q, batch_size, token, BLOCK_B)
    deltas_row = deltas + entry.to(tl.int64) * stride_table
    delta = pick(run_deltas(deltas_row, tl.load(num_pages + entry), BLOCK_R, BLOCK_P), run, BLOCK_R)
    if delta != 0:
        h = tl.arange(0, BLOCK_H)
        ok = h < NUM_HEADS
        q = derotated_q(
            Q + token.to(tl.int64) * stride_qt + h * stride_qh, ok, Cos, Sin, delta, max_position, HEAD_DIM, INTERLEAVED
        )
        rows = (run.to(tl.int64) * total_q + token) * NUM_HEADS + h
        dims = tl.arange(0, HEAD_DIM)
        tl.store(QRot + rows[:, None] * HEAD_DIM + dims[None, :], q, mask=ok[:, None])


# Counts that change with every batch are not specialised on (Triton would compile a variant for == 1 and
# for multiples of 16): a serving engine must not compile inside a request.
@triton.jit(do_not_specialize=["batch_size", "total_q", "max_position"])
def _prefill_kernel(
    Q,
    K,
    V,
    Out,
    WsO,
    WsLse,
    Cos,
    Sin,
    QRot,
    cu_seqlens_q,
    q_start,
    pages,
    deltas,
    valid,
    starts,
    firsts,
    ape,
    ape_gap,
    num_pages,
    Plan,
    batch_size,
    total_q,
    max_position,
    stride_qt,
    stride_qh,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vd,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_table,
    stride_plan,
    qk_scale,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    APPLY_DELTA: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    SPLIT_KV: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    HAS_FIRST: tl.constexpr,
    HAS_APE: tl.constexpr,
    V_T: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROTATED_RUNS: tl.constexpr,
    SPLIT_BY_RUNS: tl.constexpr,
    HOST_PLAN: tl.constexpr,
    PLAN_WIDTH: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    QB: tl.constexpr = BLOCK_M // GROUP  # query positions per block
    slot = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    wait_for_producers(USE_PDL)
    entry, first_row = find_block(cu_seqlens_q, batch_size, slot, tl.arange(0, BLOCK_B), QB, BLOCK_B)
    row0 = tl.load(cu_seqlens_q + entry)
    q_len = tl.load(cu_seqlens_q + entry + 1) - row0
    if first_row >= q_len:  # the spare slot of an entry
        return

    r = tl.arange(0, BLOCK_M)
    qi = first_row + r // GROUP
    row_ok = (r < QB * GROUP) & (qi < q_len)
    head = kv_head * GROUP + r % GROUP
    token = (row0 + qi).to(tl.int64)
    q_rows = Q + token * stride_qt + head * stride_qh
    pos0 = tl.load(q_start + entry)
    q_pos = pos0 + qi
    q_first = pos0 + first_row
    q_last = pos0 + tl.minimum(first_row + QB, q_len) - 1

    out_rows = Out + token * stride_ot + head * stride_oh
    num_heads = tl.num_programs(1) * GROUP
    ws_rows = token * num_heads + head
    rot_rows = QRot + ws_rows * HEAD_DIM  # run r's copy: r * rot_run_stride further (_rotate_runs_kernel)
    rot_run_stride = total_q.to(tl.int64) * num_heads * HEAD_DIM
    ws_split_stride = total_q * num_heads
    if SPLIT_KV:
        # This split's workspace rows (fp32, HEAD_DIM each) hold the rotated Q until the partial overwrites
        # them; without splits the program's own output rows do.
        ELEMS_PER_FP32: tl.constexpr = 32 // Q.dtype.element_ty.primitive_bitwidth
        scratch_rows = WsO.to(tl.pointer_type(Q.dtype.element_ty), bitcast=True) + (
            split * ws_split_stride + ws_rows
        ) * (HEAD_DIM * ELEMS_PER_FP32)
    else:
        scratch_rows = out_rows

    table = entry.to(tl.int64) * stride_table
    n_vis = count_pages(starts + table, tl.load(num_pages + entry), q_last, BLOCK_P)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    dims = tl.arange(0, HEAD_DIM)
    k_head = K + kv_head * stride_kh
    v_head = V + kv_head * stride_vh
    if SPLIT_KV or APPLY_DELTA:
        # Which pages this program attends, in chunks of one delta: planned by the host (HOST_PLAN, a record
        # per entry and split; count -1 where it could not plan), else found by the kernel's scans. Two calls of
        # kernel_chunks: a HOST_PLAN branch must stay a constexpr one (a local Python bool is compiled as a
        # runtime value, both branches with it).
        if HOST_PLAN:
            fields = tl.load(Plan + entry.to(tl.int64) * stride_plan + split * PLAN_WIDTH + tl.arange(0, PLAN_WIDTH))
            count = pick(fields, 0, PLAN_WIDTH)
            if count >= 0:
                acc, l_i, m_i, has_chunk = planned_chunks(
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
                    PLAN_WIDTH,
                )
            else:
                acc, l_i, m_i, has_chunk = kernel_chunks(
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
                    SPLIT_KV,
                    SPLIT_BY_RUNS,
                    BLOCK_P,
                )
        else:
            acc, l_i, m_i, has_chunk = kernel_chunks(
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
                SPLIT_KV,
                SPLIT_BY_RUNS,
                BLOCK_P,
            )
    else:
        q = load_q_tile(q_rows, scratch_rows, row_ok, K, HEAD_DIM)
        acc, l_i, m_i = attend_pages(
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
            0,
            n_vis,
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

    if SPLIT_KV:
        # This split's partial: normalised output and log2-sum-exp (-inf when it saw no key).
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # m_i = -inf already marks an empty row
        mine = split * ws_split_stride + ws_rows
        tl.store(WsLse + mine, m_i + tl.log2(l_safe), mask=row_ok)
        if has_chunk:  # a split without a chunk leaves its output unwritten: the merge skips it
            tl.store(WsO + mine[:, None] * HEAD_DIM + dims[None, :], acc / l_safe[:, None], mask=row_ok[:, None])
    else:
        o = acc / l_i[:, None]
        tl.store(out_rows[:, None] + dims[None, :], o.to(Out.dtype.element_ty), mask=row_ok[:, None])


@triton.jit(do_not_specialize=["num_rows", "num_splits"])
def combine_kernel(
    WsO,
    WsLse,
    Out,
    num_rows,
    num_splits,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Merge the splits of one (query row, head): out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M).

    One program per (row, head), BLOCK_S splits per step: the partials are read in parallel across the
    GPU. (Merging in the split kernel, by the last split of a block to finish, was measured slower: one SM then
    reads every partial of the block, 64 KiB each; docs/benchmarks.md, "Kernel constants".)"""
    row = tl.program_id(0).to(tl.int64)
    dims = tl.arange(0, HEAD_DIM)
    wait_for_producers(USE_PDL)
    m_run = tl.full([], float("-inf"), tl.float32)
    den = tl.zeros([], tl.float32)
    num = tl.zeros([HEAD_DIM], tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        ws = s * num_rows + row
        lse = tl.load(WsLse + ws, mask=s < num_splits, other=float("-inf"))
        seen = lse > float("-inf")  # a split that saw no key may have left its output unwritten
        o = tl.load(WsO + ws[:, None] * HEAD_DIM + dims[None, :], mask=seen[:, None], other=0.0)
        m_new = tl.maximum(m_run, tl.max(lse, axis=0))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        old = tl.exp2(m_run - m_ref)
        w = tl.exp2(lse - m_ref)
        den = den * old + tl.sum(w, axis=0)
        num = num * old + tl.sum(w[:, None] * o, axis=0)
        m_run = m_new
    out = num / tl.where(den == 0.0, 1.0, den)
    ptrs = Out + (row // NUM_HEADS) * stride_ot + (row % NUM_HEADS) * stride_oh + dims
    tl.store(ptrs, out.to(Out.dtype.element_ty))


@dataclass(frozen=True)
class PrefillConfig:
    block_m: int  # query rows per tile: BLOCK_M // group positions of the whole head group
    block_n: int  # key slots per tile: part of one page, or two whole pages (2 * page_size)
    num_warps: int = 4
    num_stages: int = 2
    maxnreg: int | None = None  # register cap per thread (ptxas .maxnreg); None leaves it to the compiler


def prefill_config(fp32: bool, head_dim: int, group: int, page_size: int) -> PrefillConfig:
    """Tiles of a call, measured on an H200 (`python -m benchmarks.tune_kernels`).

    16-bit, head_dim <= 128: 128 x 64 tiles, 8 warps, 3 stages (K/V prefetched 2 tiles ahead); 4 stages
    measured the same. Pages of >= 128: 128 x 128 tiles (faster than 128 x 64 at 16K causal:
    docs/benchmarks.md, "Kernel constants"); with pages of 64 the 2-page 128 x 128 tile is no faster and
    spills. A tile is part of a page or two whole pages, so BLOCK_N is capped at 2 * page_size. fp32 dots
    run on FMA units: small tiles. The M tile holds at least one position of the whole head group.
    """
    if fp32:
        block_m, block_n, warps, stages = 32, 32, 4, 2
    elif head_dim > 128:
        block_m, block_n, warps, stages = 64, 64, 8, 3
    else:
        block_m, block_n, warps, stages = 128, 128 if page_size >= 128 else 64, 8, 3
    return PrefillConfig(max(block_m, triton.next_power_of_2(group)), min(block_n, 2 * page_size), warps, stages)


def _default_config(q: torch.Tensor, group: int, page_size: int) -> PrefillConfig:
    if interpreting():  # the interpreter runs programs one by one: small tiles keep tests quick
        return PrefillConfig(max(64, triton.next_power_of_2(group)), min(page_size, 64), 4, 2)
    return prefill_config(q.dtype == torch.float32, q.shape[2], group, page_size)


def _default_splits(q: torch.Tensor, batch: PagedBatch, group: int, kv_heads: int, block_m: int) -> int:
    """Split the KV walk when (query blocks x kv heads) leaves SMs idle: one program holds an SM (8 warps,
    ~230 registers each) and split programs get equal page ranges, so the aim is one wave of at most one
    program per SM. Measured on an H200, RAG 5 x 2048 + 32 with deltas: batch 1 -> 16 splits (faster than 12, and
    than 20, which starts a second wave), batch 8 -> 2 splits (faster than 3); docs/benchmarks.md, "Kernel
    constants"."""
    if not q.is_cuda or interpreting():
        return 1
    return _split_count(
        q.shape[0], batch.batch_size, batch.max_q, batch.max_kv, group, kv_heads, block_m, sm_count(q.device)
    )


def _split_count(
    total_q: int, batch_size: int, max_q: int, max_kv: int, group: int, kv_heads: int, block_m: int, sms: int
) -> int:
    positions = max(1, block_m // group)
    blocks = min(cdiv(total_q, positions) + batch_size - 1, batch_size * cdiv(max(1, max_q), positions))
    programs = blocks * kv_heads
    by_length = max(1, max_kv // _MIN_KEYS_PER_SPLIT)
    return max(1, min(sms // programs, by_length, _MAX_SPLITS))


def graph_num_splits(
    total_q: int,
    entries: int,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    page_size: int,
    device: torch.device,
) -> int:
    """The split count a CUDA graph of `total_q` query rows in `entries` entries fixes (engine/prefill_graphs.py):
    what an eager launch picks for those rows over a long context (the case graphs are for: short questions over
    cached documents). Shorter contexts leave some splits without pages; they exit early."""
    if device.type != "cuda" or interpreting():
        return 1
    group = q_heads // kv_heads
    config = prefill_config(dtype == torch.float32, head_dim, group, page_size)
    return _split_count(
        total_q,
        max(1, entries),
        total_q,
        _MAX_SPLITS * _MIN_KEYS_PER_SPLIT,
        group,
        kv_heads,
        config.block_m,
        sm_count(device),
    )


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: PagedBatch,
    tables: RopeTables | None,
    scale: float,
    *,
    apply_delta: bool = True,
    num_splits: int | None = None,
    config: PrefillConfig | None = None,
    rotated_runs: int | None = None,
    rotated_q: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    widen: bool | None = None,
) -> torch.Tensor:
    """Paged causal attention with per-page delta, same semantics as `reference.paged_attention`.

    q [total_q, Hq, D] packed by `batch.cu_seqlens_q`, rotated at its logical positions; k_cache/v_cache
    [num_pages, page_size, Hkv, D] (strided views of the pool are fine). Returns out [total_q, Hq, D] in
    q's dtype (written into `out` when given). `tables=None` or `apply_delta=False` ignores the deltas
    (exact when they are all 0; apply_delta=False is the no-deferred-RoPE baseline of the benchmarks).

    Launch parameters: num_splits=None takes batch.num_splits, else splits the KV walk only when the grid
    leaves SMs idle (_default_splits); config=None takes prefill_config's tiles. rotated_runs: copies of Q
    rotated up front, one per run of equal delta (module docstring, "Where delta is applied"); None takes
    _ROTATED_RUNS for calls of at most _ROTATE_MAX_ROWS rows and 0 (rotation in the kernel) beyond.
    The split partials and rotated copies live in scratch allocated per call (stream-ordered by PyTorch's
    allocator, in the graph's pool under CUDA graphs). widen: over FP8 pages, widen the pages the call reads to
    float16 before the kernel (module docstring, "FP8 pages"); None: `widens_first`'s rule. The result is the same
    either way.
    """
    tables = tables if apply_delta else None
    _check_inputs(q, k_cache, v_cache, tables, batch, out)
    out = torch.empty_like(q) if out is None else out
    total_q, q_heads, head_dim = q.shape
    kv_heads, group = k_cache.shape[2], q_heads // k_cache.shape[2]
    if total_q == 0 or batch.batch_size == 0:
        return out
    q = q if q.stride(-1) == 1 else q.contiguous()
    if widen is None:
        widen = widens_first(q, k_cache, batch)
    if widen and _widenable(q, k_cache):
        k_cache, v_cache, batch = widened_pages(k_cache, v_cache, batch, fp8_tile_dtype(q.dtype))
    config = _default_config(q, group, k_cache.shape[1]) if config is None else config
    splits = num_splits or batch.num_splits or _default_splits(q, batch, group, kv_heads, config.block_m)
    ws_o = ws_lse = out  # placeholders, unused unless split
    if splits > 1:
        ws_o = torch.empty(splits, total_q, q_heads, head_dim, dtype=torch.float32, device=q.device)
        ws_lse = torch.empty(splits, total_q, q_heads, dtype=torch.float32, device=q.device)
    if rotated_q is not None:
        if (
            rotated_q.dim() != 4
            or rotated_q.shape[1:] != q.shape
            or rotated_q.dtype != q.dtype
            or not rotated_q.is_contiguous()
        ):
            raise ValueError(
                f"rotated_q must be contiguous {q.dtype} [runs, {total_q}, {q_heads}, {head_dim}], "
                f"got {rotated_q.dtype} {tuple(rotated_q.shape)}"
            )
        rotated_runs = rotated_q.shape[0]
    elif rotated_runs is None:
        rotated_runs = rotated_runs_for(total_q)
    rotated_runs = rotated_runs if tables is not None else 0
    q_rot = out  # placeholder, unused without rotated runs
    if rotated_runs > 0:
        q_rot = rotated_q if rotated_q is not None else _rotate_runs(q, batch, tables, rotated_runs)
    plan = batch.plan if splits > 1 and batch.plan is not None and batch.plan.shape[1] == splits else None
    args, consts = _kernel_args(q, k_cache, v_cache, batch, tables, scale, out, ws_o, ws_lse, q_rot, splits, plan)
    grid = (query_slots(total_q, batch.batch_size, config.block_m // group), kv_heads, splits)
    _prefill_kernel[grid](
        *args,
        **consts,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        ROTATED_RUNS=rotated_runs,
        SPLIT_BY_RUNS=tables is not None and rotated_runs == 0,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **pdl_options(q.device, "attention"),
        **({"maxnreg": config.maxnreg} if config.maxnreg else {}),
    )
    if splits > 1:
        combine_kernel[(total_q * q_heads,)](
            ws_o,
            ws_lse,
            out,
            total_q * q_heads,
            splits,
            out.stride(0),
            out.stride(1),
            NUM_HEADS=q_heads,
            HEAD_DIM=head_dim,
            BLOCK_S=min(16, triton.next_power_of_2(splits)),
            **pdl_options(q.device, "attention"),
        )
    return out


def widens_first(q: torch.Tensor, k_cache: torch.Tensor, batch: PagedBatch) -> bool:
    """Whether a prefill call of q over pages of k_cache's dtype widens its pages before the kernel (module
    docstring, "FP8 pages"): FP8 pages under a 16-bit q, an entry of at least _WIDEN_MIN_ROWS query rows (each
    of its keys is then read by many query blocks) and _WIDEN_MIN_SCORES rows x keys, widened pages of at most
    _WIDEN_MAX_BYTES, and no CUDA graph being captured."""
    if not _widenable(q, k_cache) or batch.max_q < _WIDEN_MIN_ROWS or batch.max_q * batch.max_kv < _WIDEN_MIN_SCORES:
        return False
    page_bytes = 2 * k_cache[0].numel() * fp8_tile_dtype(q.dtype).itemsize  # a K and a V page, widened
    if batch.pages.numel() * page_bytes > _WIDEN_MAX_BYTES:
        return False
    return not (q.is_cuda and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _widenable(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """FP8 pages under a 16-bit q: the calls whose tiles the kernel widens (module docstring, "FP8 pages")."""
    return is_fp8(k_cache.dtype) and q.dtype != torch.float32


def widened_pages(
    k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, PagedBatch]:
    """The pages `batch` lists, widened to `dtype`, and the batch that reads them: entry b's page i becomes page
    b * P + i of new [B * P, page_size, kv_heads, D] caches (P: the tables' width). A page listed by several
    entries is widened once for each."""
    entries, width = batch.pages.shape
    _, page_size, kv_heads, head_dim = k_cache.shape
    wide_k, wide_v = torch.empty(
        2, entries * width, page_size, kv_heads, head_dim, dtype=dtype, device=k_cache.device
    ).unbind(0)
    if entries * width:
        _widen_pages_kernel[(entries * width, kv_heads)](
            k_cache,
            v_cache,
            wide_k,
            wide_v,
            batch.pages,
            batch.num_pages,
            width,
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            v_cache.stride(0),
            v_cache.stride(1),
            v_cache.stride(3),  # stride_vd
            v_cache.stride(2),
            batch.pages.stride(0),
            PAGE_SIZE=page_size,
            KV_HEADS=kv_heads,
            HEAD_DIM=head_dim,
            num_warps=4,
        )
    return wide_k, wide_v, dataclasses.replace(batch, pages=_page_table(entries, width, batch.pages.device))


@functools.lru_cache(maxsize=64)
def _page_table(entries: int, width: int, device: torch.device) -> torch.Tensor:
    """[entries, width] int32: entry b's page i is page b * width + i (never written: calls share it)."""
    return torch.arange(entries * width, dtype=torch.int32, device=device).view(entries, width)


def query_slots(total_q: int, batch_size: int, positions: int) -> int:
    """Grid axis 0 of a launch over `total_q` query rows of `batch_size` entries in blocks of `positions` (module
    docstring, "Grid"): every entry's blocks plus one slot per entry that may stay idle; a lone entry's blocks
    start at slot 0, so it needs none (at batch 1 the idle slot was half the grid, each a launch that holds an SM)."""
    return cdiv(total_q, positions) if batch_size == 1 else total_q // positions + batch_size


def rotated_runs_for(total_q: int) -> int:
    """How many runs a call of total_q query rows takes rotated up front (module docstring)."""
    return _ROTATED_RUNS if total_q <= _ROTATE_MAX_ROWS else 0


def _rotate_runs(q: torch.Tensor, batch: PagedBatch, tables: RopeTables, runs: int) -> torch.Tensor:
    """[runs, total_q, Hq, D] copies of q, copy r rotated by -delta of each entry's run r (where nonzero)."""
    total_q, q_heads, head_dim = q.shape
    q_rot = torch.empty(runs, total_q, q_heads, head_dim, dtype=q.dtype, device=q.device)
    cos, sin = tables.cos.contiguous(), tables.sin.contiguous()
    _rotate_runs_kernel[(total_q, runs)](
        q,
        q_rot,
        cos,
        sin,
        batch.cu_seqlens_q,
        batch.deltas,
        batch.num_pages,
        batch.batch_size,
        total_q,
        cos.shape[0],
        q.stride(0),
        q.stride(1),
        batch.deltas.stride(0),
        NUM_HEADS=q_heads,
        BLOCK_H=triton.next_power_of_2(q_heads),
        HEAD_DIM=head_dim,
        INTERLEAVED=tables.interleaved,
        BLOCK_R=triton.next_power_of_2(runs),
        BLOCK_B=BLOCK_B,
        BLOCK_P=BLOCK_P,
        num_warps=4,
    )
    return q_rot


def _kernel_args(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: PagedBatch,
    tables: RopeTables | None,
    scale: float,
    out: torch.Tensor,
    ws_o: torch.Tensor,
    ws_lse: torch.Tensor,
    q_rot: torch.Tensor,
    splits: int,
    plan: torch.Tensor | None,
) -> tuple[tuple, dict]:
    """Positional arguments and constexprs of _prefill_kernel (block sizes and ROTATED_RUNS aside)."""
    cos, sin = (tables.cos.contiguous(), tables.sin.contiguous()) if tables is not None else (q, q)
    args = (
        q,
        k_cache,
        v_cache,
        out,
        ws_o,
        ws_lse,
        cos,
        sin,
        q_rot,
        batch.cu_seqlens_q,
        batch.q_start,
        batch.pages,
        batch.deltas,
        batch.valid,
        batch.starts,
        batch.starts if batch.firsts is None else batch.firsts,  # a placeholder pointer without offsets
        batch.starts if batch.inv_temps is None else batch.inv_temps,  # a placeholder without temperatures
        batch.ape_gap,
        batch.num_pages,
        batch.pages if plan is None else plan,  # a placeholder pointer without a plan
        batch.batch_size,
        q.shape[0],
        cos.shape[0] if tables is not None else 0,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(3),  # stride_vd
        v_cache.stride(2),
        out.stride(0),
        out.stride(1),
        batch.pages.stride(0),
        0 if plan is None else plan.stride(0),
        scale * LOG2E,
    )
    consts = dict(
        GROUP=q.shape[1] // k_cache.shape[2],
        HEAD_DIM=q.shape[2],
        PAGE_SIZE=k_cache.shape[1],
        APPLY_DELTA=tables is not None,
        INTERLEAVED=tables is not None and tables.interleaved,
        SPLIT_KV=splits > 1,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        UPCAST=interpreting() and q.dtype != torch.float32,
        HAS_FIRST=batch.firsts is not None,
        HAS_APE=batch.inv_temps is not None,
        V_T=v_transposed(v_cache),
        BLOCK_B=BLOCK_B,
        BLOCK_P=BLOCK_P,
        HOST_PLAN=plan is not None,
        PLAN_WIDTH=PLAN_WIDTH,
    )
    return args, consts


def _check_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: RopeTables | None,
    batch: PagedBatch,
    out: torch.Tensor | None,
) -> None:
    if not q.is_cuda and not interpreting():
        raise RuntimeError("the Triton prefill kernel needs CUDA tensors (or TRITON_INTERPRET=1 on a CPU)")
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"expected q [T, Hq, D] and k/v caches [pages, page_size, Hkv, D], got "
            f"{tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    head_dim, page_size, kv_heads = q.shape[2], k_cache.shape[1], k_cache.shape[2]
    if k_cache.shape[3] != head_dim or q.shape[1] % kv_heads:
        raise ValueError(f"q {tuple(q.shape)} does not fit the caches {tuple(k_cache.shape)} (GQA needs Hq % Hkv == 0)")
    if head_dim & (head_dim - 1) or not 16 <= head_dim <= 256:
        raise ValueError(f"prefill kernel needs a power-of-two head_dim in [16, 256], got {head_dim}")
    if page_size & (page_size - 1) or page_size < 16:
        raise ValueError(f"prefill kernel needs a power-of-two page_size >= 16, got {page_size}")
    if k_cache.stride(-1) != 1 or not (v_cache.stride(-1) == 1 or v_transposed(v_cache)):
        raise ValueError("the k cache must be contiguous along head_dim, the v cache along head_dim or its slots")
    check_dtypes(q, k_cache, v_cache)
    if tables is not None and (
        tables.cos.shape[1] != head_dim // 2 or tables.cos.dtype != torch.float32 or tables.cos.device != q.device
    ):
        raise ValueError(
            f"RoPE tables must be fp32 [max_position, {head_dim // 2}] on {q.device}, got "
            f"{tables.cos.dtype} {tuple(tables.cos.shape)} on {tables.cos.device}"
        )
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1):
        raise ValueError(
            f"out must be {q.dtype} {tuple(q.shape)} and contiguous along head_dim, got {out.dtype} {tuple(out.shape)}"
        )
    if out is not None and out.data_ptr() == q.data_ptr():
        raise ValueError("out must not be q itself: the kernel keeps rotated copies of q in out's rows")
    rows = (batch.pages, batch.deltas, batch.valid, batch.starts) + (() if batch.firsts is None else (batch.firsts,))
    rows += () if batch.inv_temps is None else (batch.inv_temps, batch.log_scales)
    if any(t.stride(1) != 1 or t.stride(0) != batch.pages.stride(0) for t in rows):
        raise ValueError("PagedBatch tables must be contiguous [B, P] int32 tensors of one shape")
