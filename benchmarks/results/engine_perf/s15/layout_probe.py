"""Session 15: does the page layout set batch-1 decode attention's bandwidth?

The pool stores a page as [page_size, kv_heads, head_dim]: one (page, kv head) tile, which one decode program
reads, is 64 rows of 256 bytes at a 2 KiB stride, and the 8 programs of a page's 8 heads read interleaved pieces of
the same 128 KiB at different times. Head-major pages ([kv_heads, page_size, head_dim]) make each tile one
contiguous 16 KiB run. The kernels take strides, so the same launch runs either layout: this script times decode
at batch 1 over 10 304 cached keys (the issue-10 target) per layer in a CUDA graph of 32 (benchmarks/kernels.py's
graph_us), for

- layout: token-major (the pool's) or head-major (a permuted copy of the same pages, same logical shape);
- page order: the shuffled free list of benchmarks/kernels.py (realistic) or ascending page ids (best case);
- split count: the default rule and fixed counts;
- form: decode launches back to back (`alone`) or each after a RoPE launch (`layer`, as in the engine).

Every variant's output is checked bit-equal to the token-major one (same arithmetic, other addresses). Then the
RAG prefill (prefill.py's kernel over per-run Q copies; the Gluon kernel where it takes the token-major call) at
batch 1 and 8 in both layouts.

    python benchmarks/results/engine_perf/s15/layout_probe.py OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from benchmarks import kernels as kb  # noqa: E402
from lazyattn.kernels import cache_ops  # noqa: E402
from lazyattn.kernels.paged import PagedBatch  # noqa: E402
from lazyattn.kernels.prefill import prefill_attention  # noqa: E402


def head_major(cache: torch.Tensor) -> torch.Tensor:
    """The same pages stored [pages, heads, slots, dim], viewed with the pool's logical shape."""
    return cache.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)


def decode_inputs(b: kb.Bench, ctx: int, ordered: bool, gen: torch.Generator) -> list[tuple]:
    """Four independent batch-1 decode inputs (q, k, v, batch), past L2 together."""
    s = b.s
    per = kb.pages_for(ctx, s)
    pool = kb.Pool(s, 4 * per + 1, b.device)
    if ordered:
        pool.free.sort(reverse=True)  # pop() hands out ascending ids
    out = []
    for _ in range(4):
        entry = kb.long_context(pool, ctx, s, gen, b.tables.max_position - ctx)
        pb = PagedBatch.build([entry], [1], [ctx - 1], b.device)
        q = torch.randn(1, s.q_heads, s.head_dim, dtype=kb.DTYPE, device=b.device)
        out.append((q, pool.k, pool.v, pb))
    return out


