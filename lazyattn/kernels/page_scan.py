"""Scans of a paged batch's tables inside the attention kernels: which entry and query block a program owns,
how many of an entry's pages a query block sees, and its runs of equal delta (kernels/prefill.py, "Where delta is
applied"). Shared by the prefill kernels (prefill.py, prefill_hopper.py), their tile loops (prefill_tiles.py) and
the RoPE/KV-write launch (cache_ops.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK_B = 128  # entries scanned per step when a program looks up its entry
BLOCK_P = 256  # pages scanned per step (causal page count, run ends); deltas held in registers


@triton.jit
def find_block(cu_seqlens_q, batch_size, slot, offsets, QB: tl.constexpr, BLOCK_B: tl.constexpr):
    """(entry, first query row) of grid slot `slot` (the slot layout: kernels/prefill.py, "Grid"). offsets: the
    caller's arange(0, BLOCK_B), so that the Gluon kernel (prefill_hopper.py) runs this same code with its own
    layout."""
    count = 0
    for lo in range(0, batch_size, BLOCK_B):
        b = lo + offsets
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
def count_pages(starts_row, n_pages, last_pos, BLOCK_P: tl.constexpr):
    """Pages whose first position is <= last_pos."""
    return _count_at_most(starts_row, n_pages, last_pos, BLOCK_P)


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def run_starts(deltas_row, i, n_pages):
    """Which of the pages `i` start a run (a maximal stretch of pages of one delta) among the first n_pages."""
    inside = i < n_pages
    d = tl.load(deltas_row + i, mask=inside, other=0)
    d_prev = tl.load(deltas_row + i - 1, mask=inside & (i > 0), other=0)
    return inside & ((i == 0) | (d != d_prev))


@triton.jit
def count_runs(deltas_row, n_pages, BLOCK_P: tl.constexpr):
    """Runs among the first n_pages pages."""
    runs = 0
    for lo in range(0, n_pages, BLOCK_P):
        runs += tl.sum(run_starts(deltas_row, lo + tl.arange(0, BLOCK_P), n_pages).to(tl.int32), axis=0)
    return runs


@triton.jit
def chunk_bounds(deltas_row, first, last, c, chunk_len, BLOCK_P: tl.constexpr):
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
def entry_of_row(cu_seqlens_q, batch_size, token, BLOCK_B: tl.constexpr):
    """The entry owning packed query row `token`: the number of entries ending at or before it."""
    return _count_at_most(cu_seqlens_q + 1, batch_size, token, BLOCK_B)


@triton.jit
def _run_firsts(deltas_row, n_pages, run, BLOCK_P: tl.constexpr):
    """First page of each run index in `run` ([R]) among an entry's first n_pages pages (runs counted from its
    first page, as count_runs does; n_pages for a run past the last), and the number of runs there."""
    first = tl.zeros_like(run) + n_pages
    seen = 0
    for lo in range(0, n_pages, BLOCK_P):
        i = lo + tl.arange(0, BLOCK_P)
        new_run = run_starts(deltas_row, i, n_pages)
        index = seen + tl.cumsum(new_run.to(tl.int32), 0) - 1
        hit = new_run[None, :] & (index[None, :] == run[:, None])
        first = tl.minimum(first, tl.min(tl.where(hit, i[None, :], n_pages), axis=1))
        seen += tl.sum(new_run.to(tl.int32), axis=0)
    return first, seen


@triton.jit
def run_deltas(deltas_row, n_pages, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr):
    """Delta of each of the first BLOCK_R runs of an entry's pages, 0 for runs past its last one: [BLOCK_R]."""
    first, _ = _run_firsts(deltas_row, n_pages, tl.arange(0, BLOCK_R), BLOCK_P)
    return tl.load(deltas_row + first, mask=first < n_pages, other=0)


@triton.jit
def pick(vector, index, BLOCK: tl.constexpr):
    """vector[index] of a register vector [BLOCK]."""
    return tl.sum(tl.where(tl.arange(0, BLOCK) == index, vector, 0), axis=0)
