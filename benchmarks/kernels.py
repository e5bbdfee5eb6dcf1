"""Kernel benchmark: deferred-RoPE overhead, decode bandwidth, prefill TFLOP/s vs torch SDPA, block-mode copy, and
the attention targets of the request path (`targets`: each beside the copy bandwidth of the same run).

On the GPU (all sections, about 5 minutes on an H100; Llama-3.1-8B heads: 32 q, 8 kv, head_dim 128, bf16):

    python -m benchmarks.kernels --out OUT/kernels_h100

writes kernels_h100.json and kernels_h100.md and prints the tables. `--kv-cache-dtype fp8_e4m3` stores the paged
pools in FP8 (docs/design.md, "FP8 KV cache"; decode's bytes count one per element); the SDPA baselines keep bf16.
`--sections overhead,decode` picks sections; `--quick` runs tiny shapes (on a CPU: the Triton interpreter, SDPA and
copy bandwidth skipped) to smoke-test the script. The goals these numbers are held against are in docs/kernels.md.

Method. Times are triton.testing.do_bench medians (it flushes L2 before each call); inputs whose working
set would fit in L2 are additionally rotated over several copies. Data is random (never zeros). Pages are
taken from a shuffled free list, as in a long-running pool. Each section and each case runs under its own
try/except: a failure is recorded in the results and the run goes on.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import itertools
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

if not torch.cuda.is_available():  # must precede the first triton import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import mbarrier  # noqa: E402

from lazyattn.kernels.cache_ops import copy_rotate, rope_write_kv, rope_write_kv_runs  # noqa: E402
from lazyattn.kernels.kv_dtype import quantize, resolve  # noqa: E402
from lazyattn.kernels.launch import hopper_or_later, pdl_options, sm_count, wait_for_producers  # noqa: E402
from lazyattn.kernels.paged import EntryPages, PagedBatch, cdiv, page_fill, transposed_copy  # noqa: E402
from lazyattn.kernels.prefill import rotated_runs_for  # noqa: E402
from lazyattn.kernels.prefill_hopper import _tma_load, _wait_for_producers  # noqa: E402
from lazyattn.kernels.reference import copy_rotate as torch_copy_rotate  # noqa: E402
from lazyattn.kernels.rope import RopeConfig, RopeTables, rotate  # noqa: E402


@dataclass(frozen=True)
class Shapes:
    q_heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 64
    layers: int = 32
    doc_len: int = 2048  # a RAG document, and the segment length of long contexts (one delta each)
    n_docs: int = 5
    question: int = 32
    causal_lens: tuple[int, ...] = (4096, 8192, 16384)
    rag_batches: tuple[int, ...] = (1, 8, 32, 64)
    decode_batches: tuple[int, ...] = (1, 8, 32, 64)
    decode_contexts: tuple[int, ...] = (4096, 8192, 32768)
    overhead_rag_batch: int = 8
    overhead_causal: int = 8192
    overhead_decode_batches: tuple[int, ...] = (8, 32)
    overhead_context: int = 8192
    overhead_rounds: int = 5  # on/off measured alternately, median of rounds: drift hits both alike
    target_rag_batches: tuple[int, ...] = (1, 8)
    target_decode_context: int = 10304  # 5 x 2048 cached documents + a 64-token system prompt and question


QUICK = Shapes(
    q_heads=4,
    kv_heads=2,
    head_dim=64,
    page_size=16,
    layers=2,
    doc_len=32,
    n_docs=3,
    question=8,
    causal_lens=(64,),
    rag_batches=(1, 2),
    decode_batches=(1, 2),
    decode_contexts=(48, 96),
    overhead_rag_batch=2,
    overhead_causal=64,
    overhead_decode_batches=(2,),
    overhead_context=64,
    overhead_rounds=1,
    target_rag_batches=(1, 2),
    target_decode_context=96,
)
DTYPE = torch.bfloat16
KV_DTYPE = DTYPE  # the paged pools' (--kv-cache-dtype)
SECTIONS = ("overhead", "targets", "decode", "prefill", "copy")
COPY_CONFIGS = ((32, 4), (64, 4), (64, 8), (128, 8))  # copy_rotate (block_rows, num_warps) swept


# --- setup ----------------------------------------------------------------------------------------------


def dtype_comparison_args(description: str, argv: list[str] | None) -> argparse.Namespace:
    """The options of the scripts that time one kernel over bfloat16 and FP8 pages (benchmarks/kernels_fp8_*.py):
    --quick, --warmup, --rep and --rounds, with the seed `Bench` reads."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="tiny shapes: a smoke run")
    p.add_argument("--warmup", type=int, default=50, help="do_bench warm-up, ms")
    p.add_argument("--rep", type=int, default=500, help="do_bench repetition time, ms")
    p.add_argument("--rounds", type=int, default=5, help="readings per figure, the page dtypes taking turns")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds = min(args.rounds, 2)
    args.seed = 0
    return args


def llama31_tables(head_dim: int, max_position: int, device: torch.device) -> RopeTables:
    cfg = RopeConfig(
        head_dim=head_dim,
        base=500000.0,
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position=8192,
    )
    return RopeTables.build(cfg, max_position, device)


