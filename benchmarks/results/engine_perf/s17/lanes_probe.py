"""Session 17: decode attention with key lanes (kernels/decode.py, DecodeConfig.lanes): a tile's slots cut into
`lanes` runs, each with its own softmax state in its own warps, so the per-tile row max, row sum and P operand stay
inside a warp (no shared-memory round trip and barrier per tile). Each variant timed per layer as the engine's
graphs run it (benchmarks/kernels.py graph_us: 32 calls per CUDA graph, input copies past L2), two alternated rounds:

- batch 1 x 10 304 keys (issue 10's decode-attention target), alone and after a RoPE/KV-write launch;
- batch 8 x 4096, 32 x 4096 and 64 x 2048: that the other grids do not lose;
- batch 1 x 10 304 with the rotation compiled out (apply_delta=False): what the per-tile query operand costs.

Variants: lanes 1 (the kernel as it was), 2 and 4; with the decode_config register cap and without it.

    python benchmarks/results/engine_perf/s17/lanes_probe.py OUT.json
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
from lazyattn.kernels import decode  # noqa: E402
from lazyattn.kernels.reference import paged_attention  # noqa: E402

VARIANTS = {"lanes 1": (1, True), "lanes 2": (2, True), "lanes 4": (4, True), "lanes 4, no cap": (4, False),
            "lanes 2, no cap": (2, False)}
_config = decode.decode_config


def patched(lanes: int, cap: bool):
    """decode_config as the launcher calls it, with these lanes (at most one per 16 slots) and register cap."""
    def config(*args, **kwargs):
        c = _config(*args, **kwargs)
        return replace(c, lanes=min(lanes, c.block_n // 16) if torch.cuda.is_available() else lanes,
                       maxnreg=c.maxnreg if cap else None)
    return config


def reference(b: kb.Bench, q, k, v, pb) -> torch.Tensor:
    """The fp32 reference of one decode input."""
    return paged_attention(q.float(), k, v, pb, b.tables, b.scale)


def main() -> None:
    out = Path(sys.argv[1])
    c = batch1()
    b, fn = c.b, c.fn
    gen = torch.Generator().manual_seed(3)
    shapes = {"1 x 10304": c.inputs}
    batches = ((8, 4096), (32, 4096), (64, 2048)) if c.gpu else ((2, 48),)
    for bsz, ctx in batches:
        shapes[f"{bsz} x {ctx}"] = kb.decode_case(b, bsz, ctx, gen)[0]
    rows: dict[str, dict[str, list[float]]] = {}
    # Each variant's output on each shape's first input against the fp32 reference's (kernels/reference.py).
    errors: dict[str, dict[str, float]] = {}
    refs = {shape: reference(b, *inputs[0]) for shape, inputs in shapes.items()}
    for name, (lanes, cap) in VARIANTS.items():
        decode.decode_config = patched(lanes, cap)
        try:
            errors[name] = {shape: (fn(*inputs[0], b.tables, b.scale).float() - refs[shape]).abs().max().item()
                            for shape, inputs in shapes.items()}
        finally:
            decode.decode_config = _config
    for _ in range(2):
        for name, (lanes, cap) in VARIANTS.items():
            decode.decode_config = patched(lanes, cap)
            try:
                row = rows.setdefault(name, {})
                for shape, inputs in shapes.items():
                    calls = [functools.partial(fn, *i, b.tables, b.scale) for i in inputs]
                    row.setdefault(shape, []).append(kb.graph_us(b, calls))
                row.setdefault("1 x 10304 after RoPE", []).append(
                    kb.graph_us(b, [functools.partial(c.after_rope, *i) for i in c.inputs]))
                row.setdefault("1 x 10304 no deltas", []).append(
                    kb.graph_us(b, [functools.partial(fn, *i, b.tables, b.scale, apply_delta=False)
                                    for i in c.inputs]))
            finally:
                decode.decode_config = _config
    result = {"gpu": torch.cuda.get_device_name() if c.gpu else "cpu", "copy_GBps": c.copy,
              "bytes_1x10304": c.nbytes, "us": rows, "max_abs_err_vs_reference": errors}
    out.write_text(json.dumps(result, indent=1))
    cols = list(next(iter(rows.values())))
    print("| µs per layer, round 1 / 2 | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(f"{row[k][0]:.2f} / {row[k][1]:.2f}" for k in cols) + " |")
    print("max |out - fp32 reference|: " + json.dumps(errors))
    print(f"copy {c.copy:.0f} GB/s; batch 1 x 10304 reads {c.nbytes} B")


if __name__ == "__main__":
    main()
