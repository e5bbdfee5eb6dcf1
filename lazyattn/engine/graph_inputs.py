"""A step's inputs as host lists, and the page tables of CUDA-graph steps written straight into (pinned) host
buffers that one copy moves to the graphs' static device buffers.

Why: a graph replay is one launch, so what is left of a step's host time is building its inputs. Built as
PyTorch tensors (PagedBatch.build, then a device-to-device copy into each static buffer) that is ~20 small
tensors and ~20 copies; written with numpy into one buffer per dtype it is a few slice assignments and 2-3
copies (engine/cuda_graphs.py), or one where the three buffers are views of one (engine/prefill_graphs.py).

Tables are entry-major, [entries, 5, width]: the pages, deltas, valid, starts and firsts of an entry are one
contiguous record, so the first b entries of a batch are one prefix of the buffer, and the five [entries,
width] views share one row stride, as the attention kernels take it (kernels/paged.py). Graphs of an engine whose
requests default to a temperature or scale on their documents (docs/design.md, "APE") carry two more tables,
[entries, 7, width]: each page's 1/T and ln S as float32 bits, read through float32 views of the same buffer.

A decode step whose entries share documents also gets a shared-document plan (kernels/shared_decode.py): its job
count, slot_start and job rows in one int32 buffer (fill_plan), one more copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from lazyattn.kernels.paged import HOPPER_MAX_QUESTION, EntryPages, PagedBatch, cdiv

if TYPE_CHECKING:  # kernels/shared_decode.py imports Triton, which CPU engines do without
    from lazyattn.kernels.shared_decode import HostPlan, SharedPlan

TABLES = 5  # pages, deltas, valid, starts, firsts
APE_TABLES = 7  # and inv_temps, log_scales (float32 bits)
_ALIGN = 4  # int32s in 16 bytes
_ROW = 16  # a table row's stride, in int32s, is a multiple of this


def table_count(ape: bool) -> int:
    """Tables per entry record: with the temperature and scale tables or without."""
    return APE_TABLES if ape else TABLES


@dataclass
class StepInputs:
    """One forward step as host lists (what ModelRunner.describe builds from a StepPlan)."""

    tokens: list[int]
    positions: list[int]
    slots: list[int]
    entries: list[EntryPages]
    q_lens: list[int]
    q_starts: list[int]
    logits_rows: list[int]
    is_decode: bool
    # block mode's copies (docs/design.md, Modes), one element per page; with the rest, what a tensor-parallel
    # driver sends every other rank (engine/executor/tensor_parallel.py)
    copy_src: list[int] = field(default_factory=list)
    copy_dst: list[int] = field(default_factory=list)
    copy_deltas: list[int] = field(default_factory=list)
    # overlapped scheduling: tokens sampled by the previous step, still on the device (engine/step_pipeline.py)
    fed_back: FedBack | None = None


@dataclass
class FedBack:
    """A decode step's input tokens that the previous step sampled and the host has not seen yet: input row i
    takes `source[index[i]]`, copied on the device into the step's input ids (no host round trip)."""

    source: torch.Tensor  # [B'] int64, the previous step's sampled ids
    index: list[int]

    def write(self, input_ids: torch.Tensor) -> None:
        """Overwrite input_ids[:len(index)] (the placeholders the host staged) with the fed-back tokens."""
        n = len(self.index)
        if self.index == list(range(n)):  # the usual case: same sequences in the same order
            input_ids[:n].copy_(self.source[:n])
            return
        index = torch.tensor(self.index, dtype=torch.int64)
        if self.source.device.type == "cuda":  # pinned, so that the copy does not wait for the step in flight
            index = index.pin_memory()
        input_ids[:n].copy_(self.source.index_select(0, index.to(self.source.device, non_blocking=True)))


