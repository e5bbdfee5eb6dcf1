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

    def record(row: dict) -> None:
        rows.append(row)
        print(row, flush=True)

    def pct(nbytes: float, us: float) -> float:
        return round(100 * nbytes / (us * 1e-6) / (gbps * 1e9), 1)

    # Prefill: split counts x tiles x how Q is rotated, at the RAG shape; then context length at bs 1 (fixed vs
    # per-byte cost); then the RoPE launch alone with and without the per-run copies.
    P = prefill.PrefillConfig
    small = (P(128, 32, 8, 3, 128), P(128, 64, 8, 2, 128), P(128, 32, 8, 4, None))
    cases = [(1, s, (16, 20, 24, 32), (None,) + small), (8, s, (2, 6, 8, 11, 16), (None,))]
    cases += [(1, replace(s, n_docs=n), (0,), (None,)) for n in (1, 2, 10)]
    for batch, shp, split_counts, configs in cases:
        bb = kb.Bench(b.args, shp, device, tables, gbps)
        inputs, _ = kb.rag_case(bb, batch, False, copies=4)
        rotated = [kb.rope_runs(bb, *i) for i in inputs]
        kv_bytes = batch * (shp.n_docs * shp.doc_len + shp.question) * shp.kv_heads * shp.head_dim * 2 * 2
        variants = {"none": dict(apply_delta=False), "rotq": None, "inkernel": dict(rotated_runs=0)}
        if shp.n_docs != s.n_docs:
            variants = {"none": variants["none"]}
        for config in configs:
            for splits in split_counts:
                for name, kw in variants.items():
                    for plan in ((True, False) if splits in (16, 2) and config is None and name == "rotq" else (True,)):
                        calls = [lambda q=q, k=k, v=v, pb=pb, r=r, n=splits, kw=kw, c=config, pl=plan:
                                 prefill.prefill_attention(q, k, v, pb, tables, b.scale, num_splits=n or None,
                                                           config=c, plan_pieces=pl,
                                                           **(kw if kw is not None else {"rotated_q": r}))
                                 for (q, k, v, pb), r in zip(inputs, rotated)]
                        try:
                            us = asp.graph_us(calls, device)
                        except Exception as e:  # noqa: BLE001 - a config that does not compile is recorded
                            record(dict(kind="prefill", batch=batch, cfg=str(config), splits=splits, q=name,
                                        error=str(e)[-300:]))
                            continue
                        record(dict(kind="prefill", batch=batch, docs=shp.n_docs, cfg=str(config), splits=splits,
                                    plan=plan, q=name, us=round(us, 2), bw_pct=pct(kv_bytes, us)))
        if shp.n_docs == s.n_docs:
            from lazyattn.kernels.cache_ops import rope_write_kv, rope_write_kv_runs
            from lazyattn.kernels.prefill import rotated_runs_for
            for runs in (0, rotated_runs_for(batch * s.question)):
                def rope(q, k, v, pb, runs=runs, bb=bb):
                    t = q.shape[0]
                    kv = torch.randn(t, 2, s.kv_heads, s.head_dim, dtype=torch.bfloat16, device=device)
                    slots = torch.full((t,), -1, dtype=torch.int64, device=device)
                    args = (q, kv[:, 0], kv[:, 1], kb.rag_positions(bb, pb), slots, k, v, tables)
                    if runs:
                        return lambda: rope_write_kv_runs(*args, pb, runs)
                    return lambda: rope_write_kv(*args)
                us = asp.graph_us([rope(*i) for i in inputs], device)
                record(dict(kind="rope", batch=batch, runs=runs, us=round(us, 2)))
        del inputs, rotated
        torch.cuda.empty_cache()
    # Decode at batch 1: split counts x tiles at 10 304 keys; then context length with the default.
    gen = torch.Generator().manual_seed(0)
    D = decode.DecodeConfig
    for ctx, split_counts, configs in ((10304, (12, 16, 20, 24, 33),
                                        (None, D(64, 4, 3, 168), D(64, 4, 5, 168), D(64, 8, 4, None),
                                         D(32, 4, 4, 168))),
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
