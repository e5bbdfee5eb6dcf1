"""The host's plan of which pages each split of a prefill call attends (kernels/prefill.py, "Chunks").

A caller that knows its split count can plan the chunks itself (`PagedBatch.plan`; the prefill graphs do,
engine/prefill_graphs.py): split_plan deals each entry's pages out in order as pieces of one delta, a split taking
pieces until a budget in pages (SWITCH_PAGES more for each piece after its first) would be passed, at the least
budget that covers the entry. Each (entry, split) gets one record of PLAN_WIDTH ints (count, then first page, end
page and run index per piece) that the program reads in one load beside the visible-page count
(prefill_tiles.planned_chunks): no scan, and balanced splits where the kernel's own rule gives the engine's request
chunks of up to 18 pages against 10-11. Pieces are cut to the block's visible pages; records of -1 (runs past what
a record holds) fall back to the kernel's chunks.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import torch

from lazyattn.kernels.paged import PagedBatch

# A host plan (split_plan) gives each (entry, split) one record of PLAN_WIDTH int32: the number of pieces (-1: no
# plan, the kernel scans), then (first page, end page, run index) of each piece.
PLAN_WIDTH = 16
PLAN_MAX_PIECES = (PLAN_WIDTH - 1) // 3
# What a second piece in a program costs, in pages of work: its Q tile load and the pipeline's refill. Measured
# with the engine's prefill graph of the cached RAG request, 4 against 2 alternated in one call
# (docs/benchmarks.md, "Kernel constants"); the kernel alone varies more from machine to machine than between them.
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
