"""Session 12: one attention call of issue 10's targets, for Nsight Compute. The call runs a few times to compile
and warm up, then once between cudaProfilerStart / cudaProfilerStop, so that

    ncu --profile-from-start off --clock-control none --set full -o OUT python profile_case.py CASE

profiles exactly the launches of that one call (attention and, where it splits, the merge).

CASE: decode1 (batch 1 over 10 304 keys), triton1 / triton8 (the RAG short-question prefill at batch 1 / 8, the
engine's splits and Q copies), gluon1 / gluon8 (kernels/prefill_hopper.py on the same inputs).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from kernels import attention, decode_case, engine_split, rag_case, rag_sweep_bench, rope_runs  # noqa: E402

from lazyattn.kernels import prefill_hopper  # noqa: E402
from lazyattn.kernels.prefill import prefill_attention  # noqa: E402


def call_for(case: str):
    b, _, _, _ = rag_sweep_bench()
    if case == "decode1":
        gen = torch.Generator().manual_seed(2)
        inputs, _ = decode_case(b, 1, b.s.target_decode_context, gen)
        fn = attention(True)
        return lambda: fn(*inputs[0], b.tables, b.scale)
    batch = int(case[-1])
    inputs, _ = rag_case(b, batch, False, copies=1)
    i = engine_split(b, *inputs[0])
    if case.startswith("triton"):
        r = rope_runs(b, *i)
        return lambda: prefill_attention(*i, b.tables, b.scale, rotated_q=r)
    splits = i[3].plan.shape[1] if i[3].plan is not None else 1
    return lambda: prefill_hopper.short_prefill_attention(*i, b.tables, b.scale, splits)


def main() -> None:
    fn = call_for(sys.argv[1])
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
