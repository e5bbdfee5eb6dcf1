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
  copies (cache_ops.rope_write_kv_runs, passed as `rotated_q`), which saves this launch: ~7.6 us per layer
  on an H100. Runs past the last copy fall back to:
- Rotated in the kernel, at the start of the chunk: the Q tile is de-rotated by -delta in fp32 with the
  cos/sin rows `tables.cos/sin[delta]`, written to the program's scratch rows and loaded back. The round trip
  is what keeps the tile loop the same code as without deltas: triton keeps a *loaded* Q tile in shared
  memory as the QK^T wgmma operand, while a computed one stays a register operand, reloaded from shared
  memory on every tile at 255 registers, which measured 38 % slower per tile on an H200. Scratch rows: the
  program's own output rows, or its split's workspace rows, both overwritten by its result later.
  (A single tile loop that re-rotates Q when the delta changes lets triton 3.6 pipeline nothing at all.)

Both compute R_{-delta} q in fp32 from the same inputs and round it to Q's dtype, so they give the same tile.

Chunks. Without splits: the runs of equal delta, in order (with APPLY_DELTA=False: one loop over all
pages). With S >= _PLAN_MIN_SPLITS splits and at most min(S, _PLAN_RUNS) runs (a short question over a few
cached documents), each split takes one piece of one run (_plan_piece): the runs are cut into pieces of L pages,
L the least length giving at most S pieces, so no program holds two deltas (one Q tile, one tile loop, no run
scan per chunk) and none walks more than L pages. Where the plan does not apply, split s
takes the s-th of S balanced page ranges and walks the runs in it: every program gets the same number of
tiles, whatever the runs. When Q is rotated in the kernel, the rotation is kept to one per program where
possible: with more splits than runs, the runs cut into pieces of about (n - runs) / (S - runs) pages, split
s taking piece s alone; with fewer, the balanced ranges. Chunk bounds come from a scan of the visible pages'
deltas.

Host plans. A caller that knows its split count can plan the chunks itself (`PagedBatch.plan`; the prefill graphs
do, engine/prefill_graphs.py): split_plan deals each entry's pages out in order as pieces of one delta, a split
taking pieces until a budget in pages (SWITCH_PAGES more for each piece after its first) would be passed, at the
least budget that covers the entry. Each (entry, split) gets one record of PLAN_WIDTH ints (count, then first page,
end page and run index per piece) that the program reads in one load beside the visible-page count: no scan, and
balanced splits where the kernel's rule gives the engine's request chunks of up to 18 pages against 10-11. Pieces
are cut to the block's visible pages; records of -1 (runs past what a record holds) fall back to the kernel's
chunks.

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
  valid counts and first position of tile t + 1 are loaded during tile t (_attend_pages says why).
- Causal: a block walks only the pages starting at or before its last position. Masks are applied only to
  tiles holding padding slots (past `valid`) or crossing the diagonal; other tiles skip the select.
- Split-KV: when (blocks x kv heads) leaves SMs idle (a 32-token question against 10K cached tokens at
  batch 1), the visible pages are split across grid axis 2; each split writes a normalised partial output
  and its log2-sum-exp, and a second kernel merges them, one program per (query row, head). A program holds
  an SM and its tiles are arithmetic-bound at this shape (128 query rows per K/V tile), so the split count
  aims at one wave of equal programs: the slowest program is the kernel's time.
- Softmax in fp32 with exp2 (log2 e folded into the scale); bf16/fp16 dots accumulate in fp32, fp32 dots
  use ieee precision. Tiles and split counts: prefill_config and _default_splits, measured on an H200 with
  benchmarks/tune_kernels.py; small fixed tiles under TRITON_INTERPRET. Both are launch parameters of
  prefill_attention (num_splits, config) for tests and benchmarks.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lazyattn.kernels.launch import LOG2E, interpreting, pdl_options, sm_count, wait_for_producers
from lazyattn.kernels.paged import PagedBatch, cdiv
from lazyattn.kernels.rope import RopeTables

