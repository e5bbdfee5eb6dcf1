"""Decode attention over FP8 e4m3 pages against bfloat16 pages, side by side in one process.

    python -m benchmarks.kernels_fp8_decode            # on the GPU: Llama-3.1-8B heads, pages of 64
    python -m benchmarks.kernels_fp8_decode --quick    # a smoke run (CPU: Triton interpreter)

Per case (batch x context, segments of 2,048 tokens at random nonzero deltas, as benchmarks/kernels.py's decode
section builds them), the same inputs rounded to each page dtype, then timed one after the other with do_bench
(medians, `--rep` ms each). Prints one line per case: both times, FP8 / bf16, and the largest difference between the
two outputs (the FP8 rounding of K and V, not the kernel's error: tests/kernels/test_fp8_attention.py has that).
"""

from __future__ import annotations

import functools

import torch

import benchmarks.kernels as bk
from lazyattn.kernels.decode import ArrivalCounters, decode_attention
from lazyattn.kernels.kv_dtype import FP8

CASES = ((64, 4096), (32, 8192), (64, 8192), (8, 4096), (8, 32768), (64, 32768), (1, 32768))


def main(argv: list[str] | None = None) -> None:
    args = bk.dtype_comparison_args(__doc__.splitlines()[0], argv)
    s = bk.QUICK if args.quick else bk.Shapes()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cases = ((2, 64),) if args.quick else CASES
    b = bk.Bench(args, s, device, bk.llama31_tables(s.head_dim, 4 * max(c for _, c in cases) + 64, device))
    decode = functools.partial(decode_attention, counters=ArrivalCounters())
    for batch, ctx in cases:
        times, outs = {}, {}
        for dtype in (torch.bfloat16, FP8):
            bk.KV_DTYPE = dtype  # the pools benchmarks/kernels.py builds are rounded to it
            inputs, _ = bk.decode_case(b, batch, ctx, torch.Generator().manual_seed(1))
            outs[dtype] = decode(*inputs[0], b.tables, b.scale).float()
            times[dtype] = 1e3 * b.time_ms(bk.cycle([lambda i=i: decode(*i, b.tables, b.scale) for i in inputs]))
            del inputs
        diff = (outs[FP8] - outs[torch.bfloat16]).abs().max().item()
        print(
            f"batch {batch:3d} x {ctx:6d} tokens: bf16 {times[torch.bfloat16]:9.1f} us  fp8 {times[FP8]:9.1f} us  "
            f"fp8 / bf16 {times[FP8] / times[torch.bfloat16]:.2f}  max |fp8 - bf16| {diff:.3g}",
            flush=True,
        )


if __name__ == "__main__":
    main()
