"""Helper K, session 5: split counts, the one-piece plan, and fixed vs per-byte cost of the short-query prefill and
batch-1 decode attention, timed as benchmarks/attention_splits.py times them (32 launches in one CUDA graph, inputs
rotated over copies larger than L2, median of 20 replays per launch).

    python benchmarks/results/engine_perf/s5K_sweep.py --out $OUT/s5K_sweep.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

import attention_splits as asp  # noqa: E402
import kernels as kb  # noqa: E402

from lazyattn.kernels import decode, prefill  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    device = torch.device("cuda")
    s = kb.Shapes()
    tables = kb.llama31_tables(s.head_dim, 65536, device)
    b = kb.Bench(argparse.Namespace(warmup=25, rep=100), s, device, tables)
    gbps = b.copy_bandwidth()
    rows: list[dict] = []
    plan_ok = "plan_pieces" in prefill.prefill_attention.__code__.co_varnames

    def record(row: dict) -> None:
        rows.append(row)
        print(row, flush=True)

    def pct(nbytes: float, us: float) -> float:
        return round(100 * nbytes / (us * 1e-6) / (gbps * 1e9), 1)

    # Prefill: split counts x plan x deltas at the RAG shape; then context length at bs 1 (fixed vs per-byte).
    cases = [(1, s, (12, 16, 20, 24, 32)), (8, s, (2, 4, 6, 8, 11, 16, 22))]
    cases += [(1, replace(s, n_docs=n), (0,)) for n in (1, 2, 10)]
    for batch, shp, split_counts in cases:
        bb = kb.Bench(b.args, shp, device, tables, gbps)
        inputs, _ = kb.rag_case(bb, batch, False, copies=4)
        kv_bytes = batch * (shp.n_docs * shp.doc_len + shp.question) * shp.kv_heads * shp.head_dim * 2 * 2
        for splits in split_counts:
            for plan in ((True, False) if plan_ok else (None,)):
                for deltas in (True, False):
                    extra = {} if plan is None else {"plan_pieces": plan}
                    calls = [lambda q=q, k=k, v=v, pb=pb, n=splits, d=deltas, e=extra: prefill.prefill_attention(
                        q, k, v, pb, tables, b.scale, apply_delta=d, num_splits=n or None, **e)
                        for q, k, v, pb in inputs]
                    us = asp.graph_us(calls, device)
                    record(dict(kind="prefill", batch=batch, docs=shp.n_docs, splits=splits, plan=plan,
                                delta=deltas, us=round(us, 2), bw_pct=pct(kv_bytes, us)))
        del inputs
        torch.cuda.empty_cache()
    # Decode at batch 1: split counts x tiles at 10 304 keys; then context length with the default.
    gen = torch.Generator().manual_seed(0)
    for ctx, split_counts, configs in ((10304, (8, 12, 16, 24, 33, 48, 66),
                                        (None, decode.DecodeConfig(64, 4, 3, 168), decode.DecodeConfig(64, 4, 5, 168),
                                         decode.DecodeConfig(64, 8, 4, None), decode.DecodeConfig(32, 4, 6, 168))),
                                       (2048, (0,), (None,)), (4096, (0,), (None,)), (20480, (0,), (None,))):
        inputs, nbytes = kb.decode_case(b, 1, ctx, gen)
        while len(inputs) < 4:
            inputs += kb.decode_case(b, 1, ctx, gen)[0]
        for config in configs:
            for splits in split_counts:
                counters = decode.ArrivalCounters()
                calls = [lambda q=q, k=k, v=v, pb=pb, c=config, n=splits, a=counters: decode.decode_attention(
                    q, k, v, pb, tables, b.scale, counters=a, num_splits=n or None, config=c)
                    for q, k, v, pb in inputs]
                try:
                    us = asp.graph_us(calls, device)
                except Exception as e:  # noqa: BLE001 - a config that does not fit is recorded, the sweep goes on
                    record(dict(kind="decode", ctx=ctx, splits=splits, cfg=str(config), error=str(e)[:200]))
                    continue
                record(dict(kind="decode", ctx=ctx, splits=splits, cfg=str(config), us=round(us, 2),
                            bw_pct=pct(nbytes, us)))
        del inputs
        torch.cuda.empty_cache()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"copy_gbps": gbps, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
