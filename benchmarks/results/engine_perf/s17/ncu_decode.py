"""Session 17: batch-1 decode attention (batch 1 x 10 304 cached keys at their deltas, the split rule) launched a few
times for Nsight Compute to profile: kernels/decode.py's with DecodeConfig fields replaced (`tma=2`, `tma=0`, ...;
`s16` is `tma=0`, the same code as Session 16's kernel; calls 2-3 profiled that kernel from a copy,
`git show b68b422:benchmarks/results/engine_perf/s17/decode_s16.py`).

    ncu --clock-control none --set full -k regex:_decode_split_kernel -s 2 -c 1 -o REPORT \
        python benchmarks/results/engine_perf/s17/ncu_decode.py s16|FIELD=VALUE[,FIELD=VALUE]

Call 2 profiled `s16` and `lanes4` (four key lanes, on commit 62826e8's kernel).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from benchmarks.results.engine_perf.s16.batch1 import batch1  # noqa: E402
from benchmarks.results.engine_perf.s17 import decode_probe  # noqa: E402
from lazyattn.kernels import decode  # noqa: E402


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "s16"
    fields = {"tma": 0} if which == "s16" else {k: int(v) for k, v in (f.split("=") for f in which.split(","))}
    c = batch1()
    fn = decode_probe.launcher()
    decode.decode_config = decode_probe.patched(fields)
    for i in range(4):
        q, k, v, pb = c.inputs[i % len(c.inputs)]
        fn(q, k, v, pb, c.b.tables, c.b.scale)
    if c.gpu:
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