_BLOCK_B = 128  # entries scanned per step when a program looks up its entry
_BLOCK_P = 256  # pages scanned per step (causal page count, run ends); deltas held in registers
_MIN_KEYS_PER_SPLIT = 512  # below this a split's startup latency outweighs its work
_MAX_SPLITS = 32
# Runs of a short call's entries rotated up front (_rotate_runs_kernel), and the calls that qualify: the copies
# take ROTATED_RUNS x total_q x Hq x D elements (16 MiB at 256 rows of 32 x 128 bf16 heads). Further runs, and
# longer calls, whose Q is rotated once per program of many tiles, rotate in the attention kernel.
_ROTATED_RUNS = 8
_ROTATE_MAX_ROWS = 256
# Split calls plan one piece of one run per split (_plan_piece) when an entry's visible pages hold at most this
# many runs (and no more than splits); beyond, splits take balanced page ranges and walk the runs in them.
_PLAN_RUNS = 16
# Below this many splits (RAG at batch 8: 2) entries hold more runs than splits, the plan never applies, and its
# scan only costs (H100, benchmarks/results/engine_perf/s5K_sweep.json: 177 against 169 us).
_PLAN_MIN_SPLITS = 4
# A piece may be this many pages longer than a balanced range: what a second run in a program costs (its scan,
# Q load and pipeline refill), about 3 tiles on an H100 (RAG bs 1, 16 splits: 37.1 us planned at 11 pages
# against 44.0 us balanced at 10-11 pages over two runs).
_PLAN_SLACK = tl.constexpr(2)

# A host plan (split_plan) gives each (entry, split) one record of PLAN_WIDTH int32: the number of pieces (-1: no
# plan, the kernel scans), then (first page, end page, run index) of each piece.
PLAN_WIDTH = 16
PLAN_MAX_PIECES = (PLAN_WIDTH - 1) // 3
# What a second piece in a program costs, in pages of work: its Q tile load and the pipeline's refill. Measured on
# an H100 (benchmarks/results/engine_perf/s9): the engine's prefill graph of the cached RAG request took
# 6966/6961 us at 4 against 6995/6984 at 2, alternated in one call (the kernel alone varies more from machine to
# machine than between these).
SWITCH_PAGES = 4


def split_plan(deltas: Sequence[int], num_splits: int, switch_pages: int = SWITCH_PAGES) -> tuple[int, ...]:
    """The host's plan of one entry's pages (deltas: one per page) over `num_splits` splits: num_splits records of
    PLAN_WIDTH ints, flat, for `PagedBatch.plan` (plan_runs says how they are made)."""
    lengths = []
    lo = 0
    for i in range(1, len(deltas) + 1):
        if i == len(deltas) or deltas[i] != deltas[i - 1]:
            lengths.append(i - lo)
            lo = i
    return plan_runs(tuple(lengths), num_splits, switch_pages)


