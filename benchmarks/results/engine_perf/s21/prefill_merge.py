"""Session 21: the short prefill's merge in the kernel (kernels/prefill_hopper.py `_merge_group`: each (query slot, kv
head) group's programs wait for each other, then each merges its share of the group's rows) against prefill's combine
launch, at batch 1, 2, 4 and 8 of kernels.py's RAG case (5 x 2048 cached documents at their deltas + a 32-token
question each), at the split count the engine takes (num_splits).

Forms, each timed as the targets are (graph_us), alone ("attention") and after the RoPE launch ("layer"), ROUNDS
alternated rounds:
- "combine": the kernel's partials merged by prefill's combine launch (short_prefill_attention without counters: the
  tree before);
- "fused": the merge in the kernel (with counters: what the engine's backend now runs where fused_merge allows);
- "fused coop": the same launch with CUDA's cooperative attribute (the driver then guarantees that the grid is
  resident at once, or refuses the launch);
- "no merge": the kernel's partials alone (split_partials), the bound of any merge.

Checks, per batch: the fused output against the combine launch's (max abs difference, bf16), and the counters all 0
after the timed graphs.

    python benchmarks/results/engine_perf/s21/prefill_merge.py OUT.json [BATCHES]

The fused merge was measured and taken out again (no faster than the combine launch at batch 1; docs/kernels.md,
"Session 21"): this probe runs on the tree of commit 549441e, which has it (`git checkout 549441e`).
"""

from __future__ import annotations

import functools
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import forms_rounds, graph_us, patched_module, probe_rows, rag_sweep_bench, short_prefill_case  # noqa

from lazyattn.kernels import prefill_hopper  # noqa: E402
from lazyattn.kernels.decode import ArrivalCounters  # noqa: E402

ROUNDS = 3
COOP = [("num_warps=4, maxnreg=_MAXNREG,", "num_warps=4, maxnreg=_MAXNREG, launch_cooperative_grid=fused,")]


def main() -> None:
    out_path = sys.argv[1]
    batches = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,2,4,8").split(",")]
    b, copy_gbps, kv_bytes, copies = rag_sweep_bench()
    tmp = tempfile.TemporaryDirectory()
    coop = patched_module(Path(prefill_hopper.__file__), Path(tmp.name), "prefill_hopper_coop", COOP)
    counters = ArrivalCounters()

    def row(batch: int) -> dict:
        inputs, splits, layer = short_prefill_case(b, batch, max(4, copies // batch))
        q0, k0, _, pb0 = inputs[0]
        grid = prefill_hopper._grid(q0, k0, pb0, splits)

        def attend(mod, fused, q, k, v, pb):
            return mod.short_prefill_attention(q, k, v, pb, b.tables, b.scale, splits,
                                               counters=counters if fused else None)

        def partials(q, k, v, pb):
            return prefill_hopper.split_partials(q, k, v, pb, b.tables, b.scale, splits)

        combine = attend(prefill_hopper, False, *inputs[0])
        fused = attend(prefill_hopper, True, *inputs[0])
        again = attend(prefill_hopper, True, *inputs[0])
        result = {"batch": batch, "splits": splits, "grid": list(grid),
                  "fused taken": prefill_hopper.fused_merge(grid, b.device),
                  "max |fused - combine|": (fused.float() - combine.float()).abs().max().item(),
                  "fused twice, same bits": bool(torch.equal(fused, again)),
                  "bytes": kv_bytes * batch, "copy_gbps": copy_gbps}
        forms = {"combine": functools.partial(attend, prefill_hopper, False),
                 "fused": functools.partial(attend, prefill_hopper, True), "no merge": partials}
        try:
            coop_out = attend(coop, True, *inputs[0])
            result["max |fused coop - combine|"] = (coop_out.float() - combine.float()).abs().max().item()
            graph_us(b, [functools.partial(attend, coop, True, *inputs[0])], layers=2, replays=1)  # captures?
            forms["fused coop"] = functools.partial(attend, coop, True)
        except Exception as e:  # noqa: BLE001 - the probe reports why the attribute is refused
            result["fused coop error"] = repr(e)[:300]
        result.update(forms_rounds(b, forms, inputs, layer, ROUNDS, kv_bytes * batch, copy_gbps))
        torch.cuda.synchronize()
        buf = counters.get(b.device, prefill_hopper.counters_needed(grid))
        result["counters zero after"] = int(buf.abs().sum().item()) == 0
        return result

    probe_rows(out_path, {"rounds": ROUNDS}, batches, row)


if __name__ == "__main__":
    main()
