"""Session 13: one call of the engine's short-question prefill attention (the Gluon kernel at its split rule, then the
combine) on the RAG case at batch BATCH, for Nsight Compute; the call runs a few times to compile and warm up, then
once between cudaProfilerStart / cudaProfilerStop:

    ncu --profile-from-start off --clock-control none --set full --import-source yes -o OUT \
        python benchmarks/results/engine_perf/s13/profile_gluon.py BATCH
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from kernels import rag_case, rag_sweep_bench  # noqa: E402

from lazyattn.kernels import prefill_hopper  # noqa: E402


def main() -> None:
    b, _, _, _ = rag_sweep_bench()
    batch = int(sys.argv[1])
    q, k, v, pb = rag_case(b, batch, False, copies=1)[0][0]
    splits = prefill_hopper.num_splits(q.shape[0], q.shape[1], k.shape[2], q.device)
    for _ in range(5):
        prefill_hopper.short_prefill_attention(q, k, v, pb, b.tables, b.scale, splits)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    prefill_hopper.short_prefill_attention(q, k, v, pb, b.tables, b.scale, splits)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
