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

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import module_from, probe_rows, rag_sweep_bench, short_prefill_ab  # noqa: E402

from lazyattn.kernels import prefill_hopper, reference  # noqa: E402

ROUNDS = 3


def main() -> None:
    out_path = sys.argv[1]
    batches = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,2,4,8").split(",")]
    base = module_from(ROOT / ".s21base/lazyattn/kernels/prefill_hopper.py", "prefill_hopper_s21base")
    b, copy_gbps, kv_bytes, copies = rag_sweep_bench()

    def row(batch: int) -> dict:
        modules = {"fp32 partials": base, "bf16 partials": prefill_hopper}
        result, outs, first = short_prefill_ab(b, batch, max(4, copies // batch), modules, ROUNDS, kv_bytes, copy_gbps)
        result["max |bf16 - fp32 partials|"] = (outs["bf16 partials"] - outs["fp32 partials"]).abs().max().item()
        if batch in (1, 8):
            expected = reference.paged_attention(*first, b.tables, b.scale).float()
            for name, out in outs.items():
                result[f"{name}: max abs error"] = (out - expected).abs().max().item()
                result[f"{name}: rel error"] = ((out - expected).norm() / expected.norm()).item()
        return result

    probe_rows(out_path, {"rounds": ROUNDS}, batches, row)


if __name__ == "__main__":
    main()
