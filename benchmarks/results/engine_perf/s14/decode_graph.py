"""Session 14: batch-1 decode attention over 10 304 cached keys (issue 10's decode target), timed per layer as
benchmarks/kernels.py's targets section times it (graph_us: 32 launches per CUDA graph, inputs rotated past L2),
in two graph forms:

- `alone`: 32 decode launches back to back (the targets section's form);
- `layer`: each decode launch after a RoPE/KV-write launch of its own token (rope_write_kv, as in the engine's
  decode step): under PDL the decode's programs start while a small kernel, not another decode, finishes.

    PYTHONPATH=TREE python benchmarks/results/engine_perf/s14/decode_graph.py OUT.json [LABEL]

Runs over whichever lazyattn PYTHONPATH names (this tree or an older checkout: the A/B), with the environment's
LAZYATTN_PDL and LAZYATTN_DECODE_PREFETCH. Appends {label, alone_us, layer_us, GB/s, % of copy} to OUT.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.environ.get("PYTHONPATH", ".").split(":")[0])
from benchmarks import kernels as kb  # noqa: E402
from lazyattn.kernels import cache_ops  # noqa: E402


def main() -> None:
    out, label = Path(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "run")
    args = argparse.Namespace(warmup=25, rep=100, seed=0, argv=[])
    gpu = torch.cuda.is_available()  # on a CPU (interpreter): tiny shapes, a smoke test of the script
    s = kb.Shapes() if gpu else kb.QUICK
    device = torch.device("cuda" if gpu else "cpu")
    b = kb.Bench(args, s, device, kb.llama31_tables(s.head_dim, 4 * 32768, device))
    gen = torch.Generator().manual_seed(2)
    ctx = s.target_decode_context
    inputs, nbytes = kb.decode_case(b, 1, ctx, gen)
    while len(inputs) < 4:
        inputs += kb.decode_case(b, 1, ctx, gen)[0]
    fn = kb.attention(True)
    alone = kb.graph_us(b, [lambda i=i: fn(*i, b.tables, b.scale) for i in inputs])

    def layer(i):
        q, k_cache, v_cache, pb = i
        kq = torch.randn(1, s.kv_heads, s.head_dim, dtype=q.dtype, device=device)
        pos = pb.q_start.long()
        slot = torch.full((1,), -1, dtype=torch.int64, device=device)  # rotates, stores nothing
        return lambda: fn(cache_ops.rope_write_kv(q, kq, kq, pos, slot, k_cache, v_cache, b.tables), k_cache,
                          v_cache, pb, b.tables, b.scale)

    layered = kb.graph_us(b, [layer(i) for i in inputs])
    copy = b.copy_bandwidth() or float("nan")
    row = {"label": label, "pdl": os.environ.get("LAZYATTN_PDL", "1"),
           "prefetch": os.environ.get("LAZYATTN_DECODE_PREFETCH", "0"), "alone_us": alone, "layer_us": layered,
           "alone_%_of_copy": 100 * nbytes / alone / 1e3 / copy, "layer_%_of_copy": 100 * nbytes / layered / 1e3 / copy,
           "copy_GBps": copy, "gpu": torch.cuda.get_device_name() if gpu else "cpu"}
    rows = json.loads(out.read_text()) if out.exists() else []
    out.write_text(json.dumps(rows + [row], indent=1))
    print(json.dumps(row))


if __name__ == "__main__":
    main()
