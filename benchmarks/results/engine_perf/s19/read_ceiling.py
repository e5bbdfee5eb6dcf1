"""Session 19: what one launch that only reads the decode case's bytes reaches, timed as the attention targets are
(kernels.py `graph_us`: 32 launches per CUDA graph, inputs rotated past L2). The yardstick of issue 10's attention
targets is the copy bandwidth of 1 GiB copies, where a launch's ramp and tail are spread over ~0.7 ms; a batch-1
decode layer reads 42.2 MB in one launch of ~14 us at that rate, so its ramp and tail count. This probe measures that
part alone: a plain streaming read of the same bytes, no attention at all.

Variants (each over 4 input copies of BYTES bytes of bf16):
- "sum P x W": a Triton kernel of P programs of W warps, each summing a contiguous chunk in 16 KiB steps (vector loads,
  one fp32 store a program: kernels.py `read_kernel`, which this file held as `_sum_kernel` for calls 2-5); with and
  without programmatic dependent launch (the wait first, as the engine's kernels do);
- "torch sum": torch's own reduction over the tensor;
- "4x bytes": the sum over 4 x the bytes in one launch (call 4 on).

    python benchmarks/results/engine_perf/s19/read_ceiling.py OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import graph_us, rag_sweep_bench, read_kernel  # noqa: E402

from lazyattn.kernels.launch import sm_count  # noqa: E402

BYTES = 42221568  # the decode target's K/V bytes (batch 1 x 10 304 keys, 8 kv heads x 128 dims, bf16) and q/out
BLOCK = 8192  # elements a step: 16 KiB of bf16
ROUNDS = 2


def main() -> None:
    out_path = sys.argv[1]
    b, copy_gbps, _, _ = rag_sweep_bench()
    n = BYTES // 2
    xs = [torch.randn(n, dtype=torch.bfloat16, device=b.device) for _ in range(4)]
    sms = sm_count(b.device)
    out = torch.empty(16 * sms, dtype=torch.float32, device=b.device)
    row = {"copy_gbps": copy_gbps, "bytes": BYTES, "sms": sms}

    def summed(x, programs, warps, pdl, block=BLOCK, size=n):
        per = triton.cdiv(triton.cdiv(size, programs), block) * block
        extra = {"launch_pdl": True} if pdl else {}
        read_kernel[(programs,)](x, out, per, size, BLOCK=block, USE_PDL=pdl, num_warps=warps, **extra)

    variants = {}
    for mult in (1, 2, 3, 4, 6, 8):
        for warps in (4, 8):
            for pdl in (False, True):
                name = f"sum {mult * sms} x {warps}{', PDL' if pdl else ''}"
                variants[name] = [lambda x=x, p=mult * sms, w=warps, d=pdl: summed(x, p, w, d) for x in xs]
    # Call 4: steps of 32 and 64 KiB (more bytes in flight a program), and 4 x the bytes in one launch (the launch's
    # ramp and tail spread over 4 x the time: the fixed part of a launch is t(1x) - t(4x) / 4).
    for block in (16384, 32768):
        for mult, warps in ((2, 8), (4, 8), (4, 16), (8, 8)):
            name = f"sum {mult * sms} x {warps}, {block * 2 // 1024} KiB steps, PDL"
            variants[name] = [lambda x=x, p=mult * sms, w=warps, k=block: summed(x, p, w, True, k) for x in xs]
    big = [torch.randn(4 * n, dtype=torch.bfloat16, device=b.device) for _ in range(2)]
    for mult, warps in ((4, 8), (8, 8), (16, 8)):
        variants[f"4x bytes: sum {mult * sms} x {warps}, PDL"] = [
            lambda x=x, p=mult * sms, w=warps: summed(x, p, w, True, BLOCK, 4 * n) for x in big]
    variants["torch sum"] = [lambda x=x: x.sum() for x in xs]
    for rnd in range(ROUNDS):
        for name, fns in variants.items():
            us = graph_us(b, fns)
            row[f"{name} r{rnd} us"] = us
            row[f"{name} r{rnd} %copy"] = 100 * BYTES * (4 if name.startswith("4x") else 1) / us / 1e3 / copy_gbps
    print(json.dumps(row), flush=True)
    Path(out_path).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
