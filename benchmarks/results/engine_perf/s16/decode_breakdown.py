"""Session 16: where batch-1 decode attention's time goes (kernels/decode.py, batch 1 x 10 304 cached keys in
documents at their deltas, the split rule), each variant timed per layer as the engine's graphs run it
(benchmarks/kernels.py graph_us: 32 calls per CUDA graph, input copies past L2), two alternated rounds:

- "decode": the launch as the engine makes it;
- "no pages": every entry's page count 0 (launch, prologue, q load, one direct store: the floor of a launch);
- "L2 pages": every page id folded onto the entry's first 20 pages (the same tiles, math and merge, from L2): close
  to "decode" means the time is not the memory's;
- "zero deltas": every delta 0 (the per-page delta loads stay, no de-rotation);
- "no deltas": the rotation compiled out (apply_delta=False);
- "RoPE + decode": after a RoPE/KV-write launch, as in the engine's step.

    python benchmarks/results/engine_perf/s16/decode_breakdown.py OUT.json
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from benchmarks import kernels as kb  # noqa: E402
from benchmarks.results.engine_perf.s16.batch1 import batch1  # noqa: E402
from lazyattn.kernels.paged import cdiv  # noqa: E402


def folded(pb, keep: int = 20):
    """pb with its page ids folded onto its first `keep` pages (tiles that stay in L2)."""
    reps = cdiv(pb.pages.shape[1], keep)
    return replace(pb, pages=pb.pages[:, :keep].repeat(1, reps)[:, :pb.pages.shape[1]].contiguous())


def main() -> None:
    out = Path(sys.argv[1])
    c = batch1()
    b, inputs, fn, nbytes, copy = c.b, c.inputs, c.fn, c.nbytes, c.copy

    variants = {
        "decode": inputs,
        "no pages": [(q, k, v, replace(pb, num_pages=torch.zeros_like(pb.num_pages))) for q, k, v, pb in inputs],
        "L2 pages": [(q, k, v, folded(pb)) for q, k, v, pb in inputs],
        "zero deltas": [(q, k, v, replace(pb, deltas=torch.zeros_like(pb.deltas))) for q, k, v, pb in inputs],
    }
    calls = {name: [functools.partial(fn, *i, b.tables, b.scale) for i in ins] for name, ins in variants.items()}
    calls["no deltas"] = [functools.partial(fn, *i, b.tables, b.scale, apply_delta=False) for i in inputs]
    calls["RoPE + decode"] = [functools.partial(c.after_rope, *i) for i in inputs]
    rows = {name: [] for name in calls}
    for _ in range(2):
        for name, fns in calls.items():
            rows[name].append(kb.graph_us(b, fns))
    result = {"gpu": torch.cuda.get_device_name() if c.gpu else "cpu", "copy_GBps": copy, "bytes": nbytes,
              "us": rows, "%copy": {k: [100 * nbytes / u / 1e3 / copy for u in v] for k, v in rows.items()}}
    out.write_text(json.dumps(result, indent=1))
    print("| variant | µs, round 1 / 2 | % of copy |\n|---|---|---|")
    for name, us in rows.items():
        pct = result["%copy"][name]
        print(f"| {name} | {us[0]:.2f} / {us[1]:.2f} | {pct[0]:.1f} / {pct[1]:.1f} |")


if __name__ == "__main__":
    main()
