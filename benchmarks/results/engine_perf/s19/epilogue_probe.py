"""Session 19: the Gluon short prefill's partial store through the consumer's Q buffers (this tree) against the layout
conversion it replaced (the tree unpacked into .s19base: `mkdir .s19base && git archive 689d4c6 lazyattn
benchmarks/engine.py benchmarks/models | tar x -C .s19base`, carried to the device), timed as the engine's graphs
run it (kernels.py `graph_us`): the RAG case (5 x 2048 cached documents at their deltas + a 32-token question per
entry), attention (kernel + combine) and layer (the RoPE/KV-write launch first), ROUNDS alternated rounds.

    python benchmarks/results/engine_perf/s19/epilogue_probe.py OUT.json [BATCH ...]
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import DTYPE, graph_rounds, module_from, probe_rows, rag_case, rag_positions, rag_sweep_bench  # noqa: E402

from lazyattn.kernels import prefill_hopper  # noqa: E402
from lazyattn.kernels.cache_ops import rope_write_kv  # noqa: E402
from lazyattn.kernels.reference import paged_attention  # noqa: E402

ROUNDS = 3
BASE = HERE.parents[3] / ".s19base"


def batch_row(b, batch: int, copy_gbps: float, modules: dict) -> dict:
    s = b.s
    kv_bytes = batch * (s.n_docs * s.doc_len + s.question) * s.kv_heads * s.head_dim * 2 * 2
    inputs, _ = rag_case(b, batch, False, copies=6)
    splits = prefill_hopper.num_splits(batch * s.question, s.q_heads, s.kv_heads, b.device)
    row = {"batch": batch, "splits": splits}
    q, k, v, pb = inputs[0]
    ref = paged_attention(q.float(), k.float(), v.float(), pb, b.tables, b.scale)
    kv_new = torch.randn(batch * s.question, 2, s.kv_heads, s.head_dim, dtype=DTYPE, device=b.device)
    slots = torch.full((batch * s.question,), -1, dtype=torch.int64, device=b.device)
    positions = rag_positions(b, pb)

    def attend(module, q, k, v, pb):
        return module.short_prefill_attention(q, k, v, pb, b.tables, b.scale, splits)

    def layer(module, q, k, v, pb):
        rq = rope_write_kv(q, kv_new[:, 0], kv_new[:, 1], positions, slots, k, v, b.tables)
        return attend(module, rq, k, v, pb)

    calls = {}
    for name, module in modules.items():
        row[f"{name} max_abs_vs_ref"] = (attend(module, q, k, v, pb).float() - ref).abs().max().item()
        for form, fn in (("attention", attend), ("layer", layer)):
            calls[f"{name} {form}"] = [functools.partial(fn, module, *i) for i in inputs]
    row.update(graph_rounds(b, calls, ROUNDS, kv_bytes, copy_gbps))
    return row


def main() -> None:
    out_path = sys.argv[1]
    b, copy_gbps, _, _ = rag_sweep_bench()
    modules = {"base": module_from(BASE / "lazyattn" / "kernels" / "prefill_hopper.py", "prefill_hopper_base"),
               "this": prefill_hopper}
    probe_rows(out_path, {"copy_gbps": copy_gbps}, [int(x) for x in sys.argv[2:]] or [1, 8],
               lambda batch: batch_row(b, batch, copy_gbps, modules))


if __name__ == "__main__":
    main()
