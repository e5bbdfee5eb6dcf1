"""Session 16: decode attention with one or two lanes per program (kernels/decode.py, LANES), timed per layer as
benchmarks/kernels.py's targets section times it (graph_us: 32 launches per CUDA graph, inputs past L2), alone and
after a RoPE/KV-write launch of the step's own token (the engine's decode step; s14/decode_graph.py's two forms).

Cases: batch 1 x 10 304 keys (issue 10's decode target), batch 1 x 32 768, batch 2 x 10 304, batch 1 x 2 080;
variants: one lane (the split rule before this session: one program per SM up to 16-page splits, two per SM
beyond), two lanes (the new rule: one program per SM at every length), and one lane over fixed 24 / 32 splits
(two programs per SM at batch 1 x 10K). Each variant's output is checked against the reference.

    python benchmarks/results/engine_perf/s16/lanes_probe.py OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from benchmarks import kernels as kb  # noqa: E402
from lazyattn.kernels import cache_ops, reference  # noqa: E402


def main() -> None:
    out = Path(sys.argv[1])
    args = argparse.Namespace(warmup=25, rep=100, seed=0, argv=[])
    gpu = torch.cuda.is_available()  # on a CPU (interpreter): tiny shapes, a smoke test of the script
    s = kb.Shapes() if gpu else kb.QUICK
    device = torch.device("cuda" if gpu else "cpu")
    b = kb.Bench(args, s, device, kb.llama31_tables(s.head_dim, 4 * 32768, device))
    gen = torch.Generator().manual_seed(2)
    fn = kb.attention(True)
    copy = b.copy_bandwidth() or float("nan")
    cases = [(1, s.target_decode_context), (1, 32768), (2, s.target_decode_context), (1, 2080)] if gpu else \
        [(1, s.target_decode_context), (2, s.target_decode_context)]
    rows = []
    for batch, ctx in cases:
        inputs, nbytes = kb.decode_case(b, batch, ctx, gen)
        while len(inputs) < 4:
            inputs += kb.decode_case(b, batch, ctx, gen)[0]
        variants = {"one lane": {"lanes": 1}, "two lanes": {"lanes": 2}}
        if batch == 1 and ctx == s.target_decode_context:
            variants |= {"one lane, 24 splits": {"lanes": 1, "num_splits": 24},
                         "one lane, 32 splits": {"lanes": 1, "num_splits": 32}}
        q0, k0, v0, pb0 = inputs[0]
        want = reference.paged_attention(q0, k0, v0, pb0, b.tables, b.scale).float()
        for name, kw in variants.items():
            got = fn(q0, k0, v0, pb0, b.tables, b.scale, **kw).float()
            err = ((got - want).norm() / want.norm()).item()
            alone = kb.graph_us(b, [lambda i=i, kw=kw: fn(*i, b.tables, b.scale, **kw) for i in inputs])

            def layer(i, kw=kw, batch=batch):
                q, k_cache, v_cache, pb = i
                kq = torch.randn(batch, s.kv_heads, s.head_dim, dtype=q.dtype, device=device)
                pos = pb.q_start.long()
                slot = torch.full((batch,), -1, dtype=torch.int64, device=device)  # rotates, stores nothing
                return lambda: fn(cache_ops.rope_write_kv(q, kq, kq, pos, slot, k_cache, v_cache, b.tables), k_cache,
                                  v_cache, pb, b.tables, b.scale, **kw)

            layered = kb.graph_us(b, [layer(i) for i in inputs])
            row = {"batch": batch, "context": ctx, "variant": name, "rel_err": err, "alone_us": alone,
                   "layer_us": layered, "alone_%": 100 * nbytes / alone / 1e3 / copy,
                   "layer_%": 100 * nbytes / layered / 1e3 / copy, "copy_GBps": copy,
                   "gpu": torch.cuda.get_device_name() if gpu else "cpu"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    out.write_text(json.dumps(rows, indent=1))
    print("\n| batch x context | variant | rel. err. | alone / us (% copy) | after RoPE / us (% copy) |\n"
          "|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} x {r['context']} | {r['variant']} | {r['rel_err']:.1e} | {r['alone_us']:.2f} "
              f"({r['alone_%']:.1f}) | {r['layer_us']:.2f} ({r['layer_%']:.1f}) |")


if __name__ == "__main__":
    main()
