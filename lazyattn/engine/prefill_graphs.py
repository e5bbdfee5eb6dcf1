"""CUDA graphs for small prefill steps (a cached RAG request's question, short chunks), by token-count bucket.

Why: the cached-documents request of docs/benchmarks.md ("The request path against the hardware limit") spends
one prefill step of 32 query tokens over 10K cached keys; issued eagerly from Python it is ~370 launch calls and
~1900 PyTorch operators, more host time than the step's GPU work. Replayed as a graph it is one launch, and the
time to first token drops by about a third (docs/benchmarks.md, "Kernel constants").

A step fits a bucket (T tokens, E entries) when its tokens fit in T, its entries in E - 1 and each entry's page
table in the graphs' width. The step is padded to the bucket:

- entries after the real ones list no query rows (the prefill kernel's programs for them return at once);
- the last entry is the *padding entry*: it owns the padding rows [real tokens, T), at positions 0, 1, ...,
  attending to slot 0 of page 0 (one key, so its rows stay finite); padding rows store nothing (slot -1);
- the logits rows of the sampling entries come first, then row 0 repeated; only the first n are returned.

Real rows never see padding rows: attention is by entry and the padding writes no key.

Which attention kernel a graph runs is fixed at capture. A bucket of at most 256 tokens gives the Hopper kernel its
calls where it takes them (kernels/prefill_hopper.py: questions of at most MAX_QUESTION tokens). Past that, a bucket
has two graphs (PrefillGraphs): prefill.py's kernel for steps with a longer entry (a prompt or document chunk, where
it is faster), and the Hopper kernel for steps of short questions, and of longer questions over placed documents
(EntryPages.reads_documents), where that kernel is the faster one. The split-KV count is
fixed per bucket (PagedBatch.num_splits), the one an eager launch picks for T rows in E - 1 entries over a long
context; the kernel cuts the actual pages of each entry at run time, so any context length is served.

With a temperature or scale on documents by default (docs/design.md, "APE"), the tables carry each page's 1/T and
ln S and every bucket takes prefill.py's kernel (the Hopper kernel has no such tables); without, a step that carries
them runs eagerly.

Inputs travel in three views of one buffer (Buffers; the tables as engine/graph_inputs.py lays them out): the host
fills a pinned copy (StepLayout.fill) and one copy moves it to the static device buffer the graphs read.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import numpy as np
import torch

from lazyattn.engine.graph_inputs import (
    StepInputs,
    ape_views,
    fill_tables,
    has_ape,
    max_prompt_q,
    table_count,
    table_views,
)
from lazyattn.kernels import prefill_hopper
from lazyattn.kernels.backend import AttentionBackend, ForwardBatch
from lazyattn.kernels.paged import EntryPages, PagedBatch
from lazyattn.kernels.prefill import graph_num_splits
from lazyattn.kernels.prefill_plan import PLAN_WIDTH, plan_runs
from lazyattn.model.config import ModelConfig
from lazyattn.model.llama import CausalLM

# Up to 512 tokens: a step that admits several questions at once (5 x 32 tokens when requests arrive together) stays
# on a graph. Issued eagerly such a step costs the host many times its GPU time, requests arriving meanwhile pile
# into the next step, which is eager again: a burst that feeds itself into the p99 (docs/benchmarks.md, "Tracing a
# window").
TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512)
# Entries including the padding entry: up to 63 real ones, so that a step mixing decode rows with a new
# request's question (continuous batching) replays a graph too.
ENTRY_BUCKETS = (2, 4, 8, 16, 32, 64)


def pick_bucket(
    step: StepInputs,
    width: int,
    token_buckets: Sequence[int] = TOKEN_BUCKETS,
    entry_buckets: Sequence[int] = ENTRY_BUCKETS,
) -> tuple[int, int] | None:
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
    int32 one (cu_seqlens_q, q_start, num_pages) and the entry-major records, last: each entry's page tables
    [5, width], then its split plan [plan_splits, PLAN_WIDTH] (kernels/prefill_plan.py, split_plan; none when
    plan_splits is 0). Why one buffer: one copy moves a step's inputs to the device, where three copies would
    each cost a launch on the host and a few µs on the GPU before the graph can start (the first token waits
    for both)."""

    def __init__(self, layout: StepLayout, device: torch.device | str, pin: bool = False) -> None:
        n64, n32 = 3 * layout.t + layout.e, 3 * layout.e + 1
        # Each view starts on a 256-byte boundary, as a buffer of its own would (the kernels' pointer alignment).
        head_at = _aligned(8 * n64)
        self.tables_at = _aligned(head_at + 4 * n32)
        table_ints = table_count(layout.ape) * layout.w
        record_ints = table_ints + layout.plan_splits * PLAN_WIDTH
        self.record_bytes = 4 * record_ints
        self.raw = torch.zeros(
            self.tables_at + layout.e * self.record_bytes, dtype=torch.uint8, device=device, pin_memory=pin
        )
        self.i64 = self.raw[: 8 * n64].view(torch.int64)
        self.head = self.raw[head_at : head_at + 4 * n32].view(torch.int32)
        records = self.raw[self.tables_at :].view(torch.int32).view(layout.e, record_ints)
        self.tables = records[:, :table_ints].view(layout.e, table_count(layout.ape), layout.w)
        self.plan = records[:, table_ints:].view(layout.e, layout.plan_splits, PLAN_WIDTH)
        # numpy views of a host buffer, made once: the host writes a step through them (a view made per step costs
        # host time on every step)
        self.arrays = (
            tuple(t.numpy() for t in (self.i64, self.head, self.tables, records[:, table_ints:]))
            if self.raw.device.type == "cpu"
            else None
        )

    def upto(self, entries: int) -> torch.Tensor:
        """The bytes a step of `entries` entries (padding included) is read from: everything before its records
        and its records."""
        return self.raw[: self.tables_at + entries * self.record_bytes]


