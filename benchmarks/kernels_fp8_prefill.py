"""Prefill attention over FP8 e4m3 pages against bfloat16 pages, side by side in one process.

    python -m benchmarks.kernels_fp8_prefill            # on the GPU: Llama-3.1-8B heads, pages of 64
    python -m benchmarks.kernels_fp8_prefill --quick    # a smoke run (CPU: Triton interpreter)

Per case, the same inputs (one seed) rounded to each page dtype, then the attention launch the engine's GPU backend runs
for the call (benchmarks/kernels.py's engine_attention: the Hopper kernel, kernels/prefill_hopper.py, where it takes the
call, else prefill.py's; split as the engine's prefill graphs split it, engine_split), FP8 pages with V's stored
transposed as the engine's FP8 pools store them, over input copies that consecutive calls never find in L2, timed two
ways: as the engine's CUDA graphs run it (graph_timer: 32 launches a graph, the median of 20 replays) and launched one
by one (do_bench medians, `--rep` ms each; at small batches the host's launch of the Gluon kernel, not the GPU, sets
that time). Each figure is the median of `--rounds` readings (default 5), the page dtypes and ways taking turns
(benchmarks/kernels.py, alternating), so that drift over the run falls on both alike. Cases: the RAG prefill, batch x (5
x 2,048 cached documents at their deltas + a question of 32 or 512 tokens), and one causal sequence. Prints a markdown
table (benchmarks/results/kernels_fp8_prefill_h200.md holds one), a row per case as it finishes: the kernel, both times
for each page dtype, FP8 / bf16 of each, and the largest difference between the two outputs (the FP8 rounding of K and
V, not the kernel's error: tests/kernels/test_prefill_hopper.py and test_fp8_attention.py have that). Calls that widen
their FP8 pages before prefill.py's kernel (prefill.widens_first: long entries, launched eagerly; the engine captures no
graph of them, and a capture widens only when asked, as here for the graph column) are also timed with the tiles widened
in the kernel (`widen=False`), the way every FP8 call ran before, in graphs and eagerly.
"""

from __future__ import annotations

import dataclasses
import platform
from importlib.metadata import version

import torch

import benchmarks.kernels as bk
from lazyattn.kernels.kv_dtype import FP8
from lazyattn.kernels.prefill import prefill_attention, widens_first

RAG_BATCHES = (1, 8, 16, 32, 64)
LONG_QUESTION = 512  # tokens: past MAX_QUESTION; over placed documents the Hopper kernel takes it too
LONG_QUESTION_BATCHES = (1, 4)
CAUSAL = (512, 1024, 2048, 4096)


