"""Split counts and tiles of the two attention shapes of the request path, timed as the engine runs them.

    python benchmarks/attention_splits.py --out benchmarks/results/engine_perf/attention_splits_s3.json   # GPU, ~1 min
    python benchmarks/attention_splits.py --prefill-only --out ...   # the prefill rows near the default tiles, ~15 s

Shapes (Llama-3.1-8B heads, bf16, pages of 64, benchmarks/kernels.py layouts): the cached-RAG prefill (a 32-token
question over 5 x 2048 cached tokens at their deltas) at batch 1 and 8, and decode at batch 1 over 10 304 tokens.
Each configuration is 32 launches (one per layer, rotating over input copies larger than L2) captured in one
CUDA graph, timed by events over 20 replays after the clocks are spun up (median, per launch): what a layer of
the engine's graphs pays, launch gaps included. Percentages are KV bytes over the device-to-device copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels as kb  # noqa: E402  (benchmarks/kernels.py: layouts, the copy bandwidth, graph timing)

from lazyattn.kernels import decode, prefill  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file of every row")
    parser.add_argument(
        "--prefill-only",
        action="store_true",
        help="prefill only, default tiles, split counts near the default (0: the default)",
    )
    args = parser.parse_args()
    device = torch.device("cuda")
    s = kb.Shapes()
    tables = kb.llama31_tables(s.head_dim, 65536, device)
    b = kb.Bench(argparse.Namespace(warmup=25, rep=100), s, device, tables)
    gbps = b.copy_bandwidth()
    rows: list[dict] = []

    def record(row: dict) -> None:
        rows.append(row)
        print(row, flush=True)

    prefill_cases = (
        (
            1,
            (8, 12, 16, 20, 24, 32),
            (None, prefill.PrefillConfig(128, 64, 8, 3), prefill.PrefillConfig(128, 64, 8, 2)),
        ),
        (8, (1, 2, 3, 4), (None,)),
    )
    if args.prefill_only:
        prefill_cases = ((1, (0, 12, 16, 20, 24), (None,)), (8, (0, 1, 2, 3), (None,)))
    for batch, split_counts, configs in prefill_cases:
        inputs, _ = kb.rag_case(b, batch, False, copies=4)
        kv_bytes = batch * (s.n_docs * s.doc_len + s.question) * s.kv_heads * s.head_dim * 2 * 2
        for config in configs:
            for splits in split_counts:
                for deltas in (True, False):
                    calls = [
                        lambda q=q, k=k, v=v, pb=pb, c=config, n=splits, d=deltas: prefill.prefill_attention(
                            q, k, v, pb, tables, b.scale, apply_delta=d, num_splits=n or None, config=c
                        )
                        for q, k, v, pb in inputs
                    ]
                    us = kb.graph_us(b, calls)
                    record(
                        dict(
                            kind="prefill",
                            batch=batch,
                            cfg=str(config),
                            splits=splits,
                            delta=deltas,
                            us=round(us, 2),
                            bw_pct=round(100 * kv_bytes / (us * 1e-6) / (gbps * 1e9), 1),
                        )
                    )
        del inputs
        torch.cuda.empty_cache()
    if not args.prefill_only:
        gen = torch.Generator().manual_seed(0)
        inputs, nbytes = kb.decode_case(b, 1, 10304, gen)
        while len(inputs) < 4:
            inputs += kb.decode_case(b, 1, 10304, gen)[0]
        for config in (None, decode.DecodeConfig(32, 4, 5, 168), decode.DecodeConfig(64, 4, 3, 168)):
            for splits in (8, 16, 24, 33, 48, 64):
                counters = decode.ArrivalCounters()
                calls = [
                    lambda q=q, k=k, v=v, pb=pb, c=config, n=splits, a=counters: decode.decode_attention(
                        q, k, v, pb, tables, b.scale, counters=a, num_splits=n, config=c
                    )
                    for q, k, v, pb in inputs
                ]
                us = kb.graph_us(b, calls)
                record(
                    dict(
                        kind="decode",
                        ctx=10304,
                        splits=splits,
                        cfg=str(config),
                        us=round(us, 2),
                        bw_pct=round(100 * nbytes / (us * 1e-6) / (gbps * 1e9), 1),
                    )
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"copy_gbps": gbps, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
