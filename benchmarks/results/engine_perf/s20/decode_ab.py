"""Session 20: the decode kernel of this tree against .s20base's (the tree before the first page's rotation moved
before the PDL wait), over issue 10's decode case (BATCHES x 10 304 cached keys in segments of 2048 at random deltas,
kernels.py `decode_case`), timed as the engine's graphs run it (`graph_us`), alone ("attention") and after the RoPE
launch ("layer"), ROUNDS alternated rounds; both checked against the reference first.

    mkdir .s20base && git archive 8ccdf5e lazyattn benchmarks/engine.py benchmarks/models | tar x -C .s20base
    python benchmarks/results/engine_perf/s20/decode_ab.py OUT.json [BATCHES, default 1,8,32] [BASE, default .s20base]

Session 21 runs it against its own base tree (.s21base) and with more rounds (ROUNDS in the environment).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import decode_inputs, decode_layer, forms_rounds, module_from, rag_sweep_bench  # noqa: E402

from lazyattn.kernels import decode  # noqa: E402
from lazyattn.kernels.reference import paged_attention  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "3"))
CONTEXT = 10304


def main() -> None:
    out_path = sys.argv[1]
    batches = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,8,32").split(",")]
    base_dir = sys.argv[3] if len(sys.argv) > 3 else ".s20base"
    base = module_from(ROOT / base_dir / "lazyattn/kernels/decode.py", "decode_" + base_dir.strip("."))
    b, copy_gbps, _, _ = rag_sweep_bench()
    result = {"copy_gbps": copy_gbps, "rows": []}
    for batch in batches:
        inputs, nbytes = decode_inputs(b, batch, CONTEXT, 11 + batch)
        layer = decode_layer(b, batch)

        def attend(mod, counters, q, k, v, pb):
            return mod.decode_attention(q, k, v, pb, b.tables, b.scale, counters=counters)

        q, k, v, pb = inputs[0]
        ref = paged_attention(q.float(), k.float(), v.float(), pb, b.tables, b.scale)
        row = {"batch": batch, "bytes": nbytes}
        row["ref max_abs"] = ref.abs().max().item()
        forms, outs = {}, {}
        for name, mod in (("base", base), ("this", decode)):
            forms[name] = functools.partial(attend, mod, mod.ArrivalCounters())
            outs[name] = forms[name](q, k, v, pb).float()
            row[f"{name} max_abs_vs_ref"] = (outs[name] - ref).abs().max().item()
        row["this vs base max_abs"] = (outs["this"] - outs["base"]).abs().max().item()
        row.update(forms_rounds(b, forms, inputs, layer, ROUNDS, nbytes, copy_gbps))
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
    Path(out_path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
