"""CUDA graphs for decode steps.

Measured at Llama-3.1-8B shapes on an H200 (tests/engine/test_engine_gpu.py, docs/benchmarks.md): issuing
one eager decode step from Python takes ~15 ms at batch 1 and at batch 16, more than the GPU needs, so
decode is launch-bound; a replayed graph finishes the step in 6.3 ms (batch 1) and 8.9 ms (batch 16).
One graph per padded batch size, captured at warm-up (or on first use), over static input buffers sized for
the largest batch and the widest page table.

Padding rows are harmless: they store nothing (slot -1), list no pages, and their logits are dropped.
The graphs read per-page first-slot offsets (all 0 unless a row is relinked, docs/design.md "Relink"), so one
graph serves relinked and plain rows: one more scalar load per K/V tile.
"""

from __future__ import annotations

import torch

from lazyattn.kernels.backend import AttentionBackend, ForwardBatch
from lazyattn.kernels.paged import PagedBatch
from lazyattn.model.llama import CausalLM


def graph_batch_sizes(max_batch: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, max_batch + 16, 16))
    return sorted({min(s, max_batch) for s in sizes})


class DecodeGraphs:
    def __init__(self, model: CausalLM, backend: AttentionBackend, max_batch: int, max_pages: int,
                 device: torch.device) -> None:
        self.model = model
        self.backend = backend
        self.sizes = graph_batch_sizes(max_batch)
        self.max_pages = max_pages
        n = self.sizes[-1]
        i32 = dict(dtype=torch.int32, device=device)
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slots = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.cu = torch.arange(n + 1, **i32)
        self.q_start = torch.zeros(n, **i32)
        self.pages = torch.zeros(n, max_pages, **i32)
        self.deltas = torch.zeros(n, max_pages, **i32)
        self.valid = torch.zeros(n, max_pages, **i32)
        self.starts = torch.zeros(n, max_pages, **i32)
        self.firsts = torch.zeros(n, max_pages, **i32)
        self.num_pages = torch.zeros(n, **i32)
        self.rows = torch.arange(n, dtype=torch.int64, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None

    def fits(self, fb: ForwardBatch) -> bool:
        return fb.is_decode and fb.attn.batch_size <= self.sizes[-1] and fb.attn.max_pages <= self.max_pages

    def run(self, input_ids: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """Logits [B, vocab] of a decode batch (every row samples), by graph replay."""
        b, w = fb.attn.batch_size, fb.attn.max_pages
        size = next(s for s in self.sizes if s >= b)
        self.input_ids[:b].copy_(input_ids)
        self.positions[:b].copy_(fb.positions)
        self.slots[:b].copy_(fb.slot_mapping)
        self.slots[b:size].fill_(-1)
        self.q_start[:b].copy_(fb.attn.q_start)
        self.num_pages[:b].copy_(fb.attn.num_pages)
        self.num_pages[b:size].zero_()
        for static, live in ((self.pages, fb.attn.pages), (self.deltas, fb.attn.deltas),
                             (self.valid, fb.attn.valid), (self.starts, fb.attn.starts)):
            static[:b, :w].copy_(live)
        if fb.attn.firsts is None:
            self.firsts[:b, :w].zero_()
        else:
            self.firsts[:b, :w].copy_(fb.attn.firsts)
        if size not in self.graphs:
            self.graphs[size] = self._capture(size)
        graph, logits = self.graphs[size]
        graph.replay()
        return logits[:b]

    def capture_all(self) -> None:
        """Capture every batch size now (start-up), instead of on a request's first decode of that size."""
        self.slots.fill_(-1)
        self.num_pages.zero_()
        for size in self.sizes:
            if size not in self.graphs:
                self.graphs[size] = self._capture(size)

    def _static_batch(self, size: int) -> ForwardBatch:
        attn = PagedBatch(self.cu[: size + 1], self.q_start[:size], self.pages[:size], self.deltas[:size],
                          self.valid[:size], self.starts[:size], self.num_pages[:size], max_q=1,
                          max_kv=self.max_pages * self.backend.page_size, firsts=self.firsts[:size])
        return ForwardBatch(self.positions[:size], self.slots[:size], attn, True, self.rows[:size])

    @torch.inference_mode()
    def _capture(self, size: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        fb = self._static_batch(size)
        ids = self.input_ids[:size]
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
