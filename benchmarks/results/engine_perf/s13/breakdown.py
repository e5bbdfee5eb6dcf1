"""Session 13: where the short-question prefill's time goes at batch 1 (the RAG case of `benchmarks/kernels.py
--sections targets`: 5 x 2048 cached documents at their deltas + a 32-token question per entry), each part timed as
the engine's graphs run it (graph_us: 32 calls per CUDA graph, input copies past L2), with programmatic dependent
launch on and off (LAZYATTN_PDL), two alternated rounds:

- "attention": the Gluon kernel and the combine launch (prefill_hopper.short_prefill_attention);
- "kernel": the Gluon kernel alone (split_partials); "combine": the merge alone, over one call's partials;
- "no pages": attention with every entry's page count 0 (launch, set-up, Q, partial store and merge only);
- "L2 pages": attention with every page id folded onto the entry's first 20 pages (the same tiles, from L2);
- "no deltas": attention with the rotation compiled out (the deferred-RoPE overhead);
- "RoPE + attention": the engine's layer on this path (the plain RoPE/KV-write launch, then attention);
- decode at batch 1 over 10 304 keys (kernels/decode.py), for reference.

    python benchmarks/results/engine_perf/s13/breakdown.py OUT.json [BATCH ...]
"""

from __future__ import annotations

import functools
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from kernels import (  # noqa: E402
    DTYPE,
    attention,
    decode_case,
    free_memory,
    graph_us,
    rag_case,
    rag_positions,
    rag_sweep_bench,
)

from lazyattn.kernels import prefill_hopper  # noqa: E402
from lazyattn.kernels.cache_ops import rope_write_kv  # noqa: E402
from lazyattn.kernels.paged import cdiv  # noqa: E402
from lazyattn.kernels.reference import paged_attention  # noqa: E402


def folded(pb, keep: int = 20):
    """pb with its page ids folded onto its first `keep` pages (tiles that stay in L2)."""
    reps = cdiv(pb.pages.shape[1], keep)
    return replace(pb, pages=pb.pages[:, :keep].repeat(1, reps)[:, :pb.pages.shape[1]].contiguous())


def prefill_row(b, batch: int, copy_gbps: float) -> dict:
    s = b.s
    kv_bytes = batch * (s.n_docs * s.doc_len + s.question) * s.kv_heads * s.head_dim * 2 * 2
    inputs, _ = rag_case(b, batch, False, copies=6)
    splits = prefill_hopper.num_splits(batch * s.question, s.q_heads, s.kv_heads, b.device)
    q, k, v, pb = inputs[0]
    ref = paged_attention(q.float(), k.float(), v.float(), pb, b.tables, b.scale)
    got = prefill_hopper.short_prefill_attention(q, k, v, pb, b.tables, b.scale, splits)
    row = {"batch": batch, "splits": splits, "kv_bytes": kv_bytes,
           "max_abs_vs_ref": (got.float() - ref).abs().max().item()}
    kv_new = torch.randn(batch * s.question, 2, s.kv_heads, s.head_dim, dtype=DTYPE, device=b.device)
    slots = torch.full((batch * s.question,), -1, dtype=torch.int64, device=b.device)
    positions = rag_positions(b, pb)
    parts = [prefill_hopper.split_partials(*i, b.tables, b.scale, splits) for i in inputs]
    outs = [torch.empty_like(i[0]) for i in inputs]

    def attend(q, k, v, pb, apply_delta=True):
        return prefill_hopper.short_prefill_attention(q, k, v, pb, b.tables, b.scale, splits, apply_delta=apply_delta)

    def layer(q, k, v, pb):
        return attend(rope_write_kv(q, kv_new[:, 0], kv_new[:, 1], positions, slots, k, v, b.tables), k, v, pb)

    empty = [(q, k, v, replace(pb, num_pages=torch.zeros_like(pb.num_pages))) for q, k, v, pb in inputs]
    in_l2 = [(q, k, v, folded(pb)) for q, k, v, pb in inputs]
    calls = {
        "attention": [functools.partial(attend, *i) for i in inputs],
        "kernel": [functools.partial(prefill_hopper.split_partials, *i, b.tables, b.scale, splits) for i in inputs],
        "combine": [functools.partial(prefill_hopper.merge_partials, *p, o) for p, o in zip(parts, outs)],
        "no pages": [functools.partial(attend, *i) for i in empty],
        "L2 pages": [functools.partial(attend, *i) for i in in_l2],
        "no deltas": [functools.partial(attend, *i, apply_delta=False) for i in inputs],
        "RoPE + attention": [functools.partial(layer, *i) for i in inputs],
    }
    for rnd in range(2):
        for pdl in ("1", "0"):
            os.environ["LAZYATTN_PDL"] = pdl
            for name, fns in calls.items():
                us = graph_us(b, fns)
                row[f"{name}, pdl {pdl} r{rnd} us"] = us
                if name in ("attention", "RoPE + attention", "no deltas"):
                    row[f"{name}, pdl {pdl} r{rnd} %copy"] = 100 * kv_bytes / us / 1e3 / copy_gbps
    return row


def decode_row(b, copy_gbps: float) -> dict:
    gen = torch.Generator().manual_seed(2)
    inputs, nbytes = decode_case(b, 1, 10304, gen)
    while len(inputs) < 4:
        inputs += decode_case(b, 1, 10304, gen)[0]
    fn = attention(True)
    row = {"decode": "bs 1 x 10304", "bytes": nbytes}
    for rnd in range(2):
        for pdl in ("1", "0"):
            os.environ["LAZYATTN_PDL"] = pdl
            us = graph_us(b, [functools.partial(fn, *i, b.tables, b.scale) for i in inputs])
            row[f"pdl {pdl} r{rnd} us"] = us
            row[f"pdl {pdl} r{rnd} %copy"] = 100 * nbytes / us / 1e3 / copy_gbps
    return row


def main() -> None:
    out_path = sys.argv[1]
    batches = [int(x) for x in sys.argv[2:]] or [1]
    b, copy_gbps, _, _ = rag_sweep_bench()
    result = {"copy_gbps": copy_gbps, "rows": []}
    for batch in batches:
        result["rows"].append(prefill_row(b, batch, copy_gbps))
        print(json.dumps(result["rows"][-1]), flush=True)
        free_memory()
    result["rows"].append(decode_row(b, copy_gbps))
    print(json.dumps(result["rows"][-1]), flush=True)
    os.environ.pop("LAZYATTN_PDL")
    Path(out_path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
