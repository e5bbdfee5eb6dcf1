"""Session 21: two changes to decode attention's tile loop (kernels/decode.py) against the kernel as it is. Session 20's
stripped copies (s20/decode_strip.py) put ~2.8 us of the batch-1 kernel in the softmax (its row reductions cross the
4 warps every tile) and ~2.5 us in the per-page table loads and rotations.

Variants, copies of decode.py's source with text patches (same results up to fp32 summation order):
- "sum once": the softmax's running sum kept per element ([heads, keys], rescaled like the accumulator) and summed
  across the tile once after the loop, so each tile crosses the warps for its max only;
- "tables ahead": each page's key count, start, delta and first slot loaded one tile ahead (loop-carried, as the page
  id already is), the first page's before the PDL wait;
- "both".
Cases: issue 10's decode case (BATCHES x 10 304 cached keys in segments of 2048 at random deltas, kernels.py
`decode_case`), timed as the targets are (graph_us), alone ("attention") and after the RoPE launch ("layer"), ROUNDS
alternated rounds. Each variant's output against the kernel's and against the reference (max abs difference).

    python benchmarks/results/engine_perf/s21/decode_variants.py OUT.json [BATCHES, default 1,8]
"""

from __future__ import annotations

import functools
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import (  # noqa: E402
    decode_inputs,
    decode_layer,
    forms_rounds,
    patched_module,
    probe_rows,
    rag_sweep_bench,
)

from lazyattn.kernels import decode  # noqa: E402
from lazyattn.kernels.reference import paged_attention  # noqa: E402

ROUNDS = 3
CONTEXT = 10304
SUM_ONCE = [
    ("    l_i = tl.zeros([BLOCK_G], tl.float32)\n",
     "    l_i = tl.zeros([BLOCK_G], tl.float32)\n    l_acc = tl.zeros([BLOCK_G, BLOCK_N], tl.float32)\n"),
    ("        l_i = l_i * alpha + tl.sum(prob, 1)\n", "        l_acc = l_acc * alpha[:, None] + prob\n"),
    ("        m_i = m_new\n\n    if DIRECT or splits == 1:",
     "        m_i = m_new\n    l_i = tl.sum(l_acc, 1)\n\n    if DIRECT or splits == 1:"),
]
AHEAD = [
    ("    page_next = tl.load(pages_ptr + entry * stride_pages + page_lo, mask=page_lo < page_hi, other=0)\n",
     """    page_next = tl.load(pages_ptr + entry * stride_pages + page_lo, mask=page_lo < page_hi, other=0)
    valid_next = tl.load(valid_ptr + entry * stride_valid + page_lo, mask=page_lo < page_hi, other=0)
    start_next = tl.load(starts_ptr + entry * stride_starts + page_lo, mask=page_lo < page_hi, other=0)
    delta_next = tl.load(deltas_ptr + entry * stride_deltas + page_lo, mask=page_lo < page_hi, other=0)
    first_next = tl.load(firsts_ptr + entry * stride_firsts + page_lo, mask=page_lo < page_hi, other=0)
"""),
    ("""        n_keys = tl.minimum(tl.load(valid_ptr + entry * stride_valid + p),
                            q_pos + 1 - tl.load(starts_ptr + entry * stride_starts + p))
""", """        n_keys = tl.minimum(valid_next, q_pos + 1 - start_next)
        delta_p = delta_next
        first_p = first_next
        ahead = t + 1 < t_hi
        valid_next = tl.load(valid_ptr + entry * stride_valid + p_next, mask=ahead, other=0)
        start_next = tl.load(starts_ptr + entry * stride_starts + p_next, mask=ahead, other=0)
        delta_next = tl.load(deltas_ptr + entry * stride_deltas + p_next, mask=ahead, other=0)
        first_next = tl.load(firsts_ptr + entry * stride_firsts + p_next, mask=ahead, other=0)
"""),
    ("            delta = tl.load(deltas_ptr + entry * stride_deltas + p)\n", "            delta = delta_p\n"),
    ("            first = tl.load(firsts_ptr + entry * stride_firsts + p)\n", "            first = first_p\n"),
]
VARIANTS = {"sum once": SUM_ONCE, "tables ahead": AHEAD, "both": SUM_ONCE + AHEAD}


def main() -> None:
    out_path = sys.argv[1]
    batches = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,8").split(",")]
    b, copy_gbps, _, _ = rag_sweep_bench()
    tmp = tempfile.TemporaryDirectory()
    modules = {"kernel": decode} | {
        name: patched_module(Path(decode.__file__), Path(tmp.name), "decode_" + name.replace(" ", "_"), patches)
        for name, patches in VARIANTS.items()}

    def row(batch: int) -> dict:
        inputs, nbytes = decode_inputs(b, batch, CONTEXT, 21 + batch)
        layer = decode_layer(b, batch)

        def attend(mod, counters, q, k, v, pb):
            return mod.decode_attention(q, k, v, pb, b.tables, b.scale, counters=counters)

        result = {"batch": batch, "bytes": nbytes, "copy_gbps": copy_gbps}
        expected = paged_attention(*inputs[0], b.tables, b.scale).float()
        outs = {name: attend(mod, mod.ArrivalCounters(), *inputs[0]).float() for name, mod in modules.items()}
        for name, out in outs.items():
            result[f"max |{name} - reference|"] = (out - expected).abs().max().item()
            result[f"max |{name} - kernel|"] = (out - outs["kernel"]).abs().max().item()
        forms = {name: functools.partial(attend, mod, mod.ArrivalCounters()) for name, mod in modules.items()}
        result.update(forms_rounds(b, forms, inputs, layer, ROUNDS, nbytes, copy_gbps))
        return result

    probe_rows(out_path, {"rounds": ROUNDS, "context": CONTEXT}, batches, row)


if __name__ == "__main__":
    main()
