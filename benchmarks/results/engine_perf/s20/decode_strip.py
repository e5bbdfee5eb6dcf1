"""Session 20: batch-1 decode attention (kernels/decode.py) with parts of its work taken out, beside the copy-engine
read of the same tiles (s20/tma_read.py, 16.1 us): what makes up the kernel's other 8-9 us.

Variants, each a copy of decode.py's source with text patches (wrong outputs where work is removed; timing only):
- "kernel": as it is;
- "no merge": the last split does not merge (the partials are still stored and counted);
- "no softmax": the scores go to the P·V product as they are (no max, no exp2, no sums across the tile);
- "no tables": each page's key count, start and delta not loaded (a full page at the query's delta, no rotation);
- "no softmax, no tables, no merge": all three.
The case is issue 10's decode target (1 x 10 304 cached keys in segments of 2048 at random deltas, kernels.py
`decode_case`), timed as the targets are (graph_us), alone ("attention") and after the RoPE launch ("layer"), ROUNDS
alternated rounds.

    python benchmarks/results/engine_perf/s20/decode_strip.py OUT.json
"""

from __future__ import annotations

import functools
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import decode_inputs, decode_layer, forms_rounds, patched_module, rag_sweep_bench  # noqa: E402

from lazyattn.kernels import decode  # noqa: E402

ROUNDS = 3
CONTEXT = 10304
MERGE = ('        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == splits - 1:\n',
         '        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == splits + (1 << 30):\n')
SOFTMAX = ("""        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        prob = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(prob, 1)
        p_dot = prob.to(kv_ty).to(DOT_TY)
""", """        m_new = m_i
        alpha = m_i * 0 + 1.0
        p_dot = s.to(kv_ty).to(DOT_TY)
""")
TABLES = ("""        n_keys = tl.minimum(tl.load(valid_ptr + entry * stride_valid + p),
                            q_pos + 1 - tl.load(starts_ptr + entry * stride_starts + p))
        if APPLY_DELTA:
            delta = tl.load(deltas_ptr + entry * stride_deltas + p)
""", """        n_keys = q_pos * 0 + TILES_PER_PAGE * BLOCK_N
        if APPLY_DELTA:
            delta = cur_delta
""")
VARIANTS = {"no merge": [MERGE], "no softmax": [SOFTMAX], "no tables": [TABLES],
            "no softmax, no tables, no merge": [SOFTMAX, TABLES, MERGE]}


def patched(folder: Path, name: str, patches: list[tuple[str, str]]):
    return patched_module(Path(decode.__file__), folder, f"decode_{name.replace(' ', '_').replace(',', '')}", patches)


def main() -> None:
    out_path = sys.argv[1]
    b, copy_gbps, _, _ = rag_sweep_bench()
    inputs, nbytes = decode_inputs(b, 1, CONTEXT, 2)
    layer = decode_layer(b, 1)

    def attend(mod, counters, q, k, v, pb):
        return mod.decode_attention(q, k, v, pb, b.tables, b.scale, counters=counters)

    row = {"copy_gbps": copy_gbps, "bytes": nbytes}
    with tempfile.TemporaryDirectory() as tmp:
        modules = {"kernel": decode} | {name: patched(Path(tmp), name, p) for name, p in VARIANTS.items()}
        forms = {name: functools.partial(attend, mod, mod.ArrivalCounters()) for name, mod in modules.items()}
        row.update(forms_rounds(b, forms, inputs, layer, ROUNDS, nbytes, copy_gbps))
    print(json.dumps(row, indent=1), flush=True)
    Path(out_path).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
