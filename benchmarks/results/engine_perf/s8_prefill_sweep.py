"""Session 8: the short-query prefill attention (RAG batch 1: 5 x 2048 cached documents + a 32-token question,
Llama-3.1-8B heads, bf16, Q rotated per run as the engine passes it) over tile configs and split counts, timed as
benchmarks/kernels.py's targets section times it (graph_us: 32 launches per graph, inputs rotated past L2). Session
5's sweep (s5K_sweep.json) tried only 128-row tiles of 8 warps, one program per SM; this one adds 64- and 32-row
tiles of 4 warps, whose programs share an SM two or four at a time. Each config's output is checked against the
default config's. From the repository root, on the GPU:

    python benchmarks/results/engine_perf/s8_prefill_sweep.py OUT.json
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import kernels as kb  # noqa: E402  (benchmarks/kernels.py)

from lazyattn.kernels.prefill import PrefillConfig, prefill_attention  # noqa: E402

CONFIGS = [None] + [PrefillConfig(m, n, w, st) for m, n, w, st in (
    (64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4), (64, 64, 8, 3), (64, 32, 4, 3), (32, 64, 4, 3), (32, 64, 4, 2),
    (128, 64, 4, 3))]
SPLITS = (8, 12, 16, 24, 32)


def main() -> None:
    out = Path(sys.argv[1])
    b, copy, kv_bytes, copies = kb.rag_sweep_bench()
    inputs, _ = kb.rag_case(b, 1, False, copies=copies)
    rotated = [kb.rope_runs(b, *i) for i in inputs]
    ref = prefill_attention(*inputs[0], b.tables, b.scale, rotated_q=rotated[0])
    rows = []
    for cfg in CONFIGS:
        for splits in ((16,) if cfg is None else SPLITS):
            row = {"config": None if cfg is None else [cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages],
                   "splits": splits}
            try:
                got = prefill_attention(*inputs[0], b.tables, b.scale, rotated_q=rotated[0], config=cfg,
                                        num_splits=splits)
                row["max_err"] = (got.float() - ref.float()).abs().max().item()
                calls = [lambda i=i, r=r, cfg=cfg, splits=splits: prefill_attention(
                    *i, b.tables, b.scale, rotated_q=r, config=cfg, num_splits=splits)
                    for i, r in zip(inputs, rotated)]
                us = kb.graph_us(b, calls)
                row.update(us=us, pct_of_copy=100 * kv_bytes / us / 1e3 / copy)
            except Exception as e:  # noqa: BLE001 - a config that does not compile is recorded and skipped
                row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
            rows.append(row)
            print(row, flush=True)
    out.write_text(json.dumps({"copy_gbps": copy, "kv_bytes": kv_bytes, "rows": rows}, indent=1))
    ok = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
    for r in ok[:8]:
        print(f"best: {r['config']} splits {r['splits']}: {r['us']:.1f} us ({r['pct_of_copy']:.1f} %), "
              f"max err {r['max_err']:.2e}")


if __name__ == "__main__":
    main()
