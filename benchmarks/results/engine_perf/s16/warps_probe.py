"""Session 16: batch-1 decode attention over 10 304 keys with fewer warps per program and more splits (kernels/decode.py
unchanged: DecodeConfig and num_splits are launch parameters). decode_breakdown.py found the same tiles from L2 as slow
as from memory: the tile loop is bound by its own latency chain, and one 4-warp program per SM puts one warp on each
scheduler. Here each SM gets more, smaller programs. Timed as lanes_probe.py times (graph_us, alone and after a RoPE
launch); every output is checked against the reference.

    python benchmarks/results/engine_perf/s16/warps_probe.py OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from benchmarks import kernels as kb  # noqa: E402
from benchmarks.results.engine_perf.s16.batch1 import batch1  # noqa: E402
from lazyattn.kernels import reference  # noqa: E402
from lazyattn.kernels.decode import DecodeConfig  # noqa: E402


def main() -> None:
    out = Path(sys.argv[1])
    c = batch1()
    s, b, inputs, fn, nbytes, copy, gpu = c.s, c.b, c.inputs, c.fn, c.nbytes, c.copy, c.gpu
    block = min(64, s.page_size)
    variants = {"rule (4 warps)": {}}
    for warps, stages, splits in [(1, 3, 16), (1, 3, 32), (1, 3, 48), (1, 3, 64), (2, 3, 16), (2, 3, 32), (2, 3, 48),
                                  (1, 2, 64), (2, 2, 64)]:
        variants[f"{warps} warps, {stages} stages, {splits} splits"] = {
            "config": DecodeConfig(block_n=block, num_warps=warps, num_stages=stages), "num_splits": splits}
    q0, k0, v0, pb0 = inputs[0]
    want = reference.paged_attention(q0, k0, v0, pb0, b.tables, b.scale).float()
    rows = []
    for name, kw in variants.items():
        try:
            got = fn(q0, k0, v0, pb0, b.tables, b.scale, **kw).float()
        except Exception as e:  # noqa: BLE001 - a config that does not compile or launch is a result too
            rows.append({"variant": name, "error": f"{type(e).__name__}: {e}"[:300]})
            print(json.dumps(rows[-1]), flush=True)
            continue
        err = ((got - want).norm() / want.norm()).item()
        alone = kb.graph_us(b, [lambda i=i, kw=kw: fn(*i, b.tables, b.scale, **kw) for i in inputs])
        layered = kb.graph_us(b, [lambda i=i, kw=kw: c.after_rope(*i, **kw) for i in inputs])
        rows.append({"variant": name, "rel_err": err, "alone_us": alone, "layer_us": layered,
                     "alone_%": 100 * nbytes / alone / 1e3 / copy, "layer_%": 100 * nbytes / layered / 1e3 / copy,
                     "copy_GBps": copy, "gpu": torch.cuda.get_device_name() if gpu else "cpu"})
        print(json.dumps(rows[-1]), flush=True)
    out.write_text(json.dumps(rows, indent=1))
    print("| variant | rel. err. | alone / us (% copy) | after RoPE / us (% copy) |\n|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['variant']} | {r['error'][:80]} | | |")
            continue
        print(f"| {r['variant']} | {r['rel_err']:.1e} | {r['alone_us']:.2f} ({r['alone_%']:.1f}) | "
              f"{r['layer_us']:.2f} ({r['layer_%']:.1f}) |")


if __name__ == "__main__":
    main()
