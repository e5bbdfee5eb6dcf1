"""Decode attention over FP8 e4m3 pages against bfloat16 pages, side by side in one process.

    python -m benchmarks.kernels_fp8_decode            # on the GPU: Llama-3.1-8B heads, pages of 64
    python -m benchmarks.kernels_fp8_decode --quick    # a smoke run (CPU: Triton interpreter)

Per case (batch x context, segments of 2,048 tokens at random nonzero deltas, as benchmarks/kernels.py's decode
section builds them), the same inputs rounded to each page dtype, then timed two ways: as the engine's CUDA graphs
run it (graph: 32 launches captured in one graph, the median of 20 replays, per launch) and launched one by one
(eager: do_bench medians, `--rep` ms each; at batch 1-2 the host's launch, which builds the copy-engine descriptors
of FP8 pages per call, not the GPU, sets that time). Each figure is the median of `--rounds` readings (default 5),
the page dtypes and ways taking turns (benchmarks/kernels.py, alternating), so that drift over the run falls on both
alike. Prints a markdown table, a row per case
as it finishes: both times each way, FP8 / bf16 of each, and the largest difference between the two outputs (the FP8
rounding of K and V, not the kernel's error: tests/kernels/test_fp8_attention.py has that).

"FP8, V^T": the same FP8 pages with V stored transposed (a page's slots contiguous for each kv head and channel,
decode.v_transposed), timed in the same rounds.
"""

from __future__ import annotations

import functools
import platform
from importlib.metadata import version

import torch

import benchmarks.kernels as bk
from lazyattn.kernels.decode import ArrivalCounters, decode_attention
from lazyattn.kernels.kv_dtype import FP8

TRANSPOSED = "fp8, V transposed"  # the timers' key of FP8 pages with V stored transposed
CASES = (
    (64, 4096),
    (32, 8192),
    (64, 8192),
    (8, 4096),
    (8, 32768),
    (64, 32768),
    (1, 4096),
    (1, 8192),
    (4, 8192),
    (1, 32768),
    (2, 32768),
)


def main(argv: list[str] | None = None) -> None:
    args = bk.dtype_comparison_args(__doc__.splitlines()[0], argv)
    s = bk.QUICK if args.quick else bk.Shapes()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cases = ((2, 64),) if args.quick else CASES
    b = bk.Bench(args, s, device, bk.llama31_tables(s.head_dim, 4 * max(c for _, c in cases) + 64, device))
    decode = functools.partial(decode_attention, counters=ArrivalCounters())
    name = torch.cuda.get_device_name(device) if b.gpu else "CPU, Triton interpreter"
    print(f"{name}, torch {torch.__version__}, Triton {version('triton')}, Python {platform.python_version()}")
    print()
    print(
        "| batch × context | bf16 graphs µs | FP8 graphs µs | FP8 / bf16 graphs | FP8, V^T graphs µs "
        "| FP8, V^T / bf16 graphs | bf16 eager µs | FP8 eager µs | FP8 / bf16 eager | FP8, V^T eager µs "
        "| FP8, V^T / bf16 eager | max abs(FP8 − bf16) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    bf16 = torch.bfloat16
    for batch, ctx in cases:
        timers, outs, held = {}, {}, []
        for dtype in (bf16, FP8):
            bk.KV_DTYPE = dtype  # the pools benchmarks/kernels.py builds are rounded to it
            inputs, _ = bk.decode_case(b, batch, ctx, torch.Generator().manual_seed(1))
            held.append(inputs)
            outs[dtype] = decode(*inputs[0], b.tables, b.scale).float()
            calls = [lambda i=i: decode(*i, b.tables, b.scale) for i in inputs]
            timers |= bk.both_ways(b, calls, dtype)
            if dtype == FP8:
                # the same pages with V stored transposed, as the engine's FP8 pools store them
                moved = bk.with_transposed_v(inputs)
                held.append(moved)
                outs[TRANSPOSED] = decode(*moved[0], b.tables, b.scale).float()
                calls = [lambda i=i: decode(*i, b.tables, b.scale) for i in moved]
                timers |= bk.both_ways(b, calls, TRANSPOSED)
        graph, eager = bk.by_way(bk.alternating(timers, args.rounds))
        del held, timers
        bk.free_memory()
        diff = (outs[FP8] - outs[bf16]).abs().max().item()
        if not torch.allclose(outs[TRANSPOSED], outs[FP8], rtol=0, atol=1e-3):
            raise AssertionError(f"{batch} x {ctx}: V transposed gives another result than V as K is stored")
        cells = [f"{batch} × {ctx:,}"]
        for times in (graph, eager):
            cells += [f"{times[bf16]:,.1f}", f"{times[FP8]:,.1f}", f"{times[FP8] / times[bf16]:.2f}"]
            cells += [f"{times[TRANSPOSED]:,.1f}", f"{times[TRANSPOSED] / times[bf16]:.2f}"]
        cells.append(f"{diff:.3g}")
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