class Pool:
    """One layer's K and V pages, random, with pages handed out from a shuffled free list."""

    def __init__(self, s: Shapes, num_pages: int, device: torch.device) -> None:
        shape = (num_pages, s.page_size, s.kv_heads, s.head_dim)
        self.k = quantize(torch.randn(shape, dtype=DTYPE, device=device), KV_DTYPE)
        self.v = quantize(torch.randn(shape, dtype=DTYPE, device=device), KV_DTYPE)
        self.page_size = s.page_size
        self.free = torch.randperm(num_pages).tolist()

    def segment(
        self,
        length: int,
        delta: int,
        k: torch.Tensor | None = None,
        v: torch.Tensor | None = None,
        tables: RopeTables | None = None,
    ) -> EntryPages:
        """Pages for one segment of `length` keys at `delta`; stores k/v [length, Hkv, D] when given.

        k is given at its logical positions; the cache holds it at local ones: R_{-delta} k.
        """
        fill = page_fill(length, self.page_size)
        pages = [self.free.pop() for _ in fill]
        if k is not None:
            if delta:
                cos, sin = tables.cos[delta], tables.sin[delta]
                k = rotate(k, cos, -sin, tables.interleaved).to(DTYPE)
            idx = torch.tensor(pages, device=self.k.device)
            padded = cdiv(length, self.page_size) * self.page_size
            for src, dst in ((k, self.k), (v, self.v)):
                full = torch.randn(padded, *src.shape[1:], dtype=DTYPE, device=src.device)  # tail: padding
                full[:length] = src
                dst[idx] = quantize(full.view(len(pages), self.page_size, *src.shape[1:]), KV_DTYPE)
        return EntryPages(pages, [delta] * len(pages), fill)


def join(parts: list[EntryPages]) -> EntryPages:
    return EntryPages(
        [p for e in parts for p in e.pages], [d for e in parts for d in e.deltas], [n for e in parts for n in e.valid]
    )


def pages_for(tokens: int, s: Shapes) -> int:
    return cdiv(tokens, s.page_size)


def copies_for(working_set: int, l2_bytes: int) -> int:
    """Input copies to rotate over so that consecutive calls never find their inputs in L2."""
    return 1 if working_set >= 2 * l2_bytes else min(16, cdiv(3 * l2_bytes, max(1, working_set)))


def cycle(fns: list[Callable[[], object]]) -> Callable[[], object]:
    """One call of the next input copy per call."""
    it = itertools.cycle(fns)
    return lambda: next(it)()


# --- measurement ------------------------------------------------------------------------------------------


