"""Session 19: batch-1 decode attention by the Gluon kernel (kernels/prefill_hopper.py) against the Triton decode kernel
(kernels/decode.py), timed as the engine's graphs run them (kernels.py `graph_us`: 32 launches per CUDA graph, inputs
rotated past L2), programmatic dependent launch as the engine has it. The case: issue 10's decode target, BATCH entries
x 10 304 cached keys in segments of 2048 at random deltas (kernels.py `decode_case`), ROUNDS alternated rounds.

Variants:
- "triton": decode.decode_attention (split-KV, the merge in the kernel; what the engine runs);
- "gluon rows": the Gluon kernel as the short prefill runs it (two consumers over rows: one of them holds no query);
- "gluon keys": its key split (both consumers over the 64 rows of one program, alternate tiles), SPLITS splits, and
  the combine launch over the 2 x SPLITS partials;
- "gluon keys, no merge": the same kernel without the combine launch (what a merge in the kernel could at most save).

Forms: "attention" (the launches alone) and "layer" (the RoPE/KV-write launch first, as the engine's layer).

    python benchmarks/results/engine_perf/s19/decode_probe.py OUT.json [BATCH ...]

The key split it times was measured (calls 1 and 3) and then taken out of the kernel: it gained nothing in the engine's
form (docs/kernels.md, "Session 19"). The probe runs on the tree of commit 08615fb (`git checkout 08615fb`).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import DTYPE, decode_case, graph_rounds, probe_rows, rag_sweep_bench  # noqa: E402

from lazyattn.kernels import prefill_hopper  # noqa: E402
from lazyattn.kernels.cache_ops import rope_write_kv  # noqa: E402
from lazyattn.kernels.decode import ArrivalCounters, decode_attention  # noqa: E402
from lazyattn.kernels.reference import paged_attention  # noqa: E402

ROUNDS = 3
CONTEXT = 10304
SPLITS = (16, 8)


def batch_row(b, batch: int, copy_gbps: float) -> dict:
    s = b.s
    gen = torch.Generator().manual_seed(7)
    inputs, nbytes = decode_case(b, batch, CONTEXT, gen)
    while len(inputs) < 4:
        inputs += decode_case(b, batch, CONTEXT, gen)[0]
    row = {"batch": batch, "context": CONTEXT, "bytes": nbytes}
    q, k, v, pb = inputs[0]
    ref = paged_attention(q.float(), k.float(), v.float(), pb, b.tables, b.scale)
    kv_new = torch.randn(batch, 2, s.kv_heads, s.head_dim, dtype=DTYPE, device=b.device)
    slots = torch.full((batch,), -1, dtype=torch.int64, device=b.device)
    positions = pb.q_start.long()
    counters = ArrivalCounters()

    def triton_decode(q, k, v, pb):
        return decode_attention(q, k, v, pb, b.tables, b.scale, counters=counters)

    def gluon(splits, key_split, merge, q, k, v, pb):
        if merge:
            return prefill_hopper.short_prefill_attention(q, k, v, pb, b.tables, b.scale, splits, key_split=key_split)
        return prefill_hopper.split_partials(q, k, v, pb, b.tables, b.scale, splits, key_split=key_split)

    variants = {"triton": triton_decode, "gluon rows 16": functools.partial(gluon, 16, False, True)}
    for n in SPLITS:
        variants[f"gluon keys {n}"] = functools.partial(gluon, n, True, True)
    variants[f"gluon keys {SPLITS[0]}, no merge"] = functools.partial(gluon, SPLITS[0], True, False)

    def layer(fn, q, k, v, pb):
        rq = rope_write_kv(q, kv_new[:, 0], kv_new[:, 1], positions, slots, k, v, b.tables)
        return fn(rq, k, v, pb)

    calls = {}
    for name, fn in variants.items():
        if "no merge" not in name:
            row[f"{name} max_abs_vs_ref"] = (fn(q, k, v, pb).float() - ref).abs().max().item()
        calls[f"{name}, attention"] = [functools.partial(fn, *i) for i in inputs]
        calls[f"{name}, layer"] = [functools.partial(layer, fn, *i) for i in inputs]
    row.update(graph_rounds(b, calls, ROUNDS, nbytes, copy_gbps))
    return row


def main() -> None:
    out_path = sys.argv[1]
    b, copy_gbps, _, _ = rag_sweep_bench()
    probe_rows(out_path, {"copy_gbps": copy_gbps}, [int(x) for x in sys.argv[2:]] or [1],
               lambda batch: batch_row(b, batch, copy_gbps))


if __name__ == "__main__":
    main()
