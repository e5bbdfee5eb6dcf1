"""Session 18: the Gluon short prefill (kernels/prefill_hopper.py) against Session 17's, timed in the same run as the
engine's graphs run them (kernels.py `graph_us`: 32 launches per CUDA graph, inputs rotated past L2): the RAG case (5 x
2048 cached documents at their deltas + a 32-token question per entry), programmatic dependent launch as the engine
has it (on, on an H100), ROUNDS alternated rounds (two in call 1). Session 17's kernel is its module in Session 17's
tree, unpacked into .s18base as run_s18.sh's header says. Calls 1-12 timed a copy of it in this folder (the same
file: `git show c2d3a43:benchmarks/results/engine_perf/s18/prefill_hopper_s17.py`).

Variants:
- "s17": Session 17's kernel;
- "this": this tree's kernel and merge.

Call 1 also timed "early": a form of this tree's kernel (commit 3405914) whose load warp copied the documents' pages
(`safe_pages`: the pages before each entry's question) before the wait for the RoPE launch. It gained nothing and is
gone; `git show 3405914:benchmarks/results/engine_perf/s18/prefill_probe.py` is the probe that timed it.

Forms, each with the documents' deltas and with the rotation compiled out (apply_delta=False; the deferred-RoPE
overhead is their ratio):
- "attention": the kernel and the combine launch, back to back;
- "layer": the RoPE/KV-write launch, then attention (the engine's layer, kernels.py `rag_layer`).

    python benchmarks/results/engine_perf/s18/prefill_probe.py OUT.json [BATCH ...]
    python benchmarks/results/engine_perf/s18/prefill_probe.py OUT.json merge

`merge`: batch 1 in the layer form, this tree's kernel followed by the combine launch in each of MERGE_FORMS (warps,
splits merged per step) and by none (the kernel alone: what merging the splits in the kernel could at most save),
four alternated rounds.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE))

from kernels import DTYPE, graph_rounds, graph_us, module_from, probe_rows, rag_case, rag_positions, rag_sweep_bench  # noqa: E402

from lazyattn.kernels import prefill_hopper  # noqa: E402
from lazyattn.kernels.cache_ops import rope_write_kv  # noqa: E402
from lazyattn.kernels.reference import paged_attention  # noqa: E402

ROUNDS = 3
BASE = HERE.parents[3] / ".s18base"  # Session 17's tree (8e0b643)


def session17_kernel():
    """Session 17's kernels/prefill_hopper.py, as a module of its own (its lazyattn imports resolve to this tree's,
    which kept every name it uses)."""
    return module_from(BASE / "lazyattn" / "kernels" / "prefill_hopper.py", "prefill_hopper_s17")

# The merge section's (warps, splits per step) of the combine launch; 0 warps: no combine. Call 2 timed 4, 2 and 1
# warps at 16 splits per step (all of them) and none.
MERGE_FORMS = ((4, 16), (1, 16), (1, 8), (1, 4), (0, 16))


def merge_section(b, out_path: str) -> None:
    from lazyattn.kernels.launch import pdl_options
    from lazyattn.kernels.prefill import _combine_kernel

    s = b.s
    inputs, _ = rag_case(b, 1, False, copies=6)
    splits = prefill_hopper.num_splits(s.question, s.q_heads, s.kv_heads, b.device)
    kv_new = torch.randn(s.question, 2, s.kv_heads, s.head_dim, dtype=DTYPE, device=b.device)
    slots = torch.full((s.question,), -1, dtype=torch.int64, device=b.device)
    positions = rag_positions(b, inputs[0][3])
    outs = [torch.empty_like(i[0]) for i in inputs]

    def layer(q, k, v, pb, out, warps, block_s):
        rq = rope_write_kv(q, kv_new[:, 0], kv_new[:, 1], positions, slots, k, v, b.tables)
        ws_o, ws_lse = prefill_hopper.split_partials(rq, k, v, pb, b.tables, b.scale, splits)
        if warps:
            n, total_q, q_heads, head_dim = ws_o.shape
            _combine_kernel[(total_q * q_heads,)](ws_o, ws_lse, out, total_q * q_heads, n, out.stride(0),
                                                  out.stride(1), NUM_HEADS=q_heads, HEAD_DIM=head_dim,
                                                  BLOCK_S=block_s, num_warps=warps,
                                                  **pdl_options(out.device, "attention"))
        return out

    row = {"batch": 1, "splits": splits}
    for rnd in range(4):
        for warps, block_s in MERGE_FORMS:
            name = f"combine {warps} warps, BLOCK_S {block_s}" if warps else "no combine"
            row[f"{name} r{rnd} us"] = graph_us(b, [functools.partial(layer, *i, o, warps, block_s)
                                                     for i, o in zip(inputs, outs)])
    print(json.dumps(row), flush=True)
    Path(out_path).write_text(json.dumps(row, indent=1))


def batch_row(b, batch: int, copy_gbps: float) -> dict:
    s = b.s
    kv_bytes = batch * (s.n_docs * s.doc_len + s.question) * s.kv_heads * s.head_dim * 2 * 2
    inputs, _ = rag_case(b, batch, False, copies=6)
    splits = prefill_hopper.num_splits(batch * s.question, s.q_heads, s.kv_heads, b.device)
    row = {"batch": batch, "splits": splits, "kv_bytes": kv_bytes}
    q, k, v, pb = inputs[0]
    ref = paged_attention(q.float(), k.float(), v.float(), pb, b.tables, b.scale)
    kv_new = torch.randn(batch * s.question, 2, s.kv_heads, s.head_dim, dtype=DTYPE, device=b.device)
    slots = torch.full((batch * s.question,), -1, dtype=torch.int64, device=b.device)
    positions = rag_positions(b, pb)

    def attend(module, q, k, v, pb, apply_delta):
        return module.short_prefill_attention(q, k, v, pb, b.tables, b.scale, splits, apply_delta=apply_delta)

    def layer(module, q, k, v, pb, apply_delta):
        rq = rope_write_kv(q, kv_new[:, 0], kv_new[:, 1], positions, slots, k, v, b.tables)
        return attend(module, rq, k, v, pb, apply_delta)

    calls = {}
    for name, module in (("s17", session17_kernel()), ("this", prefill_hopper)):
        got = module.short_prefill_attention(q, k, v, pb, b.tables, b.scale, splits)
        row[f"{name} max_abs_vs_ref"] = (got.float() - ref).abs().max().item()
        for form, fn in (("attention", attend), ("layer", layer)):
            for deltas in (True, False):
                calls[f"{name} {form}{'' if deltas else ', no deltas'}"] = [
                    functools.partial(fn, module, *i, deltas) for i in inputs]
    row.update(graph_rounds(b, calls, ROUNDS, kv_bytes, copy_gbps))
    return row


def main() -> None:
    out_path = sys.argv[1]
    if sys.argv[2:] == ["merge"]:
        merge_section(rag_sweep_bench()[0], out_path)
        return
    b, copy_gbps, _, _ = rag_sweep_bench()
    probe_rows(out_path, {"copy_gbps": copy_gbps}, [int(x) for x in sys.argv[2:]] or [1, 8],
               lambda batch: batch_row(b, batch, copy_gbps))


if __name__ == "__main__":
    main()
