"""What decode_breakdown.py and warps_probe.py share: batch-1 decode attention over the targets section's context
(benchmarks/kernels.py: 10 304 cached keys in documents at their deltas), four input copies past L2, and a decode
launch after a RoPE/KV-write launch of the step's own token, as the engine's decode step runs it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from benchmarks import kernels as kb  # noqa: E402
from lazyattn.kernels.cache_ops import rope_write_kv  # noqa: E402


@dataclass
class Batch1:
    gpu: bool  # False: the interpreter's tiny shapes (a smoke test of the scripts on a CPU)
    s: kb.Shapes
    b: kb.Bench
    inputs: list[tuple]  # (q, k_cache, v_cache, paged batch) copies
    nbytes: int  # bytes one call reads and writes
    fn: Callable  # the decode launcher, with kept arrival counters
    copy: float  # copy bandwidth, GB/s (NaN on a CPU)
    kv: torch.Tensor
    slot: torch.Tensor

    def after_rope(self, q, k, v, pb, **kw):
        """Decode of q after a RoPE launch that rotates it (and stores nothing: slot -1)."""
        return self.fn(rope_write_kv(q, self.kv, self.kv, pb.q_start.long(), self.slot, k, v, self.b.tables), k, v,
                       pb, self.b.tables, self.b.scale, **kw)


def batch1() -> Batch1:
    gpu = torch.cuda.is_available()
    s = kb.Shapes() if gpu else kb.QUICK
    device = torch.device("cuda" if gpu else "cpu")
    b = kb.Bench(argparse.Namespace(warmup=25, rep=100, seed=0, argv=[]), s, device,
                 kb.llama31_tables(s.head_dim, 4 * 32768, device))
    gen = torch.Generator().manual_seed(2)
    inputs, nbytes = kb.decode_case(b, 1, s.target_decode_context, gen)
    while len(inputs) < 4:
        inputs += kb.decode_case(b, 1, s.target_decode_context, gen)[0]
    fn = kb.attention(True)
    copy = b.copy_bandwidth() or float("nan")
    kv = torch.randn(1, s.kv_heads, s.head_dim, dtype=kb.DTYPE, device=device)
    slot = torch.full((1,), -1, dtype=torch.int64, device=device)
    return Batch1(gpu, s, b, inputs, nbytes, fn, copy, kv, slot)