def main(argv: list[str] | None = None) -> None:
    args = bk.dtype_comparison_args(__doc__.splitlines()[0], argv)
    s = bk.QUICK if args.quick else bk.Shapes()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    causal = s.causal_lens[:1] if args.quick else CAUSAL
    rag = s.rag_batches if args.quick else RAG_BATCHES
    long = dataclasses.replace(s, question=2 * s.question if args.quick else LONG_QUESTION)
    max_position = max(s.n_docs * s.doc_len + long.question, *causal) + 64
    b = bk.Bench(args, s, device, bk.llama31_tables(s.head_dim, max_position, device))
    b_long = bk.Bench(args, long, device, b.tables)
    cases = [(f"RAG batch {n} × ({s.n_docs} × {s.doc_len:,} + {s.question})", b, n, None) for n in rag]
    batches = rag[:1] if args.quick else LONG_QUESTION_BATCHES
    cases += [(f"RAG batch {n} × ({s.n_docs} × {s.doc_len:,} + {long.question})", b_long, n, None) for n in batches]
    cases += [(f"causal {n:,}", b, None, n) for n in causal]
    name = torch.cuda.get_device_name(device) if b.gpu else "CPU, Triton interpreter"
    print(f"{name}, torch {torch.__version__}, Triton {version('triton')}, Python {platform.python_version()}")
    print()
    print(
        "| case | kernel | bf16 graphs µs | FP8 graphs µs | FP8 / bf16 graphs | bf16 eager µs | FP8 eager µs "
        "| FP8 / bf16 eager | FP8 graphs, tiles widened in the kernel µs | its / bf16 | FP8 eager, tiles widened in "
        "the kernel µs | its / bf16 | max abs(FP8 − bf16) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    bf16 = torch.bfloat16
    for label, bench, batch, tokens in cases:
        timers, outs, kernels, held = {}, {}, {}, []
        for dtype in (bf16, FP8):
            bk.KV_DTYPE = dtype  # the pools benchmarks/kernels.py builds are rounded to it
            torch.manual_seed(1)  # the same values for both page dtypes
            inputs = [bk.engine_split(bench, *i) for i in _inputs(bench, batch, tokens)]
            if dtype == FP8:  # V's pages stored transposed, as the engine's FP8 pools store them
                inputs = bk.with_transposed_v(inputs)
            held.append(inputs)
            kernels[dtype] = "Hopper (Gluon)" if bk.hopper_takes(*inputs[0]) else "prefill.py"
            outs[dtype] = bk.engine_attention(bench, *inputs[0]).float()
            calls = [lambda i=i, b=bench: bk.engine_attention(b, *i) for i in inputs]
            if kernels[dtype] == "prefill.py" and widens_first(inputs[0][0], inputs[0][1], inputs[0][3]):
                kernels[dtype] = "prefill.py, FP8 pages widened first"
                # captured, the widening has to be asked for; `kept` widens each tile in the kernel
                calls, kept = (
                    [lambda i=i, w=w, b=bench: prefill_attention(*i, b.tables, b.scale, widen=w) for i in inputs]
                    for w in (True, False)
                )
                timers |= bk.both_ways(bench, kept, "in kernel")
            timers |= bk.both_ways(bench, calls, dtype)
        graph, eager = bk.by_way(bk.alternating(timers, args.rounds))
        in_kernel = (graph["in kernel"], eager["in kernel"]) if "in kernel" in graph else None
        del held, timers
        bk.free_memory()
        diff = (outs[FP8] - outs[bf16]).abs().max().item()
        kernel = kernels[bf16] if kernels[bf16] == kernels[FP8] else f"bf16 {kernels[bf16]}, FP8 {kernels[FP8]}"
        cells = [label, kernel, f"{graph[bf16]:,.1f}", f"{graph[FP8]:,.1f}", f"{graph[FP8] / graph[bf16]:.2f}"]
        cells += [f"{eager[bf16]:,.1f}", f"{eager[FP8]:,.1f}", f"{eager[FP8] / eager[bf16]:.2f}"]
        if in_kernel is None:
            cells += ["—"] * 4
        else:
            cells += [f"{in_kernel[0]:,.1f}", f"{in_kernel[0] / graph[bf16]:.2f}"]
            cells += [f"{in_kernel[1]:,.1f}", f"{in_kernel[1] / eager[bf16]:.2f}"]
        print("| " + " | ".join(cells + [f"{diff:.3g}"]) + " |", flush=True)


def _inputs(b: bk.Bench, batch: int | None, tokens: int | None) -> list[tuple]:
    """Copies of one case's (q, k pages, v pages, paged batch): the RAG case of `batch` requests, or one causal
    sequence of `tokens`. As many copies for both page dtypes, enough for FP8's half-size pages (so that both draw
    the same values from one seed)."""
    s = b.s
    keys = tokens if batch is None else batch * (s.n_docs * s.doc_len + s.question)
    copies = bk.copies_for(keys * s.kv_heads * s.head_dim * 2 * FP8.itemsize, b.l2_bytes())
    if batch is None:
        return [bk.causal_case(b, tokens, False)[0] for _ in range(copies)]
    return bk.rag_case(b, batch, False, copies=copies)[0]


if __name__ == "__main__":
    main()
