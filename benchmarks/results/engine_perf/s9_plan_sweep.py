"""Session 9: the short-query prefill attention with the host's plan of each split's pages (kernels/prefill.py,
split_plan) against the kernel's own chunking, at RAG batch 1 (Llama-3.1-8B heads, bf16, Q rotated per run as the
engine passes it), timed as benchmarks/kernels.py's targets section times it (graph_us: 32 launches per graph,
inputs rotated past L2).

Two layouts: `rag6`, benchmarks/kernels.py's case (5 x 2048 cached documents + a 32-token question: 6 runs), and
`rag7`, the engine's request (a 32-token system segment first: 7 runs, pages 1 + 160 + 1). Per layout: the default
kernel (its scans; 16 splits), the same with the rotation compiled out (apply_delta=False, the overhead's
baseline), and host plans over split counts and switch costs, each with and without deltas. Every output is
checked against the default's. From the repository root, on the GPU:

    python benchmarks/results/engine_perf/s9_plan_sweep.py OUT.json
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import kernels as kb  # noqa: E402  (benchmarks/kernels.py)

from lazyattn.kernels.paged import PagedBatch  # noqa: E402
from lazyattn.kernels.prefill import prefill_attention, with_plan  # noqa: E402

SPLITS = (12, 16)
SWITCHES = (0, 1, 2, 4, 100)
SYSTEM = 32


def rag7(b, copies: int):
    """kb.rag_case's request with a SYSTEM-token segment at delta 0 before the documents (random K/V)."""
    s = b.s
    per = 1 + s.n_docs * kb.pages_for(s.doc_len, s) + kb.pages_for(s.question, s)
    pool = kb.Pool(s, copies * per + 1, b.device)
    inputs = []
    for _ in range(copies):
        parts = [pool.segment(SYSTEM, 0)] + [pool.segment(s.doc_len, SYSTEM + i * s.doc_len) for i in range(s.n_docs)]
        parts.append(pool.segment(s.question, 0))
        pb = PagedBatch.build([kb.join(parts)], [s.question], [SYSTEM + s.n_docs * s.doc_len], b.device)
        q = torch.randn(s.question, s.q_heads, s.head_dim, dtype=kb.DTYPE, device=b.device)
        inputs.append((q, pool.k, pool.v, pb))
    return inputs


def main() -> None:
    out = Path(sys.argv[1])
    b, copy, kv_bytes, copies = kb.rag_sweep_bench()
    layouts = {"rag6": kb.rag_case(b, 1, False, copies=copies)[0], "rag7": rag7(b, copies)}
    rows = []
    for name, inputs in layouts.items():
        rotated = [kb.rope_runs(b, *i) for i in inputs]
        ref = prefill_attention(*inputs[0], b.tables, b.scale, rotated_q=rotated[0], num_splits=16)
        variants = [("default", 16, None, True), ("default", 16, None, False)]
        variants += [("plan", sp, sw, d) for sp in SPLITS for sw in SWITCHES for d in (True, False)]
        for kind, splits, switch, delta in variants:
            row = {"layout": name, "kind": kind, "splits": splits, "switch": switch, "delta": delta}
            batches = [with_plan(i[3], splits, switch) if kind == "plan" else i[3] for i in inputs]

            def call(i, pb, r, splits=splits, delta=delta):
                if delta:
                    return prefill_attention(i[0], i[1], i[2], pb, b.tables, b.scale, rotated_q=r, num_splits=splits)
                return prefill_attention(i[0], i[1], i[2], pb, b.tables, b.scale, apply_delta=False,
                                         num_splits=splits)

            try:
                if delta:
                    row["max_err"] = (call(inputs[0], batches[0], rotated[0]).float() - ref.float()).abs().max().item()
                if kind == "plan":
                    row["pieces"] = batches[0].plan[0, :, 0].tolist()
                us = kb.graph_us(b, [lambda i=i, pb=pb, r=r: call(i, pb, r)
                                     for i, pb, r in zip(inputs, batches, rotated)])
                row.update(us=us, pct_of_copy=100 * kv_bytes / us / 1e3 / copy)
            except Exception as e:  # noqa: BLE001 - recorded and skipped
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
            print(row, flush=True)
    out.write_text(json.dumps({"copy_gbps": copy, "kv_bytes": kv_bytes, "rows": rows}, indent=1))
    for name in layouts:
        ok = sorted((r for r in rows if "us" in r and r["layout"] == name and r["delta"]), key=lambda r: r["us"])
        for r in ok[:5]:
            print(f"{name} best: {r['kind']} splits {r['splits']} switch {r['switch']}: {r['us']:.1f} us "
                  f"({r['pct_of_copy']:.1f} %), max err {r.get('max_err', 0):.2e}")


if __name__ == "__main__":
    main()