@dataclass
class Bench:
    args: argparse.Namespace
    s: Shapes
    device: torch.device
    tables: RopeTables
    copy_gbps: float | None = None

    @property
    def gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def scale(self) -> float:
        return self.s.head_dim**-0.5

    def time_ms(self, fn: Callable[[], object]) -> float:
        fn()  # compile / autotune outside the timing
        if self.gpu:
            torch.cuda.synchronize()
            return float(triton.testing.do_bench(fn, warmup=self.args.warmup, rep=self.args.rep, return_mode="median"))
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    def l2_bytes(self) -> int:
        if not self.gpu:
            return 0
        return getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", 50 << 20)

    def fits(self, nbytes: int) -> bool:
        """Room for nbytes more (with 20 % headroom for scratch and the allocator)."""
        if not self.gpu:
            return True
        torch.cuda.empty_cache()
        return nbytes * 1.2 < torch.cuda.mem_get_info(self.device)[0]

    def copy_bandwidth(self) -> float | None:
        """Device-to-device copy bandwidth (bytes read + written), GB/s: the decode goals' yardstick."""
        if self.copy_gbps is None and self.gpu:
            n = 1 << 30  # 1 GiB each way: far past L2
            src = torch.randn(n // 2, dtype=DTYPE, device=self.device)
            dst = torch.empty_like(src)
            ms = self.time_ms(lambda: dst.copy_(src))
            self.copy_gbps = 2 * n / ms / 1e6
            del src, dst
        return self.copy_gbps


def run_case(rows: list[dict], label: dict, body: Callable[[], dict]) -> None:
    """One table row: body's measurements, or the error, so that one failure does not end the section."""
    try:
        rows.append({**label, **body()})
    except Exception as e:  # noqa: BLE001 - recorded and reported, the benchmark goes on
        rows.append({**label, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"})
    finally:
        free_memory()


def with_transposed_v(inputs: list[tuple]) -> list[tuple]:
    """Cases' (q, k pages, v pages, ...) with V's pages stored transposed, as the engine's FP8 pools store them
    (kernels/paged.py, layer_caches): one transposed copy of each V pool the cases share."""
    done: dict[int, torch.Tensor] = {}
    for case in inputs:
        if id(case[2]) not in done:
            done[id(case[2])] = transposed_copy(case[2])
    return [(*case[:2], done[id(case[2])], *case[3:]) for case in inputs]


def free_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def attention(decode: bool):
    """The launcher under test. Decode keeps one set of arrival counters across calls, as TritonBackend does
    (without them every call would allocate and zero its own)."""
    if decode:
        from lazyattn.kernels.decode import ArrivalCounters, decode_attention

        return functools.partial(decode_attention, counters=ArrivalCounters())
    from lazyattn.kernels.prefill import prefill_attention

    return prefill_attention


# --- layouts ------------------------------------------------------------------------------------------------


def long_context(pool: Pool, ctx: int, s: Shapes, gen: torch.Generator, max_delta: int) -> EntryPages:
    """ctx keys in segments of doc_len, each at a random nonzero delta (a RAG context of many documents)."""
    parts = []
    for start in range(0, ctx, s.doc_len):
        delta = int(torch.randint(1, max_delta, (1,), generator=gen))
        parts.append(pool.segment(min(s.doc_len, ctx - start), delta))
    return join(parts)


def decode_case(b: Bench, batch: int, ctx: int, gen: torch.Generator) -> tuple[list[tuple], int]:
    """`copies` independent decode inputs (q, pool, batch) of `batch` entries x ctx keys; bytes per call."""
    s = b.s
    kv_bytes = batch * ctx * s.kv_heads * s.head_dim * 2 * KV_DTYPE.itemsize
    qo_bytes = 2 * batch * s.q_heads * s.head_dim * DTYPE.itemsize
    copies = copies_for(kv_bytes, b.l2_bytes())
    pool = Pool(s, copies * batch * pages_for(ctx, s) + 1, b.device)
    max_delta = b.tables.max_position - ctx
    inputs = []
    for _ in range(copies):
        entries = [long_context(pool, ctx, s, gen, max_delta) for _ in range(batch)]
        pb = PagedBatch.build(entries, [1] * batch, [ctx - 1] * batch, b.device)
        q = torch.randn(batch, s.q_heads, s.head_dim, dtype=DTYPE, device=b.device)
        inputs.append((q, pool.k, pool.v, pb))
    return inputs, kv_bytes + qo_bytes


def rag_case(b: Bench, batch: int, materialise: bool, copies: int = 1):
    """RAG prefill: per request n_docs documents at their starts, then the question (delta 0).

    Returns [(q, pool.k, pool.v, paged batch)] x copies and, when materialise, the first copy's contiguous
    q/k/v at logical positions (what SDPA attends over) [batch, heads, tokens, D].
    """
    s = b.s
    ctx = s.n_docs * s.doc_len
    total = ctx + s.question
    per_request = s.n_docs * pages_for(s.doc_len, s) + pages_for(s.question, s)
    pool = Pool(s, copies * batch * per_request + 1, b.device)
    inputs, dense = [], None
    for c in range(copies):
        keep = materialise and c == 0
        entries, ks, vs = [], [], []
        for _ in range(batch):
            k = torch.randn(total, s.kv_heads, s.head_dim, dtype=DTYPE, device=b.device) if keep else None
            v = torch.randn_like(k) if keep else None
            parts = [
                pool.segment(s.doc_len, i * s.doc_len, *_slice(k, v, i * s.doc_len, s.doc_len), b.tables)
                for i in range(s.n_docs)
            ]
            parts.append(pool.segment(s.question, 0, *_slice(k, v, ctx, s.question)))
            entries.append(join(parts))
            ks.append(k)
            vs.append(v)
        pb = PagedBatch.build(entries, [s.question] * batch, [ctx] * batch, b.device)
        q = torch.randn(batch * s.question, s.q_heads, s.head_dim, dtype=DTYPE, device=b.device)
        inputs.append((q, pool.k, pool.v, pb))
        if keep:
            dense = tuple(
                t.transpose(1, 2).contiguous()
                for t in (q.view(batch, s.question, s.q_heads, -1), torch.stack(ks), torch.stack(vs))
            )
    return inputs, dense


def _slice(k, v, start, n):
    return (None, None) if k is None else (k[start : start + n], v[start : start + n])


def causal_case(b: Bench, n: int, segment_deltas: bool, gen: torch.Generator | None = None, rows: int | None = None):
    """One sequence of n tokens prefilled causally: q, pool, batch, and contiguous q/k/v [1, heads, n, D].

    With segment_deltas the pages carry random nonzero deltas per doc_len segment (the deferred-RoPE
    overhead case); otherwise delta 0 (the plain causal prefill), and K/V equal the contiguous tensors.
    `rows`: only the last `rows` tokens are queries (a prompt's last chunk over all its keys; no contiguous copy).
    """
    rows = n if rows is None else rows
    s = b.s
    pool = Pool(s, pages_for(n, s) + 1, b.device)
    if segment_deltas:
        entry = long_context(pool, n, s, gen, b.tables.max_position - n)
    else:
        k = torch.randn(n, s.kv_heads, s.head_dim, dtype=DTYPE, device=b.device)
        v = torch.randn_like(k)
        entry = pool.segment(n, 0, k, v)
    pb = PagedBatch.build([entry], [rows], [n - rows], b.device)
    q = torch.randn(rows, s.q_heads, s.head_dim, dtype=DTYPE, device=b.device)
    dense = None
    if not segment_deltas and rows == n:
        dense = tuple(t.transpose(0, 1)[None].contiguous() for t in (q, k, v))
    return (q, pool.k, pool.v, pb), dense


# --- sections --------------------------------------------------------------------------------------------------


def section_overhead(b: Bench) -> list[dict]:
    """Deferred-RoPE overhead: the same kernel with apply_delta=True (nonzero deltas) vs False (rotation
    compiled out), measured alternately, median of rounds. Goal (docs/kernels.md): <= 1 %."""
    s, rows = b.s, []
    gen = torch.Generator().manual_seed(b.args.seed)

    def measure(decode: bool, inputs: list[tuple]) -> dict:
        fn = attention(decode)
        return alternate(
            {
                flag: cycle([lambda i=i, f=flag: fn(*i, b.tables, b.scale, apply_delta=f) for i in inputs])
                for flag in (True, False)
            }
        )

    def alternate(calls: dict) -> dict:
        times = {True: [], False: []}
        for _ in range(s.overhead_rounds):
            for flag in (True, False):
                times[flag].append(b.time_ms(calls[flag]))
        on, off = statistics.median(times[True]), statistics.median(times[False])
        return {"ms_delta": on, "ms_no_delta": off, "overhead_%": 100 * (on / off - 1)}

    def rag() -> dict:
        inputs, _ = rag_case(b, s.overhead_rag_batch, False)
        return {**measure(False, inputs), "deltas": "document starts"}

    def rag_engine(batch: int) -> dict:
        """As the engine runs a layer (rag_layer): the RoPE/KV-write launch, then attention."""
        inputs, _ = rag_case(b, batch, False)
        return {
            **alternate({flag: cycle([rag_layer(b, *i, flag) for i in inputs]) for flag in (True, False)}),
            "deltas": "document starts, RoPE launch included",
        }

    label = f"RAG bs {s.overhead_rag_batch}: {s.n_docs}x{s.doc_len} cached + {s.question}"
    run_case(rows, {"case": f"prefill {label}"}, rag)
    for batch in sorted({1, s.overhead_rag_batch}):
        run_case(
            rows,
            {"case": f"RoPE launch + prefill, RAG bs {batch} (engine path)"},
            lambda batch=batch: rag_engine(batch),
        )
    run_case(
        rows,
        {"case": f"prefill {s.overhead_causal} causal"},
        lambda: {
            **measure(False, [causal_case(b, s.overhead_causal, True, gen)[0]]),
            "deltas": f"random, one per {s.doc_len} tokens",
        },
    )
    for batch in s.overhead_decode_batches:
        run_case(
            rows,
            {"case": f"decode bs {batch} x {s.overhead_context}"},
            lambda batch=batch: {
                **measure(True, decode_case(b, batch, s.overhead_context, gen)[0]),
                "deltas": f"random, one per {s.doc_len} tokens",
            },
        )
    return rows


def graph_us(b: Bench, calls: list[Callable[[], object]], layers: int = 32, replays: int = 20) -> float:
    """Microseconds per call of `layers` calls (cycling over `calls`, input copies past L2) captured in one CUDA
    graph, median of `replays` replays: what a layer of the engine's graphs pays, launch gaps included and no L2
    flush in the timed span. On a CPU: one eager pass, timed."""
    return graph_timer(b, calls, layers, replays)()


def graph_timer(
    b: Bench, calls: list[Callable[[], object]], layers: int = 32, replays: int = 20
) -> Callable[[], float]:
    """`graph_us`'s measurement with its graph captured once: each call of the result clocks the GPU up, replays the
    graph `replays` times and returns the median microseconds per call (`alternating` takes turns with several)."""
    for call in calls:
        call()  # compile outside the capture
    if not b.gpu:

        def eager_pass() -> float:
            t0 = time.perf_counter()
            for i in range(layers):
                calls[i % len(calls)]()
            return (time.perf_counter() - t0) * 1e6 / layers

        return eager_pass
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm the allocator's graph-side pools
        for i in range(layers):
            calls[i % len(calls)]()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(layers):
            calls[i % len(calls)]()
    x = torch.randn(4096, 4096, device=b.device, dtype=DTYPE)

    def replay() -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.3:  # clocks up before the timed replays
            x @ x
        for _ in range(3):
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(replays):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / layers)
        return statistics.median(times)

    return replay


def eager_us(b: Bench, calls: list[Callable[[], object]]) -> float:
    """Microseconds per call of `calls` launched one by one, cycling (`Bench.time_ms`: do_bench's median)."""
    return 1e3 * b.time_ms(cycle(calls))


def both_ways(
    b: Bench, calls: list[Callable[[], object]], key: object
) -> dict[tuple[str, object], Callable[[], float]]:
    """Timers of `calls` in CUDA graphs (`graph_timer`) and launched one by one (`eager_us`), as ("graph", key) and
    ("eager", key) for `alternating`; `by_way` splits its result back."""
    return {("graph", key): graph_timer(b, calls), ("eager", key): functools.partial(eager_us, b, calls)}


def by_way(times: dict[tuple[str, Any], float]) -> tuple[dict[Any, float], dict[Any, float]]:
    """`alternating`'s figures of `both_ways` timers: (graph, eager), each keyed as the timers were."""
    return tuple({key: t for (way, key), t in times.items() if way == w} for w in ("graph", "eager"))  # type: ignore[return-value]


def alternating(timers: dict[Any, Callable[[], float]], rounds: int) -> dict[Any, float]:
    """The median over `rounds` of each timer's reading, the timers taking turns (each round starts one later), so
    that what drifts over a run (clocks, heat, the GPU's other tenants) falls on all of them alike."""
    names = list(timers)
    readings: dict[Any, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            readings[name].append(timers[name]())
    return {name: statistics.median(values) for name, values in readings.items()}


@triton.jit
def read_kernel(x_ptr, out_ptr, per_program, n, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    """Sum one contiguous chunk of x (16-bit) into out[program]: a launch that does nothing but read."""
    pid = tl.program_id(0)
    wait_for_producers(USE_PDL)
    lo = pid.to(tl.int64) * per_program
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, per_program, BLOCK):
        offs = lo + start + tl.arange(0, BLOCK)
        inside = (start + tl.arange(0, BLOCK) < per_program) & (offs < n)
        acc += tl.load(x_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


# (programs per SM, warps) of the register reads read_ceiling tries: the fastest four of a sweep of 1-8 programs per
# SM, 4-16 warps and steps of 16-64 KiB on an H100 and an H200.
_READ_FORMS = ((3, 8), (4, 8), (6, 4), (8, 8))
_READ_STEP = 8192  # elements a program reads a step: 16 KiB
# (programs per SM, ring slots) of the copy-engine reads (Hopper on): a sweep read the batch-1 decode
# case's tiles fastest with one program per SM and two to four 32 KiB slots.
_TMA_FORMS = ((1, 2), (1, 4), (2, 2))
_TMA_BOX = 128  # rows of 128 16-bit elements a copy: 32 KiB


@gluon.jit
def _tma_read_tile(desc, tile, pred, bar, buf, BOX: gl.constexpr):
    mbarrier.expect(bar, desc.block_type.nbytes, pred)
    _tma_load(desc, [tile * BOX, 0], bar, buf, pred)


@gluon.jit
def tma_read_kernel(desc, out_ptr, n_tiles, BOX: gl.constexpr, STAGES: gl.constexpr, USE_PDL: gl.constexpr):
    """Copy tiles [p * T / P, (p + 1) * T / P) of desc's [rows, 128] matrix ([BOX, 128] boxes) into a ring of STAGES
    shared-memory slots, each refilled as soon as its bytes have landed; nothing reads them: a launch that only
    reads, by the copy engine (TMA), as the Hopper attention kernels load their tiles."""
    pid = gl.program_id(0)
    lo = pid * n_tiles // gl.num_programs(0)
    n = (pid + 1) * n_tiles // gl.num_programs(0) - lo
    bufs = gl.allocate_shared_memory(desc.block_type.element_ty, [STAGES, BOX, 128], desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    if USE_PDL:
        _wait_for_producers()
    for i in gl.static_range(STAGES):
        _tma_read_tile(desc, lo + i, i < n, ready.index(i), bufs.index(i), BOX)
    for t in range(n):
        slot = t % STAGES
        mbarrier.wait(ready.index(slot), (t // STAGES) & 1)
        _tma_read_tile(desc, lo + t + STAGES, t + STAGES < n, ready.index(slot), bufs.index(slot), BOX)
    lanes = gl.arange(0, 128, layout=gl.BlockedLayout([1], [32], [4], [0]))
    gl.store(out_ptr + pid + lanes * 0, n + lanes * 0, mask=lanes == 0)


def read_ceiling(b: Bench, nbytes: int) -> float | None:
    """Microseconds of the fastest launch that only reads `nbytes`, timed as the targets are (graph_us: 32 launches a
    graph, 4 input copies past L2, PDL as the engine launches): a streaming sum into registers over _READ_FORMS' grids
    and, on Hopper GPUs, copy-engine reads into shared memory over _TMA_FORMS'. A launch has a ramp and a tail that
    1 GiB copies spread thin. On an H100 the register read of the decode target's 42 MB reaches ~79 % of copy
    bandwidth, the copy-engine read of the same tiles 86-91 %, with one program per SM,
    as the attention kernels run. The attention targets are printed against both yardsticks."""
    if not b.gpu:
        return None
    n = nbytes // 2
    xs = [torch.randn(n, dtype=DTYPE, device=b.device) for _ in range(4)]
    sms = sm_count(b.device)
    sums = torch.empty(8 * sms, dtype=torch.float32, device=b.device)
    counts = torch.empty(8 * sms, dtype=torch.int32, device=b.device)
    pdl = pdl_options(b.device, "attention")

    def read(x, programs, warps):
        per = cdiv(cdiv(n, programs), _READ_STEP) * _READ_STEP
        read_kernel[(programs,)](x, sums, per, n, BLOCK=_READ_STEP, num_warps=warps, **pdl)

    times = [
        graph_us(b, [functools.partial(read, x, per_sm * sms, warps) for x in xs]) for per_sm, warps in _READ_FORMS
    ]
    if hopper_or_later(b.device):
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        tiles = n // (128 * _TMA_BOX)
        layout = gl.NVMMASharedLayout.get_default_for([_TMA_BOX, 128], gl.bfloat16)
        descs = [
            TensorDescriptor(
                x[: tiles * _TMA_BOX * 128].view(-1, 128), [tiles * _TMA_BOX, 128], [128, 1], [_TMA_BOX, 128], layout
            )
            for x in xs
        ]

        def tma_read(desc, programs, stages):
            tma_read_kernel[(programs,)](desc, counts, tiles, BOX=_TMA_BOX, STAGES=stages, num_warps=4, **pdl)

        times += [
            graph_us(b, [functools.partial(tma_read, d, per_sm * sms, stages) for d in descs])
            for per_sm, stages in _TMA_FORMS
        ]
    return min(times)


def section_targets(b: Bench) -> list[dict]:
    """The request path's attention targets, each against the copy bandwidth measured in this run: time per layer as the
    engine's CUDA graphs run it (graph_us: 32 launches per graph, inputs rotated past L2, no L2 flush), KV bytes
    read per second, and that as % of copy. Short-query prefill: the RAG case (5 x 2048 cached documents at
    their deltas + a 32-token question), target >= 70 %; "attention" is the attention launch(es) the engine runs
    (engine_attention: on Hopper the warp-specialised kernel, which rotates Q itself; elsewhere prefill.py's over Q
    copies rotated per run), "RoPE + attention" adds the RoPE/KV-write launch before it (the engine's layer).
    Decode at batch 1 over 10 304 keys, target >= 80 %. Deferred-RoPE overhead, target <= 3 %: the same launches
    with per-document deltas vs the rotation compiled out (apply_delta=False, plain RoPE launch). The prefill calls
    split the keys as the engine's prefill graphs do (engine_split), both ways. Each bandwidth row also stands
    against the fastest launch that only reads the same bytes (read_ceiling, "%_of_read"): what one launch of that
    size can reach at all."""
    s, rows = b.s, []
    copy_gbps = b.copy_bandwidth()
    ceilings: dict[int, float | None] = {}

    def bw(us: float, nbytes: float) -> dict:
        gbps = nbytes / us / 1e3
        if nbytes not in ceilings:
            ceilings[nbytes] = read_ceiling(b, nbytes)
        read_us = ceilings[nbytes]
        return {
            "us": us,
            "GB/s": gbps,
            "%_of_copy": None if copy_gbps is None else 100 * gbps / copy_gbps,
            "read_us": read_us,
            "%_of_read": None if read_us is None else 100 * read_us / us,
        }

    for batch in s.target_rag_batches:
        kv_bytes = batch * (s.n_docs * s.doc_len + s.question) * s.kv_heads * s.head_dim * 2 * DTYPE.itemsize
        inputs, _ = rag_case(b, batch, False, copies=max(2, copies_for(kv_bytes, b.l2_bytes())))
        inputs = [engine_split(b, *i) for i in inputs]
        layers = {flag: [rag_layer(b, *i, flag) for i in inputs] for flag in (True, False)}
        rotated = [None if hopper_takes(*i) else rope_runs(b, *i) for i in inputs]
        attend = {
            True: [lambda i=i, r=r: engine_attention(b, *i, rotated_q=r) for i, r in zip(inputs, rotated)],
            False: [lambda i=i: engine_attention(b, *i, apply_delta=False) for i in inputs],
        }
        label = f"RAG bs {batch}: {s.n_docs}x{s.doc_len} cached + {s.question}"
        times = {}
        for what, calls in (("attention", attend), ("RoPE + attention", layers)):
            for flag in (True, False):
                key = (what, flag)
                try:
                    times[key] = graph_us(b, calls[flag])
                except Exception as e:  # noqa: BLE001 - recorded, the section goes on
                    rows.append({"target": f"prefill {label}, {what}", "deltas": flag, "error": str(e)[:200]})
                    continue
                goal = ">= 70 %" if flag else ""
                rows.append(
                    {"target": f"prefill {label}, {what}", "deltas": flag, **bw(times[key], kv_bytes), "goal": goal}
                )
            if (what, True) in times and (what, False) in times:
                over = 100 * (times[(what, True)] / times[(what, False)] - 1)
                rows.append(
                    {"target": f"deferred-RoPE overhead, {label}, {what}", "overhead_%": over, "goal": "<= 3 %"}
                )
        del inputs, layers, rotated, attend
        free_memory()

    def decode_row() -> dict:
        gen = torch.Generator().manual_seed(b.args.seed + 2)
        ctx = s.target_decode_context
        inputs, nbytes = decode_case(b, 1, ctx, gen)
        while len(inputs) < 4:
            inputs += decode_case(b, 1, ctx, gen)[0]
        fn = attention(True)
        return {**bw(graph_us(b, [lambda i=i: fn(*i, b.tables, b.scale) for i in inputs]), nbytes), "goal": ">= 80 %"}

    run_case(rows, {"target": f"decode bs 1 x {s.target_decode_context}", "deltas": True}, decode_row)
    rows.append({"target": "copy", "GB/s": copy_gbps})
    return rows


def hopper_takes(q, k_cache, v_cache, pb: PagedBatch) -> bool:
    """Whether the engine's GPU backend gives this prefill call to the Hopper kernel (kernels/prefill_hopper.py)."""
    from lazyattn.kernels import prefill_hopper

    return prefill_hopper.supports(q, k_cache, v_cache, pb)


def engine_attention(b: Bench, q, k_cache, v_cache, pb: PagedBatch, *, rotated_q=None, apply_delta: bool = True):
    """The prefill attention the engine's GPU backend runs for this call (kernels/triton_backend.py): the Hopper
    kernel where it takes the call (it rotates Q itself, at the split count the prefill graphs fix for it), else
    prefill.py's kernel over Q copies rotated per run (rotated_q) or with the rotation compiled out."""
    from lazyattn.kernels.prefill import prefill_attention

    if hopper_takes(q, k_cache, v_cache, pb):
        return hopper_attention(b, q, k_cache, v_cache, pb, apply_delta=apply_delta)
    return prefill_attention(q, k_cache, v_cache, pb, b.tables, b.scale, rotated_q=rotated_q, apply_delta=apply_delta)


def hopper_attention(b: Bench, q, k_cache, v_cache, pb: PagedBatch, *, apply_delta: bool = True):
    """The Hopper kernel's launch as the engine's eager steps split it (kernels/triton_backend.py), whether or not
    the engine would give it the call."""
    from lazyattn.kernels import prefill_hopper

    splits = prefill_hopper.num_splits(q.shape[0], q.shape[1], k_cache.shape[2], q.device, pb.batch_size, pb.max_q)
    return prefill_hopper.short_prefill_attention(
        q, k_cache, v_cache, pb, b.tables, b.scale, splits, apply_delta=apply_delta
    )


def engine_split(b: Bench, q, k_cache, v_cache, pb: PagedBatch) -> tuple:
    """The call's inputs with the split count the engine's prefill graphs fix for prefill.py's kernel over its rows
    and entries and, where they split, the host's plan of each entry's pages (kernels/prefill_plan.py, split_plan), as
    the graphs take it. The Hopper kernel ignores both (engine_attention: it splits pages evenly itself)."""
    from lazyattn.kernels.prefill import graph_num_splits
    from lazyattn.kernels.prefill_plan import with_plan

    s = b.s
    splits = graph_num_splits(
        q.shape[0], pb.batch_size, s.q_heads, s.kv_heads, s.head_dim, q.dtype, s.page_size, q.device
    )
    return q, k_cache, v_cache, with_plan(pb, splits) if splits > 1 else pb


def rag_positions(b: Bench, pb: PagedBatch) -> torch.Tensor:
    s = b.s
    return (
        pb.q_start.repeat_interleave(s.question) + torch.arange(s.question, device=b.device).repeat(pb.batch_size)
    ).long()


def rope_runs(b: Bench, q, k_cache, v_cache, pb) -> torch.Tensor:
    """The per-run rotated Q copies the engine's RoPE launch writes for this layer (made once, outside timing)."""
    s, t = b.s, q.shape[0]
    kv = torch.randn(t, 2, s.kv_heads, s.head_dim, dtype=DTYPE, device=b.device)
    slots = torch.full((t,), -1, dtype=torch.int64, device=b.device)
    return rope_write_kv_runs(
        q, kv[:, 0], kv[:, 1], rag_positions(b, pb), slots, k_cache, v_cache, b.tables, pb, rotated_runs_for(t)
    )[1]


def rag_layer(b: Bench, q, k_cache, v_cache, pb, deltas: bool) -> Callable[[], object]:
    """One engine layer of the RAG prefill: the RoPE/KV-write launch, then attention (engine_attention). Where the
    Hopper kernel takes the call, the plain RoPE launch and that kernel, which rotates Q per document itself.
    Elsewhere, with deltas the RoPE launch also writes Q rotated per run (rope_write_kv_runs) and attention reads
    those copies; without, the plain RoPE launch and attention with the rotation compiled out. The question's K/V
    count as cached (slots -1)."""
    s, t = b.s, q.shape[0]
    fn = attention(False)
    kv = torch.randn(t, 2, s.kv_heads, s.head_dim, dtype=DTYPE, device=b.device)
    slots = torch.full((t,), -1, dtype=torch.int64, device=b.device)
    args = (q, kv[:, 0], kv[:, 1], rag_positions(b, pb), slots, k_cache, v_cache, b.tables)
    if hopper_takes(q, k_cache, v_cache, pb):

        def call():
            return engine_attention(b, rope_write_kv(*args), k_cache, v_cache, pb, apply_delta=deltas)
    elif deltas:

        def call():
            rq, q_rot = rope_write_kv_runs(*args, pb, rotated_runs_for(t))
            return fn(rq, k_cache, v_cache, pb, b.tables, b.scale, rotated_q=q_rot)
    else:

        def call():
            return fn(rope_write_kv(*args), k_cache, v_cache, pb, b.tables, b.scale, apply_delta=False)

    return call


def section_decode(b: Bench) -> list[dict]:
    """Decode attention bandwidth: bytes of K+V actually read (+ q and out) per call over its time, and as a
    share of a device-to-device copy (torch copy_, bytes read + written) measured in the same run. Contexts
    are segments of doc_len tokens at nonzero deltas. Goal: >= 85 % (batch >= 8), >= 70 % (batch 1)."""
    s, rows = b.s, []
    gen = torch.Generator().manual_seed(b.args.seed + 1)
    copy_gbps = b.copy_bandwidth()
    decode = attention(True)
    for ctx in s.decode_contexts:
        for batch in s.decode_batches:

            def body(batch=batch, ctx=ctx) -> dict:
                need = batch * ctx * s.kv_heads * s.head_dim * 2 * KV_DTYPE.itemsize
                if not b.fits(need * copies_for(need, b.l2_bytes())):
                    return {"skipped": "does not fit in free memory"}
                inputs, nbytes = decode_case(b, batch, ctx, gen)
                ms = b.time_ms(cycle([lambda i=i: decode(*i, b.tables, b.scale) for i in inputs]))
                gbps = nbytes / ms / 1e6
                pct = None if copy_gbps is None else 100 * gbps / copy_gbps
                return {"us": 1e3 * ms, "GB/s": gbps, "%_of_copy": pct, "copies": len(inputs)}

            run_case(rows, {"batch": batch, "context": ctx}, body)
    rows.append({"batch": "copy", "context": "torch copy_ 1 GiB", "GB/s": copy_gbps})
    return rows


def sdpa_variants(q, k, v, causal: str):
    """Ways to ask torch SDPA for this attention, tried in order: native GQA first, expanded KV heads next.

    causal: "square" (is_causal) or "lower_right": the question rows see every cached key, a bottom-right
    aligned mask (is_causal is top-left aligned, wrong for Lq != Lk). Expanded K/V are built once, here,
    outside the timed call.
    """
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    lq, lk = q.shape[2], k.shape[2]
    masks = (
        [("is_causal", {"is_causal": True})]
        if causal == "square"
        else [
            ("causal_lower_right", {"attn_mask": causal_lower_right(lq, lk)}),
            ("bool mask", {"attn_mask": torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)}),
        ]
    )
    group = q.shape[1] // k.shape[1]
    expanded = None
    for mask_name, mask in masks:
        yield f"{mask_name}, enable_gqa", lambda m=mask: F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **m)
        if expanded is None:
            expanded = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        yield (
            f"{mask_name}, kv heads expanded x{group}",
            lambda m=mask, kv=expanded: F.scaled_dot_product_attention(q, *kv, **m),
        )


def time_sdpa(b: Bench, backend, dense, causal: str, ours: torch.Tensor) -> dict:
    """Median ms of the first SDPA variant the backend accepts, its name, and its max |diff| to ours."""
    from torch.nn.attention import sdpa_kernel

    errors = []
    for name, fn in sdpa_variants(*dense, causal):
        try:
            with sdpa_kernel(backend):
                out = fn()
                ms = b.time_ms(fn)
        except Exception as e:  # noqa: BLE001 - "no available kernel" and kin: try the next variant
            errors.append(f"{name}: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:100]}")
            continue
        diff = (out.transpose(1, 2).reshape(ours.shape).float() - ours.float()).abs().max().item()
        # Same inputs, same math: a mismatch means the two do not compute the same attention (a mask or
        # layout error), which would make the comparison meaningless. bf16 outputs differ by ~1e-2.
        return {"ms": ms, "variant": name, "max_abs_diff_vs_ours": diff, "same_output": diff < 0.1}
    return {"error": "unavailable: " + " | ".join(errors)}


def section_prefill(b: Bench) -> list[dict]:
    """Prefill TFLOP/s: ours (paged, per-page deltas) vs torch SDPA (flash, cuDNN) over contiguous K/V already
    rotated into place; SDPA's time leaves out materialising that K. FLOPs: causal N = 2 N^2 D Hq (half of
    4 N^2 D Hq); RAG = 4 D Hq x the (query, key) pairs the question rows see, the same count for both.
    `variant` says how SDPA was called (native GQA or KV heads expanded); `same_output` checks that both
    computed the same attention. Goals: causal >= 1.2x SDPA flash; RAG >= SDPA over materialised K."""
    s, rows = b.s, []
    prefill = attention(False)
    backends = {}
    if b.gpu:
        from torch.nn.attention import SDPBackend

        backends = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}

    def compare(label: dict, flops: float, inputs: list[tuple], dense, causal: str) -> None:
        fn = cycle([lambda i=i: prefill(*i, b.tables, b.scale) for i in inputs])
        ours = prefill(*inputs[0], b.tables, b.scale)
        run_case(rows, {**label, "impl": "ours (paged)"}, lambda: _tflops(b.time_ms(fn), flops))
        for name, backend in backends.items():
            run_case(
                rows,
                {**label, "impl": name},
                lambda backend=backend: _with_tflops(time_sdpa(b, backend, dense, causal, ours), flops),
            )

    for n in s.causal_lens:
        flops = 2.0 * n * n * s.head_dim * s.q_heads  # causal: half of 4 N^2 D H
        try:
            inputs, dense = causal_case(b, n, False)
            compare({"case": f"causal {n}"}, flops, [inputs], dense, "square")
        except Exception as e:  # noqa: BLE001
            rows.append({"case": f"causal {n}", "error": f"{type(e).__name__}: {e}"})
        free_memory()

    ctx = s.n_docs * s.doc_len
    visible = sum(ctx + i + 1 for i in range(s.question))  # keys seen by the question rows, causal
    for batch in s.rag_batches:
        label = {"case": f"RAG bs {batch}: {s.n_docs}x{s.doc_len} + {s.question}"}
        try:
            kv_bytes = batch * (ctx + s.question) * s.kv_heads * s.head_dim * 2 * DTYPE.itemsize
            inputs, dense = rag_case(b, batch, True, copies=copies_for(kv_bytes, b.l2_bytes()))
            compare(label, 4.0 * visible * s.head_dim * s.q_heads * batch, inputs, dense, "lower_right")
        except Exception as e:  # noqa: BLE001
            rows.append({**label, "error": f"{type(e).__name__}: {e}"})
        free_memory()
    return rows


def _tflops(ms: float, flops: float) -> dict:
    return {"ms": ms, "TFLOP/s": flops / ms / 1e9}


def _with_tflops(r: dict, flops: float) -> dict:
    return {**r, **_tflops(r["ms"], flops)} if "ms" in r else r


def section_copy(b: Bench) -> list[dict]:
    """Block mode's private copy (copy_rotate): n_docs x doc_len tokens of K re-rotated and V copied, for
    every layer; MB_moved counts K and V read and written. The PyTorch reference is shown for scale."""
    s, rows = b.s, []
    n = s.n_docs * pages_for(s.doc_len, s)
    page_bytes = s.page_size * s.kv_heads * s.head_dim * DTYPE.itemsize
    moved = 2 * 2 * s.layers * n * page_bytes  # K and V, read and written
    if not b.fits(s.layers * 2 * (2 * n + 1) * page_bytes):
        return [{"impl": "ours", "skipped": "does not fit in free memory"}]
    kv = torch.randn(s.layers, 2, 2 * n + 1, s.page_size, s.kv_heads, s.head_dim, dtype=DTYPE, device=b.device)
    perm = torch.randperm(2 * n + 1, device=b.device)
    src, dst = perm[:n].contiguous(), perm[n : 2 * n].contiguous()
    deltas = torch.arange(n, device=b.device, dtype=torch.int32) // pages_for(s.doc_len, s) * s.doc_len + 1
    copy_gbps = b.copy_bandwidth()
    impls = {
        f"ours, {r} rows x {w} warps{' (default)' if (r, w) == (64, 4) else ''}": lambda r=r, w=w: copy_rotate(
            kv, src, dst, deltas, b.tables, block_rows=r, num_warps=w
        )
        for r, w in COPY_CONFIGS
    }
    impls["torch reference (per layer)"] = lambda: torch_copy_rotate(kv, src, dst, deltas, b.tables)
    check = [0, n - 1]  # pages checked against the rotation done here in PyTorch after each timing

    def want(i: int) -> torch.Tensor:
        c, sn = b.tables.cos[deltas[i]], b.tables.sin[deltas[i]]
        return torch.stack([rotate(kv[:, 0, src[i]], c, sn, b.tables.interleaved).to(DTYPE), kv[:, 1, src[i]]], 1)

    for name, fn in impls.items():

        def body(fn=fn) -> dict:
            kv[:, :, dst[check]] = 0
            ms = b.time_ms(fn)  # every call rewrites dst from the unchanged src: idempotent
            gbps = moved / ms / 1e6
            diff = max((kv[:, :, dst[i]].float() - want(i).float()).abs().max().item() for i in check)
            return {
                "ms": ms,
                "GB/s": gbps,
                "%_of_copy": None if copy_gbps is None else 100 * gbps / copy_gbps,
                "same_output": diff < 0.05,
            }

        run_case(rows, {"impl": name, "pages": n, "layers": s.layers, "MB_moved": moved / 1e6}, body)
    return rows


# --- report ------------------------------------------------------------------------------------------------


def markdown(results: dict) -> str:
    out = [f"# Kernel benchmark ({results['env']['device']})", "", f"`{results['env']['command']}`", ""]
    for name, rows in results["sections"].items():
        out += [f"## {name}", "", inspect.cleandoc(globals()[f"section_{name}"].__doc__), ""]
        if isinstance(rows, dict):  # the section itself failed
            out += ["```", rows["error"], "```", ""]
            continue
        cols = list(dict.fromkeys(k for r in rows for k in r))
        out += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        out += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
        out.append("")
    return "\n".join(out)


def _fmt(x) -> str:
    if x is None:
        return ""
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"
    return str(x).replace("|", "/")


def environment(args: argparse.Namespace, device: torch.device) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU, Triton interpreter"
    return {
        "device": name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "interpreter": os.environ.get("TRITON_INTERPRET") == "1",
        "command": "python -m benchmarks.kernels " + " ".join(args.argv),
        "dtype": str(DTYPE),
        "kv_dtype": str(KV_DTYPE),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="path prefix: writes <out>.json and <out>.md")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    p.add_argument("--page-size", type=int, default=None, help="KV page size (default 64; 16 with --quick)")
    p.add_argument("--quick", action="store_true", help="tiny shapes: smoke test (CPU: Triton interpreter)")
    p.add_argument("--warmup", type=int, default=25, help="do_bench warmup, ms")
    p.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--kv-cache-dtype", default="bfloat16", choices=("bfloat16", "fp8_e4m3"), help="the paged pools' dtype"
    )
    args = p.parse_args(argv)
    global KV_DTYPE
    KV_DTYPE = resolve(args.kv_cache_dtype, DTYPE)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    if unknown := set(sections) - set(SECTIONS):
        p.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")

    s = QUICK if args.quick else Shapes()
    if args.page_size:
        s = replace(s, page_size=args.page_size)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    max_position = 4 * max(s.decode_contexts + s.causal_lens + (s.n_docs * s.doc_len + s.question,))
    b = Bench(args, s, device, llama31_tables(s.head_dim, max_position, device))
    results = {"env": environment(args, device), "shapes": asdict(s), "sections": {}}
    for name in sections:
        t0 = time.perf_counter()
        print(f"[{name}] ...", flush=True)
        try:
            results["sections"][name] = globals()[f"section_{name}"](b)
        except Exception as e:  # noqa: BLE001 - recorded, the other sections still run
            results["sections"][name] = {"error": "".join(traceback.format_exception(e))[-2000:]}
        print(f"[{name}] {time.perf_counter() - t0:.1f} s", flush=True)
    results["env"]["copy_GBps"] = b.copy_gbps

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = markdown(results)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2, default=_json_default))
    out.with_suffix(".md").write_text(report + "\n")
    print(report)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return results


def _json_default(x):
    return None if isinstance(x, float) and math.isnan(x) else str(x)


if __name__ == "__main__":
    main()
