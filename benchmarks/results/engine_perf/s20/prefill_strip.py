"""Session 20: the batch-1 short prefill (kernels/prefill_hopper.py) with parts of its work taken out, to find what
holds its tile loop below the pace of a launch that only reads the same tiles (s20/tma_read.py: ~97 % of copy over
the loop, against the kernel's 87 %).

Variants, each a copy of the kernel's source with text patches (wrong outputs where work is removed; timing only):
- "kernel": as it is, with prefill's merge launch (the engine's call);
- "no merge": the kernel's launch alone (split_partials), no merge launch;
- "no compute": the consumers' loop keeps its waits, metadata loads and rotations but issues no product and no softmax:
  each consumer releases a tile as soon as it has landed;
- "no softmax": the loop's products issued and retired as they are, the softmax taken out (P stays the first tile's,
  the accumulator is not rescaled);
- "no tables": the loop's per-tile loads of the page tables (keys, first slot, start, next delta) replaced by a full
  page at delta 0.
The case is kernels.py's RAG case at batch 1 (5 x 2048 cached documents at their deltas + a 32-token question), timed
as the targets are (graph_us), alone ("attention") and after the RoPE launch ("layer"), ROUNDS alternated rounds.

    python benchmarks/results/engine_perf/s20/prefill_strip.py OUT.json
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

from kernels import forms_rounds, patched_module, rag_sweep_bench, short_prefill_case  # noqa: E402

from lazyattn.kernels import prefill_hopper  # noqa: E402

ROUNDS = 3
SOFTMAX = ("        p_op, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, n_keys, first, key0, keys, q_pos, q_first, "
           "qk_scale,\n                                               Q.dtype.element_ty, p_layout)\n")
RESCALE = "        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]\n"
PRODUCTS = ("        s = warpgroup_mma(q_smem, k_bufs.index(next_stage).permute((1, 0)), s_zero, use_acc=False, "
            "is_async=True)\n"
            "        acc = warpgroup_mma(p_op, v_bufs.index(stage), acc, is_async=True)\n"
            "        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))\n" + SOFTMAX +
            "        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))\n"
            "        mbarrier.arrive(empty.index(stage), count=1)  # tile t's K and V are read\n" + RESCALE)
TABLES = """        delta_next = gl.load(deltas_row + page + 1, mask=t + 2 < n_tiles, other=0) * apply_delta
        if delta != held:
            cos, sin = _rotation(Cos, Sin, delta, max_position, interleaved, load_layout)
            _store_q(q_smem, q_raw.load(load_layout), cos, sin, interleaved)
            held = delta
        n_keys = gl.load(valid_row + page, mask=more, other=0)
        first = gl.load(firsts_row + page, mask=more & (has_first != 0), other=0)
        key0 = gl.load(starts_row + page, mask=more, other=0)
"""
VARIANTS = {
    "no compute": [(PRODUCTS, "        mbarrier.arrive(empty.index(stage), count=1)\n")],
    "no softmax": [(PRODUCTS, PRODUCTS.replace(SOFTMAX, "").replace(RESCALE, ""))],
    "no tables": [(TABLES, "        n_keys = n_keys * 0 + 64\n        first = first * 0\n        key0 = key0 * 0\n")],
}


def patched(folder: Path, name: str, patches: list[tuple[str, str]]):
    return patched_module(Path(prefill_hopper.__file__), folder, f"prefill_hopper_{name.replace(' ', '_')}", patches)


def main() -> None:
    out_path = sys.argv[1]
    b, copy_gbps, kv_bytes, copies = rag_sweep_bench()
    inputs, splits, layer = short_prefill_case(b, 1, max(4, copies))

    def full(mod, q, k, v, pb):
        return mod.short_prefill_attention(q, k, v, pb, b.tables, b.scale, splits)

    def partials(mod, q, k, v, pb):
        return mod.split_partials(q, k, v, pb, b.tables, b.scale, splits)

    row = {"copy_gbps": copy_gbps, "bytes": kv_bytes, "splits": splits}
    with tempfile.TemporaryDirectory() as tmp:
        forms = {"kernel": functools.partial(full, prefill_hopper),
                 "no merge": functools.partial(partials, prefill_hopper)}
        for name, patches in VARIANTS.items():
            forms[name] = functools.partial(partials, patched(Path(tmp), name, patches))
        row.update(forms_rounds(b, forms, inputs, layer, ROUNDS, kv_bytes, copy_gbps))
    print(json.dumps(row, indent=1), flush=True)
    Path(out_path).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
