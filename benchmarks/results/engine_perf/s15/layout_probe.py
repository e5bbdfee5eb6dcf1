"""Session 15: does the page layout set batch-1 decode attention's bandwidth, and what does the memory allow?

The pool stores a page as [page_size, kv_heads, head_dim]: one (page, kv head) tile, which one decode program
reads, is 64 rows of 256 bytes at a 2 KiB stride, and the 8 programs of a page's 8 heads read interleaved pieces of
the same 128 KiB at different times. Head-major pages ([kv_heads, page_size, head_dim]) make each tile one
contiguous 16 KiB run. The kernels take strides, so the same launch runs either layout. Decode at batch 1 over
10 304 cached keys (the issue-10 target) is timed per layer in a CUDA graph of 32 (benchmarks/kernels.py's
graph_us). Sections (all by default):

- `decode`: token-major (the pool's) or head-major (a permuted copy of the same pages, same logical shape) x page
  order (the shuffled free list of benchmarks/kernels.py, or ascending ids: the best case) x split count (the rule,
  fixed counts) x form (back to back, `alone`; each after a RoPE launch, `layer`, as in the engine). Every output
  is checked bit-equal to the token-major one (same arithmetic, other addresses).
- `configs`: the rule's splits with other tiles' pipelines (stages, warps), both layouts, shuffled pages.
- `stream`: the ceiling of that grid: a kernel that walks the same pages with the same loop (page ids a tile
  ahead, K and V tiles through tl.dot with a 16-row operand) and nothing else: no masks, no softmax, no partials,
  no merge. Its time against decode's is what the softmax and the split merge cost; against the copy, what the
  memory gives a grid of one program per (kv head, split).
- `prefill`: prefill.py's kernel on the RAG case at batch 1 and 8 in both layouts (the Gluon kernel's TMA
  descriptor assumes the pool's layout: it is timed in that layout only, as the reference point).

    python benchmarks/results/engine_perf/s15/layout_probe.py OUT.json [SECTION ...]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import traceback
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from benchmarks import kernels as kb  # noqa: E402
from lazyattn.kernels import cache_ops  # noqa: E402
from lazyattn.kernels.decode import DecodeConfig  # noqa: E402
from lazyattn.kernels.paged import PagedBatch, cdiv  # noqa: E402
from lazyattn.kernels.prefill import prefill_attention  # noqa: E402

SECTIONS = ("decode", "configs", "stream", "prefill")


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


@triton.jit
def _stream_pages(q_ptr, k_src, v_src, pages_ptr, out_ptr, n_pages, per_split, stride_kp, stride_kt, stride_kh,
                  HEADS: tl.constexpr, HEAD_MAJOR: tl.constexpr, TMA: tl.constexpr, BLOCK_N: tl.constexpr,
                  D: tl.constexpr):
    """decode.py's tile loop with nothing around it: program (split, kv head) walks its pages' K and V tiles. TMA:
    k_src and v_src are tensor descriptors whose boxes are (page, kv head) tiles (one copy-engine load per tile on
    Hopper), else the caches, read by per-thread asynchronous copies as decode.py reads them."""
    split = tl.program_id(0)
    head = tl.program_id(1)
    lo = split * per_split
    hi = tl.minimum(lo + per_split, n_pages)
    g = tl.arange(0, 16)
    n = tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + g[:, None] * D + d[None, :])
    acc = tl.zeros([16, D], tl.float32)
    page_next = tl.load(pages_ptr + lo, mask=lo < hi, other=0)
    for p in range(lo, hi):
        page = page_next.to(tl.int64)
        page_next = tl.load(pages_ptr + p + 1, mask=p + 1 < hi, other=0)
        if TMA:
            if HEAD_MAJOR:  # rows of [pages * heads * slots, D]
                row = ((page * HEADS + head) * BLOCK_N).to(tl.int32)
                col = 0
            else:  # rows of [pages * slots, heads * D]
                row = (page * BLOCK_N).to(tl.int32)
                col = head * D
            k = k_src.load([row, col])
            v = v_src.load([row, col])
        else:
            offs = head.to(tl.int64) * stride_kh + page * stride_kp + n[:, None] * stride_kt + d[None, :]
            k = tl.load(k_src + offs)
            v = tl.load(v_src + offs)
        s = tl.dot(q, tl.trans(k))
        acc += tl.dot(s.to(k.dtype), v)
    rows = (head * tl.num_programs(0) + split) * 16 + g
    tl.store(out_ptr + rows[:, None].to(tl.int64) * D + d[None, :], acc)


def tile_descriptor(cache: torch.Tensor):
    """A tensor descriptor whose [page_size, head_dim] boxes are (page, kv head) tiles, and whether the layout is
    head-major."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    pages, slots, heads, dim = cache.shape
    head_major = cache.stride(2) == slots * dim
    rows, cols = (pages * heads * slots, dim) if head_major else (pages * slots, heads * dim)
    flat = cache.as_strided((rows, cols), (cols, 1))
    return TensorDescriptor(flat, [rows, cols], [cols, 1], [slots, dim]), head_major


