"""CUDA graphs for small prefill steps (a cached RAG request's question, short chunks), by token-count bucket.

Why: the cached-documents request of docs/benchmarks.md ("The request path against the hardware limit") spends
one prefill step of 32 query tokens over 10K cached keys; issued eagerly from Python it is ~370 launch calls and
~1900 PyTorch operators, 15-27 ms of host time (by the host CPU) for 7.9 ms of GPU work. Replayed as a graph it
is one launch: time to first token 14.8 -> 9.2 ms on an H100 (docs/benchmarks.md, "Second round").

A step fits a bucket (T tokens, E entries) when its tokens fit in T, its entries in E - 1 and each entry's page
table in the graphs' width. The step is padded to the bucket:

- entries after the real ones list no query rows (the prefill kernel's programs for them return at once);
- the last entry is the *padding entry*: it owns the padding rows [real tokens, T), at positions 0, 1, ...,
  attending to slot 0 of page 0 (one key, so its rows stay finite); padding rows store nothing (slot -1);
- the logits rows of the sampling entries come first, then row 0 repeated; only the first n are returned.

Real rows never see padding rows: attention is by entry and the padding writes no key. The split-KV count is
fixed per bucket (PagedBatch.num_splits), the one an eager launch picks for T rows in E - 1 entries over a long
context; the kernel cuts the actual pages of each entry at run time, so any context length is served.

Inputs travel in three views of one buffer (Buffers; the tables as engine/graph_inputs.py lays them out): the host
fills a pinned copy (StepLayout.fill) and one copy moves it to the static device buffer the graphs read.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from lazyattn.engine.graph_inputs import TABLES, StepInputs, fill_tables, table_views
from lazyattn.kernels.backend import AttentionBackend, ForwardBatch
from lazyattn.kernels.paged import EntryPages, PagedBatch
from lazyattn.model.llama import CausalLM

TOKEN_BUCKETS = (16, 32, 64, 128)
# Entries including the padding entry: up to 63 real ones, so that a step mixing decode rows with a new
# request's question (continuous batching) replays a graph too.
ENTRY_BUCKETS = (2, 4, 8, 16, 32, 64)


def pick_bucket(step: StepInputs, width: int, token_buckets: Sequence[int] = TOKEN_BUCKETS,
                entry_buckets: Sequence[int] = ENTRY_BUCKETS) -> tuple[int, int] | None:
    """The smallest (tokens, entries) bucket a prefill step fits in, or None (decode steps, long or wide ones)."""
    if step.is_decode or not step.tokens or any(len(e.pages) > width for e in step.entries):
        return None
    t = next((b for b in token_buckets if b >= len(step.tokens)), None)
    e = next((b for b in entry_buckets if b >= len(step.entries) + 1), None)
    return None if t is None or e is None else (t, e)


def _aligned(offset: int, to: int = 256) -> int:
    return -(-offset // to) * to


class Buffers:
    """A step's inputs as three views of one byte buffer: an int64 one (ids, positions, slots, logits rows), an
    int32 one (cu_seqlens_q, q_start, num_pages) and the entry-major page tables [max_entries, 5, width], last.
    Why one buffer: one copy moves a step's inputs to the device, where three copies would each cost a launch
    on the host and a few µs on the GPU before the graph can start (the first token waits for both)."""

    def __init__(self, layout: StepLayout, device: torch.device | str, pin: bool = False) -> None:
        n64, n32 = 3 * layout.t + layout.e, 3 * layout.e + 1
        # Each view starts on a 256-byte boundary, as a buffer of its own would (the kernels' pointer alignment).
        head_at = _aligned(8 * n64)
        self.tables_at = _aligned(head_at + 4 * n32)
        self.record_bytes = 4 * TABLES * layout.w
        self.raw = torch.zeros(self.tables_at + layout.e * self.record_bytes, dtype=torch.uint8, device=device,
                               pin_memory=pin)
        self.i64 = self.raw[: 8 * n64].view(torch.int64)
        self.head = self.raw[head_at: head_at + 4 * n32].view(torch.int32)
        self.tables = self.raw[self.tables_at:].view(torch.int32).view(layout.e, TABLES, layout.w)
        # numpy views of a host buffer, made once: the host writes a step through them (~2 µs a view per step)
        self.arrays = tuple(t.numpy() for t in (self.i64, self.head, self.tables)) if self.raw.device.type == "cpu" \
            else None

    def upto(self, entries: int) -> torch.Tensor:
        """The bytes a step of `entries` entries (padding included) is read from: everything before its tables
        and its tables."""
        return self.raw[: self.tables_at + entries * self.record_bytes]


class StepLayout:
    """Where each input of a step of at most `max_tokens` tokens and `max_entries` entries of at most `width`
    pages lives (Buffers; the page tables as in engine/graph_inputs.py), and the views of one bucket over such
    buffers."""

    def __init__(self, max_tokens: int, max_entries: int, width: int, page_size: int) -> None:
        self.t, self.e, self.w, self.page_size = max_tokens, max_entries, width, page_size

    def buffers(self, device: torch.device | str, pin: bool = False) -> Buffers:
        return Buffers(self, device, pin)

    def views(self, buffers: Buffers, tokens: int, entries: int,
              num_splits: int | None = None) -> tuple[torch.Tensor, ForwardBatch]:
        """(input_ids [T], ForwardBatch) of bucket (tokens, entries) over the buffers."""
        i64, head, tables = buffers.i64, buffers.head, buffers.tables
        t, e = self.t, self.e
        pages, deltas, valid, starts, firsts = table_views(tables[:entries])
        attn = PagedBatch(head[: entries + 1], head[e + 1: e + 1 + entries], pages, deltas, valid, starts,
                          head[2 * e + 1: 2 * e + 1 + entries], max_q=tokens, max_kv=self.w * self.page_size,
                          firsts=firsts, num_splits=num_splits)
        fb = ForwardBatch(i64[t: t + tokens], i64[2 * t: 2 * t + tokens], attn, False,
                          i64[3 * t: 3 * t + entries])
        return i64[:tokens], fb

    def fill(self, buffers: Buffers, step: StepInputs, tokens: int, entries: int) -> None:
        """Write `step` padded to bucket (tokens, entries) into CPU buffers (module docstring, padding). One
        slice assignment per field, from lists padded in Python: each numpy call costs about a µs."""
        i64, head, tables = buffers.arrays
        t, e = self.t, self.e
        n, real = len(step.tokens), len(step.entries)
        pad = tokens - n
        i64[:tokens] = step.tokens + [0] * pad
        i64[t: t + tokens] = step.positions + list(range(pad))
        i64[2 * t: 2 * t + tokens] = step.slots + [-1] * pad
        rows = step.logits_rows
        i64[3 * t: 3 * t + entries] = rows + [0] * (entries - len(rows))
        empty = entries - 1 - real  # entries listing no rows, before the padding entry
        head[: entries + 1] = [0, *itertools.accumulate(step.q_lens)] + [n] * empty + [tokens]  # cu_seqlens_q
        head[e + 1: e + 1 + entries] = step.q_starts + [0] * (entries - real)
        head[2 * e + 1: 2 * e + 1 + entries] = [len(x.pages) for x in step.entries] + [0] * empty + [1]
        fill_tables(tables, step.entries + [_NO_PAGES] * empty + [_PADDING])


def _reachable(entry_buckets: Sequence[int], tokens: int) -> list[int]:
    """The entry buckets a step of at most `tokens` tokens can take: every entry has a token, so a bucket
    whose smaller neighbour already holds `tokens` entries is never picked."""
    return [e for i, e in enumerate(entry_buckets) if i == 0 or entry_buckets[i - 1] <= tokens]


_NO_PAGES = EntryPages([], [], [])
_PADDING = EntryPages([0], [0], [1])  # slot 0 of page 0: one key, so that padding rows stay finite


class PrefillGraphs:
    """One CUDA graph per (tokens, entries) bucket over static buffers of the largest bucket."""

    def __init__(self, model: CausalLM, backend: AttentionBackend, width: int, device: torch.device,
                 token_buckets: Sequence[int] = TOKEN_BUCKETS, entry_buckets: Sequence[int] = ENTRY_BUCKETS) -> None:
        from lazyattn.kernels.prefill import graph_num_splits

        self.model = model
        self.backend = backend
        self.width = width
        self.device = device
        self.token_buckets, self.entry_buckets = tuple(token_buckets), tuple(entry_buckets)
        self.layout = StepLayout(self.token_buckets[-1], self.entry_buckets[-1], width, backend.page_size)
        self.static = self.layout.buffers(device)
        self.staging = self.layout.buffers("cpu", pin=True)
        self.empty = self.layout.buffers("cpu")  # an empty step: what the graphs are captured over
        self.copied = torch.cuda.Event()  # the staging buffers are free again once their copies ran
        self.copied.record()
        cfg = model.config
        self.splits = {(t, e): graph_num_splits(t, e - 1, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                                                backend.kv.dtype, backend.page_size, device)
                       for t in self.token_buckets for e in _reachable(self.entry_buckets, t)}
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None
        self.replays = 0  # steps served by a graph (tests check that graphs actually ran)

    def bucket(self, step: StepInputs) -> tuple[int, int] | None:
        return pick_bucket(step, self.width, self.token_buckets, self.entry_buckets)

    def run(self, step: StepInputs, bucket: tuple[int, int]) -> torch.Tensor:
        """fp32 logits [len(step.logits_rows), vocab] of a step that fits `bucket`, by graph replay."""
        tokens, entries = bucket
        self.copied.synchronize()  # the previous step's copy may still read the staging buffers
        self.layout.fill(self.staging, step, tokens, entries)
        self.static.upto(entries).copy_(self.staging.upto(entries), non_blocking=True)
        self.copied.record()
        if bucket not in self.graphs:
            self.graphs[bucket] = self._capture(bucket)
        graph, logits = self.graphs[bucket]
        graph.replay()
        self.replays += 1
        return logits[: len(step.logits_rows)]

    def capture_all(self) -> None:
        """Capture every bucket now (start-up). The static buffers then describe an empty step: no real entry,
        the padding entry owning every row, so the capture runs write nothing to the pool."""
        for bucket in sorted(self.splits):
            if bucket not in self.graphs:
                tokens, entries = bucket
                self.layout.fill(self.empty, StepInputs([], [], [], [], [], [], [], False), tokens, entries)
                self.static.raw.copy_(self.empty.raw)
                self.graphs[bucket] = self._capture(bucket)

    @torch.inference_mode()
    def _capture(self, bucket: tuple[int, int]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        tokens, entries = bucket
        ids, fb = self.layout.views(self.static, tokens, entries, num_splits=self.splits[bucket])
        model = self.model

        def forward() -> torch.Tensor:
            return model.compute_logits(model(ids, fb, self.backend)[fb.logits_indices])

        # Warm up on a side stream (compiles kernels outside the capture), then capture.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            forward()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):  # see cuda_graphs.py
            logits = forward()
        self.pool = graph.pool()
        return graph, logits
