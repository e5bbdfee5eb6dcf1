"""Shared-document decode against the plain decode kernel, one layer of Llama-3.1-8B attention shapes.

On the GPU (about a minute; 32 q heads, 8 kv heads, head_dim 128, bf16, pages of 64):

    python benchmarks/shared_decode.py --out shared_decode.md

Workload (the serving benchmark's, docs/benchmarks.md): 100 documents of 2048 tokens, each cached once in its own
pages; every entry lists a 64-token system prompt (one page, shared by all), 5 distinct documents drawn Zipf(2.1)
at their deltas, and 32..64 tokens of its own. Batches of 8, 32 and 64 entries, one decode step. A second
workload ("private") gives every entry documents of its own: only the system prompt's page is shared, which shows
the shared path's cost where it saves nothing (the engine would not take it: "engine takes it", worth_sharing).

Per batch and plan variant (group_rows: query rows of a job's tile; chunk_pages: pages of a job): the plan's jobs,
the KV bytes a step reads (plain: every entry's pages; shared: every job's pages once), the kernels' times
(triton.testing.do_bench medians, L2 flushed before each call; the plan is built and copied outside the timed
region), and the host planner's time per step (median of Python calls, shared_plan alone). `--quick` runs tiny
shapes (on a CPU under the Triton interpreter) to smoke-test the script.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

if not torch.cuda.is_available():  # must precede the first triton import
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402

from benchmarks.kernels import llama31_tables  # noqa: E402
from lazyattn.kernels.decode import ArrivalCounters, decode_attention  # noqa: E402
from lazyattn.kernels.paged import EntryPages, PagedBatch, cdiv, page_fill  # noqa: E402
from lazyattn.kernels.shared_decode import shared_decode_attention, shared_plan, worth_sharing  # noqa: E402


def zipf_documents(rng: np.random.Generator, n_docs: int, per_entry: int, exponent: float) -> list[int]:
    """per_entry distinct documents, drawn with probability ~ 1 / rank^exponent."""
    weights = 1.0 / np.arange(1, n_docs + 1) ** exponent
    return rng.choice(n_docs, size=per_entry, replace=False, p=weights / weights.sum()).tolist()


def make_step(
    args, batch: int, rng: np.random.Generator, free: list[int], private: bool = False
) -> tuple[list[EntryPages], list[int]]:
    """One decode step's entries over the documents' shared pages, and each entry's query position. `private`: each
    entry's documents are its own (only the system prompt is shared)."""
    ps = args.page_size
    doc_pages = args.doc_pages
    entries, q_starts = [], []
    for i in range(batch):
        pages, deltas, valid = list(args.system_pages), [0] * len(args.system_pages), page_fill(args.system, ps)
        start = args.system
        if private:
            docs = [args.documents + i * args.per_entry + k for k in range(args.per_entry)]
        else:
            docs = zipf_documents(rng, args.documents, args.per_entry, args.zipf)
        for d in docs:
            pages += doc_pages[d]
            deltas += [start] * len(doc_pages[d])
            valid += page_fill(args.doc_len, ps)
            start += args.doc_len
        own = int(rng.integers(args.own_min, args.own_max + 1))
        n_own = cdiv(own, ps)
        pages += [free.pop() for _ in range(n_own)]
        deltas += [0] * n_own
        valid += page_fill(own, ps)
        entries.append(EntryPages(pages, deltas, valid))
        q_starts.append(start + own - 1)
    return entries, q_starts


def step_bytes(pages_valid: list[int], kv_heads: int, head_dim: int, elem: int) -> int:
    """K and V bytes of the listed keys."""
    return 2 * sum(pages_valid) * kv_heads * head_dim * elem


