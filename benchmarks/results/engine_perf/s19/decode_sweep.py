"""Session 19: batch-1 decode attention (kernels/decode.py) over issue 10's case (1 x 10 304 cached keys in segments
of 2048 at random deltas, kernels.py `decode_case`) at launch configs beside decode_config's, timed as the engine's
graphs run it (`graph_us`), after the RoPE launch ("layer") and alone ("attention"), ROUNDS alternated rounds.

    python benchmarks/results/engine_perf/s19/decode_sweep.py OUT.json
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

from kernels import DTYPE, decode_inputs, decode_layer, graph_rounds, rag_sweep_bench, read_ceiling  # noqa: E402

from lazyattn.kernels.decode import ArrivalCounters, copy_engine_tiles, decode_attention, decode_config  # noqa: E402
from lazyattn.kernels.launch import sm_count  # noqa: E402
from lazyattn.kernels.reference import paged_attention  # noqa: E402

ROUNDS = 3
CONTEXT = 10304


def sweep(out_path: str, configs_of, seed: int, read_us: bool = True) -> None:
    """Time decode_config's config and the others `configs_of(base)` names ({name: DecodeConfig}, "default" first) on
    inputs from `seed`, each checked against the reference; with read_us, the one-launch read of the same bytes too."""
    b, copy_gbps, _, _ = rag_sweep_bench()
    s = b.s
    inputs, nbytes = decode_inputs(b, 1, CONTEXT, seed)
    base = decode_config(s.head_dim, DTYPE, s.page_size, 120 / sm_count(b.device), copy_engine_tiles(b.device))
    configs = configs_of(base)
    row = {"copy_gbps": copy_gbps, "bytes": nbytes}
    if read_us:
        row["read_us"] = read_ceiling(b, nbytes)
    row["configs"] = {k: dataclasses.asdict(v) for k, v in configs.items()}
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


def main() -> None:
    sweep(sys.argv[1], lambda base: {
        "default": base,
        "8 warps": dataclasses.replace(base, num_warps=8),
        "3 buffers": dataclasses.replace(base, num_stages=base.num_stages + 1),
        "tiles of 32, 4 buffers": dataclasses.replace(base, block_n=32, num_stages=5),
        "tiles of 32, 3 buffers": dataclasses.replace(base, block_n=32, num_stages=4),
    }, seed=7)


if __name__ == "__main__":
    main()
