"""Session 12: the Gluon short-question prefill (kernels/prefill_hopper.py) with its products no longer serialised,
against the Triton kernel (kernels/prefill.py) on the RAG case of `benchmarks/kernels.py --sections targets`
(5 x 2048 cached documents at their deltas + a 32-token question per entry), timed the same way (graph_us: 32
launches per CUDA graph, inputs rotated past L2), at batch 1-8 and several split counts, two alternated rounds.
"old grid" rows launch batch 1 with the spare query slot that `prefill.query_slots` now drops.

    python benchmarks/results/engine_perf/s12/gluon_sweep.py OUT.json
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from kernels import engine_split, free_memory, graph_us, rag_case, rag_sweep_bench, rope_runs  # noqa: E402

from lazyattn.kernels import prefill, prefill_hopper  # noqa: E402
from lazyattn.kernels.prefill import prefill_attention  # noqa: E402
from lazyattn.kernels.reference import paged_attention  # noqa: E402

GLUON_SPLITS = {1: (8, 12, 16, 24), 2: (4, 6, 8), 4: (2, 3, 4), 8: (1, 2)}
_new_slots = prefill.query_slots


def _old_slots(total_q: int, batch_size: int, positions: int) -> int:
    return total_q // positions + batch_size


@contextlib.contextmanager
def old_grid():
    prefill.query_slots = prefill_hopper.query_slots = _old_slots
    try:
        yield
    finally:
        prefill.query_slots = prefill_hopper.query_slots = _new_slots


def timed(b, fns, grid_old: bool) -> float:
    with old_grid() if grid_old else contextlib.nullcontext():
        return graph_us(b, fns)


def main() -> None:
    b, copy_gbps, _, _ = rag_sweep_bench()
    s = b.s
    rows = []
    for batch, gluon_splits in GLUON_SPLITS.items():
        kv_bytes = batch * (s.n_docs * s.doc_len + s.question) * s.kv_heads * s.head_dim * 2 * 2
        inputs, _ = rag_case(b, batch, False, copies=6)
        inputs = [engine_split(b, *i) for i in inputs]
        rotated = [rope_runs(b, *i) for i in inputs]
        q, k, v, pb = inputs[0]
        ref = paged_attention(q.float(), k.float(), v.float(), pb, b.tables, b.scale) if batch <= 2 else None
        row = {"batch": batch, "engine_splits": pb.plan.shape[1] if pb.plan is not None else 1}
        calls = {"triton (engine's splits)": ([lambda i=i, r=r: prefill_attention(*i, b.tables, b.scale, rotated_q=r)
                                              for i, r in zip(inputs, rotated)], False)}
        if batch == 1:
            calls["triton, old grid"] = (calls["triton (engine's splits)"][0], True)
        for n in gluon_splits:
            fns = [lambda i=i, n=n: prefill_hopper.short_prefill_attention(*i, b.tables, b.scale, n) for i in inputs]
            calls[f"gluon, {n} splits"] = (fns, False)
            if ref is not None:
                row[f"gluon, {n} splits: max_abs_vs_ref"] = (fns[0]().float() - ref).abs().max().item()
            if batch == 1 and n == 16:
                calls["gluon, 16 splits, old grid"] = (fns, True)
        for rnd in range(2):  # alternated rounds
            for name, (fns, grid_old) in calls.items():
                us = timed(b, fns, grid_old)
                row[f"{name} r{rnd} us"] = us
                row[f"{name} r{rnd} %copy"] = 100 * kv_bytes / us / 1e3 / copy_gbps
        rows.append(row)
        print(json.dumps(row), flush=True)
        del inputs, rotated, calls, ref
        free_memory()
    Path(sys.argv[1]).write_text(json.dumps({"copy_gbps": copy_gbps, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