def time_us(fn, gpu: bool, warmup: int, rep: int) -> float:
    if not gpu:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    return 1000 * float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="also write the markdown table here")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a CPU smoke test)")
    ap.add_argument("--batches", default="8,32,64")
    ap.add_argument("--variants", default="16:4,16:8,16:16,32:8,32:16,64:8", help="group_rows:chunk_pages,...")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workloads", default="zipf,private", help="zipf: the serving mix; private: no shared document")
    args = ap.parse_args()
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    if args.quick:
        q_heads, kv_heads, head_dim, ps = 4, 1, 32, 16
        args.documents, args.doc_len, args.system, args.per_entry = 10, 48, 16, 3
        args.own_min, args.own_max = 2, 20
        batches = [4]
    else:
        q_heads, kv_heads, head_dim, ps = 32, 8, 128, 64
        args.documents, args.doc_len, args.system, args.per_entry = 100, 2048, 64, 5
        args.own_min, args.own_max = 32, 64
        batches = [int(b) for b in args.batches.split(",")]
    args.zipf, args.page_size = 2.1, ps
    variants = [tuple(int(x) for x in v.split(":")) for v in args.variants.split(",")]
    dtype = torch.bfloat16
    elem = 2
    group = q_heads // kv_heads
    max_batch = max(batches)
    doc_n = cdiv(args.doc_len, ps)
    sys_n = cdiv(args.system, ps)
    all_docs = args.documents + max_batch * args.per_entry  # the Zipf pool, then the private workload's
    num_pages = all_docs * doc_n + sys_n + max_batch * cdiv(args.own_max, ps) + 8
    gen = torch.Generator().manual_seed(args.seed)
    perm = torch.randperm(num_pages, generator=gen).tolist()  # a long-running pool's shuffled free list
    args.system_pages = [perm.pop() for _ in range(sys_n)]
    args.doc_pages = [[perm.pop() for _ in range(doc_n)] for _ in range(all_docs)]
    k_cache = torch.randn(num_pages, ps, kv_heads, head_dim, device=device, dtype=dtype)
    v_cache = torch.randn(num_pages, ps, kv_heads, head_dim, device=device, dtype=dtype)
    max_pos = args.system + args.per_entry * args.doc_len + args.own_max + 1
    tables = llama31_tables(head_dim, max_pos, device)
    scale = head_dim**-0.5
    counters = ArrivalCounters()
    rng = np.random.default_rng(args.seed)
    warmup, rep = 25, 100

    lines = [
        f"Shared-document decode, one layer ({q_heads} q / {kv_heads} kv heads, d {head_dim}, bf16, pages of {ps}); "
        f"entries: {args.system}-token system + {args.per_entry} x {args.doc_len}-token documents Zipf({args.zipf}) "
        f"of {args.documents} + {args.own_min}..{args.own_max} own tokens; "
        f"device: {torch.cuda.get_device_name() if gpu else 'CPU (interpreter)'}",
        "",
        "| documents | batch | group_rows | chunk_pages | distinct docs | jobs | shared jobs | plain MiB | "
        "shared MiB | plain us | shared us | speedup | plan ms (host) | engine takes it | rel err |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    print("\n".join(lines), flush=True)
    for workload, batch in [(w, b) for w in args.workloads.split(",") for b in batches]:
        free = list(perm)
        entries, q_starts = make_step(args, batch, rng, free, private=workload == "private")
        distinct = len({p for e in entries for p in e.pages[sys_n : sys_n + args.per_entry * doc_n]}) // doc_n
        pb = PagedBatch.build(entries, [1] * batch, q_starts, device)
        q = torch.randn(batch, q_heads, head_dim, device=device, dtype=dtype)
        plain_bytes = step_bytes([v for e in entries for v in e.valid], kv_heads, head_dim, elem)

        def plain(q=q, pb=pb):
            return decode_attention(q, k_cache, v_cache, pb, tables, scale, counters=counters)

        ref = plain().float()
        plain_us = time_us(plain, gpu, warmup, rep)
        for group_rows, chunk_pages in variants:
            host_times = []
            for _ in range(3 if args.quick else 20):
                t = time.perf_counter()
                host = shared_plan(entries, group, group_rows, chunk_pages)
                host_times.append(time.perf_counter() - t)
            plan = host.to(device)
            shared_bytes = step_bytes(
                [v for row in host.jobs.tolist() for v in entries[row[0]].valid[row[1] : row[2]]],
                kv_heads,
                head_dim,
                elem,
            )

            def shared(plan=plan, q=q, pb=pb):
                return shared_decode_attention(q, k_cache, v_cache, pb, plan, tables, scale)

            err = ((shared().float() - ref).norm() / ref.norm()).item()
            shared_us = time_us(shared, gpu, warmup, rep)
            row = (
                f"| {workload} | {batch} | {group_rows} | {chunk_pages} | {distinct} | {host.num_jobs} | "
                f"{host.shared_jobs} | {plain_bytes / 2**20:.0f} | {shared_bytes / 2**20:.0f} | "
                f"{plain_us:.1f} | {shared_us:.1f} | "
                f"{plain_us / shared_us:.2f}x | {1000 * statistics.median(host_times):.2f} | "
                f"{'yes' if worth_sharing(host) else 'no'} | {err:.1e} |"
            )
            print(row, flush=True)
            lines.append(row)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
