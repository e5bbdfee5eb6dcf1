"""Session 19: the Gluon short prefill's key split against its row split on questions of at most 64 query rows (16
positions of Llama-3.1-8B's 4-head groups), the RAG case otherwise as kernels.py has it (5 x 2048 cached documents at
their deltas + the question, per entry), timed as the engine's graphs run it (`graph_us`), ROUNDS alternated rounds.

- "rows": the row split (two consumers over 64 rows each: one holds no query at these lengths), prefill_hopper's split
  count for it (from call 5 on, each entry's blocks counted: `num_splits(..., entries, max_q, key_split=False)`);
- "rows, s18 rule" (call 5 on): the row split at Session 18's split count (blocks counted over the batch's rows
  together, cdiv(total_q, 32), as call 4's "rows" had it);
- "keys": the key split (both consumers over a program's 64 rows, alternate tiles), its split count (call 4: the
  same count over blocks of 16 positions; call 5 on: `num_splits`' own).

Forms: "attention" (the kernel and the combine launch) and "layer" (the RoPE/KV-write launch first).

    python benchmarks/results/engine_perf/s19/short_probe.py OUT.json [QUESTION:BATCH ...]

The key split it times was measured (calls 4 and 5) and then taken out of the kernel: it gained nothing in the engine's
form (docs/kernels.md, "Session 19"). The probe runs on the tree of commit 08615fb (`git checkout 08615fb`).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import DTYPE, graph_rounds, probe_rows, rag_case, rag_positions, rag_sweep_bench  # noqa: E402

from lazyattn.kernels import prefill_hopper  # noqa: E402
from lazyattn.kernels.cache_ops import rope_write_kv  # noqa: E402
from lazyattn.kernels.paged import cdiv  # noqa: E402
from lazyattn.kernels.reference import paged_attention  # noqa: E402

ROUNDS = 3


def s18_splits(total_q: int, s, device) -> int:
    """Session 18's prefill_hopper.num_splits: one program per SM over cdiv(total_q, 32) blocks, at most 16."""
    blocks = cdiv(total_q, 128 // (s.q_heads // s.kv_heads))
    return max(1, min(prefill_hopper.MAX_SPLITS, torch.cuda.get_device_properties(device).multi_processor_count
                      // (blocks * s.kv_heads)))


def case_row(b0, question: int, batch: int, copy_gbps: float) -> dict:
    b = dataclasses.replace(b0, s=dataclasses.replace(b0.s, question=question))
    s = b.s
    kv_bytes = batch * (s.n_docs * s.doc_len + question) * s.kv_heads * s.head_dim * 2 * 2
    inputs, _ = rag_case(b, batch, False, copies=6)
    total_q = batch * question
    rule = functools.partial(prefill_hopper.num_splits, total_q, s.q_heads, s.kv_heads, b.device, batch, question)
    splits = {"rows": rule(key_split=False), "rows, s18 rule": s18_splits(total_q, s, b.device),
              "keys": rule(key_split=True)}
    row = {"question": question, "batch": batch, "kv_bytes": kv_bytes, "splits": splits}
    q, k, v, pb = inputs[0]
    ref = paged_attention(q.float(), k.float(), v.float(), pb, b.tables, b.scale)
    kv_new = torch.randn(total_q, 2, s.kv_heads, s.head_dim, dtype=DTYPE, device=b.device)
    slots = torch.full((total_q,), -1, dtype=torch.int64, device=b.device)
    positions = rag_positions(b, pb)

    def attend(name, q, k, v, pb):
        return prefill_hopper.short_prefill_attention(q, k, v, pb, b.tables, b.scale, splits[name],
                                                      key_split=name == "keys")

    def layer(name, q, k, v, pb):
        rq = rope_write_kv(q, kv_new[:, 0], kv_new[:, 1], positions, slots, k, v, b.tables)
        return attend(name, rq, k, v, pb)

    calls = {}
    for name in splits:
        row[f"{name} max_abs_vs_ref"] = (attend(name, q, k, v, pb).float() - ref).abs().max().item()
        for form, fn in (("attention", attend), ("layer", layer)):
            calls[f"{name}, {form}"] = [functools.partial(fn, name, *i) for i in inputs]
    row.update(graph_rounds(b, calls, ROUNDS, kv_bytes, copy_gbps))
    return row


def main() -> None:
    out_path = sys.argv[1]
    b, copy_gbps, _, _ = rag_sweep_bench()
    cases = [tuple(int(x) for x in case.split(":")) for case in sys.argv[2:] or ["16:1", "8:1", "16:4", "16:8"]]
    probe_rows(out_path, {"copy_gbps": copy_gbps}, cases, lambda case: case_row(b, *case, copy_gbps))


if __name__ == "__main__":
    main()