class StepLayout:
    """Where each input of a step of at most `max_tokens` tokens and `max_entries` entries of at most `width`
    pages lives (Buffers; the page tables as in engine/graph_inputs.py), and the views of one bucket over such
    buffers."""

    def __init__(
        self, max_tokens: int, max_entries: int, width: int, page_size: int, plan_splits: int = 0, ape: bool = False
    ) -> None:
        self.t, self.e, self.w, self.page_size = max_tokens, max_entries, width, page_size
        self.plan_splits = plan_splits  # the most splits a bucket's attention is planned over (0: no plans)
        self.ape = ape  # the page tables carry the temperature and scale tables (engine/graph_inputs.py)

    def buffers(self, device: torch.device | str, pin: bool = False) -> Buffers:
        return Buffers(self, device, pin)

    def views(
        self, buffers: Buffers, tokens: int, entries: int, num_splits: int | None = None, max_q: int | None = None
    ) -> tuple[torch.Tensor, ForwardBatch]:
        """(input_ids [T], ForwardBatch) of bucket (tokens, entries) over the buffers; the attention follows the
        host's plan where the layout holds one for the bucket's split count (fill writes it). `max_q`: the longest
        entry's rows the graph allows (default: all the bucket's tokens)."""
        i64, head, tables = buffers.i64, buffers.head, buffers.tables
        t, e = self.t, self.e
        pages, deltas, valid, starts, firsts = table_views(tables[:entries])
        inv_temps, log_scales = ape_views(tables[:entries])
        plan = buffers.plan[:entries, :num_splits] if self.planned(num_splits) else None
        attn = PagedBatch(
            head[: entries + 1],
            head[e + 1 : e + 1 + entries],
            pages,
            deltas,
            valid,
            starts,
            head[2 * e + 1 : 2 * e + 1 + entries],
            max_q=tokens if max_q is None else max_q,
            max_kv=self.w * self.page_size,
            firsts=firsts,
            num_splits=num_splits,
            plan=plan,
            inv_temps=inv_temps,
            log_scales=log_scales,
        )
        fb = ForwardBatch(i64[t : t + tokens], i64[2 * t : 2 * t + tokens], attn, False, i64[3 * t : 3 * t + entries])
        return i64[:tokens], fb

    def planned(self, num_splits: int | None) -> bool:
        """Whether a bucket of this split count attends by the host's plan."""
        return num_splits is not None and 1 < num_splits <= self.plan_splits

    def fill(
        self, buffers: Buffers, step: StepInputs, tokens: int, entries: int, num_splits: int | None = None
    ) -> None:
        """Write `step` padded to bucket (tokens, entries) into CPU buffers (module docstring, padding), with the
        split plan of each entry when the bucket splits `num_splits` ways. One slice assignment per field, from
        lists padded in Python: each numpy call costs about a µs."""
        i64, head, tables, plans = buffers.arrays
        t, e = self.t, self.e
        n, real = len(step.tokens), len(step.entries)
        pad = tokens - n
        i64[:tokens] = step.tokens + [0] * pad
        i64[t : t + tokens] = step.positions + list(range(pad))
        i64[2 * t : 2 * t + tokens] = step.slots + [-1] * pad
        rows = step.logits_rows
        i64[3 * t : 3 * t + entries] = rows + [0] * (entries - len(rows))
        empty = entries - 1 - real  # entries listing no rows, before the padding entry
        head[: entries + 1] = [0, *itertools.accumulate(step.q_lens)] + [n] * empty + [tokens]  # cu_seqlens_q
        head[e + 1 : e + 1 + entries] = step.q_starts + [0] * (entries - real)
        head[2 * e + 1 : 2 * e + 1 + entries] = [len(x.pages) for x in step.entries] + [0] * empty + [1]
        fill_tables(tables, step.entries + [_NO_PAGES] * empty + [_PADDING])
        if self.planned(num_splits):
            fill_plans(plans, tables, [len(x.pages) for x in step.entries] + [0] * empty + [1], num_splits)


