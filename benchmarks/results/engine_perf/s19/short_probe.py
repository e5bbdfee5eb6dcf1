"""Session 19: the Gluon short prefill's key split against its row split on questions of at most 64 query rows (16
positions of Llama-3.1-8B's 4-head groups), the RAG case otherwise as kernels.py has it (5 x 2048 cached documents at
their deltas + the question, per entry), timed as the engine's graphs run it (`graph_us`), ROUNDS alternated rounds.

- "rows": the row split (two consumers over 64 rows each: one holds no query at these lengths), prefill_hopper's split
  count for it;
- "keys": the key split (both consumers over a program's 64 rows, alternate tiles), its split count.

Forms: "attention" (the kernel and the combine launch) and "layer" (the RoPE/KV-write launch first).

    python benchmarks/results/engine_perf/s19/short_probe.py OUT.json [QUESTION:BATCH ...]
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import DTYPE, free_memory, graph_us, rag_case, rag_positions, rag_sweep_bench  # noqa: E402

from lazyattn.kernels import prefill_hopper  # noqa: E402
from lazyattn.kernels.cache_ops import rope_write_kv  # noqa: E402
from lazyattn.kernels.paged import cdiv  # noqa: E402
from lazyattn.kernels.reference import paged_attention  # noqa: E402

ROUNDS = 3


def splits_for(total_q: int, s, rows: int, device) -> int:
    """prefill_hopper.num_splits' rule for programs of `rows` query rows: one program per SM, at most 16."""
    blocks = cdiv(total_q, rows // (s.q_heads // s.kv_heads))
    return max(1, min(prefill_hopper.MAX_SPLITS, torch.cuda.get_device_properties(device).multi_processor_count
                      // (blocks * s.kv_heads)))


def case_row(b0, question: int, batch: int, copy_gbps: float) -> dict:
    b = dataclasses.replace(b0, s=dataclasses.replace(b0.s, question=question))
    s = b.s
    kv_bytes = batch * (s.n_docs * s.doc_len + question) * s.kv_heads * s.head_dim * 2 * 2
    inputs, _ = rag_case(b, batch, False, copies=6)
    total_q = batch * question
    splits = {"rows": splits_for(total_q, s, 128, b.device), "keys": splits_for(total_q, s, 64, b.device)}
    row = {"question": question, "batch": batch, "kv_bytes": kv_bytes, "splits": splits}
    q, k, v, pb = inputs[0]
    ref = paged_attention(q.float(), k.float(), v.float(), pb, b.tables, b.scale)
    kv_new = torch.randn(total_q, 2, s.kv_heads, s.head_dim, dtype=DTYPE, device=b.device)
    slots = torch.full((total_q,), -1, dtype=torch.int64, device=b.device)
    positions = rag_positions(b, pb)

    def attend(key_split, q, k, v, pb):
        return prefill_hopper.short_prefill_attention(q, k, v, pb, b.tables, b.scale,
                                                      splits["keys" if key_split else "rows"], key_split=key_split)

    def layer(key_split, q, k, v, pb):
        rq = rope_write_kv(q, kv_new[:, 0], kv_new[:, 1], positions, slots, k, v, b.tables)
        return attend(key_split, rq, k, v, pb)

    calls = {}
    for name, key_split in (("rows", False), ("keys", True)):
        row[f"{name} max_abs_vs_ref"] = (attend(key_split, q, k, v, pb).float() - ref).abs().max().item()
        for form, fn in (("attention", attend), ("layer", layer)):
            calls[f"{name}, {form}"] = [functools.partial(fn, key_split, *i) for i in inputs]
    for rnd in range(ROUNDS):
        for name, fns in calls.items():
            us = graph_us(b, fns)
            row[f"{name} r{rnd} us"] = us
            row[f"{name} r{rnd} %copy"] = 100 * kv_bytes / us / 1e3 / copy_gbps
    return row


def main() -> None:
    out_path = sys.argv[1]
    b, copy_gbps, _, _ = rag_sweep_bench()
    result = {"copy_gbps": copy_gbps, "rows": []}
    for case in sys.argv[2:] or ["16:1", "8:1", "16:4", "16:8"]:
        question, batch = (int(x) for x in case.split(":"))
        result["rows"].append(case_row(b, question, batch, copy_gbps))
        print(json.dumps(result["rows"][-1]), flush=True)
        free_memory()
    Path(out_path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
