"""CUDA graphs for decode steps.

Measured at Llama-3.1-8B shapes on an H200: issuing one eager decode step from Python takes longer than the GPU
needs, at batch 1 and at batch 16, so decode is launch-bound; a replayed graph finishes the step in a fraction of
that time (docs/benchmarks.md, "Kernel constants").
One graph per padded batch size, captured at warm-up (or on first use), over static input buffers sized for
the largest batch and the widest page table. A step's inputs are written into pinned host buffers and copied
over in three copies (engine/graph_inputs.py): the host work left between two replays.

Padding rows are harmless: they store nothing (slot -1), list no pages, and their logits are dropped.
The graphs read per-page first-slot offsets (all 0 unless a row is relinked, docs/design.md "Relink"), so one
graph serves relinked and plain rows: one more scalar load per K/V tile. Where the engine's requests default to a
temperature or scale on their documents (docs/design.md, "APE"), the graphs read each page's 1/T and ln S too (two
more loads per tile); without, a step that carries them (a request's own choice) runs eagerly.

Shared-document decode (kernels/shared_decode.py): with a SharedDecode, each batch size has a second graph that
attends by a plan held in static buffers (room for SharedDecode.jobs_per_entry jobs per entry). A step whose entries
share a document and whose plan fits replays it; any other decode step replays the plain graph. The plan graph's job
kernel has a fixed grid whose programs stride over the step's job count (a device scalar).
"""

from __future__ import annotations

import torch

from lazyattn.engine.graph_inputs import (
    SharedDecode,
    StepInputs,
    ape_views,
    fill_plan,
    fill_tables,
    has_ape,
    plan_buffer_size,
    plan_views,
    table_count,
    table_views,
)
from lazyattn.kernels.backend import AttentionBackend, ForwardBatch
from lazyattn.kernels.paged import PagedBatch
from lazyattn.model.llama import CausalLM


def graph_batch_sizes(max_batch: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, max_batch + 16, 16))
    return sorted({min(s, max_batch) for s in sizes})


