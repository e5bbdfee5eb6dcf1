"""Session 20: batch-1 decode attention (kernels/decode.py) with 2 warps a program instead of 4, beside the default
config: the [16, 64] score tile's row reductions then cross 2 warps instead of 4 (s20/decode_strip.py put the softmax at
~2.8 us of 24). One warp spills (664-800 bytes a thread at 255 registers), so it is not tried. Issue 10's decode case
(1 x 10 304 cached keys, kernels.py `decode_case`), alone ("attention") and after the RoPE launch ("layer"), in the
targets' graph form, three alternated rounds; each config checked against the reference (s19/decode_sweep.py's
`sweep`, which this calls with its configs).

    python benchmarks/results/engine_perf/s20/decode_warps2.py OUT.json
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import module_from  # noqa: E402


def main() -> None:
    module_from(HERE.parent / "s19" / "decode_sweep.py", "s19_decode_sweep").sweep(sys.argv[1], lambda base: {
        "default": base,
        "2 warps": dataclasses.replace(base, num_warps=2, maxnreg=None),
        "2 warps, tiles of 32": dataclasses.replace(base, num_warps=2, maxnreg=None, block_n=32,
                                                    num_stages=base.num_stages + 1),
    }, seed=5, read_us=False)


if __name__ == "__main__":
    main()
