"""Session 11: the warp-specialised Gluon short-question prefill (kernels/prefill_hopper.py) against the Triton
kernel (kernels/prefill.py) on the RAG case of `benchmarks/kernels.py --sections targets`, timed the same way
(graph_us: 32 launches per CUDA graph, inputs rotated past L2), outputs compared.

    python benchmarks/results/engine_perf/s11/gluon_prefill.py OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from kernels import engine_split, graph_us, rag_case, rag_sweep_bench, rope_runs  # noqa: E402

from lazyattn.kernels import prefill_hopper  # noqa: E402
from lazyattn.kernels.prefill import prefill_attention  # noqa: E402
from lazyattn.kernels.reference import paged_attention  # noqa: E402


def main() -> None:
    b, copy_gbps, _, _ = rag_sweep_bench()
    s = b.s
    rows = []
    for batch in (1, 8):
        kv_bytes = batch * (s.n_docs * s.doc_len + s.question) * s.kv_heads * s.head_dim * 2 * 2
        inputs, _ = rag_case(b, batch, False, copies=6)
        inputs = [engine_split(b, *i) for i in inputs]
        rotated = [rope_runs(b, *i) for i in inputs]
        q, k, v, pb = inputs[0]
        splits = pb.plan.shape[1] if pb.plan is not None else 1
        assert prefill_hopper.supports(q, k, v, pb), "the Gluon kernel should take this call"
        ours = prefill_hopper.short_prefill_attention(q, k, v, pb, b.tables, b.scale, splits)
        triton_out = prefill_attention(q, k, v, pb, b.tables, b.scale, rotated_q=rotated[0])
        ref = paged_attention(q.float(), k.float(), v.float(), pb, b.tables, b.scale) if batch == 1 else None
        row = {"batch": batch, "splits": splits,
               "max_abs_vs_triton": (ours.float() - triton_out.float()).abs().max().item(),
               "max_abs_triton_vs_ref": None if ref is None else (triton_out.float() - ref).abs().max().item(),
               "max_abs_gluon_vs_ref": None if ref is None else (ours.float() - ref).abs().max().item()}
        calls = {
            "triton, deltas": [lambda i=i, r=r: prefill_attention(*i, b.tables, b.scale, rotated_q=r)
                               for i, r in zip(inputs, rotated)],
            "triton, no deltas": [lambda i=i: prefill_attention(*i, b.tables, b.scale, apply_delta=False)
                                  for i in inputs],
            "gluon, deltas": [lambda i=i, n=splits: prefill_hopper.short_prefill_attention(*i, b.tables, b.scale, n)
                              for i in inputs],
            "gluon, no deltas": [lambda i=i, n=splits: prefill_hopper.short_prefill_attention(*i, b.tables, b.scale, n,
                                                                                   apply_delta=False)
                                 for i in inputs],
        }
        for rnd in range(2):  # alternated rounds
            for name, fns in calls.items():
                us = graph_us(b, fns)
                row[f"{name} r{rnd} us"] = us
                row[f"{name} r{rnd} %copy"] = 100 * kv_bytes / us / 1e3 / copy_gbps
        rows.append(row)
        print(json.dumps(row), flush=True)
        del inputs, rotated, calls
    Path(sys.argv[1]).write_text(json.dumps({"copy_gbps": copy_gbps, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
