"""Prefill calls past the Hopper kernel's longest question: the Hopper kernel against prefill.py's, side by side.

    python -m benchmarks.kernels_long_questions      # on a Hopper GPU: Llama-3.1-8B heads, pages of 64

Which kernel should take an entry of more than 256 rows (kernels/prefill_hopper.py, MAX_QUESTION)? Two kinds of
call, each with both kernels over the same inputs, over bfloat16 pages and over FP8 e4m3 pages:

- RAG: batch x (n_docs x doc_len cached documents at their deltas + a question of 384 to 1,024 tokens), as
  benchmarks/kernels.py's rag_case places them (the first document at delta 0);
- chunk: the last chunk of a causal prompt, over the prompt's earlier rows (all at delta 0).

Timed as the engine's CUDA graphs run them (benchmarks/kernels.py graph_us: 32 launches a graph, the median of 20
replays, per launch), each kernel split as the engine splits it (prefill.py's: the graphs' rule and the host's plan;
FP8 pages widened first where `prefill.widens_first` says). "shifted / rows": the keys an entry reads at a nonzero
delta over its rows, the smallest of the call's entries; the engine gives the call to the Hopper kernel where every
entry has at least 1 (EntryPages.reads_documents); "engine" names the kernel it picks, and the last column is the
picked kernel's time over FP8 pages over the picked one's over bfloat16 pages. Both kernels' outputs are checked
against each other (max abs difference < 0.02) before timing.
"""

from __future__ import annotations

import dataclasses
import platform
from importlib.metadata import version

import torch

import benchmarks.kernels as bk
from lazyattn.kernels import prefill_hopper
from lazyattn.kernels.kv_dtype import FP8
from lazyattn.kernels.paged import PagedBatch
from lazyattn.kernels.prefill import prefill_attention, widens_first

# (batch, documents, document length, question)
RAG = [
    (1, 1, 512, 384),
    (8, 1, 512, 384),
    (1, 2, 512, 384),
    (8, 2, 512, 384),
    (1, 2, 512, 1024),
    (1, 4, 512, 384),
    (8, 4, 512, 384),
    (1, 4, 512, 1024),
    (1, 2, 2048, 384),
    (8, 2, 2048, 384),
    (1, 2, 2048, 1024),
    (1, 5, 2048, 384),
    (8, 5, 2048, 384),
    (1, 5, 2048, 512),
    (4, 5, 2048, 512),
    (1, 5, 2048, 1024),
]
CHUNKS = [(512, 512), (1024, 512), (2048, 512), (3584, 512), (7680, 512), (2048, 1024), (6144, 1024)]  # (offset, rows)
COPIES = 3  # inputs per case, cycled


def _shifted_per_row(pb: PagedBatch) -> float:
    """The smallest (keys at a nonzero delta) / rows over the call's entries."""
    shifted = ((pb.deltas != 0) * pb.valid).sum(1).cpu()
    rows = (pb.cu_seqlens_q[1:] - pb.cu_seqlens_q[:-1]).cpu()
    return float((shifted / rows).min())


def _time_case(b: bk.Bench, make_inputs) -> tuple[dict, float, str]:
    """{(page dtype, kernel): graph µs}, shifted keys per row, and the kernel the engine picks."""
    times, picked = {}, ""
    for dtype in (torch.bfloat16, FP8):
        bk.KV_DTYPE = dtype  # the pools are rounded to it
        torch.manual_seed(1)  # the same values for both page dtypes
        inputs = [bk.engine_split(b, *i) for i in make_inputs()]
        q, k_cache, v_cache, pb = inputs[0]
        ratio = _shifted_per_row(pb)
        picked = "Hopper" if prefill_hopper.supports(q, k_cache, v_cache, pb) else "prefill.py"
        widen = dtype == FP8 and widens_first(q, k_cache, pb)
        calls = {
            "prefill.py": [lambda i=i, w=widen: prefill_attention(*i, b.tables, b.scale, widen=w) for i in inputs],
            "Hopper": [lambda i=i: bk.hopper_attention(b, *i) for i in inputs],
        }
        diff = (calls["Hopper"][0]().float() - calls["prefill.py"][0]().float()).abs().max().item()
        if not diff < 0.02:
            raise SystemExit(f"the two kernels differ by {diff} over {dtype} pages")
        for kernel, fns in calls.items():
            times[dtype, kernel] = bk.graph_us(b, fns)
        del inputs, calls
        bk.free_memory()
    return times, ratio, picked


def main() -> None:
    device = torch.device("cuda")
    if not prefill_hopper.shape_supported(1, 32, 8, 128, torch.bfloat16, 64, device):
        raise SystemExit("needs a Hopper GPU with the Gluon kernel switched on")
    s = bk.Shapes()
    args = bk.dtype_comparison_args(__doc__.splitlines()[0], [])
    tables = bk.llama31_tables(s.head_dim, 16384 + 64, device)
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, Triton {version('triton')}, ", end="")
    print(f"Python {platform.python_version()}\n")
    print(
        "| case | shifted / rows | engine | bf16 prefill.py µs | bf16 Hopper µs | Hopper / prefill.py | "
        "FP8 prefill.py µs | FP8 Hopper µs | Hopper / prefill.py | engine's FP8 / bf16 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    cases = []
    for batch, docs, length, question in RAG:
        shapes = dataclasses.replace(s, n_docs=docs, doc_len=length, question=question)
        b = bk.Bench(args, shapes, device, tables)
        label = f"RAG {batch} × ({docs} × {length:,} + {question:,})"
        cases.append((label, b, lambda b=b, n=batch: bk.rag_case(b, n, False, copies=COPIES)[0]))
    for offset, rows in CHUNKS:
        b = bk.Bench(args, s, device, tables)
        label = f"chunk of {rows:,} rows at {offset:,}"
        cases.append(
            (
                label,
                b,
                lambda b=b, o=offset, r=rows: [bk.causal_case(b, o + r, False, rows=r)[0] for _ in range(COPIES)],
            )
        )
    bf16 = torch.bfloat16
    for label, b, make in cases:
        t, ratio, picked = _time_case(b, make)
        cells = [label, f"{ratio:.1f}", picked]
        for dtype in (bf16, FP8):
            p, h = t[dtype, "prefill.py"], t[dtype, "Hopper"]
            cells += [f"{p:,.1f}", f"{h:,.1f}", f"{h / p:.2f}"]
        cells.append(f"{t[FP8, picked] / t[bf16, picked]:.2f}")
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
