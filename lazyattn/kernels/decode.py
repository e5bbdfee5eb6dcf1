"""Triton decode attention: split-KV (flash-decoding), GQA-aware, with deferred RoPE (per-page delta).

Contract: kernels/paged.py, with one query row per entry. Ground truth: reference.paged_attention.

Deferred RoPE: a key in a page of delta Δ is scored against the query de-rotated by -Δ (the derivation,
and the elementwise rotation with a partner-channel load, are in kernels/prefill.py, "Deferred RoPE").
Pages come in runs of equal Δ (one run per segment), so a program keeps the original query in registers and
rebuilds the de-rotated copy only when Δ changes from one page to the next: one scalar compare per page,
one [G, D] rotation per segment.

Work split. Grid = (split, kv head, entry). Each program takes one kv head and the whole group of
G = Hq/Hkv query heads that share it, so every K/V tile is read from memory exactly once. Scores and the
P·V product are tl.dot with the query group padded to >= 16 rows: decode does ~2G flops per KV element,
so the padded tensor-core work is free, and tl.dot operands let Triton stage K/V tiles through shared
memory with asynchronous copies (num_stages tiles in flight), which is what reaches copy bandwidth.
(Broadcast-multiply + tl.sum would hold a [G, BLOCK_N, D] product in registers and spill for G >= 4.)
Each entry's pages are cut into num_splits contiguous page ranges; a program walks its range in tiles of
BLOCK_N slots (BLOCK_N divides page_size, so a tile never straddles pages) with an online softmax in
fp32 and exp2, and writes an unnormalised partial (acc, running max m, running sum l) to fp32 scratch.
The last split of an (entry, kv head) to finish merges them (an arrival counter per (entry, kv head),
ArrivalCounters), so a step is one launch; its partials are G x D floats per split, and every head's come in
one load (the merger is the kernel's last program: its round trips are the kernel's tail).
With one split the program normalises and writes directly. How many splits: split_rule, per entry, inside the
kernel (a CUDA graph is captured with the grid of its longest context, and replays short ones with few splits:
the programs past an entry's count return at once).

Copy-engine tiles (DecodeConfig.tma, decode_config's rule: on Hopper, below two programs per SM): K and V tiles
come by tensor-descriptor loads (tile_descriptors) instead of per-thread asynchronous copies, which take away the
copies' address and mask arithmetic (a third of the tile loop's instructions are integer work; one warp per
scheduler at batch 1 issues every ~7 cycles, so instructions are time). Such a load reads page padding too, which
the contract lets hold NaN: masked scores are -inf whatever K holds, and a tile with masked slots takes its P·V
again over masked per-thread loads of V. Measured on an H100 against per-thread copies, they are faster at batch 8
and 32 and at batch 1 over 10K keys (docs/benchmarks.md, "Kernel constants").

Programmatic dependent launch (kernels/launch.py): the page count, the split's page range, the query position, the
first page id, and the deltas of the split's first and last pages with their cos/sin rows are the host's tables
(kernels/paged.py, rope.py), read before the wait, while the kernel before this one finishes; q and the step's own
keys, the RoPE launch's writes, after it. The wait placed after those loads, with the one-load merge, shortened a
layer at batch 1 over 10K keys on an H100. Reading the rotation rows before the wait rather than in the loop gives
the same bits and a decode step over the cached documents no slower (docs/benchmarks.md, "Kernel constants").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lazyattn import envs
from lazyattn.kernels.decode_tiles import (
    NEG_BIG,
    TL_DTYPES,
    derotate,
    load_mask,
    masked_tile,
    merge_group,
    pair_layout,
    rotate,
    rotation_rows,
    softmax_tile,
    v_tile,
)
from lazyattn.kernels.kv_dtype import check_dtypes, is_fp8, tile_dtype
from lazyattn.kernels.launch import (
    LOG2E,
    hopper_or_later,
    interpreting,
    pdl_options,
    sm_count,
    wait_for_producers,
)
from lazyattn.kernels.paged import PagedBatch, cdiv, v_transposed
from lazyattn.kernels.rope import RopeTables

# Batch-1 decode takes one program per SM while its splits stay this short (pages); see split_rule.
_SHORT_SPLIT_PAGES = 16
# The merge loads (query head, split) partials this many at a time: 64 rows of 128 fp32 are 64 registers a thread.
_MERGE_ROWS = 64


@dataclass(frozen=True)
class DecodeConfig:
    block_n: int  # key slots per tile; divides page_size
    num_warps: int
    num_stages: int
    maxnreg: int | None = None  # register cap per thread (ptxas .maxnreg); None leaves it to the compiler
    # Tiles by copy-engine loads where the caches' strides allow it (tile_descriptors): 1 K, 2 K and V (3: K and V
    # with page padding left in V, wrong where it holds NaN: only for probing); 0 per-thread copies.
    tma: int = 0


def decode_config(
    head_dim: int,
    dtype: torch.dtype,
    page_size: int,
    programs_per_sm: float = 0.0,
    copy_engine: bool = False,
    v_transposed: bool = False,
) -> DecodeConfig:
    """Launch config per (head_dim, dtype, page_size) and grid size (programs per SM).

    Tiles of up to 16 KiB for K and as much for V (64 rows of 128 bf16 channels), and enough stages that
    a program has ~64 KiB of K/V buffers (2 to 4 tile pairs; num_stages = buffers + 1): at d=128 bf16,
    page 64 that is 68 KiB of shared memory, so three programs share an SM, each loading one tile pair
    while it computes on another: several times what Little's law asks to saturate HBM. Smaller pages give
    smaller tiles and deeper pipelines. From two programs per SM on, one more buffer (two programs fit per
    SM): a grid of 512 programs then runs in two even waves instead of 1.3 (more bandwidth on an H200 at batch
    64, the same at batch 8 and 32: docs/benchmarks.md, "Kernel constants"). Three programs of 128 threads need
    <= 168 registers each: Triton 3.9 gets there by itself for sm_90, Triton 3.6 takes 176-183 unless capped (capped,
    16-bit, d <= 128: at most 8 bytes of spills; d=256 would spill more, so it is left uncapped).

    copy_engine (a Hopper GPU, LAZYATTN_DECODE_TMA not 0): below two programs per SM (FP8 pages: always), K and V
    tiles come by copy-engine loads (tma=2): on an H100 they beat per-thread copies at batch 8 and 32 x 4K and at
    batch 1 x 10K after a RoPE launch (docs/benchmarks.md, "Kernel constants"). With four programs per SM (64 x 2K)
    they measured equal over 16-bit pages, and V's partial-tile buffer (82 KiB of shared memory in all at pages of
    64) leaves room for two programs per SM instead of three, so larger grids over 16-bit pages keep per-thread
    copies. FP8 tiles are half the bytes: there copy-engine loads won at every grid measured (H200, batch 8-64).

    v_transposed (V's pages stored transposed, as the pool stores FP8 pages' V: paged.v_transposed): over FP8 pages,
    three stages, the fastest or within 2 % of five and seven at every shape measured on an H200 (docs/benchmarks.md,
    "Kernel constants").
    """
    row_bytes = head_dim * torch.tensor([], dtype=dtype).element_size()
    block_n = max(16, min(page_size, 16384 // row_bytes))
    block_n = 1 << (block_n.bit_length() - 1)
    buffers = min(4, max(2, 65536 // (2 * block_n * row_bytes)))
    if programs_per_sm >= 2:
        buffers = min(4, buffers + 1)
    cap = 168 if head_dim <= 128 and row_bytes == 2 * head_dim else None
    tma = 2 if copy_engine and (programs_per_sm < 2 or is_fp8(dtype)) else 0
    if is_fp8(dtype) and v_transposed:
        return DecodeConfig(block_n=block_n, num_warps=4, num_stages=3, maxnreg=cap, tma=tma)
    return DecodeConfig(block_n=block_n, num_warps=4, num_stages=buffers + 1, maxnreg=cap, tma=tma)


class ArrivalCounters:
    """Zeroed int32 counters for the fused split merge, kept by whoever launches decode steps (TritonBackend).

    One buffer per (device, stream), reused by every launch: a kernel that counts on a counter sets it back
    to zero before it exits. Per stream, because kernels on two streams may run at the same time. A buffer
    that grows too small is replaced but kept as long as its owner: a CUDA graph captured with it keeps
    using it.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[torch.device, int], torch.Tensor] = {}
        self._outgrown: list[torch.Tensor] = []

    def get(self, device: torch.device, n: int) -> torch.Tensor:
        """At least n zeroed counters for launches on the current stream of `device`."""
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        buf = self._buffers.get((device, stream))
        if buf is None or buf.numel() < n:
            if buf is not None:
                self._outgrown.append(buf)
            size = max(n, 4096, 0 if buf is None else 2 * buf.numel())
            buf = self._buffers[(device, stream)] = torch.zeros(size, dtype=torch.int32, device=device)
        return buf