def main() -> None:
    out = Path(sys.argv[1])
    args = argparse.Namespace(warmup=25, rep=100, seed=0, argv=[])
    gpu = torch.cuda.is_available()
    s = kb.Shapes() if gpu else kb.QUICK
    device = torch.device("cuda" if gpu else "cpu")
    b = kb.Bench(args, s, device, kb.llama31_tables(s.head_dim, 4 * 32768, device))
    copy = b.copy_bandwidth() or float("nan")
    ctx = s.target_decode_context
    nbytes = ctx * s.kv_heads * s.head_dim * 2 * kb.DTYPE.itemsize + 2 * s.q_heads * s.head_dim * kb.DTYPE.itemsize
    rows: list[dict] = []

    def record(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        out.write_text(json.dumps({"copy_GBps": copy, "gpu": torch.cuda.get_device_name() if gpu else "cpu",
                                   "rows": rows}, indent=1))

    fn = kb.attention(True)
    gen = torch.Generator().manual_seed(2)
    for ordered in (False, True):
        base = decode_inputs(b, ctx, ordered, gen)
        hm = [(q, head_major(k), head_major(v), pb) for q, k, v, pb in base]
        for splits in (None, 8, 24, 32, 48):
            ref = [fn(*i, b.tables, b.scale, num_splits=splits) for i in base]
            for layout, inputs in (("token", base), ("head", hm)):
                try:
                    got = [fn(*i, b.tables, b.scale, num_splits=splits) for i in inputs]
                    same = all(torch.equal(x, y) for x, y in zip(got, ref))

                    def layer(i, splits=splits):
                        q, k_cache, v_cache, pb = i
                        kq = torch.randn(1, s.kv_heads, s.head_dim, dtype=q.dtype, device=device)
                        pos = pb.q_start.long()
                        slot = torch.full((1,), -1, dtype=torch.int64, device=device)
                        return lambda: fn(cache_ops.rope_write_kv(q, kq, kq, pos, slot, k_cache, v_cache, b.tables),
                                          k_cache, v_cache, pb, b.tables, b.scale, num_splits=splits)

                    alone = kb.graph_us(b, [lambda i=i: fn(*i, b.tables, b.scale, num_splits=splits)
                                            for i in inputs])
                    layered = kb.graph_us(b, [layer(i) for i in inputs])
                    record({"kind": "decode", "layout": layout, "ordered": ordered, "splits": splits or "rule",
                            "bit_equal": same, "alone_us": alone, "layer_us": layered,
                            "alone_%": 100 * nbytes / alone / 1e3 / copy, "layer_%": 100 * nbytes / layered / 1e3 / copy})
                except Exception:  # noqa: BLE001 - recorded, the probe goes on
                    record({"kind": "decode", "layout": layout, "ordered": ordered, "splits": splits or "rule",
                            "error": traceback.format_exc()[-600:]})
        del base, hm
        kb.free_memory()

    for batch in (1, 8):
        kv_bytes = batch * (s.n_docs * s.doc_len + s.question) * s.kv_heads * s.head_dim * 2 * kb.DTYPE.itemsize
        inputs, _ = kb.rag_case(b, batch, False, copies=max(2, kb.copies_for(kv_bytes, b.l2_bytes())))
        inputs = [kb.engine_split(b, *i) for i in inputs]
        rotated = [kb.rope_runs(b, *i) for i in inputs]
        variants = {"token": inputs, "head": [(q, head_major(k), head_major(v), pb) for q, k, v, pb in inputs]}
        ref = [prefill_attention(*i, b.tables, b.scale, rotated_q=r) for i, r in zip(inputs, rotated)]
        for layout, ins in variants.items():
            try:
                got = [prefill_attention(*i, b.tables, b.scale, rotated_q=r) for i, r in zip(ins, rotated)]
                us = kb.graph_us(b, [lambda i=i, r=r: prefill_attention(*i, b.tables, b.scale, rotated_q=r)
                                     for i, r in zip(ins, rotated)])
                record({"kind": f"prefill.py RAG bs {batch}", "layout": layout,
                        "bit_equal": all(torch.equal(x, y) for x, y in zip(got, ref)), "us": us,
                        "%": 100 * kv_bytes / us / 1e3 / copy})
            except Exception:  # noqa: BLE001
                record({"kind": f"prefill.py RAG bs {batch}", "layout": layout, "error": traceback.format_exc()[-600:]})
        if gpu and kb.hopper_takes(*inputs[0]):
            us = kb.graph_us(b, [lambda i=i: kb.engine_attention(b, *i) for i in inputs])
            record({"kind": f"gluon RAG bs {batch}", "layout": "token", "us": us, "%": 100 * kv_bytes / us / 1e3 / copy})
        del inputs, variants, rotated, ref
        kb.free_memory()

    print("\n| what | layout | ordered | splits | bit-equal | alone / us (% copy) | layer / us (% copy) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['kind']} | {r['layout']} | {r.get('ordered', '')} | {r.get('splits', '')} | ERROR | | |")
        elif r["kind"] == "decode":
            print(f"| decode | {r['layout']} | {r['ordered']} | {r['splits']} | {r['bit_equal']} | "
                  f"{r['alone_us']:.2f} ({r['alone_%']:.1f}) | {r['layer_us']:.2f} ({r['layer_%']:.1f}) |")
        else:
            print(f"| {r['kind']} | {r['layout']} | | | {r.get('bit_equal', '')} | {r['us']:.2f} ({r['%']:.1f}) | |")
    print(f"copy {copy:.0f} GB/s")


if __name__ == "__main__":
    main()
