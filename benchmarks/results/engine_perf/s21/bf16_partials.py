"""Session 21: the short prefill's partial outputs stored in q's dtype (bf16) instead of fp32, against .s21base's
kernel (fp32 partials; the tree before), at batch 1, 2, 4 and 8 of kernels.py's RAG case, at the engine's split count.
Call 2 (s21/c2) measured the fused merge ~1 us faster with bf16 partials; here the engine's path, prefill's combine
launch, merges them.

Each form timed as the targets are (graph_us), alone ("attention") and after the RoPE launch ("layer"), ROUNDS
alternated rounds. Accuracy: each form's error against the fp32 reference (kernels/reference.py paged_attention, the
ground truth of the tests) at batch 1 and 8, max abs and relative (as tests/kernels's rel_err: ||out - ref|| /
||ref||), and max |bf16 partials - fp32 partials|.

    mkdir .s21base && git archive 38f531d lazyattn | tar x -C .s21base
    python benchmarks/results/engine_perf/s21/bf16_partials.py OUT.json [BATCHES]

The bf16 partials were measured and taken out again (within noise at batch 1, 1-2 % at batch 8, a slightly larger
error; docs/kernels.md, "Session 21"): this probe runs on the tree of commit edda6ac, which has them.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import (  # noqa: E402
    DTYPE,
    graph_rounds,
    module_from,
    probe_rows,
    rag_case,
    rag_positions,
    rag_sweep_bench,
)

from lazyattn.kernels import prefill_hopper, reference  # noqa: E402
from lazyattn.kernels.cache_ops import rope_write_kv  # noqa: E402

ROUNDS = 3


def main() -> None:
    out_path = sys.argv[1]
    batches = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,2,4,8").split(",")]
    base = module_from(ROOT / ".s21base/lazyattn/kernels/prefill_hopper.py", "prefill_hopper_s21base")
    b, copy_gbps, kv_bytes, copies = rag_sweep_bench()
    s = b.s

    def row(batch: int) -> dict:
        inputs, _ = rag_case(b, batch, False, copies=max(4, copies // batch))
        q0, k0, v0, pb0 = inputs[0]
        splits = prefill_hopper.num_splits(q0.shape[0], s.q_heads, s.kv_heads, b.device, pb0.batch_size, pb0.max_q)
        kv_new = torch.randn(q0.shape[0], 2, s.kv_heads, s.head_dim, dtype=DTYPE, device=b.device)
        slots = torch.full((q0.shape[0],), -1, dtype=torch.int64, device=b.device)
        positions = rag_positions(b, pb0)

        def attend(mod, q, k, v, pb):
            return mod.short_prefill_attention(q, k, v, pb, b.tables, b.scale, splits)

        def layer(mod, q, k, v, pb):
            return attend(mod, rope_write_kv(q, kv_new[:, 0], kv_new[:, 1], positions, slots, k, v, b.tables), k, v,
                          pb)

        forms = {"fp32 partials": base, "bf16 partials": prefill_hopper}
        outs = {name: attend(mod, *inputs[0]).float() for name, mod in forms.items()}
        result = {"batch": batch, "splits": splits, "bytes": kv_bytes * batch, "copy_gbps": copy_gbps,
                  "max |bf16 - fp32 partials|": (outs["bf16 partials"] - outs["fp32 partials"]).abs().max().item()}
        if batch in (1, 8):
            expected = reference.paged_attention(q0, k0, v0, pb0, b.tables, b.scale).float()
            for name, out in outs.items():
                result[f"{name}: max abs error"] = (out - expected).abs().max().item()
                result[f"{name}: rel error"] = ((out - expected).norm() / expected.norm()).item()
        calls = {}
        for name, mod in forms.items():
            calls[f"{name}, attention"] = [functools.partial(attend, mod, *i) for i in inputs]
            calls[f"{name}, layer"] = [functools.partial(layer, mod, *i) for i in inputs]
        result.update(graph_rounds(b, calls, ROUNDS, kv_bytes * batch, copy_gbps))
        return result

    probe_rows(out_path, {"rounds": ROUNDS}, batches, row)


if __name__ == "__main__":
    main()
