"""Session 20: batch-1 decode attention (kernels/decode.py) with 2 warps a program instead of 4, beside the default
config: the [16, 64] score tile's row reductions then cross 2 warps instead of 4 (s20/decode_strip.py put the softmax at
~2.8 us of 24). One warp spills (664-800 bytes a thread at 255 registers), so it is not tried. Issue 10's decode case
(1 x 10 304 cached keys, kernels.py `decode_case`), alone ("attention") and after the RoPE launch ("layer"), in the
targets' graph form, ROUNDS alternated rounds; each config checked against the reference.

    python benchmarks/results/engine_perf/s20/decode_warps2.py OUT.json
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import DTYPE, decode_inputs, decode_layer, graph_rounds, rag_sweep_bench  # noqa: E402

from lazyattn.kernels.decode import ArrivalCounters, copy_engine_tiles, decode_attention, decode_config  # noqa: E402
from lazyattn.kernels.launch import sm_count  # noqa: E402
from lazyattn.kernels.reference import paged_attention  # noqa: E402

ROUNDS = 3
CONTEXT = 10304


def main() -> None:
    out_path = sys.argv[1]
    b, copy_gbps, _, _ = rag_sweep_bench()
    s = b.s
    inputs, nbytes = decode_inputs(b, 1, CONTEXT, 5)
    base = decode_config(s.head_dim, DTYPE, s.page_size, 120 / sm_count(b.device), copy_engine_tiles(b.device))
    configs = {
        "default": base,
        "2 warps": dataclasses.replace(base, num_warps=2, maxnreg=None),
        "2 warps, tiles of 32": dataclasses.replace(base, num_warps=2, maxnreg=None, block_n=32,
                                                    num_stages=base.num_stages + 1),
    }
    row = {"copy_gbps": copy_gbps, "bytes": nbytes, "configs": {k: dataclasses.asdict(v) for k, v in configs.items()}}
    q, k, v, pb = inputs[0]
    ref = paged_attention(q.float(), k.float(), v.float(), pb, b.tables, b.scale)
    layer = decode_layer(b, 1)
    counters = ArrivalCounters()

    def attend(config, q, k, v, pb):
        return decode_attention(q, k, v, pb, b.tables, b.scale, config=config, counters=counters)

    calls = {}
    for name, config in configs.items():
        row[f"{name} max_abs_vs_ref"] = (attend(config, q, k, v, pb).float() - ref).abs().max().item()
        calls[f"{name}, attention"] = [functools.partial(attend, config, *i) for i in inputs]
        calls[f"{name}, layer"] = [functools.partial(layer, functools.partial(attend, config), *i) for i in inputs]
    row.update(graph_rounds(b, calls, ROUNDS, nbytes, copy_gbps))
    print(json.dumps(row), flush=True)
    Path(out_path).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