@dataclass(frozen=True)
class SplitRule:
    """How many splits an entry of n pages takes. The launcher sizes the grid with it for the batch's longest
    entry (or, in a CUDA graph, the longest one the graph allows) and the kernel applies it again to each
    entry's own page count (`_entry_splits`): a graph captured for long contexts replays a short one with
    the few splits that suit it, and every program past an entry's count exits at once. Eager and graph
    launches therefore split every entry the same way, so they give the same bits."""

    cap: int  # at most this many splits per entry
    short_pages: int  # entries of at most this many pages ...
    short_cap: int  # ... take at most this many (one program per SM); short_pages = -1: no such entries
    min_pages: int  # each split walks at least this many pages

    @staticmethod
    def fixed(num_splits: int) -> SplitRule:
        """Every entry cut into num_splits page ranges (fewer only where it has fewer pages)."""
        return SplitRule(cap=num_splits, short_pages=-1, short_cap=num_splits, min_pages=1)

    def unrounded(self, n_pages: int) -> int:
        """The split count before rounding to splits that get pages: never decreases with n_pages, so the
        value at the longest entry bounds every entry's (the grid)."""
        n = max(1, min(self.cap, n_pages // self.min_pages))
        return min(n, self.short_cap) if n_pages <= self.short_pages else n

    def splits(self, n_pages: int) -> int:
        """The splits an entry of n_pages really takes: page ranges of cdiv(n_pages, unrounded) pages."""
        n_pages = max(1, n_pages)
        return cdiv(n_pages, cdiv(n_pages, self.unrounded(n_pages)))


@functools.lru_cache(maxsize=256)  # eager launches ask once per layer with the same few shapes
def split_rule(
    batch_size: int, kv_heads: int, sm_count: int, programs_per_sm: int = 2, min_pages_per_split: int = 4
) -> SplitRule:
    """Splits per entry: about programs_per_sm programs per SM, in one wave.

    Decode is bandwidth bound: what costs is too few programs (too little in flight) or a ragged wave
    (some SMs run one program more than others). Two resident programs per SM keep enough loads in flight
    (decode_config); on an H200 at batch 8 x 4K-32K, 4 splits (256 programs) beat 5 and 6 (docs/benchmarks.md,
    "Kernel constants").
    Each split walks at least min_pages_per_split pages so its pipeline fills. Splits are page-granular, so
    the count is rounded down to the number that really get pages.

    A handful of (entry, kv head) pairs (batch 1-2) over a context that one program per SM covers in short
    splits (at most _SHORT_SPLIT_PAGES pages each) takes one program per SM. Measured on an H100 at batch 1 over
    10K keys, 16 splits beat 20, 24 and 33 (two per SM), each larger count slower
    (docs/benchmarks.md, "Kernel constants"): each program's fixed cost (prologue, partial store, merge) outweighs
    the overlap a second program per SM buys. Longer contexts
    (not measured against this) keep two per SM.
    """
    base = max(1, batch_size * kv_heads)
    per_sm_one = sm_count // base
    short = base <= sm_count // 8
    return SplitRule(
        cap=max(1, sm_count * programs_per_sm // base),
        short_pages=_SHORT_SPLIT_PAGES * per_sm_one if short else -1,
        short_cap=max(1, per_sm_one),
        min_pages=min_pages_per_split,
    )


def pick_num_splits(
    batch_size: int,
    kv_heads: int,
    max_pages: int,
    sm_count: int,
    programs_per_sm: int = 2,
    min_pages_per_split: int = 4,
) -> int:
    """The splits split_rule gives an entry of max_pages pages.
    H100/H200 (132 SMs), 8 kv heads, pages of 64: batch 1 x 10K -> 16 splits, 1 x 32K -> 32, 8 x 4K -> 4,
    32 x 4K -> 1."""
    return split_rule(batch_size, kv_heads, sm_count, programs_per_sm, min_pages_per_split).splits(max_pages)


# ---------------------------------------------------------------------------------------------------
# kernels


@triton.jit
def _decode_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    k_desc,
    v_desc,
    out_ptr,
    acc_ptr,
    m_ptr,
    l_ptr,
    counters_ptr,
    pages_ptr,
    deltas_ptr,
    valid_ptr,
    starts_ptr,
    firsts_ptr,
    ape_ptr,
    num_pages_ptr,
    q_start_ptr,
    cos_ptr,
    sin_ptr,
    stride_qb,
    stride_qh,
    stride_kp,
    stride_kt,
    stride_kh,
    stride_vp,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_ob,
    stride_oh,
    stride_pages,
    stride_deltas,
    stride_valid,
    stride_starts,
    stride_firsts,
    ape_gap,
    stride_tab,
    qk_scale,
    num_splits,
    min_pages,
    short_pages,
    short_cap,
    HQ: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TILES_PER_PAGE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_S: tl.constexpr,
    APPLY_DELTA: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    DIRECT: tl.constexpr,
    DOT_TY: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_FIRST: tl.constexpr,
    HAS_APE: tl.constexpr,
    TMA: tl.constexpr,
    V_T: tl.constexpr,
    USE_PDL: tl.constexpr,
    TILE_TY: tl.constexpr,
):
    split = tl.program_id(0)
    kv_head = tl.program_id(1)
    entry = tl.program_id(2).to(tl.int64)

    # This entry's split count (SplitRule, evaluated on its own pages; at most the grid's num_splits) and
    # this program's contiguous page range [page_lo, page_hi). Programs past the count have nothing to do.
    # The page tables are the host's (no kernel of the step writes them): read before the PDL wait, in
    # _decode_split, while the kernel before this one finishes.
    n_pages = tl.load(num_pages_ptr + entry)
    splits = _entry_splits(n_pages, num_splits, min_pages, short_pages, short_cap)
    if split < splits:
        _decode_split(
            q_ptr,
            k_ptr,
            v_ptr,
            k_desc,
            v_desc,
            out_ptr,
            acc_ptr,
            m_ptr,
            l_ptr,
            counters_ptr,
            pages_ptr,
            deltas_ptr,
            valid_ptr,
            starts_ptr,
            firsts_ptr,
            ape_ptr,
            q_start_ptr,
            cos_ptr,
            sin_ptr,
            stride_qb,
            stride_qh,
            stride_kp,
            stride_kt,
            stride_kh,
            stride_vp,
            stride_vt,
            stride_vh,
            stride_vd,
            stride_ob,
            stride_oh,
            stride_pages,
            stride_deltas,
            stride_valid,
            stride_starts,
            stride_firsts,
            ape_gap,
            stride_tab,
            qk_scale,
            num_splits,
            split,
            kv_head,
            entry,
            n_pages,
            splits,
            HQ,
            GROUP,
            HEAD_DIM,
            BLOCK_G,
            BLOCK_D,
            BLOCK_N,
            TILES_PER_PAGE,
            BLOCK_H,
            BLOCK_S,
            APPLY_DELTA,
            INTERLEAVED,
            DIRECT,
            DOT_TY,
            DOT_PRECISION,
            HAS_FIRST,
            HAS_APE,
            TMA,
            V_T,
            USE_PDL,
            TILE_TY,
        )


@triton.jit
def _entry_splits(n_pages, num_splits, min_pages, short_pages, short_cap):
    """SplitRule.splits for one entry, capped by the grid (the same integer arithmetic as the Python)."""
    n = tl.maximum(tl.minimum(num_splits, n_pages // min_pages), 1)
    n = tl.where(n_pages <= short_pages, tl.minimum(n, short_cap), n)
    pages = tl.maximum(n_pages, 1)
    return tl.cdiv(pages, tl.cdiv(pages, n))


@triton.jit
def _decode_split(
    q_ptr,
    k_ptr,
    v_ptr,
    k_desc,
    v_desc,
    out_ptr,
    acc_ptr,
    m_ptr,
    l_ptr,
    counters_ptr,
    pages_ptr,
    deltas_ptr,
    valid_ptr,
    starts_ptr,
    firsts_ptr,
    ape_ptr,
    q_start_ptr,
    cos_ptr,
    sin_ptr,
    stride_qb,
    stride_qh,
    stride_kp,
    stride_kt,
    stride_kh,
    stride_vp,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_ob,
    stride_oh,
    stride_pages,
    stride_deltas,
    stride_valid,
    stride_starts,
    stride_firsts,
    ape_gap,
    stride_tab,
    qk_scale,
    num_splits,
    split,
    kv_head,
    entry,
    n_pages,
    splits,
    HQ: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TILES_PER_PAGE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_S: tl.constexpr,
    APPLY_DELTA: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    DIRECT: tl.constexpr,
    DOT_TY: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_FIRST: tl.constexpr,
    HAS_APE: tl.constexpr,
    TMA: tl.constexpr,
    V_T: tl.constexpr,
    USE_PDL: tl.constexpr,
    TILE_TY: tl.constexpr,
):
    """One program's split of one (entry, kv head): its pages' online softmax, then the partial's store and
    the merge by the last split, or the normalised output where the entry takes one split."""
    per_split = tl.cdiv(n_pages, splits)
    page_lo = split * per_split
    page_hi = tl.minimum(page_lo + per_split, n_pages)
    # Causal bound of the contract: the query sees logical positions <= its own (all keys, in decode).
    q_pos = tl.load(q_start_ptr + entry)
    t_lo = page_lo * TILES_PER_PAGE
    t_hi = page_hi * TILES_PER_PAGE
    page_next = tl.load(pages_ptr + entry * stride_pages + page_lo, mask=page_lo < page_hi, other=0)
    k_base = k_ptr + kv_head.to(tl.int64) * stride_kh
    v_base = v_ptr + kv_head.to(tl.int64) * stride_vh
    # With TMA the caches are seen as rows of stride_kt elements (tile_descriptors): the kv head's offset falls
    # into whole rows (head-major pages) or into the columns of one row (token-major pages).
    head_row = (kv_head * stride_kh) // stride_kt
    head_col = (kv_head * stride_kh) % stride_kt
    rows_per_page = stride_kp // stride_kt
    # V pages stored transposed (V_T: a page's slots contiguous for each kv head and channel) are seen as rows of
    # stride_vd slots, one row per (page, kv head, channel).
    v_head_row = (kv_head * stride_vh) // stride_vd
    v_rows_per_page = stride_vp // stride_vd
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    d_mask = d < HEAD_DIM
    if APPLY_DELTA:
        # The deltas of the split's first and last pages and their cos/sin rows. A split holds one document or the
        # end of one and the start of the next, so these two rotations are all most programs need (a third delta,
        # from documents shorter than a split, loads its rows in the loop). Loaded in the loop, each was a round trip
        # to L2 on the program's critical path.
        partner, pair, sign = pair_layout(HEAD_DIM, BLOCK_D, INTERLEAVED)
        has_pages = page_lo < page_hi
        delta_lo = tl.load(deltas_ptr + entry * stride_deltas + page_lo, mask=has_pages, other=0)
        delta_hi = tl.load(deltas_ptr + entry * stride_deltas + page_hi - 1, mask=has_pages, other=0)
        cos_lo, sin_lo = rotation_rows(cos_ptr, sin_ptr, stride_tab, delta_lo, pair, sign, d_mask)
        cos_hi, sin_hi = rotation_rows(cos_ptr, sin_ptr, stride_tab, delta_hi, pair, sign, d_mask)
    # Everything above reads the host's tables only; q and this step's keys are the earlier kernels' writes.
    wait_for_producers(USE_PDL)

    heads = kv_head * GROUP + g
    g_mask = g < GROUP
    q_mask = g_mask[:, None] & d_mask[None, :]
    q_rows = q_ptr + entry * stride_qb + heads[:, None].to(tl.int64) * stride_qh
    q = tl.load(q_rows + d[None, :], mask=q_mask, other=0.0).to(tl.float32)
    # The tiles' dtype once loaded: q's, which is the cache's or wider (bf16 pages under an fp32 model), or for FP8
    # pages float16 under a 16-bit q (kv_dtype.fp8_tile_dtype): q and P are rounded to it for the dots, never to the
    # narrower page dtype.
    kv_ty = TILE_TY
    # q is rotated for delta 0 already: pages of other deltas trigger the de-rotation, the first page's here.
    q_dot = q.to(kv_ty).to(DOT_TY)
    cur_delta = tl.full([], 0, tl.int32)
    if APPLY_DELTA:
        q_partner = tl.load(q_rows + partner[None, :], mask=q_mask, other=0.0).to(tl.float32)
        q_dot = rotate(q, q_partner, cos_lo, sin_lo).to(kv_ty).to(DOT_TY)
        cur_delta = delta_lo

    m_i = tl.full([BLOCK_G], NEG_BIG, tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    # The next tile's page id is loaded one iteration ahead (a loop-carried scalar). Loaded in the same
    # iteration, it makes the K/V loads "indirect" and Triton's pipeliner then gives them one buffer
    # (no overlap of load and compute within a program); carried, they get num_stages - 1 buffers.
    # The other per-page metadata is scalar loads from small rows that stay in L1.
    for t in range(t_lo, t_hi):
        p = t // TILES_PER_PAGE
        page = page_next.to(tl.int64)
        p_next = (t + 1) // TILES_PER_PAGE
        page_next = tl.load(pages_ptr + entry * stride_pages + p_next, mask=t + 1 < t_hi, other=0)
        n_keys = tl.minimum(
            tl.load(valid_ptr + entry * stride_valid + p),
            q_pos + 1 - tl.load(starts_ptr + entry * stride_starts + p),
        )
        if APPLY_DELTA:
            delta = tl.load(deltas_ptr + entry * stride_deltas + p)
            if delta != cur_delta:
                if delta == delta_hi:
                    q_dot = rotate(q, q_partner, cos_hi, sin_hi).to(kv_ty).to(DOT_TY)
                else:
                    q_dot = (
                        derotate(q, q_partner, cos_ptr, sin_ptr, stride_tab, delta, pair, sign, d_mask)
                        .to(kv_ty)
                        .to(DOT_TY)
                    )
                cur_delta = delta
        slot = (t % TILES_PER_PAGE) * BLOCK_N + n
        if HAS_FIRST:
            # keys in slots [first, first + valid), at logical positions starts + slot - first
            first = tl.load(firsts_ptr + entry * stride_firsts + p)
            key_mask = (slot >= first) & (slot < first + n_keys)
        else:
            key_mask = slot < n_keys
        tile_mask = load_mask(key_mask, d_mask, HEAD_DIM, BLOCK_D)
        if TMA >= 1:
            # K by one copy-engine load per tile (no per-thread addresses or masks). It reads the whole tile,
            # page padding too, which may hold anything (NaN included): harmless, masked scores are -inf
            # whatever K holds.
            row = (page * rows_per_page + head_row).to(tl.int32) + (t % TILES_PER_PAGE) * BLOCK_N
            k = k_desc.load([row, head_col]).to(kv_ty)
        else:
            k = masked_tile(k_base, page, stride_kp, slot, stride_kt, d, tile_mask).to(kv_ty)
        if TMA >= 2 and V_T:
            # [channels, slots] rows: K-major as the P·V product's second operand, so an FP8 tile reaches
            # registers by matrix loads rather than byte by byte (docs/design.md, "FP8 KV cache").
            v_row = (page * v_rows_per_page + v_head_row).to(tl.int32)
            v = tl.trans(v_desc.load([v_row, (t % TILES_PER_PAGE) * BLOCK_N])).to(kv_ty)
        elif TMA >= 2:
            v = v_desc.load([row, head_col]).to(kv_ty)
        else:
            v = v_tile(
                v_base, page, stride_vp, slot, stride_vt, d, stride_vd, key_mask, d_mask, kv_ty, V_T, HEAD_DIM, BLOCK_D
            )
        pv, p_dot, alpha, l_i, m_new = softmax_tile(
            q_dot,
            k,
            v,
            key_mask,
            ape_ptr + entry * stride_firsts + p,
            ape_gap,
            qk_scale,
            m_i,
            l_i,
            HAS_APE,
            DOT_TY,
            DOT_PRECISION,
        )
        if TMA == 2:
            # V by the copy engine holds the page padding too, and 0 x NaN is NaN: a tile with masked slots takes
            # the product again over V read by masked per-thread loads (from L2: the copy engine just brought it).
            # Whole tiles (nearly all) multiply V as it landed; the unconditional first product keeps V in Triton's
            # pipelined buffers. (TMA == 3, a probe's, leaves the padding in.)
            slot0 = (t % TILES_PER_PAGE) * BLOCK_N
            if HAS_FIRST:  # noqa: SIM108 (a compile-time branch reads clearer in a kernel)
                whole = (slot0 >= first) & (slot0 + BLOCK_N <= first + n_keys)
            else:
                whole = slot0 + BLOCK_N <= n_keys
            if not whole:
                v_masked = v_tile(
                    v_base,
                    page,
                    stride_vp,
                    slot,
                    stride_vt,
                    d,
                    stride_vd,
                    key_mask,
                    d_mask,
                    kv_ty,
                    V_T,
                    HEAD_DIM,
                    BLOCK_D,
                )
                pv = tl.dot(p_dot, v_masked.to(DOT_TY), input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    if DIRECT or splits == 1:
        # One split: normalise here and skip the merge. l_i is 0 only for an entry without keys, which
        # the contract excludes; writing 0 there beats writing NaN.
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_rows = out_ptr + entry * stride_ob + heads[:, None].to(tl.int64) * stride_oh
        tl.store(o_rows + d[None, :], out.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        # Scratch [B, Hq, num_splits] (+ [D]) fp32, contiguous.
        row = (entry * HQ + heads) * num_splits + split
        tl.store(m_ptr + row, m_i, mask=g_mask)
        tl.store(l_ptr + row, l_i, mask=g_mask)
        tl.store(acc_ptr + row[:, None] * HEAD_DIM + d[None, :], acc, mask=q_mask)
        # The last split of this (entry, kv head) to finish merges them all, so no second launch. The
        # barrier puts every thread's stores before the counter's release; the merger resets the counter.
        tl.debug_barrier()
        counter = counters_ptr + entry * tl.num_programs(1) + kv_head
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == splits - 1:
            merge_group(
                acc_ptr,
                m_ptr,
                l_ptr,
                (entry * HQ + kv_head * GROUP) * num_splits,
                num_splits,
                splits,
                out_ptr + entry * stride_ob + (kv_head * GROUP).to(tl.int64) * stride_oh,
                stride_oh,
                GROUP,
                HEAD_DIM,
                BLOCK_H,
                BLOCK_S,
                BLOCK_D,
            )
            tl.store(counter, 0)


def _check(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: PagedBatch,
    tables: RopeTables | None,
    out: torch.Tensor | None,
) -> None:
    b, hq, d = q.shape
    if batch.batch_size != b:
        raise ValueError(f"decode takes one query row per entry: q has {b} rows, batch {batch.batch_size}")
    if k_cache.shape != v_cache.shape or k_cache.shape[-1] != d or hq % k_cache.shape[2]:
        raise ValueError(
            f"q {tuple(q.shape)} does not fit caches {tuple(k_cache.shape)} / "
            f"{tuple(v_cache.shape)}: head_dim must match and Hq be a multiple of Hkv"
        )
    check_dtypes(q, k_cache, v_cache)
    if k_cache.stride(-1) != 1 or not (v_cache.stride(-1) == 1 or v_transposed(v_cache)):
        raise ValueError("k_cache needs a contiguous head_dim (stride 1), v_cache that or contiguous slots")
    rows = (batch.pages, batch.deltas, batch.valid, batch.starts) + (() if batch.firsts is None else (batch.firsts,))
    if any(t.stride(-1) != 1 for t in rows):
        raise ValueError("PagedBatch pages/deltas/valid/starts/firsts need contiguous rows")
    if tables is not None and tables.cos.device != q.device:
        raise ValueError(f"RoPE tables live on {tables.cos.device}, q on {q.device}: move them with .to()")
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1):
        raise ValueError(f"out must be {tuple(q.shape)} {q.dtype} with a contiguous last dim")


def copy_engine_tiles(device: torch.device) -> bool:
    """Whether decode_config may choose copy-engine tiles on `device`: a Hopper-or-later GPU (tensor-memory
    accelerator), not the interpreter, and LAZYATTN_DECODE_TMA not 0."""
    return envs.active().decode_tma and hopper_or_later(device)


def tile_descriptors(k_cache: torch.Tensor, v_cache: torch.Tensor, block_n: int):
    """Tensor descriptors over the K and V caches for copy-engine tile loads, or None where the strides do not allow
    them. Each cache is seen as rows of stride(1) elements (one slot of one page): a tile is block_n rows starting at
    page * (stride(0) / stride(1)) + its first slot, at column kv_head * stride(2) (token-major pages: the heads
    side by side in a row) or at the row kv_head * stride(2) / stride(1) (head-major pages)."""
    pages, slots, heads, dim = k_cache.shape
    sp, st, sh, sd = k_cache.stride()
    size = k_cache.element_size()
    if v_transposed(v_cache):
        v_desc = _transposed_descriptor(v_cache, block_n)
        if v_desc is None:
            return None
    usable = (
        (k_cache.stride() == v_cache.stride() or v_transposed(v_cache))
        and sd == 1
        and dim == triton.next_power_of_2(dim)
        and dim * size >= 16
        and st * size % 16 == 0
        and sp % st == 0
        and (sh % st == 0 or (heads - 1) * sh + dim <= st)
        and all(c.data_ptr() % 16 == 0 for c in (k_cache, v_cache))
    )
    if not usable:
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    end = (pages - 1) * sp + (slots - 1) * st + (heads - 1) * sh + dim  # one past the last element a tile reads
    rows = cdiv(end, st)
    if rows >= 2**31:
        return None

    def descriptor(cache: torch.Tensor):
        flat = cache.as_strided((rows, st), (st, 1))
        return TensorDescriptor(flat, [rows, st], [st, 1], [block_n, dim])

    try:
        return descriptor(k_cache), (v_desc if v_transposed(v_cache) else descriptor(v_cache))
    except RuntimeError:  # the rows view would run past the storage
        return None


def _transposed_descriptor(v_cache: torch.Tensor, block_n: int):
    """A descriptor over transposed V pages seen as rows of stride(3) slots, one per (page, kv head, channel): a tile
    is [head_dim, block_n] at row page * stride(0) / stride(3) + kv_head * stride(2) / stride(3), column its first slot.
    None where the strides do not allow it."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    pages, slots, heads, dim = v_cache.shape
    sp, _, sh, sd = v_cache.stride()
    size = v_cache.element_size()
    usable = (
        dim == triton.next_power_of_2(dim)
        and block_n * size >= 16
        and sd * size % 16 == 0
        and slots <= sd
        and sp % sd == 0
        and sh % sd == 0
        and v_cache.data_ptr() % 16 == 0
    )
    end = (pages - 1) * sp + (heads - 1) * sh + dim * sd  # one past the last row a tile reads
    rows = cdiv(end, sd)
    if not usable or rows >= 2**31:
        return None
    try:
        flat = v_cache.as_strided((rows, sd), (sd, 1))
    except RuntimeError:
        return None
    return TensorDescriptor(flat, [rows, sd], [sd, 1], [dim, block_n])


def _default_rule(q: torch.Tensor, kv_heads: int) -> SplitRule:
    if not q.is_cuda or interpreting():
        # The interpreter runs programs one by one: a pretend GPU of 4 SMs keeps the grids small.
        return split_rule(q.shape[0], kv_heads, 4, min_pages_per_split=2)
    return split_rule(q.shape[0], kv_heads, sm_count(q.device))


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: PagedBatch,
    tables: RopeTables | None,
    scale: float,
    *,
    apply_delta: bool = True,
    num_splits: int | None = None,
    config: DecodeConfig | None = None,
    counters: ArrivalCounters | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decode step: q [B, Hq, D] (rotated at each entry's position) -> out [B, Hq, D] in q's dtype.

    k_cache/v_cache are [num_pages, page_size, Hkv, D], possibly strided views of the pool. Deltas must
    lie in [0, tables.max_position). tables=None (or apply_delta=False) compiles the rotation out: then
    every delta is taken as 0, like the reference does without tables.

    Launch parameters: num_splits=None splits each entry by its own pages (split_rule, from the GPU's SM
    count; the grid is sized for the page table's width); pass it to give every entry that many page ranges.
    config=None takes decode_config's tiles (block_n must divide page_size). counters: the split merge's
    arrival counters; None allocates zeroed ones for this call (one more launch), so callers
    that launch repeatedly, and CUDA graphs, pass one ArrivalCounters they keep.
    """
    _check(q, k_cache, v_cache, batch, tables, out)
    if q.stride(-1) != 1:
        q = q.contiguous()
    bsz, hq, head_dim = q.shape
    _, page_size, hkv, _ = k_cache.shape
    out = torch.empty_like(q) if out is None else out
    if bsz == 0:
        return out
    if num_splits is None:
        # The grid fits the longest entry the page table holds (in a CUDA graph, the longest the graph
        # allows); each entry then takes the rule's splits for its own pages.
        rule = _default_rule(q, hkv)
        num_splits = rule.unrounded(max(1, batch.max_pages))
    else:
        num_splits = max(1, int(num_splits))
        rule = SplitRule.fixed(num_splits)
    if config is None:
        per_sm = bsz * hkv * num_splits / sm_count(q.device) if q.is_cuda else 0.0
        config = decode_config(
            head_dim, k_cache.dtype, page_size, per_sm, copy_engine_tiles(q.device), v_transposed(v_cache)
        )
    if page_size % config.block_n:
        raise ValueError(f"page_size {page_size} is not a multiple of the tile ({config.block_n} slots)")
    apply_delta = apply_delta and tables is not None
    cos = tables.cos if apply_delta else q  # placeholder pointers when the rotation is compiled out
    sin = tables.sin if apply_delta else q
    if apply_delta and (cos.stride(-1) != 1 or sin.stride() != cos.stride()):
        cos, sin = cos.contiguous(), sin.contiguous()
    direct = num_splits == 1
    if direct:
        acc = m = l = arrivals = out  # unused pointers
    else:
        m = torch.empty(bsz, hq, num_splits, dtype=torch.float32, device=q.device)
        l = torch.empty_like(m)
        acc = torch.empty(bsz, hq, num_splits, head_dim, dtype=torch.float32, device=q.device)
        if counters is None:
            arrivals = torch.zeros(bsz * hkv, dtype=torch.int32, device=q.device)
        else:
            arrivals = counters.get(q.device, bsz * hkv)
    descriptors = tile_descriptors(k_cache, v_cache, config.block_n) if config.tma else None
    k_desc, v_desc = descriptors or (k_cache, v_cache)  # placeholders when the tiles come by per-thread copies
    firsts = batch.starts if batch.firsts is None else batch.firsts  # a placeholder pointer without offsets
    ape = batch.starts if batch.inv_temps is None else batch.inv_temps  # a placeholder without temperatures
    if batch.inv_temps is not None and batch.inv_temps.stride(0) != firsts.stride(0):
        raise ValueError("PagedBatch inv_temps need the row stride of firsts (of starts without firsts)")
    group = hq // hkv
    block_d = triton.next_power_of_2(head_dim)
    block_h = triton.next_power_of_2(group)
    # Dot operands are rounded to the tiles' dtype (q's; over FP8 pages fp8_tile_dtype), as on the GPU, but the
    # interpreter multiplies 16-bit floats as their raw bits (triton issue #11584): there they are widened to fp32
    # after rounding.
    tile_ty = TL_DTYPES[tile_dtype(q.dtype, k_cache.dtype)]
    dot_ty = tl.float32 if interpreting() else tile_ty
    regs = {"maxnreg": config.maxnreg} if config.maxnreg else {}
    _decode_split_kernel[(num_splits, hkv, bsz)](
        q,
        k_cache,
        v_cache,
        k_desc,
        v_desc,
        out,
        acc,
        m,
        l,
        arrivals,
        batch.pages,
        batch.deltas,
        batch.valid,
        batch.starts,
        firsts,
        ape,
        batch.num_pages,
        batch.q_start,
        cos,
        sin,
        q.stride(0),
        q.stride(1),
        *k_cache.stride()[:3],
        *v_cache.stride(),
        out.stride(0),
        out.stride(1),
        batch.pages.stride(0),
        batch.deltas.stride(0),
        batch.valid.stride(0),
        batch.starts.stride(0),
        firsts.stride(0),
        batch.ape_gap,
        cos.stride(0),
        scale * LOG2E,
        num_splits,
        rule.min_pages,
        rule.short_pages,
        rule.short_cap,
        HQ=hq,
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_D=block_d,
        BLOCK_N=config.block_n,
        TILES_PER_PAGE=page_size // config.block_n,
        BLOCK_H=block_h,
        BLOCK_S=min(max(1, _MERGE_ROWS // block_h), triton.next_power_of_2(num_splits)),
        APPLY_DELTA=apply_delta,
        INTERLEAVED=bool(tables.interleaved) if apply_delta else False,
        DIRECT=direct,
        DOT_TY=dot_ty,
        DOT_PRECISION="ieee" if dot_ty == tl.float32 else "tf32",
        HAS_FIRST=batch.firsts is not None,
        HAS_APE=batch.inv_temps is not None,
        TMA=config.tma if descriptors is not None else 0,
        V_T=v_transposed(v_cache),
        TILE_TY=tile_ty,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **regs,
        **pdl_options(q.device, "attention"),
    )
    return out