def table_views(tables: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """pages, deltas, valid, starts, firsts: [E, W] views of an entry-major [E, 5, W] buffer."""
    return tuple(tables[:, k] for k in range(TABLES))


def ape_views(tables: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """inv_temps, log_scales: float32 [E, W] views of an [E, 7, W] buffer; None, None for [E, 5, W]."""
    if tables.shape[1] < APE_TABLES:
        return None, None
    floats = tables.view(torch.float32)
    return floats[:, TABLES], floats[:, TABLES + 1]


def has_ape(entries: Sequence[EntryPages]) -> bool:
    """Whether a step's page tables carry a temperature or scale other than 1 (CUDA graphs without the tables
    leave such steps to eager launches)."""
    return any(e.inv_temps is not None and e.has_ape for e in entries)


def fill_tables(tables: np.ndarray, entries: Sequence[EntryPages]) -> None:
    """Write each entry's page table into rows [0, len(entries)) of an [E, 5, W] int32 array; the rest of those
    rows is zeroed, `starts` is the exclusive running sum of `valid` (kernels/paged.py), past the last page too."""
    n = len(entries)
    rows = tables[:n]
    rows.fill(0)
    for i, e in enumerate(entries):
        m = len(e.pages)
        if not m:
            continue
        record = rows[i]
        base = e.base
        if base is not None and base.pages:  # a context kept across steps: its tables are converted once
            nb = len(base.pages)
            memo = base.memo()
            table = memo.get("tables")
            if table is None:
                table = memo["tables"] = _context_tables(base)
            record[:TABLES, :nb] = table
            record[0, nb:m] = e.pages[nb:]
            record[1, nb:m] = e.deltas[nb:]
            record[2, nb:m] = e.valid[nb:]
            if e.firsts is not None:
                record[4, nb:m] = e.firsts[nb:]
        else:
            record[0, :m] = e.pages
            record[1, :m] = e.deltas
            record[2, :m] = e.valid
            if e.firsts is not None:
                record[4, :m] = e.firsts
        if len(record) > TABLES:
            floats = record[TABLES:].view(np.float32)
            floats[0, :m] = 1.0 if e.inv_temps is None else e.inv_temps
            if e.log_scales is not None:
                floats[1, :m] = e.log_scales
    # starts[:, 0] stays 0; starts[:, j] = valid[:, :j].sum(), written in place
    np.add.accumulate(rows[:, 2, :-1], axis=1, out=rows[:, 3, 1:])


def paged_batch(
    entries: Sequence[EntryPages], q_lens: Sequence[int], q_starts: Sequence[int], device: torch.device
) -> PagedBatch:
    """PagedBatch.build's batch for an eager step, its tables written by fill_tables (a context kept across steps
    converted once) into one table-major buffer [tables, B, W], moved by one copy. Why: at a full batch of RAG
    sequences (256 x ~165 pages) build's per-entry tensors took a slow host about ten times as long per step as
    fill_tables (docs/benchmarks.md, "Kernel constants"). As build: firsts only where some entry has an offset,
    the temperature and scale tables only where some entry has one (kernels/paged.py); each table a [B, W] view of
    its own slab, every table's rows of one stride, so that every kernel's stride checks hold."""
    b = len(entries)
    if not (b == len(q_lens) == len(q_starts)):
        raise ValueError("entries, q_lens and q_starts must have one element per entry")
    width = max((len(e.pages) for e in entries), default=0) or 1
    longest = max(q_lens, default=0)
    ape = has_ape(entries)
    # Triton specialises a kernel on whether each pointer is 16-byte aligned and each integer a multiple of 16: rows
    # of a multiple of 16 int32s and parts of `head` starting at multiples of 4 keep every table's start aligned and
    # every row stride a multiple of 16 whatever the batch's size and width, so that a batch of another shape never
    # compiles a new kernel variant mid-serving (docs/kernels.md, "Kernel variants").
    slabs = np.empty((table_count(ape), b, _ROW * cdiv(width, _ROW)), dtype=np.int32)
    fill_tables(slabs.transpose(1, 0, 2), entries)
    counts = [len(e.pages) for e in entries]
    max_kv = int(slabs[2].sum(1, dtype=np.int64).max()) if b else 0
    firsts = any(e.firsts is not None and any(e.firsts) for e in entries)
    tables = torch.from_numpy(slabs).to(device)[:, :, :width]
    at_start = _ALIGN * cdiv(b + 1, _ALIGN)
    at_count = at_start + _ALIGN * cdiv(b, _ALIGN)
    head = np.zeros(at_count + b, dtype=np.int32)
    head[1 : b + 1] = np.cumsum(q_lens, dtype=np.int64)
    head[at_start : at_start + b] = q_starts
    head[at_count:] = counts
    head = torch.from_numpy(head).to(device)
    inv_temps, log_scales = (None, None)
    if ape:
        floats = tables.view(torch.float32)
        inv_temps, log_scales = floats[TABLES], floats[TABLES + 1]
    return PagedBatch(
        cu_seqlens_q=head[: b + 1],
        q_start=head[at_start : at_start + b],
        pages=tables[0],
        deltas=tables[1],
        valid=tables[2],
        starts=tables[3],
        num_pages=head[at_count:],
        max_q=longest,
        max_kv=max_kv,
        firsts=tables[4] if firsts else None,
        inv_temps=inv_temps,
        log_scales=log_scales,
        max_prompt_q=max_prompt_q(entries, q_lens) if longest > HOPPER_MAX_QUESTION else 0,
    )


def max_prompt_q(entries: Sequence[EntryPages], q_lens: Sequence[int]) -> int:
    """PagedBatch.max_prompt_q, counted over the entries longer than the Hopper kernel's longest question
    (HOPPER_MAX_QUESTION) only: the shorter ones meet its rule either way, and counting an entry walks its pages on
    the host."""
    return max((q for e, q in zip(entries, q_lens) if q > HOPPER_MAX_QUESTION and not e.reads_documents(q)), default=0)


def _context_tables(e: EntryPages) -> np.ndarray:
    """An entry's [5, pages] int32 record as fill_tables writes it, but for `starts` (left 0: fill_tables sums it)."""
    table = np.zeros((TABLES, len(e.pages)), dtype=np.int32)
    table[0], table[1], table[2] = e.pages, e.deltas, e.valid
    if e.firsts is not None:
        table[4] = e.firsts
    return table


# --- shared-document decode plans (kernels/shared_decode.py) ----------------------------------------------------


@dataclass(frozen=True)
class SharedDecode:
    """How the engine plans shared-document decode steps (kernels/shared_decode.py, shared_plan)."""

    group: int  # query heads per kv head
    group_rows: int = 16  # query rows of a job's tile: max(1, group_rows // group) member entries
    chunk_pages: int = 8  # pages of a job, at most
    # A CUDA graph's plan buffers hold this many jobs (and partial slots) per entry of its batch size; a step whose
    # plan needs more runs the plain decode graph. A lazy entry over 5 documents of 2048 tokens at pages of 64 and
    # chunks of 8 pages takes 22 (a system-prompt run, 4 per document, its own pages).
    jobs_per_entry: int = 48

    @property
    def members(self) -> int:
        from lazyattn.kernels.shared_decode import members_per_job

        return members_per_job(self.group, self.group_rows)

    def plan(self, step: StepInputs) -> HostPlan | None:
        """The step's plan where it is a decode step in which some chunk is listed by two entries or more (else the
        plain decode kernel reads as little)."""
        if not step.is_decode or len(step.entries) < 2:
            return None
        from lazyattn.kernels.shared_decode import shared_plan, worth_sharing

        plan = shared_plan(step.entries, self.group, self.group_rows, self.chunk_pages)
        return plan if worth_sharing(plan) else None


def plan_buffer_size(max_entries: int, max_jobs: int, width: int) -> int:
    """int32 elements of a plan buffer: the job count, slot_start [max_entries + 1], then max_jobs job rows."""
    return 2 + max_entries + max_jobs * width


def fill_plan(buffer: np.ndarray, plan: HostPlan, max_entries: int) -> int:
    """Write a plan into a 1-D int32 buffer laid out as plan_buffer_size says: slot_start padded to max_entries + 1
    values with its last (padding entries get no slots). Returns how many leading elements hold the plan (what a
    copy to the device needs)."""
    b1 = plan.slot_start.shape[0]
    buffer[0] = plan.num_jobs
    buffer[1 : 1 + b1] = plan.slot_start
    buffer[1 + b1 : 2 + max_entries] = plan.slot_start[-1]
    jobs = 2 + max_entries
    end = jobs + plan.jobs.size
    buffer[jobs:end] = plan.jobs.reshape(-1)
    return end


def plan_views(
    buffer: torch.Tensor, max_entries: int, entries: int, max_jobs: int, members: int, programs: int
) -> SharedPlan:
    """The device plan over a buffer filled by fill_plan (copied over), for a batch of `entries` rows and room for
    max_jobs jobs (and as many partial slots: every job has a member)."""
    from lazyattn.kernels.shared_decode import SharedPlan, job_width

    width = job_width(members)
    jobs = 2 + max_entries
    return SharedPlan(
        num_jobs=buffer[:1],
        jobs=buffer[jobs : jobs + max_jobs * width].view(max_jobs, width),
        slot_start=buffer[1 : 2 + entries],
        members=members,
        num_slots=max_jobs,
        programs=programs,
    )