def fill_plans(plans: np.ndarray, tables: np.ndarray, num_pages: list[int], num_splits: int) -> None:
    """Each entry's split plan (kernels/prefill_plan.py, plan_runs) into its row of `plans` [E, >= S * PLAN_WIDTH],
    from the runs of equal delta in its row of the filled page tables [E, 5, W]."""
    width = num_splits * PLAN_WIDTH
    for i, n in enumerate(num_pages):
        if not n:
            plans[i, :width] = 0
            continue
        deltas = tables[i, 1, :n]
        cuts = np.flatnonzero(deltas[1:] != deltas[:-1])  # run r + 1 starts at page cuts[r] + 1
        plans[i, :width] = _plan_of_cuts(cuts.tobytes(), n, num_splits)


@functools.lru_cache(maxsize=4096)
def _plan_of_cuts(cuts: bytes, n: int, num_splits: int) -> np.ndarray:
    """plan_runs as an int32 array, by the bytes of the run cuts fill_plans finds: one lookup and one slice copy
    per entry and step (copying a tuple of S * PLAN_WIDTH ints into the buffer cost more host time than the lookup)."""
    bounds = [0, *(np.frombuffer(cuts, dtype=np.int64) + 1).tolist(), n]
    plan = np.array(plan_runs(tuple(b - a for a, b in itertools.pairwise(bounds)), num_splits), dtype=np.int32)
    plan.flags.writeable = False
    return plan


def _reachable(entry_buckets: Sequence[int], tokens: int) -> list[int]:
    """The entry buckets a step of at most `tokens` tokens can take: every entry has a token, so a bucket
    whose smaller neighbour already holds `tokens` entries is never picked."""
    return [e for i, e in enumerate(entry_buckets) if i == 0 or entry_buckets[i - 1] <= tokens]


_NO_PAGES = EntryPages([], [], [])
_PADDING = EntryPages([0], [0], [1])  # slot 0 of page 0: one key, so that padding rows stay finite


def _bucket_splits(
    tokens: int,
    entries: int,
    cfg: ModelConfig,
    backend: AttentionBackend,
    device: torch.device,
    ape: bool = False,
    q_dtype: torch.dtype = torch.bfloat16,
    max_q: int | None = None,
) -> tuple[int, bool]:
    """The split count a bucket's graph fixes and whether the host plans those splits: the Hopper kernel's rule
    where it takes the bucket's calls (kernels/prefill_hopper.py: the model's activations, `q_dtype`, over the pool's
    pages, and the shapes, the longest entry at most `max_q` rows (default: all the tokens); it splits pages evenly
    itself, no plan; never with the temperature tables), else what an eager launch of prefill.py's kernel picks,
    planned. An fp32 model over FP8 pages takes prefill.py's."""
    shape = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, backend.kv.dtype, backend.page_size, device)
    hopper = (
        not ape
        and prefill_hopper.takes_dtypes(q_dtype, backend.kv.dtype)
        and prefill_hopper.shape_supported(tokens if max_q is None else max_q, *shape)
        and prefill_hopper.takes_layout(backend.kv[0, 0])
    )
    if hopper:
        return prefill_hopper.num_splits(tokens, cfg.num_heads, cfg.num_kv_heads, device), False
    return graph_num_splits(tokens, entries - 1, *shape), True


def bucket_choices(
    token_buckets: Sequence[int],
    entry_buckets: Sequence[int],
    cfg: ModelConfig,
    backend: AttentionBackend,
    device: torch.device,
    ape: bool = False,
    q_dtype: torch.dtype = torch.bfloat16,
) -> dict[tuple[int, int, int], tuple[int, bool]]:
    """{(tokens, entries, longest entry): (splits, planned)} of every graph (`_bucket_splits`): each reachable
    (tokens, entries) bucket allowing all its tokens in one entry, and, past the Hopper kernel's longest question
    where that kernel takes the bucket's short questions, a second one allowing MAX_QUESTION (PrefillGraphs)."""
    choice = {
        (t, e, t): _bucket_splits(t, e, cfg, backend, device, ape, q_dtype)
        for t in token_buckets
        for e in _reachable(entry_buckets, t)
    }
    short = prefill_hopper.MAX_QUESTION
    for t, e, _ in list(choice):
        if t > short and not (shorts := _bucket_splits(t, e, cfg, backend, device, ape, q_dtype, short))[1]:
            choice[t, e, short] = shorts
    return choice


