"""Triton prefill attention over paged KV with deferred RoPE (the `lazy` mode's hot path).

Contract: kernels/paged.py; ground truth: kernels/reference.py (`paged_attention`), which this kernel matches.

Deferred RoPE (DESIGN.md §2)
----------------------------
`R_p` rotates each channel pair j by the angle `p * theta_j`; `R_a R_b = R_{a+b}`, `R_a^T = R_{-a}`. A query
arrives rotated at its logical position m. A cached key of local position j was stored as `R_j k`; its
logical position is `delta + j` (delta = its page's delta). Its score is

    <R_m q, R_{delta + j} k> = <R_m q, R_delta R_j k> = <R_{-delta} (R_m q), R_j k>

so rotating the *query* tile once by -delta replaces rotating every cached key. Per pair (a, b) with
c = cos(delta theta_j), s = sin(delta theta_j): a' = a c + b s, b' = b c - a s. Causality and softmax only
depend on logical positions, which come from `starts`, never from delta.

Where delta is applied: pages are walked in order, grouped into *runs* of consecutive pages that share a
delta (one run per segment: a document, the final segment). At the start of each run the Q tile is
reloaded from global memory (L2-hot) and de-rotated in fp32 with the cos/sin rows `tables.cos/sin[delta]`;
the run's K tiles are then consumed by a plain FlashAttention-2 inner loop. So the inner loop, the part
that runs per K tile, is the same code with and without deltas (`APPLY_DELTA=False` compiles the runs and
the rotation out), and the de-rotated Q is loop-invariant there. Reloading Q instead of keeping an
unrotated copy live saves registers; it happens once per segment. Run boundaries come from the
program's first 256 deltas, loaded once into registers, so a run change costs no extra memory round trip.
(A flat tile loop that re-rotates Q when delta changes was tried: triton then re-stores the MMA operand
to shared memory on every tile and spills; the run loop keeps the inner loop clean.)

Both channel pairings are handled by loading the Q tile twice, once with the column permutation that maps
each channel to its pair partner (j <-> j + D/2 half-split, 2j <-> 2j+1 interleaved): the rotation is then
elementwise on full-width tiles and K is always loaded as one contiguous [BLOCK_N, D] tile (one dot).

Grid, tiling, GQA
-----------------
- One program per (query block, kv head, kv split). The G = Hq/Hkv query heads sharing a kv head are
  packed into the M dimension (row r = query r // G, head r % G), so each K/V tile loaded serves the whole
  head group and BLOCK_M rows cover BLOCK_M // G positions (less causal waste than one head per tile).
- Query blocks of all entries share grid axis 0 without a host sync: entry b owns the slots
  [cu[b] // QB + b, cu[b+1] // QB + b + 1), at least its cdiv(len_b, QB) blocks (an entry costs at most one
  idle slot). A program finds its entry by counting slot starts <= its slot. Slots run in reverse so the
  long causal blocks (end of a sequence) start first.
- Causal: a block walks only the pages starting at or before its last position. Masks are applied only to
  tiles holding padding slots (past `valid`) or crossing the diagonal; other tiles skip the select.
  K tiles never straddle pages (page_size % BLOCK_N == 0).
- Split-KV: when (blocks x kv heads) cannot fill the GPU (a 32-token question against 10K cached tokens
  at batch 1), the visible pages are split across grid axis 2; each split writes a normalised partial
  output and its log2-sum-exp, and a small kernel merges them. Split bounds snap to the nearest run start
  within half a split, so splits rarely straddle a segment (each straddle costs a rotation and a refill).
- Softmax in fp32 with exp2 (log2 e folded into the scale); bf16/fp16 dots accumulate in fp32, fp32 dots
  use ieee precision. Block sizes: an autotuned short list per dtype/head_dim, pruned by page size
  (`_TILES`); a fixed config under TRITON_INTERPRET.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

from lazyattn.kernels.paged import PagedBatch
from lazyattn.kernels.rope import RopeTables

_BLOCK_B = 128  # entries scanned per step when a program looks up its entry
_BLOCK_P = 256  # pages scanned per step (causal page count, run ends); deltas held in registers
_BLOCK_S = 64  # pages looked at around a split boundary to snap it to a run start
_MIN_KEYS_PER_SPLIT = 512  # below this a split's startup latency outweighs its work
_MAX_SPLITS = 32


@triton.jit
def _find_block(cu_seqlens_q, batch_size, slot, QB: tl.constexpr, BLOCK_B: tl.constexpr):
    """(entry, first query row) of grid slot `slot`; see the module docstring for the slot layout."""
    count = 0
    for lo in range(0, batch_size, BLOCK_B):
        b = lo + tl.arange(0, BLOCK_B)
        inside = b < batch_size
        first_slot = tl.load(cu_seqlens_q + b, mask=inside, other=0) // QB + b
        count += tl.sum(((first_slot <= slot) & inside).to(tl.int32), axis=0)
    entry = count - 1
    first_row = (slot - (tl.load(cu_seqlens_q + entry) // QB + entry)) * QB
    return entry, first_row


@triton.jit
def _count_pages(starts_row, n_pages, last_pos, BLOCK_P: tl.constexpr):
    """Pages whose first position is <= last_pos: `starts` is non-decreasing, so they are a prefix."""
    count = 0
    for lo in range(0, n_pages, BLOCK_P):
        i = lo + tl.arange(0, BLOCK_P)
        inside = i < n_pages
        start = tl.load(starts_row + i, mask=inside, other=0)
        count += tl.sum(((start <= last_pos) & inside).to(tl.int32), axis=0)
    return count


@triton.jit
def _run_end(deltas_row, begin, stop, delta, BLOCK_P: tl.constexpr):
    """First page in [begin, stop) whose delta differs from `delta`, else stop: the end of this run."""
    end = stop
    lo = begin
    while lo < end:
        i = lo + tl.arange(0, BLOCK_P)
        d = tl.load(deltas_row + i, mask=i < end, other=delta)
        end = tl.minimum(end, tl.min(tl.where(d != delta, i, end), axis=0))
        lo += BLOCK_P
    return end


@triton.jit
def _next_run(deltas_row, win, win_idx, win_end, page, page_hi, BLOCK_P: tl.constexpr):
    """(delta, end page) of the run starting at `page`. The program's first BLOCK_P deltas are held in
    registers (`win`), so finding a run costs no memory round trip unless the run leaves that window."""
    if page < win_end:
        delta = tl.sum(tl.where(win_idx == page, win, 0), axis=0)
        change = (win_idx > page) & (win_idx < win_end) & (win != delta)
        end = tl.min(tl.where(change, win_idx, win_end), axis=0)
    else:
        delta = tl.load(deltas_row + page)
        end = page + 1
    if end >= win_end:
        end = _run_end(deltas_row, tl.maximum(end, win_end), page_hi, delta, BLOCK_P)
    return delta, end


@triton.jit
def _snap_to_run(deltas_row, x, n_vis, reach, BLOCK_S: tl.constexpr):
    """Split boundary x moved to the nearest run start within `reach` pages (x itself if none): a split
    straddling a delta change costs one more Q rotation and pipeline refill."""
    i = x - BLOCK_S // 2 + tl.arange(0, BLOCK_S)
    near = (i > 0) & (i < n_vis) & (tl.abs(i - x) <= reach)
    d = tl.load(deltas_row + i, mask=near, other=0)
    d_prev = tl.load(deltas_row + i - 1, mask=near, other=0)
    # Distinct rank per candidate: by distance, the lower page first on a tie.
    rank = tl.where(near & (d != d_prev), 2 * tl.abs(i - x) - (i < x).to(tl.int32), 2 * BLOCK_S)
    best = tl.min(rank, axis=0)
    snapped = tl.sum(tl.where(rank == best, i, 0), axis=0)
    # An if, not tl.where: a loop bound computed straight from a reduction made triton 3.9 give up on
    # coalescing and pipelining the K/V loads of the loop (checked on the sm_90 TTGIR).
    if (x > 0) & (x < n_vis) & (best < 2 * BLOCK_S):  # noqa: SIM108 - must stay an scf.if
        bound = snapped
    else:
        bound = tl.minimum(x, n_vis)
    return bound


@triton.jit
def _derotated_q(q_rows, row_ok, cos_ptr, sin_ptr, delta, max_position,
                 HEAD_DIM: tl.constexpr, INTERLEAVED: tl.constexpr):
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
def _dot(a, b, acc, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # UPCAST: the triton 3.9 interpreter multiplies bf16 as raw uint16 bits; exact products in fp32 instead.
    if UPCAST:
        a, b = a.to(tl.float32), b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=DOT_PRECISION)


@triton.jit
def _attend_pages(acc, l_i, m_i, q, q_pos, q_first,
                  k_head, v_head, pages_row, valid_row, starts_row, page_lo, page_hi,
                  stride_kp, stride_ks, stride_vp, stride_vs, qk_scale,
                  HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Online-softmax accumulation over the K/V tiles of pages [page_lo, page_hi) (FlashAttention-2)."""
    TILES: tl.constexpr = PAGE_SIZE // BLOCK_N
    offs_n = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    for tile in range(page_lo * TILES, page_hi * TILES):
        i = tile // TILES
        first_slot = (tile % TILES) * BLOCK_N
        page = tl.load(pages_row + i).to(tl.int64)  # int64: page * stride overflows int32 on big pools
        n_valid = tl.load(valid_row + i)
        start = tl.load(starts_row + i)
        slot = first_slot + offs_n
        in_page = slot < n_valid
        # Masked loads: slots past `valid` may hold anything (NaN * 0 would poison the P @ V dot).
        k = tl.load(k_head + page * stride_kp + slot[:, None] * stride_ks + dims[None, :],
                    mask=in_page[:, None], other=0.0)
        v = tl.load(v_head + page * stride_vp + slot[:, None] * stride_vs + dims[None, :],
                    mask=in_page[:, None], other=0.0)
        qk = _dot(q, tl.trans(k), None, DOT_PRECISION, UPCAST)
        if (first_slot + BLOCK_N > n_valid) | (start + first_slot + BLOCK_N - 1 > q_first):
            visible = in_page[None, :] & ((start + slot)[None, :] <= q_pos[:, None])
            qk = tl.where(visible, qk, float("-inf"))
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
def _prefill_kernel(
    Q, K, V, Out, WsO, WsLse, Cos, Sin,
    cu_seqlens_q, q_start, pages, deltas, valid, starts, num_pages,
    batch_size, total_q, max_position,
    stride_qt, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
    stride_ot, stride_oh, stride_table, qk_scale,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    APPLY_DELTA: tl.constexpr, INTERLEAVED: tl.constexpr, SPLIT_KV: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    QB: tl.constexpr = BLOCK_M // GROUP  # query positions per block
    slot = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    entry, first_row = _find_block(cu_seqlens_q, batch_size, slot, QB, BLOCK_B)
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

    table = entry.to(tl.int64) * stride_table
    n_vis = _count_pages(starts + table, tl.load(num_pages + entry), q_last, BLOCK_P)
    if SPLIT_KV:
        per_split = tl.cdiv(n_vis, tl.num_programs(2))
        page_lo = _snap_to_run(deltas + table, split * per_split, n_vis, per_split // 2, BLOCK_S)
        page_hi = _snap_to_run(deltas + table, (split + 1) * per_split, n_vis, per_split // 2, BLOCK_S)
    else:
        page_lo = 0
        page_hi = n_vis

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    dims = tl.arange(0, HEAD_DIM)
    k_head = K + kv_head * stride_kh
    v_head = V + kv_head * stride_vh
    if APPLY_DELTA:
        win_idx = page_lo + tl.arange(0, BLOCK_P)
        win_end = tl.minimum(page_lo + BLOCK_P, page_hi)
        win = tl.load(deltas + table + win_idx, mask=win_idx < win_end, other=0)
        page = page_lo
        while page < page_hi:
            delta, run_end = _next_run(deltas + table, win, win_idx, win_end, page, page_hi, BLOCK_P)
            q = _derotated_q(q_rows, row_ok, Cos, Sin, delta, max_position, HEAD_DIM, INTERLEAVED)
            acc, l_i, m_i = _attend_pages(
                acc, l_i, m_i, q, q_pos, q_first, k_head, v_head, pages + table, valid + table,
                starts + table, page, run_end, stride_kp, stride_ks, stride_vp, stride_vs, qk_scale,
                HEAD_DIM, PAGE_SIZE, BLOCK_N, DOT_PRECISION, UPCAST)
            page = run_end
    else:
        q = tl.load(q_rows[:, None] + dims[None, :], mask=row_ok[:, None], other=0.0)
        acc, l_i, m_i = _attend_pages(
            acc, l_i, m_i, q, q_pos, q_first, k_head, v_head, pages + table, valid + table,
            starts + table, page_lo, page_hi, stride_kp, stride_ks, stride_vp, stride_vs, qk_scale,
            HEAD_DIM, PAGE_SIZE, BLOCK_N, DOT_PRECISION, UPCAST)

    if SPLIT_KV:
        # Partial result of this split: normalised output and log2-sum-exp (-inf when it saw no key).
        ws_row = (split * total_q + token) * (tl.num_programs(1) * GROUP) + head
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # m_i = -inf already marks an empty row
        tl.store(WsO + ws_row[:, None] * HEAD_DIM + dims[None, :], acc / l_safe[:, None], mask=row_ok[:, None])
        tl.store(WsLse + ws_row, m_i + tl.log2(l_safe), mask=row_ok)
    else:
        o = acc / l_i[:, None]
        out_rows = Out + token * stride_ot + head * stride_oh
        tl.store(out_rows[:, None] + dims[None, :], o.to(Out.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _combine_kernel(WsO, WsLse, Out, total_q, num_splits, stride_ot, stride_oh,
                    NUM_HEADS: tl.constexpr, HEADS_P2: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Merge the splits of one query row: out = sum_s 2^(lse_s - m) o_s / sum_s 2^(lse_s - m)."""
    token = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, HEADS_P2)
    dims = tl.arange(0, HEAD_DIM)
    mask = heads < NUM_HEADS
    m = tl.full([HEADS_P2], float("-inf"), tl.float32)
    for s in range(num_splits):
        m = tl.maximum(m, tl.load(WsLse + (s * total_q + token) * NUM_HEADS + heads, mask=mask,
                                  other=float("-inf")))
    m = tl.where(m == float("-inf"), 0.0, m)
    num = tl.zeros([HEADS_P2, HEAD_DIM], tl.float32)
    den = tl.zeros([HEADS_P2], tl.float32)
    for s in range(num_splits):
        row = (s * total_q + token) * NUM_HEADS + heads
        w = tl.exp2(tl.load(WsLse + row, mask=mask, other=float("-inf")) - m)
        o = tl.load(WsO + row[:, None] * HEAD_DIM + dims[None, :], mask=mask[:, None], other=0.0)
        num += w[:, None] * o
        den += w
    out = num / den[:, None]
    ptrs = Out + token * stride_ot + heads[:, None] * stride_oh + dims[None, :]
    tl.store(ptrs, out.to(Out.dtype.element_ty), mask=mask[:, None])


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# Autotune candidates (BLOCK_M, BLOCK_N, num_warps, num_stages) per dtype / head_dim; BLOCK_N is capped at
# the page size. num_stages: the page-id load takes one pipeline stage of its own, so K/V tiles are only
# prefetched num_stages - 3 tiles ahead (measured on the sm_90 TTGIR: 3 -> 1 tile, 5 -> 2 tiles).
_TILES = {
    "16bit": [(128, 64, 8, 5), (128, 64, 8, 3), (64, 64, 4, 5), (128, 128, 8, 3)],
    "16bit_d256": [(64, 64, 8, 3), (64, 32, 4, 3)],
    "fp32": [(32, 32, 4, 2), (64, 32, 4, 2)],  # ieee dots run on FMA units: small tiles
}


def _candidates(fp32: bool, head_dim: int, group: int, page_size: int) -> list[triton.Config]:
    family = "fp32" if fp32 else "16bit_d256" if head_dim > 128 else "16bit"
    configs = {}
    for block_m, block_n, warps, stages in _TILES[family]:
        # The M tile must hold at least one position of the whole head group.
        tile = (max(block_m, _next_pow2(group)), min(block_n, page_size), warps, stages)
        configs[tile] = triton.Config({"BLOCK_M": tile[0], "BLOCK_N": tile[1]}, num_warps=warps, num_stages=stages)
    return list(configs.values())


def _prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """The candidate list of this call's dtype, head_dim, head group and page size."""
    args = {**named_args, **kwargs}
    return _candidates(args["Q"].dtype == torch.float32, args["HEAD_DIM"], args["GROUP"], args["PAGE_SIZE"])


_prefill_tuned = triton.autotune(
    configs=_candidates(False, 128, 1, 64),  # replaced per call by _prune
    key=["HEAD_DIM", "GROUP", "PAGE_SIZE", "APPLY_DELTA", "INTERLEAVED", "SPLIT_KV"],
    prune_configs_by={"early_config_prune": _prune},
)(_prefill_kernel)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=8)
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _default_splits(q: torch.Tensor, batch: PagedBatch, group: int, kv_heads: int) -> int:
    """Split the KV walk only when (query blocks x kv heads) leaves the GPU mostly idle."""
    if not q.is_cuda or _interpreting():
        return 1
    block_positions = max(1, 128 // group)
    programs = (triton.cdiv(q.shape[0], block_positions) + batch.batch_size - 1) * kv_heads
    sms = _num_sms(q.device)
    if programs >= sms:
        return 1
    by_length = max(1, batch.max_kv // _MIN_KEYS_PER_SPLIT)
    return max(1, min(triton.cdiv(2 * sms, programs), by_length, _MAX_SPLITS))


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch,
                      tables: RopeTables | None, scale: float, *, apply_delta: bool = True,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """Paged causal attention with per-page delta, same semantics as `reference.paged_attention`.

    q [total_q, Hq, D] packed by `batch.cu_seqlens_q`, rotated at its logical positions; k_cache/v_cache
    [num_pages, page_size, Hkv, D] (strided views of the pool are fine). Returns out [total_q, Hq, D] in
    q's dtype (written into `out` when given). `tables=None` or `apply_delta=False` ignores the deltas
    (exact when they are all 0; apply_delta=False is the no-deferred-RoPE baseline of the benchmarks).
    """
    return _launch(q, k_cache, v_cache, batch, tables, scale, apply_delta=apply_delta, out=out)


def _launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch,
            tables: RopeTables | None, scale: float, *, apply_delta: bool = True,
            out: torch.Tensor | None = None, num_splits: int | None = None,
            config: tuple[int, int] | None = None) -> torch.Tensor:
    """prefill_attention with the split count and (BLOCK_M, BLOCK_N) forced: for tests and benchmarks."""
    tables = tables if apply_delta else None
    _check_inputs(q, k_cache, v_cache, tables, batch, out)
    out = torch.empty_like(q) if out is None else out
    total_q, q_heads, head_dim = q.shape
    kv_heads, group = k_cache.shape[2], q_heads // k_cache.shape[2]
    if total_q == 0 or batch.batch_size == 0:
        return out
    q = q if q.stride(-1) == 1 else q.contiguous()
    splits = num_splits or _default_splits(q, batch, group, kv_heads)
    ws_o = ws_lse = out  # placeholders, unused unless split
    if splits > 1:
        ws_o = torch.empty(splits, total_q, q_heads, head_dim, dtype=torch.float32, device=q.device)
        ws_lse = torch.empty(splits, total_q, q_heads, dtype=torch.float32, device=q.device)
    args, consts = _kernel_args(q, k_cache, v_cache, batch, tables, scale, out, ws_o, ws_lse, splits)

    def grid(meta: dict) -> tuple[int, int, int]:
        return (total_q // (meta["BLOCK_M"] // group) + batch.batch_size, kv_heads, splits)

    if config is None and not _interpreting():
        _prefill_tuned[grid](*args, **consts)
    else:
        block_m, block_n = config or (max(64, _next_pow2(group)), min(k_cache.shape[1], 64))
        _prefill_kernel[grid](*args, **consts, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4, num_stages=2)
    if splits > 1:
        _combine_kernel[(total_q,)](ws_o, ws_lse, out, total_q, splits, out.stride(0), out.stride(1),
                                    NUM_HEADS=q_heads, HEADS_P2=_next_pow2(q_heads), HEAD_DIM=head_dim)
    return out


def _kernel_args(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch,
                 tables: RopeTables | None, scale: float, out: torch.Tensor, ws_o: torch.Tensor,
                 ws_lse: torch.Tensor, splits: int) -> tuple[tuple, dict]:
    """Positional arguments and constexprs of _prefill_kernel (block sizes aside)."""
    cos, sin = (tables.cos.contiguous(), tables.sin.contiguous()) if tables is not None else (q, q)
    args = (
        q, k_cache, v_cache, out, ws_o, ws_lse, cos, sin,
        batch.cu_seqlens_q, batch.q_start, batch.pages, batch.deltas, batch.valid, batch.starts,
        batch.num_pages, batch.batch_size, q.shape[0], cos.shape[0] if tables is not None else 0,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
        batch.pages.stride(0), scale * math.log2(math.e),
    )
    consts = dict(
        GROUP=q.shape[1] // k_cache.shape[2], HEAD_DIM=q.shape[2], PAGE_SIZE=k_cache.shape[1],
        APPLY_DELTA=tables is not None, INTERLEAVED=tables is not None and tables.interleaved,
        SPLIT_KV=splits > 1, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        UPCAST=_interpreting() and q.dtype == torch.bfloat16,
        BLOCK_B=_BLOCK_B, BLOCK_P=_BLOCK_P, BLOCK_S=_BLOCK_S,
    )
    return args, consts


def _check_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: RopeTables | None,
                  batch: PagedBatch, out: torch.Tensor | None) -> None:
    if not q.is_cuda and not _interpreting():
        raise RuntimeError("the Triton prefill kernel needs CUDA tensors (or TRITON_INTERPRET=1 on a CPU)")
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(f"expected q [T, Hq, D] and k/v caches [pages, page_size, Hkv, D], got "
                         f"{tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    head_dim, page_size, kv_heads = q.shape[2], k_cache.shape[1], k_cache.shape[2]
    if k_cache.shape[3] != head_dim or q.shape[1] % kv_heads:
        raise ValueError(f"q {tuple(q.shape)} does not fit the caches {tuple(k_cache.shape)} (GQA needs Hq % Hkv == 0)")
    if head_dim & (head_dim - 1) or not 16 <= head_dim <= 256:
        raise ValueError(f"prefill kernel needs a power-of-two head_dim in [16, 256], got {head_dim}")
    if page_size & (page_size - 1) or page_size < 16:
        raise ValueError(f"prefill kernel needs a power-of-two page_size >= 16, got {page_size}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k/v caches must be contiguous along head_dim")
    if tables is not None and (tables.cos.shape[1] != head_dim // 2 or tables.cos.dtype != torch.float32
                               or tables.cos.device != q.device):
        raise ValueError(f"RoPE tables must be fp32 [max_position, {head_dim // 2}] on {q.device}, got "
                         f"{tables.cos.dtype} {tuple(tables.cos.shape)} on {tables.cos.device}")
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1):
        raise ValueError(f"out must be {q.dtype} {tuple(q.shape)} and contiguous along head_dim, got "
                         f"{out.dtype} {tuple(out.shape)}")
    if any(t.stride(1) != 1 or t.stride(0) != batch.pages.stride(0)
           for t in (batch.pages, batch.deltas, batch.valid, batch.starts)):
        raise ValueError("PagedBatch tables must be contiguous [B, P] int32 tensors of one shape")
