"""Session 17: variants of batch-1 decode attention (kernels/decode.py) against the kernel as Session 16 left it.
Calls 1-8 timed that kernel from a copy of c424cb5's kernels/decode.py (`git show
b68b422:benchmarks/results/engine_perf/s17/decode_s16.py`); "s16" is now `tma 0`, which compiles the same code
(the copy-engine branches are compile-time) and measured the same in call 7. Each variant timed per layer as the
engine's graphs run it (benchmarks/kernels.py graph_us: 32 calls per CUDA graph, input copies past L2), two alternated
rounds:

- batch 1 x 10 304 keys (issue 10's decode-attention target), alone, after a RoPE/KV-write launch, and with the
  rotation compiled out (apply_delta=False);
- batch 8 x 4096, 32 x 4096 and 64 x 2048: that the other grids do not lose.

Each variant's output on each shape's first input is checked against the fp32 reference (max abs error).
Variants (VARIANTS: DecodeConfig fields over decode_config's choice): K, or K and V, by the copy engine (`tma` 1, 2;
3 leaves page padding in V unmasked, which is wrong where padding holds NaN: timing only), and 8 warps.
Call 1 ran its first form (key lanes): `git show fa09193:benchmarks/results/engine_perf/s17/c1/lanes_probe.py`,
on 62826e8's kernel.

    python benchmarks/results/engine_perf/s17/decode_probe.py OUT.json
    python benchmarks/results/engine_perf/s17/decode_probe.py OUT.json splits

`splits`: only batch 1 x 10 304 (alone and after RoPE) with the default config and 16 (the split rule's), 24 and 32
splits: whether the copy-engine tiles move the best split count.
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
from lazyattn.kernels.cache_ops import rope_write_kv  # noqa: E402
from lazyattn.kernels.reference import paged_attention  # noqa: E402

VARIANTS: dict[str, dict | None] = {
    "s16": {"tma": 0}, "default": {}, "tma 1 (K)": {"tma": 1}, "tma 2 (K, V)": {"tma": 2},
    "tma 3 (K, V unmasked)": {"tma": 3}, "8 warps": {"num_warps": 8}, "tma 2, 8 warps": {"tma": 2, "num_warps": 8}}
_config = decode.decode_config


def patched(fields: dict):
    """decode_config as the launcher calls it, with these fields replaced."""
    return lambda *args, **kwargs: replace(_config(*args, **kwargs), **fields)


def reference(b: kb.Bench, q, k, v, pb) -> torch.Tensor:
    """The fp32 reference of one decode input."""
    return paged_attention(q.float(), k, v, pb, b.tables, b.scale)


def with_variant(name: str, work, fn):
    """work(name, fn) with decode_config giving the variant's fields."""
    decode.decode_config = patched(VARIANTS[name])
    try:
        return work(name, fn)
    finally:
        decode.decode_config = _config


def launcher():
    """The decode launcher, with arrival counters kept across calls as TritonBackend keeps them."""
    return functools.partial(decode.decode_attention, counters=decode.ArrivalCounters())


def splits_section(out: Path) -> None:
    c = batch1()
    b = c.b
    fn = launcher()

    def after_rope(q, k, v, pb, n):
        return fn(rope_write_kv(q, c.kv, c.kv, pb.q_start.long(), c.slot, k, v, b.tables), k, v, pb, b.tables,
                  b.scale, num_splits=n)

    rows: dict[str, dict[str, list[float]]] = {}
    for _ in range(2):
        for n in (16, 24, 32):
            row = rows.setdefault(f"{n} splits", {})
            row.setdefault("alone", []).append(kb.graph_us(
                b, [functools.partial(fn, *i, b.tables, b.scale, num_splits=n) for i in c.inputs]))
            row.setdefault("after RoPE", []).append(kb.graph_us(
                b, [functools.partial(after_rope, *i, n) for i in c.inputs]))
    out.write_text(json.dumps({"gpu": torch.cuda.get_device_name() if c.gpu else "cpu", "copy_GBps": c.copy,
                               "bytes": c.nbytes, "us": rows}, indent=1))
    print("| batch 1 x 10304, µs, round 1 / 2 | alone | after RoPE |\n|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['alone'][0]:.2f} / {row['alone'][1]:.2f} | "
              f"{row['after RoPE'][0]:.2f} / {row['after RoPE'][1]:.2f} |")


def main() -> None:
    out = Path(sys.argv[1])
    if sys.argv[2:] == ["splits"]:
        splits_section(out)
        return
    c = batch1()
    b = c.b
    gen = torch.Generator().manual_seed(3)
    shapes = {"1 x 10304": c.inputs}
    batches = ((8, 4096), (32, 4096), (64, 2048)) if c.gpu else ((2, 48),)
    for bsz, ctx in batches:
        shapes[f"{bsz} x {ctx}"] = kb.decode_case(b, bsz, ctx, gen)[0]
    launchers = {name: launcher() for name in VARIANTS}

    def after_rope(fn, q, k, v, pb):
        return fn(rope_write_kv(q, c.kv, c.kv, pb.q_start.long(), c.slot, k, v, b.tables), k, v, pb, b.tables,
                  b.scale)

    def measure(name: str, fn) -> dict[str, float]:
        row = {shape: kb.graph_us(b, [functools.partial(fn, *i, b.tables, b.scale) for i in inputs])
               for shape, inputs in shapes.items()}
        row["1 x 10304 after RoPE"] = kb.graph_us(b, [functools.partial(after_rope, fn, *i) for i in c.inputs])
        row["1 x 10304 no deltas"] = kb.graph_us(
            b, [functools.partial(fn, *i, b.tables, b.scale, apply_delta=False) for i in c.inputs])
        return row

    def check(name: str, fn) -> dict[str, float]:
        """The variant's output on each shape's first input against the fp32 reference (kernels/reference.py)."""
        return {shape: (fn(*inputs[0], b.tables, b.scale).float() - refs[shape]).abs().max().item()
                for shape, inputs in shapes.items()}

    refs = {shape: reference(b, *inputs[0]) for shape, inputs in shapes.items()}
    errors = {name: with_variant(name, check, launchers[name]) for name in VARIANTS}
    rows: dict[str, dict[str, list[float]]] = {name: {} for name in VARIANTS}
    for _ in range(2):
        for name in VARIANTS:
            for shape, us in with_variant(name, measure, launchers[name]).items():
                rows[name].setdefault(shape, []).append(us)
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
