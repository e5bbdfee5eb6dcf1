"""Session 20: decode attention by the Gluon kernel (kernels/prefill_hopper.py `decode_attention`: one consumer
warpgroup and the copy-engine load warp a program, the last split merging), against the engine's Triton decode kernel
(kernels/decode.py), over issue 10's decode case (BATCHES x 10 304 cached keys in segments of 2048 at random deltas,
kernels.py `decode_case`), timed as the engine's graphs run it (`graph_us`): alone ("attention") and after the RoPE
launch ("layer", the engine's decode layer), ROUNDS alternated rounds. Both are checked against the reference first.

    python benchmarks/results/engine_perf/s20/gluon_decode.py OUT.json [BATCHES, default 1,2,4,8]

The decode form of the kernel was measured (call 3) and taken out again: it ran slower than the Triton kernel. Run the
probe on the tree of commit 85c1557 (`git checkout 85c1557`), which has it.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import decode_inputs, decode_layer, graph_rounds, rag_sweep_bench  # noqa: E402

from lazyattn.kernels import prefill_hopper  # noqa: E402
from lazyattn.kernels.decode import ArrivalCounters, decode_attention  # noqa: E402
from lazyattn.kernels.reference import paged_attention  # noqa: E402

ROUNDS = 3
CONTEXT = 10304


def main() -> None:
    out_path = sys.argv[1]
    batches = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,2,4,8").split(",")]
    b, copy_gbps, _, _ = rag_sweep_bench()
    s = b.s
    result = {"copy_gbps": copy_gbps, "rows": []}
    for batch in batches:
        inputs, nbytes = decode_inputs(b, batch, CONTEXT, 7 + batch)
        splits = prefill_hopper.num_splits(batch, s.q_heads, s.kv_heads, b.device, batch, 1)
        counters = ArrivalCounters()
        gluon_counters = ArrivalCounters().get(b.device, 4096)
        layer = decode_layer(b, batch)

        def triton_decode(q, k, v, pb, counters=counters):
            return decode_attention(q, k, v, pb, b.tables, b.scale, counters=counters)

        def gluon_decode(q, k, v, pb, splits=splits, counters=gluon_counters):
            return prefill_hopper.decode_attention(q, k, v, pb, b.tables, b.scale, splits, counters)

        q, k, v, pb = inputs[0]
        ref = paged_attention(q.float(), k.float(), v.float(), pb, b.tables, b.scale)
        row = {"batch": batch, "bytes": nbytes, "gluon splits": splits}
        calls = {}
        for name, fn in (("triton", triton_decode), ("gluon", gluon_decode)):
            row[f"{name} max_abs_vs_ref"] = (fn(q, k, v, pb).float() - ref).abs().max().item()
            calls[f"{name}, attention"] = [functools.partial(fn, *i) for i in inputs]
            calls[f"{name}, layer"] = [functools.partial(layer, fn, *i) for i in inputs]
        row["gluon twice, same bits"] = bool(torch.equal(gluon_decode(q, k, v, pb), gluon_decode(q, k, v, pb)))
        row.update(graph_rounds(b, calls, ROUNDS, nbytes, copy_gbps))
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
    Path(out_path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
