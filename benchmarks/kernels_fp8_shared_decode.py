"""Shared-document decode over FP8 e4m3 pages against bfloat16 pages, side by side in one process.

    python -m benchmarks.kernels_fp8_shared_decode            # on the GPU: Llama-3.1-8B heads, pages of 64
    python -m benchmarks.kernels_fp8_shared_decode --quick    # a smoke run (CPU: Triton interpreter)

Workload: benchmarks/shared_decode.py's serving mix (100 documents of 2,048 tokens, each entry a 64-token system
prompt, 5 documents drawn Zipf(2.1) at their deltas and 32-64 tokens of its own), one decode step at batch 8, 32
and 64, planned as the engine plans it (group_rows 16, chunks of 8 pages). Four layers' pools, each of random values
rounded to e4m3 once: the FP8 pages hold them with V stored transposed, as the engine's FP8 pool does, and the
bfloat16 pages hold the same values, so the two outputs differ by the kernels' arithmetic only. Timed as the engine's
CUDA graphs run it (32 launches cycling over the four layers in one graph, the median of 20 replays, per launch),
the median of `--rounds` readings with the page dtypes taking turns (benchmarks/kernels.py, alternating).
"""

from __future__ import annotations

import argparse
import functools
import platform
from importlib.metadata import version

import numpy as np
import torch

import benchmarks.kernels as bk
from benchmarks.shared_decode import make_step
from lazyattn.kernels.kv_dtype import FP8, quantize
from lazyattn.kernels.paged import PagedBatch, cdiv, transposed_copy
from lazyattn.kernels.shared_decode import shared_decode_attention, shared_plan

LAYERS = 4


def workload(quick: bool) -> tuple[argparse.Namespace, tuple[int, int, int, int], list[int]]:
    """benchmarks/shared_decode.py's workload arguments, the shapes (q heads, kv heads, head_dim, page size), and
    the batches."""
    w = argparse.Namespace(zipf=2.1)
    if quick:
        w.documents, w.doc_len, w.system, w.per_entry, w.own_min, w.own_max = 10, 48, 16, 3, 2, 20
        return w, (4, 1, 32, 16), [4]
    w.documents, w.doc_len, w.system, w.per_entry, w.own_min, w.own_max = 100, 2048, 64, 5, 32, 64
    return w, (32, 8, 128, 64), [8, 32, 64]


def main(argv: list[str] | None = None) -> None:
    args = bk.dtype_comparison_args(__doc__.splitlines()[0], argv)
    w, (q_heads, kv_heads, head_dim, ps), batches = workload(args.quick)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    w.page_size = ps
    doc_n, sys_n = cdiv(w.doc_len, ps), cdiv(w.system, ps)
    num_pages = w.documents * doc_n + sys_n + max(batches) * cdiv(w.own_max, ps) + 8
    free = torch.randperm(num_pages, generator=torch.Generator().manual_seed(args.seed)).tolist()
    w.system_pages = [free.pop() for _ in range(sys_n)]
    w.doc_pages = [[free.pop() for _ in range(doc_n)] for _ in range(w.documents)]
    gen = torch.Generator(device).manual_seed(args.seed)
    pools = []
    for _ in range(LAYERS):
        k, v = (
            quantize(torch.randn(num_pages, ps, kv_heads, head_dim, device=device, generator=gen), FP8) for _ in "kv"
        )
        pools.append({torch.bfloat16: (k.to(torch.bfloat16), v.to(torch.bfloat16)), FP8: (k, transposed_copy(v))})
    max_pos = w.system + w.per_entry * w.doc_len + w.own_max + 1
    b = bk.Bench(args, bk.Shapes(q_heads, kv_heads, head_dim), device, bk.llama31_tables(head_dim, max_pos, device))
    rng = np.random.default_rng(args.seed)
    name = torch.cuda.get_device_name(device) if b.gpu else "CPU, Triton interpreter"
    print(f"{name}, torch {torch.__version__}, Triton {version('triton')}, Python {platform.python_version()}")
    print()
    print("| batch | distinct documents | jobs | bf16 µs | FP8 µs | FP8 / bf16 | max abs(FP8 − bf16) |")
    print("|---|---|---|---|---|---|---|")
    for batch in batches:
        entries, q_starts = make_step(w, batch, rng, list(free))
        distinct = len({p for e in entries for p in e.pages[sys_n : sys_n + w.per_entry * doc_n]}) // doc_n
        pb = PagedBatch.build(entries, [1] * batch, q_starts, device)
        q = torch.randn(batch, q_heads, head_dim, device=device, generator=gen).to(torch.bfloat16)
        host = shared_plan(entries, q_heads // kv_heads, 16, 8)
        plan = host.to(device)
        timers, outs = {}, {}
        for dtype in (torch.bfloat16, FP8):
            attend = functools.partial(shared_decode_attention, q, batch=pb, plan=plan, tables=b.tables, scale=b.scale)
            calls = [functools.partial(attend, k_cache=p[dtype][0], v_cache=p[dtype][1]) for p in pools]
            outs[dtype] = calls[0]().float()
            timers[dtype] = bk.graph_timer(b, calls)
        t = bk.alternating(timers, args.rounds)
        diff = (outs[FP8] - outs[torch.bfloat16]).abs().max().item()
        cells = [batch, distinct, host.num_jobs, f"{t[torch.bfloat16]:,.1f}", f"{t[FP8]:,.1f}"]
        cells += [f"{t[FP8] / t[torch.bfloat16]:.2f}", f"{diff:.3g}"]
        print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
