"""Session 21: what the short prefill's merge in the kernel (kernels/prefill_hopper.py `_merge_group`) spends at
batch 1, and two cheaper forms of it. Call 1 (s21/c1) measured the fused merge as long as prefill's combine launch
(~5 us over the kernel's partials alone).

Variants, copies of the kernel's source with text patches (wrong outputs where work is removed; timing only):
- "fused": as committed (each program merges its 8 rows in two rounds of loads, 4 rows each);
- "fused, wait only": the programs wait for their group and set the counters back, but merge nothing;
- "fused, no wait": the merge without the wait (it reads partials that may not be there yet);
- "fused, one round": the 8 rows in one round of loads (128 fp32 a thread, no spills under Triton 3.6);
- "fused, one round, bf16 partials": and the partials stored in q's dtype (half the bytes each way);
- "combine" (prefill's combine launch) and "no merge" (the partials alone), as in prefill_merge.py.
The RAG case at batch 1, timed as the targets are (graph_us), alone and after the RoPE launch, ROUNDS alternated
rounds. Each variant's output against the combine launch's: max abs difference (bf16).

    python benchmarks/results/engine_perf/s21/merge_parts.py OUT.json

The fused merge was measured and taken out again (no faster than the combine launch at batch 1; docs/kernels.md,
"Session 21"): this probe runs on the tree of commit 549441e, which has it (`git checkout 549441e`).
"""

from __future__ import annotations

import functools
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import forms_rounds, patched_module, rag_sweep_bench, short_prefill_case  # noqa: E402

from lazyattn.kernels import prefill_hopper  # noqa: E402
from lazyattn.kernels.decode import ArrivalCounters  # noqa: E402

ROUNDS = 3
ONE_ROUND = ("CHUNK=max(4, 64 // block_s)", "CHUNK=max(4, 128 // block_s)")
BF16 = ("    ws_o = torch.empty(num_splits, total_q, q_heads, head_dim, dtype=torch.float32, device=q.device)\n",
        "    ws_o = torch.empty(num_splits, total_q, q_heads, head_dim, dtype=q.dtype, device=q.device)\n")
VARIANTS = {
    "fused, wait only": [("    for c in gl.static_range((PER + CHUNK - 1) // CHUNK):\n",
                          "    for c in gl.static_range(0):\n")],
    "fused, no wait": [("    _wait_count(counter + lanes * 0, gl.full([128], 2 * SPLITS, gl.int32, lane_layout))\n",
                        "")],
    "fused, one round": [ONE_ROUND],
    "fused, one round, bf16 partials": [ONE_ROUND, BF16],
}


def main() -> None:
    out_path = sys.argv[1]
    b, copy_gbps, kv_bytes, copies = rag_sweep_bench()
    inputs, splits, layer = short_prefill_case(b, 1, max(4, copies))
    counters = ArrivalCounters()

    def attend(mod, fused, q, k, v, pb):
        return mod.short_prefill_attention(q, k, v, pb, b.tables, b.scale, splits, counters=counters if fused else None)

    def partials(q, k, v, pb):
        return prefill_hopper.split_partials(q, k, v, pb, b.tables, b.scale, splits)

    row = {"copy_gbps": copy_gbps, "bytes": kv_bytes, "splits": splits}
    with tempfile.TemporaryDirectory() as tmp:
        forms = {"combine": functools.partial(attend, prefill_hopper, False),
                 "fused": functools.partial(attend, prefill_hopper, True)}
        for name, patches in VARIANTS.items():
            mod = patched_module(Path(prefill_hopper.__file__), Path(tmp), "ph_" + name.replace(", ", "_").replace(
                " ", "_"), patches)
            forms[name] = functools.partial(attend, mod, True)
        forms["no merge"] = partials
        combine = forms["combine"](*inputs[0])
        for name, fn in forms.items():
            if name != "no merge":
                row[f"max |{name} - combine|"] = (fn(*inputs[0]).float() - combine.float()).abs().max().item()
        row.update(forms_rounds(b, forms, inputs, layer, ROUNDS, kv_bytes, copy_gbps))
    print(json.dumps(row, indent=1), flush=True)
    Path(out_path).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