class PrefillGraphs:
    """One CUDA graph per (tokens, entries, longest entry) bucket over static buffers of the largest bucket.

    The longest entry a graph allows is all its tokens, except for a second graph of the buckets past the Hopper
    kernel's longest question (kernels/prefill_hopper.py, MAX_QUESTION) where that kernel takes short questions: a
    step whose entries, the padding one included, are each at most that long (several questions at once) or are
    questions over placed documents (EntryPages.reads_documents) replays it; a step with a longer prompt or chunk of
    one replays the other, with prefill.py's kernel, faster there."""

    def __init__(
        self,
        model: CausalLM,
        backend: AttentionBackend,
        width: int,
        device: torch.device,
        token_buckets: Sequence[int] = TOKEN_BUCKETS,
        entry_buckets: Sequence[int] = ENTRY_BUCKETS,
        plan: bool = True,
        ape: bool = False,
        q_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        """`plan` (LAZYATTN_PREFILL_PLAN, the engine's config.env): the host fills a split plan per step where
        prefill.py's kernel reads one. `q_dtype`: the model's activations, which with the pool's pages decide which
        kernel takes a bucket's calls."""
        self.model = model
        self.ape = ape  # the graphs read the temperature and scale tables
        self.backend = backend
        self.width = width
        self.device = device
        self.token_buckets, self.entry_buckets = tuple(token_buckets), tuple(entry_buckets)
        choice = bucket_choices(self.token_buckets, self.entry_buckets, model.config, backend, device, ape, q_dtype)
        self.splits = {bucket: splits for bucket, (splits, _) in choice.items()}
        self.planned = {bucket: plan for bucket, (_, plan) in choice.items()}  # prefill.py's kernel, not Hopper's
        # The host fills a plan per step only where prefill.py's kernel reads it.
        planned = [splits for splits, plan in choice.values() if plan]
        plan_splits = max(planned, default=0) if plan else 0
        self.layout = StepLayout(
            self.token_buckets[-1], self.entry_buckets[-1], width, backend.page_size, plan_splits, ape
        )
        self.static = self.layout.buffers(device)
        self.staging = self.layout.buffers("cpu", pin=True)
        self.empty = self.layout.buffers("cpu")  # an empty step: what the graphs are captured over
        self.copied = torch.cuda.Event()  # the staging buffers are free again once their copies ran
        self.copied.record()
        # (device, host) bytes of a step of e entries, made once per e: two views made per step cost host time
        self._copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.graphs: dict[tuple[int, int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None
        self.replays = 0  # steps served by a graph (tests check that graphs actually ran)

    def bucket(self, step: StepInputs) -> tuple[int, int, int] | None:
        """(tokens, entries, longest entry) of the graph that serves `step`, or None (eager)."""
        if not self.ape and has_ape(step.entries):
            return None
        picked = pick_bucket(step, self.width, self.token_buckets, self.entry_buckets)
        if picked is None:
            return None
        tokens, entries = picked
        short = (tokens, entries, prefill_hopper.MAX_QUESTION)
        # Every entry short, the padding one too, or longer and a question over placed documents (max_prompt_q)
        if short in self.splits and max(max_prompt_q(step.entries, step.q_lens), tokens - len(step.tokens)) <= short[2]:
            return short
        return tokens, entries, tokens

    def run(self, step: StepInputs, bucket: tuple[int, int, int]) -> torch.Tensor:
        """fp32 logits [len(step.logits_rows), vocab] of a step that fits `bucket`, by graph replay."""
        tokens, entries, _ = bucket
        self.copied.synchronize()  # the previous step's copy may still read the staging buffers
        self.layout.fill(self.staging, step, tokens, entries, self.splits[bucket])
        if entries not in self._copies:
            self._copies[entries] = (self.static.upto(entries), self.staging.upto(entries))
        dst, src = self._copies[entries]
        dst.copy_(src, non_blocking=True)
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
                tokens, entries, _ = bucket
                self.layout.fill(
                    self.empty, StepInputs([], [], [], [], [], [], [], False), tokens, entries, self.splits[bucket]
                )
                self.static.raw.copy_(self.empty.raw)
                self.graphs[bucket] = self._capture(bucket)

    @torch.inference_mode()
    def _capture(self, bucket: tuple[int, int, int]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        tokens, entries, max_q = bucket
        ids, fb = self.layout.views(self.static, tokens, entries, num_splits=self.splits[bucket], max_q=max_q)
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