class DecodeGraphs:
    def __init__(
        self,
        model: CausalLM,
        backend: AttentionBackend,
        max_batch: int,
        max_pages: int,
        device: torch.device,
        ape: bool = False,
        shared: SharedDecode | None = None,
    ) -> None:
        self.model = model
        self.ape = ape  # the graphs read the temperature and scale tables
        self.backend = backend
        self.sizes = graph_batch_sizes(max_batch)
        self.max_pages = max_pages
        n = self.sizes[-1]
        # Inputs in three buffers (engine/graph_inputs.py): ids, positions, slots (int64); q_start, num_pages
        # (int32); the entry-major page tables. Pinned host copies are filled and copied over once per step.
        self.static = (
            torch.zeros(3 * n, dtype=torch.int64, device=device),
            torch.zeros(2 * n, dtype=torch.int32, device=device),
            torch.zeros(n, table_count(ape), max_pages, dtype=torch.int32, device=device),
        )
        self.staging = tuple(torch.zeros_like(t, device="cpu").pin_memory() for t in self.static)
        self.copied = torch.cuda.Event()  # the staging buffers are free again once their copies ran
        self.copied.record()
        self.static[0][2 * n :].fill_(-1)  # padding rows store nothing
        self.staging[0][2 * n :].fill_(-1)
        self.cu = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.rows = torch.arange(n, dtype=torch.int64, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None
        self.shared = shared
        self.plan_graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}  # by size, with a plan
        self.shared_replays = 0  # steps that replayed a plan graph
        if shared is not None:
            from lazyattn.kernels.shared_decode import job_width

            size = plan_buffer_size(n, shared.jobs_per_entry * n, job_width(shared.members))
            self.plan_static = torch.zeros(size, dtype=torch.int32, device=device)
            self.plan_staging = torch.zeros_like(self.plan_static, device="cpu").pin_memory()

    def fits(self, step: StepInputs) -> bool:
        return (
            step.is_decode
            and len(step.tokens) <= self.sizes[-1]
            and all(len(e.pages) <= self.max_pages for e in step.entries)
            and (self.ape or not has_ape(step.entries))
        )

    def run(self, step: StepInputs) -> torch.Tensor:
        """Logits [B, vocab] of a decode step (every row samples), by graph replay."""
        b, n = len(step.tokens), self.sizes[-1]
        size = next(s for s in self.sizes if s >= b)
        self.copied.synchronize()  # the previous step's copies may still read the staging buffers
        i64, head, tables = (t.numpy() for t in self.staging)
        i64[:b] = step.tokens
        i64[b:size] = 0  # padding rows read a valid id, never a placeholder a larger step left here
        i64[n : n + b] = step.positions
        i64[2 * n : 2 * n + b] = step.slots
        i64[2 * n + b : 2 * n + size] = -1
        head[:b] = step.q_starts
        head[n : n + b] = [len(e.pages) for e in step.entries]
        head[n + b : n + size] = 0
        fill_tables(tables, step.entries)
        for static, staged in zip(self.static[:2], self.staging[:2]):
            static.copy_(staged, non_blocking=True)
        self.static[2][:b].copy_(self.staging[2][:b], non_blocking=True)
        shared = self._stage_plan(step, size)
        self.copied.record()
        if step.fed_back is not None:  # after the ids' copy, which staged placeholders in those rows
            step.fed_back.write(self.static[0][:b])
        graphs = self.plan_graphs if shared else self.graphs
        if size not in graphs:
            graphs[size] = self._capture(size, shared)
        graph, logits = graphs[size]
        graph.replay()
        self.shared_replays += shared
        return logits[:b]

    def _stage_plan(self, step: StepInputs, size: int) -> bool:
        """Stage and copy the step's shared-document plan where it has one that fits the graph of `size`."""
        if self.shared is None:
            return False
        plan = self.shared.plan(step)
        if plan is None or plan.num_slots > self._slots(size):  # every job has a slot: jobs fit too
            return False
        end = fill_plan(self.plan_staging.numpy(), plan, self.sizes[-1])
        self.plan_static[:end].copy_(self.plan_staging[:end], non_blocking=True)
        return True

    def _slots(self, size: int) -> int:
        """Jobs, and partial slots, the plan graph of `size` has room for."""
        return self.shared.jobs_per_entry * size

    def capture_all(self) -> None:
        """Capture every batch size now (start-up), instead of on a request's first decode of that size."""
        n = self.sizes[-1]
        self.static[0][2 * n :].fill_(-1)
        self.static[1][n:].zero_()
        if self.shared is not None:
            self.plan_static.zero_()  # no jobs: the plan graphs' capture runs read nothing
        for size in self.sizes:
            if size not in self.graphs:
                self.graphs[size] = self._capture(size)
            if self.shared is not None and size not in self.plan_graphs:
                self.plan_graphs[size] = self._capture(size, shared=True)

    def _static_batch(self, size: int, shared: bool = False) -> tuple[torch.Tensor, ForwardBatch]:
        n = self.sizes[-1]
        i64, head, tables = self.static
        pages, deltas, valid, starts, firsts = table_views(tables[:size])
        inv_temps, log_scales = ape_views(tables[:size])
        attn = PagedBatch(
            self.cu[: size + 1],
            head[:size],
            pages,
            deltas,
            valid,
            starts,
            head[n : n + size],
            max_q=1,
            max_kv=self.max_pages * self.backend.page_size,
            firsts=firsts,
            inv_temps=inv_temps,
            log_scales=log_scales,
        )
        fb = ForwardBatch(i64[n : n + size], i64[2 * n : 2 * n + size], attn, True, self.rows[:size])
        if shared:
            jobs = self._slots(size)
            # Programs of the job kernel: 8 per entry (128 at least), unmeasured; each strides over the step's jobs.
            programs = min(jobs, max(128, 8 * size))
            fb.shared = plan_views(self.plan_static, n, size, jobs, self.shared.members, programs)
        return i64[:size], fb

    @torch.inference_mode()
    def _capture(self, size: int, shared: bool = False) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        ids, fb = self._static_batch(size, shared)
        # Warm up on a side stream (compiles and autotunes kernels outside the capture), then capture.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.model.compute_logits(self.model(ids, fb, self.backend))
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: under tensor parallelism NCCL's watchdog thread polls events while we capture, which the
        # default (global) mode would count as an illegal call during capture.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            logits = self.model.compute_logits(self.model(ids, fb, self.backend))
        self.pool = graph.pool()
        return graph, logits