@functools.lru_cache(maxsize=4096)  # requests of documents of the same page counts share one plan
def plan_runs(lengths: tuple[int, ...], num_splits: int, switch_pages: int = SWITCH_PAGES) -> tuple[int, ...]:
    """The plan of an entry whose pages form runs of equal delta of these lengths, in page order.

    The pages are cut into pieces of one run each and dealt out in order, a split taking pieces until its cost
    (pages, plus `switch_pages` for each piece after its first) would pass the least budget for which num_splits
    splits of at most PLAN_MAX_PIECES pieces cover every page. Runs are numbered from the entry's first page, as
    the rotated Q copies are. Where no budget does (more runs than the records can hold), every record says -1:
    the kernel then finds its chunks itself."""
    runs, lo = [], 0
    for run, length in enumerate(lengths):
        runs.append((lo, lo + length, run))
        lo += length
    n = lo
    budget = max(1, -(-n // num_splits))
    while budget <= n + switch_pages * len(runs):
        splits = _deal(runs, num_splits, budget, switch_pages)
        if splits is not None:
            out: list[int] = []
            for pieces in splits + [[]] * (num_splits - len(splits)):
                record = [len(pieces)] + [x for piece in pieces for x in piece]
                out += record + [0] * (PLAN_WIDTH - len(record))
            return tuple(out)
        budget += 1
    return ((-1,) + (0,) * (PLAN_WIDTH - 1)) * num_splits


def with_plan(batch: PagedBatch, num_splits: int, switch_pages: int = SWITCH_PAGES) -> PagedBatch:
    """`batch` split num_splits ways by a host plan of each entry's pages (split_plan). Reads the page tables back
    to the host: for tests and benchmarks; the engine plans from its own lists (engine/prefill_graphs.py)."""
    counts = batch.num_pages.tolist()
    rows = [split_plan(d[:n], num_splits, switch_pages) for d, n in zip(batch.deltas.tolist(), counts)]
    plan = torch.tensor(rows, dtype=torch.int32).view(len(rows), num_splits, PLAN_WIDTH)
    return dataclasses.replace(batch, num_splits=num_splits, plan=plan.to(batch.deltas.device))


def _deal(
    runs: list[tuple[int, int, int]], num_splits: int, budget: int, switch_pages: int
) -> list[list[tuple[int, int, int]]] | None:
    """Pieces per split for one budget (split_plan), or None if num_splits splits do not cover the runs."""
    splits: list[list[tuple[int, int, int]]] = []
    pieces: list[tuple[int, int, int]] = []
    cost = 0
    for lo, hi, run in runs:
        while lo < hi:
            room = budget - cost - (switch_pages if pieces else 0)
            if room <= 0 or len(pieces) == PLAN_MAX_PIECES:
                splits.append(pieces)
                if len(splits) == num_splits:
                    return None
                pieces, cost = [], 0
                continue
            take = min(room, hi - lo)
            cost += take + (switch_pages if pieces else 0)
            pieces.append((lo, lo + take, run))
            lo += take
    if pieces:
        splits.append(pieces)
    return splits


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
def _count_at_most(sorted_ptr, n, value, BLOCK: tl.constexpr):
    """How many of the n non-decreasing values at sorted_ptr are <= value (they are a prefix)."""
    count = 0
    for lo in range(0, n, BLOCK):
        i = lo + tl.arange(0, BLOCK)
        inside = i < n
        count += tl.sum(((tl.load(sorted_ptr + i, mask=inside, other=0) <= value) & inside).to(tl.int32), axis=0)
    return count


@triton.jit
def _count_pages(starts_row, n_pages, last_pos, BLOCK_P: tl.constexpr):
    """Pages whose first position is <= last_pos."""
    return _count_at_most(starts_row, n_pages, last_pos, BLOCK_P)


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _run_starts(deltas_row, i, n_pages):
    """Which of the pages `i` start a run (a maximal stretch of pages of one delta) among the first n_pages."""
    inside = i < n_pages
    d = tl.load(deltas_row + i, mask=inside, other=0)
    d_prev = tl.load(deltas_row + i - 1, mask=inside & (i > 0), other=0)
    return inside & ((i == 0) | (d != d_prev))


@triton.jit
def _count_runs(deltas_row, n_pages, BLOCK_P: tl.constexpr):
    """Runs among the first n_pages pages."""
    runs = 0
    for lo in range(0, n_pages, BLOCK_P):
        runs += tl.sum(_run_starts(deltas_row, lo + tl.arange(0, BLOCK_P), n_pages).to(tl.int32), axis=0)
    return runs


@triton.jit
def _chunk(deltas_row, first, last, c, chunk_len, BLOCK_P: tl.constexpr):
    """Pages [lo, hi) of chunk c of the pages [first, last), and the number of chunks there. Chunks cut the
    range at every delta change and every chunk_len pages within a run, so one delta holds in a chunk.
    lo = hi = last when there is no chunk c."""
    seen = 0  # chunks starting before this window
    run_start = first
    lo = last
    hi = last
    for base in range(first, last, BLOCK_P):
        i = base + tl.arange(0, BLOCK_P)
        inside = i < last
        d = tl.load(deltas_row + i, mask=inside, other=0)
        d_prev = tl.load(deltas_row + i - 1, mask=inside & (i > first), other=0)
        new_run = inside & ((i == first) | (d != d_prev))
        # Start of the run holding each page: a running max over the run starts so far.
        in_run = tl.maximum(tl.associative_scan(tl.where(new_run, i, -1), 0, _max), run_start)
        starts_chunk = inside & ((i - in_run) % chunk_len == 0)
        index = seen + tl.cumsum(starts_chunk.to(tl.int32), 0) - 1
        lo = tl.minimum(lo, tl.min(tl.where(starts_chunk & (index == c), i, last), axis=0))
        hi = tl.minimum(hi, tl.min(tl.where(starts_chunk & (index == c + 1), i, last), axis=0))
        seen += tl.sum(starts_chunk.to(tl.int32), axis=0)
        run_start = tl.max(in_run, axis=0)
    return lo, hi, seen


@triton.jit
def _derotated_q(
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
def _entry_of_row(cu_seqlens_q, batch_size, token, BLOCK_B: tl.constexpr):
    """The entry owning packed query row `token`: the number of entries ending at or before it."""
    return _count_at_most(cu_seqlens_q + 1, batch_size, token, BLOCK_B)


@triton.jit
def _run_firsts(deltas_row, n_pages, run, BLOCK_P: tl.constexpr):
    """First page of each run index in `run` ([R]) among an entry's first n_pages pages (runs counted from its
    first page, as _count_runs does; n_pages for a run past the last), and the number of runs there."""
    first = tl.zeros_like(run) + n_pages
    seen = 0
    for lo in range(0, n_pages, BLOCK_P):
        i = lo + tl.arange(0, BLOCK_P)
        new_run = _run_starts(deltas_row, i, n_pages)
        index = seen + tl.cumsum(new_run.to(tl.int32), 0) - 1
        hit = new_run[None, :] & (index[None, :] == run[:, None])
        first = tl.minimum(first, tl.min(tl.where(hit, i[None, :], n_pages), axis=1))
        seen += tl.sum(new_run.to(tl.int32), axis=0)
    return first, seen


@triton.jit
def _run_deltas(deltas_row, n_pages, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr):
    """Delta of each of the first BLOCK_R runs of an entry's pages, 0 for runs past its last one: [BLOCK_R]."""
    first, _ = _run_firsts(deltas_row, n_pages, tl.arange(0, BLOCK_R), BLOCK_P)
    return tl.load(deltas_row + first, mask=first < n_pages, other=0)


@triton.jit
def _run_bounds(deltas_row, n_pages, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr):
    """First page and length of each of the first BLOCK_R runs among the first n_pages pages ([BLOCK_R] each;
    length 0 past the last run), and the number of runs there."""
    run = tl.arange(0, BLOCK_R)
    first, seen = _run_firsts(deltas_row, n_pages, run, BLOCK_P)
    after, _ = _run_firsts(deltas_row, n_pages, run + 1, BLOCK_P)  # the next run's first page
    return first, after - first, seen


@triton.jit
def _plan_piece(
    deltas_row, n_pages, split, num_splits, PLAN_SLACK: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr
):
    """Pages [lo, hi) of this split's piece and the index of the run holding it, for calls that give each split
    at most one piece: the runs of equal delta are cut into pieces of L pages (the last piece of a run
    shorter), L the least length that makes at most num_splits pieces, and split s takes piece s. One delta
    per program, so one Q tile and one tile loop, and no program longer than L pages.

    planned is False when that cannot be done (more runs than splits or than BLOCK_R), or when L exceeds a
    balanced range's cdiv(n_pages, num_splits) by more than PLAN_SLACK pages: the caller walks runs then.
    lo = hi when the split has no piece."""
    first, length, runs = _run_bounds(deltas_row, n_pages, BLOCK_R, BLOCK_P)
    planned = (runs <= num_splits) & (runs <= BLOCK_R)
    piece = tl.maximum(tl.cdiv(n_pages, num_splits), 1)
    if planned:
        # Pieces of L pages number sum_r cdiv(len_r, L) <= n / L + runs: L = cdiv(n, S - runs) always fits,
        # so this loop ends within `runs` steps of its start.
        while tl.sum(tl.cdiv(length, piece), axis=0) > num_splits:
            piece += 1
    # Worth it only if no piece is much longer than a balanced range: with about as many splits as runs the
    # pieces would be whole runs, longer than a balanced range plus the cost of a second run in it.
    planned = planned & (piece <= tl.cdiv(n_pages, num_splits) + PLAN_SLACK)
    count = tl.cdiv(length, piece)
    ends = tl.cumsum(count, 0)  # pieces up to and including each run
    run = tl.sum((ends <= split).to(tl.int32), axis=0)
    ok = planned & (run < runs)
    run_first = _pick(first, run, BLOCK_R)
    run_len = _pick(length, run, BLOCK_R)
    lo = run_first + (split - (_pick(ends, run, BLOCK_R) - _pick(count, run, BLOCK_R))) * piece
    hi = tl.minimum(lo + piece, run_first + run_len)
    lo = tl.where(ok, lo, 0)
    hi = tl.where(ok, hi, 0)
    return planned, lo, hi, run


@triton.jit
def _pick(vector, index, BLOCK: tl.constexpr):
    """vector[index] of a register vector [BLOCK]."""
    return tl.sum(tl.where(tl.arange(0, BLOCK) == index, vector, 0), axis=0)


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
    entry = _entry_of_row(cu_seqlens_q, batch_size, token, BLOCK_B)
    deltas_row = deltas + entry.to(tl.int64) * stride_table
    delta = _pick(_run_deltas(deltas_row, tl.load(num_pages + entry), BLOCK_R, BLOCK_P), run, BLOCK_R)
    if delta != 0:
        h = tl.arange(0, BLOCK_H)
        ok = h < NUM_HEADS
        q = _derotated_q(
            Q + token.to(tl.int64) * stride_qt + h * stride_qh, ok, Cos, Sin, delta, max_position, HEAD_DIM, INTERLEAVED
        )
        rows = (run.to(tl.int64) * total_q + token) * NUM_HEADS + h
        dims = tl.arange(0, HEAD_DIM)
        tl.store(QRot + rows[:, None] * HEAD_DIM + dims[None, :], q, mask=ok[:, None])


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
def _attend_pages(
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
    qk_scale,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    HAS_FIRST: tl.constexpr,
    HAS_APE: tl.constexpr,
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
        # Masked loads: slots past `valid` may hold anything (NaN * 0 would poison the P @ V dot).
        k = tl.load(k_rows[:, None] + dims[None, :], mask=in_page[:, None], other=0.0)
        v = tl.load(v_rows[:, None] + dims[None, :], mask=in_page[:, None], other=0.0)
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
    memory on every tile at 255 registers: 38 % slower tile loop (sm_90, measured). The barriers order the
    scratch for the whole CTA."""
    q_src = q_rows
    if delta != 0:
        if run < ROTATED_RUNS:
            q_src = rot_rows + run * rot_run_stride
        else:
            dims = tl.arange(0, HEAD_DIM)
            q = _derotated_q(q_rows, row_ok, Cos, Sin, delta, max_position, HEAD_DIM, INTERLEAVED)
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
    qk_scale,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    HAS_FIRST: tl.constexpr,
    HAS_APE: tl.constexpr,
    APPLY_DELTA: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ROTATED_RUNS: tl.constexpr,
):
    """Attend the pages [page_lo, page_hi) of one delta (run `run` of the entry) with the Q tile rotated for it;
    returns the running softmax state."""
    dims = tl.arange(0, HEAD_DIM)
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
    q = tl.load(q_src[:, None] + dims[None, :], mask=row_ok[:, None], other=0.0)
    return _attend_pages(
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
        qk_scale,
        HEAD_DIM,
        PAGE_SIZE,
        BLOCK_N,
        DOT_PRECISION,
        UPCAST,
        HAS_FIRST,
        HAS_APE,
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
    qk_scale,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    HAS_FIRST: tl.constexpr,
    HAS_APE: tl.constexpr,
    APPLY_DELTA: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ROTATED_RUNS: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """Chunks c, c + step, ... of the pages [first, last) (_chunk: cut at delta changes and every chunk_len
    pages), each with its own Q tile and tile loop; returns the running softmax state and whether the program had
    a chunk at all."""
    page_lo, page_hi, n_chunks = _chunk(deltas + table, first, last, c, chunk_len, BLOCK_P)
    has_chunk = c < n_chunks
    # The entry's first ROTATED_RUNS runs come rotated up front: each chunk needs its run. With step 1
    # (balanced ranges) consecutive chunks are consecutive runs, so one scan finds the first chunk's.
    run = tl.full([], ROTATED_RUNS, tl.int32)  # a tensor: the loop carries it
    if APPLY_DELTA and ROTATED_RUNS > 0:
        run = _count_runs(deltas + table, page_lo + 1, BLOCK_P) - 1
    while c < n_chunks:
        if APPLY_DELTA and ROTATED_RUNS > 0:  # noqa: SIM102 - a compile-time branch around a runtime one
            if step != 1:
                run = _count_runs(deltas + table, page_lo + 1, BLOCK_P) - 1
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
            qk_scale,
            HEAD_DIM,
            PAGE_SIZE,
            BLOCK_N,
            DOT_PRECISION,
            UPCAST,
            HAS_FIRST,
            HAS_APE,
            APPLY_DELTA,
            INTERLEAVED,
            ROTATED_RUNS,
        )
        c += step
        run += 1
        page_lo, page_hi, n_chunks = _chunk(deltas + table, first, last, c, chunk_len, BLOCK_P)
    return acc, l_i, m_i, has_chunk


@triton.jit
def _kernel_chunks(
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
    qk_scale,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    HAS_FIRST: tl.constexpr,
    HAS_APE: tl.constexpr,
    APPLY_DELTA: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ROTATED_RUNS: tl.constexpr,
    SPLIT_KV: tl.constexpr,
    SPLIT_BY_RUNS: tl.constexpr,
    PLAN_PIECES: tl.constexpr,
    BLOCK_R: tl.constexpr,
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
            runs = _count_runs(deltas + table, n_vis, BLOCK_P)
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
    if PLAN_PIECES:
        planned, piece_lo, piece_hi, piece_run = _plan_piece(
            deltas + table, n_vis, split, tl.num_programs(2), _PLAN_SLACK, BLOCK_R, BLOCK_P
        )
        if planned:
            # One piece of one run (_plan_piece): one Q tile, one tile loop, no scan past the plan's.
            has_chunk = piece_lo < piece_hi
            if has_chunk:
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
                    piece_lo,
                    piece_hi,
                    piece_run,
                    stride_kp,
                    stride_ks,
                    stride_vp,
                    stride_vs,
                    qk_scale,
                    HEAD_DIM,
                    PAGE_SIZE,
                    BLOCK_N,
                    DOT_PRECISION,
                    UPCAST,
                    HAS_FIRST,
                    HAS_APE,
                    APPLY_DELTA,
                    INTERLEAVED,
                    ROTATED_RUNS,
                )
        else:
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
                qk_scale,
                HEAD_DIM,
                PAGE_SIZE,
                BLOCK_N,
                DOT_PRECISION,
                UPCAST,
                HAS_FIRST,
                HAS_APE,
                APPLY_DELTA,
                INTERLEAVED,
                ROTATED_RUNS,
                BLOCK_P,
            )
    else:  # the plan compiled out: the kernel is the run walk alone
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
            qk_scale,
            HEAD_DIM,
            PAGE_SIZE,
            BLOCK_N,
            DOT_PRECISION,
            UPCAST,
            HAS_FIRST,
            HAS_APE,
            APPLY_DELTA,
            INTERLEAVED,
            ROTATED_RUNS,
            BLOCK_P,
        )
    return acc, l_i, m_i, has_chunk


@triton.jit
def _planned_chunks(
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
    qk_scale,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    HAS_FIRST: tl.constexpr,
    HAS_APE: tl.constexpr,
    APPLY_DELTA: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ROTATED_RUNS: tl.constexpr,
    PLAN_WIDTH: tl.constexpr,
):
    """The pieces the host planned for this (entry, split) (`split_plan`): `count` pieces of one delta each, piece
    i the pages [lo, hi) of run `run` at fields 1 + 3i, 2 + 3i, 3 + 3i, cut to the block's visible pages. No scan:
    the record is one load, issued beside the visible-page count."""
    for i in range(0, count):
        lo = tl.minimum(_pick(fields, 1 + 3 * i, PLAN_WIDTH), n_vis)
        hi = tl.minimum(_pick(fields, 2 + 3 * i, PLAN_WIDTH), n_vis)
        run = _pick(fields, 3 + 3 * i, PLAN_WIDTH)
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
                qk_scale,
                HEAD_DIM,
                PAGE_SIZE,
                BLOCK_N,
                DOT_PRECISION,
                UPCAST,
                HAS_FIRST,
                HAS_APE,
                APPLY_DELTA,
                INTERLEAVED,
                ROTATED_RUNS,
            )
    return acc, l_i, m_i, count > 0


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
    BLOCK_B: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROTATED_RUNS: tl.constexpr,
    SPLIT_BY_RUNS: tl.constexpr,
    PLAN_PIECES: tl.constexpr,
    BLOCK_R: tl.constexpr,
    HOST_PLAN: tl.constexpr,
    PLAN_WIDTH: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    QB: tl.constexpr = BLOCK_M // GROUP  # query positions per block
    slot = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    wait_for_producers(USE_PDL)
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
    n_vis = _count_pages(starts + table, tl.load(num_pages + entry), q_last, BLOCK_P)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    dims = tl.arange(0, HEAD_DIM)
    k_head = K + kv_head * stride_kh
    v_head = V + kv_head * stride_vh
    if SPLIT_KV or APPLY_DELTA:
        # Which pages this program attends, in chunks of one delta: planned by the host (HOST_PLAN, a record
        # per entry and split; count -1 where it could not plan), else found by the kernel's scans.
        if HOST_PLAN:
            fields = tl.load(Plan + entry.to(tl.int64) * stride_plan + split * PLAN_WIDTH + tl.arange(0, PLAN_WIDTH))
            count = _pick(fields, 0, PLAN_WIDTH)
            if count >= 0:
                acc, l_i, m_i, has_chunk = _planned_chunks(
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
                    qk_scale,
                    HEAD_DIM,
                    PAGE_SIZE,
                    BLOCK_N,
                    DOT_PRECISION,
                    UPCAST,
                    HAS_FIRST,
                    HAS_APE,
                    APPLY_DELTA,
                    INTERLEAVED,
                    ROTATED_RUNS,
                    PLAN_WIDTH,
                )
            else:
                acc, l_i, m_i, has_chunk = _kernel_chunks(
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
                    qk_scale,
                    HEAD_DIM,
                    PAGE_SIZE,
                    BLOCK_N,
                    DOT_PRECISION,
                    UPCAST,
                    HAS_FIRST,
                    HAS_APE,
                    APPLY_DELTA,
                    INTERLEAVED,
                    ROTATED_RUNS,
                    SPLIT_KV,
                    SPLIT_BY_RUNS,
                    PLAN_PIECES,
                    BLOCK_R,
                    BLOCK_P,
                )
        else:
            acc, l_i, m_i, has_chunk = _kernel_chunks(
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
                qk_scale,
                HEAD_DIM,
                PAGE_SIZE,
                BLOCK_N,
                DOT_PRECISION,
                UPCAST,
                HAS_FIRST,
                HAS_APE,
                APPLY_DELTA,
                INTERLEAVED,
                ROTATED_RUNS,
                SPLIT_KV,
                SPLIT_BY_RUNS,
                PLAN_PIECES,
                BLOCK_R,
                BLOCK_P,
            )
    else:
        q = tl.load(q_rows[:, None] + dims[None, :], mask=row_ok[:, None], other=0.0)
        acc, l_i, m_i = _attend_pages(
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
            qk_scale,
            HEAD_DIM,
            PAGE_SIZE,
            BLOCK_N,
            DOT_PRECISION,
            UPCAST,
            HAS_FIRST,
            HAS_APE,
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
def _combine_kernel(
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
    GPU. (Merging in the split kernel, by the last split of a block to finish, was measured: one SM then
    reads every partial of the block, 64 KiB each, 10-50 us at 16-48 splits.)"""
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
    """Tiles of a call, measured on an H200 (benchmarks/tune_kernels.py).

    16-bit, head_dim <= 128: 128 x 64 tiles, 8 warps, 3 stages (K/V prefetched 2 tiles ahead); 4 stages
    measured the same. Pages of >= 128: 128 x 128 tiles (455 TFLOP/s against 378 for 128 x 64 at 16K
    causal); with pages of 64 the 2-page 128 x 128 tile is no faster and spills. A tile is part of a page
    or two whole pages, so BLOCK_N is capped at 2 * page_size. fp32 dots run on FMA units: small tiles.
    The M tile holds at least one position of the whole head group.
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
    program per SM. Measured on an H200 (benchmarks/results/engine_perf/attention_splits_s3q_after.json),
    RAG 5 x 2048 + 32 with deltas: batch 1 -> 16 splits (47.8 us against 50.3 at 12 and 64.3 at 20, a second
    wave), batch 8 -> 2 splits (174.6 us against 225.5 at 3)."""
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
    plan_pieces: bool = False,
    out: torch.Tensor | None = None,
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
    plan_pieces=True gives each split one piece of one run where it can (_plan_piece); off by default: on an
    H100 it took the benchmark's RAG case at batch 1 (6 runs) from 41.4 to 36.9 us per layer, but in the
    engine's step (7 runs: a system segment too) the plan falls back to the run walk and the kernel took 39.3
    instead of 33.5 us per layer (docs/kernels.md, "Session 5"). The split
    partials and rotated copies live in scratch allocated per call (stream-ordered by PyTorch's allocator, in
    the graph's pool under CUDA graphs).
    """
    tables = tables if apply_delta else None
    _check_inputs(q, k_cache, v_cache, tables, batch, out)
    out = torch.empty_like(q) if out is None else out
    total_q, q_heads, head_dim = q.shape
    kv_heads, group = k_cache.shape[2], q_heads // k_cache.shape[2]
    if total_q == 0 or batch.batch_size == 0:
        return out
    q = q if q.stride(-1) == 1 else q.contiguous()
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
        PLAN_PIECES=splits >= _PLAN_MIN_SPLITS and plan_pieces,
        BLOCK_R=_PLAN_RUNS,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **pdl_options(q.device, "attention"),
        **({"maxnreg": config.maxnreg} if config.maxnreg else {}),
    )
    if splits > 1:
        _combine_kernel[(total_q * q_heads,)](
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
        BLOCK_B=_BLOCK_B,
        BLOCK_P=_BLOCK_P,
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
        UPCAST=interpreting() and q.dtype == torch.bfloat16,
        HAS_FIRST=batch.firsts is not None,
        HAS_APE=batch.inv_temps is not None,
        BLOCK_B=_BLOCK_B,
        BLOCK_P=_BLOCK_P,
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
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k/v caches must be contiguous along head_dim")
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