def stream_tma(q16: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pages: torch.Tensor, splits: int,
               out: torch.Tensor, num_stages: int = 3) -> torch.Tensor:
    return stream(q16, k, v, pages, splits, out, num_stages, tma=True)


def stream(q16: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pages: torch.Tensor, splits: int,
           out: torch.Tensor, num_stages: int = 3, tma: bool = False) -> torch.Tensor:
    n_pages = pages.numel()
    per = cdiv(n_pages, splits)
    (k_src, head_major), (v_src, _) = (tile_descriptor(k), tile_descriptor(v)) if tma else ((k, False), (v, False))
    _stream_pages[(cdiv(n_pages, per), k.shape[2])](
        q16, k_src, v_src, pages, out, n_pages, per, k.stride(0), k.stride(1), k.stride(2), HEADS=k.shape[2],
        HEAD_MAJOR=head_major, TMA=tma, BLOCK_N=k.shape[1], D=k.shape[3], num_warps=4, num_stages=num_stages)
    return out


def main() -> None:
    out = Path(sys.argv[1])
    sections = sys.argv[2:] or SECTIONS
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

    def pct(us: float, n: float = nbytes) -> float:
        return 100 * n / us / 1e3 / copy

    def guarded(label: dict, body) -> None:
        try:
            record({**label, **body()})
        except Exception:  # noqa: BLE001 - recorded, the probe goes on
            record({**label, "error": traceback.format_exc()[-600:]})

    fn = kb.attention(True)
    gen = torch.Generator().manual_seed(2)

    def layer(i, **kw):
        q, k_cache, v_cache, pb = i
        kq = torch.randn(1, s.kv_heads, s.head_dim, dtype=q.dtype, device=device)
        pos = pb.q_start.long()
        slot = torch.full((1,), -1, dtype=torch.int64, device=device)  # rotates, stores nothing
        return lambda: fn(cache_ops.rope_write_kv(q, kq, kq, pos, slot, k_cache, v_cache, b.tables), k_cache, v_cache,
                          pb, b.tables, b.scale, **kw)

    def decode_row(inputs, ref, **kw) -> dict:
        got = [fn(*i, b.tables, b.scale, **kw) for i in inputs]
        alone = kb.graph_us(b, [lambda i=i: fn(*i, b.tables, b.scale, **kw) for i in inputs])
        layered = kb.graph_us(b, [layer(i, **kw) for i in inputs])
        return {"bit_equal": all(torch.equal(x, y) for x, y in zip(got, ref)), "alone_us": alone,
                "layer_us": layered, "alone_%": pct(alone), "layer_%": pct(layered)}

    def stream_row(inputs: list[tuple], splits: int, stages: int, launcher=stream) -> dict:
        q16 = torch.randn(16, s.head_dim, dtype=kb.DTYPE, device=device)
        scratch = torch.zeros(s.kv_heads * splits * 16, s.head_dim, dtype=torch.float32, device=device)
        calls = [functools.partial(launcher, q16, k, v, pb.pages[0, : pb.max_pages], splits, scratch, stages)
                 for _, k, v, pb in inputs]
        # The same sums as the plain loop over the first input (other instructions: equal within rounding).
        want = stream(q16, *inputs[0][1:3], inputs[0][3].pages[0, : inputs[0][3].max_pages], splits,
                      torch.zeros_like(scratch))
        got = calls[0]()
        # (equal_nan: the CPU interpreter multiplies bf16 dot operands as raw bits, triton issue #11584.)
        close = bool(torch.allclose(got, want, rtol=1e-2, atol=1e-2 * float(want.nan_to_num().abs().max()),
                                    equal_nan=True))
        us = kb.graph_us(b, calls)
        return {"matches_stream": close, "alone_us": us, "alone_%": pct(us)}

    def prefill_rows(batch: int) -> None:
        kv_bytes = batch * (s.n_docs * s.doc_len + s.question) * s.kv_heads * s.head_dim * 2 * kb.DTYPE.itemsize
        inputs, _ = kb.rag_case(b, batch, False, copies=max(2, kb.copies_for(kv_bytes, b.l2_bytes())))
        inputs = [kb.engine_split(b, *i) for i in inputs]
        rotated = [kb.rope_runs(b, *i) for i in inputs]
        calls = {name: [functools.partial(prefill_attention, *i, b.tables, b.scale, rotated_q=r)
                        for i, r in zip(ins, rotated)]
                 for name, ins in (("token", inputs),
                                   ("head", [(q, head_major(k), head_major(v), pb) for q, k, v, pb in inputs]))}
        ref = [call() for call in calls["token"]]

        def timed(fns, check: bool = True) -> dict:
            same = {"bit_equal": all(torch.equal(f(), y) for f, y in zip(fns, ref))} if check else {}
            us = kb.graph_us(b, fns)
            return {**same, "alone_us": us, "alone_%": pct(us, kv_bytes)}

        for name, fns in calls.items():
            guarded({"kind": f"prefill.py RAG bs {batch}", "layout": name}, functools.partial(timed, fns))
        if gpu and kb.hopper_takes(*inputs[0]):
            gluon = [functools.partial(kb.engine_attention, b, *i) for i in inputs]
            guarded({"kind": f"gluon RAG bs {batch}", "layout": "token"}, functools.partial(timed, gluon, False))
        kb.free_memory()

    for ordered in (False, True):
        base = decode_inputs(b, ctx, ordered, gen)
        layouts = {"token": base, "head": [(q, head_major(k), head_major(v), pb) for q, k, v, pb in base]}
        if "decode" in sections:
            for splits in (None, 8, 24, 32, 48):
                ref = [fn(*i, b.tables, b.scale, num_splits=splits) for i in base]
                for name, inputs in layouts.items():
                    guarded({"kind": "decode", "layout": name, "ordered": ordered, "splits": splits or "rule"},
                            lambda inputs=inputs, ref=ref, splits=splits: decode_row(inputs, ref, num_splits=splits))
        if "configs" in sections and not ordered:
            ref = [fn(*i, b.tables, b.scale) for i in base]
            for warps, stages in ((4, 4), (4, 5), (8, 3), (8, 4)):
                config = DecodeConfig(block_n=s.page_size, num_warps=warps, num_stages=stages, maxnreg=None)
                for name, inputs in layouts.items():
                    guarded({"kind": f"decode {warps} warps, {stages} stages", "layout": name, "ordered": ordered,
                             "splits": "rule"},
                            lambda inputs=inputs, ref=ref, config=config: decode_row(inputs, ref, config=config))
        if "stream" in sections:
            for splits in (15, 16):  # the rule's 15 x 11 pages; 16 x 10 pages + 1
                for name, inputs in layouts.items():
                    for launcher, stage_counts in ((stream, (3, 4)), (stream_tma, (3, 4, 6))):
                        for stages in stage_counts:
                            guarded({"kind": f"{launcher.__name__}, {stages} stages", "layout": name,
                                     "ordered": ordered, "splits": splits},
                                    functools.partial(stream_row, inputs, splits, stages, launcher))
        del base, layouts
        kb.free_memory()

    for batch in (1, 8) if "prefill" in sections else ():
        prefill_rows(batch)

    print("\n| what | layout | ordered | splits | bit-equal | alone / us (% copy) | layer / us (% copy) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [r["kind"], r["layout"], r.get("ordered", ""), r.get("splits", "")]
        if "error" in r:
            cells += ["ERROR", "", ""]
        else:
            cells += [r.get("bit_equal", r.get("matches_stream", "")), f"{r['alone_us']:.2f} ({r['alone_%']:.1f})",
                      f"{r['layer_us']:.2f} ({r['layer_%']:.1f})" if "layer_us" in r else ""]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    print(f"copy {copy:.0f} GB/s")


if __name__ == "__main__":
    main()
