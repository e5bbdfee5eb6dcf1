"""Session 18: the Gluon short prefill (kernels/prefill_hopper.py) against Session 17's (a copy of it,
prefill_hopper_s17.py), timed in the same run as the engine's graphs run them (kernels.py `graph_us`: 32 launches per
CUDA graph, inputs rotated past L2), the RAG case (5 x 2048 cached documents at their deltas + a 32-token question
per entry), programmatic dependent launch as the engine has it (on, on an H100), two alternated rounds.

Variants:
- "s17": Session 17's kernel;
- "this": this tree's, every page loaded after the wait (no `safe_pages`);
- "early": this tree's, with `safe_pages` = the pages before each entry's question (the documents' pages, as the
  engine marks them): those load before the wait.

Forms, each with the documents' deltas and with the rotation compiled out (apply_delta=False; the deferred-RoPE
overhead is their ratio):
- "attention": the kernel and the combine launch, back to back;
- "layer": the RoPE/KV-write launch, then attention (the engine's layer, kernels.py `rag_layer`).

    python benchmarks/results/engine_perf/s18/prefill_probe.py OUT.json [BATCH ...]
    python benchmarks/results/engine_perf/s18/prefill_probe.py OUT.json merge

`merge`: batch 1 in the layer form, this tree's kernel followed by the combine launch at 4 (as now), 2 and 1 warps,
and by none (the kernel alone: what merging the splits in the kernel could at most save), four alternated rounds.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE))

import prefill_hopper_s17  # noqa: E402
from kernels import DTYPE, free_memory, graph_us, rag_case, rag_positions, rag_sweep_bench  # noqa: E402

from lazyattn.kernels import prefill_hopper  # noqa: E402
from lazyattn.kernels.cache_ops import rope_write_kv  # noqa: E402
from lazyattn.kernels.reference import paged_attention  # noqa: E402


def documents_only(pb):
    """pb with safe_pages = each entry's pages that end before its question starts."""
    ends = pb.starts + pb.valid
    listed = torch.arange(pb.pages.shape[1], device=pb.pages.device)[None, :] < pb.num_pages[:, None]
    safe = ((ends <= pb.q_start[:, None]) & listed).sum(1, dtype=torch.int32)
    return replace(pb, safe_pages=safe)


def merge_section(b, out_path: str) -> None:
    import triton

    from lazyattn.kernels.launch import pdl_options
    from lazyattn.kernels.prefill import _combine_kernel

    s = b.s
    inputs, _ = rag_case(b, 1, False, copies=6)
    splits = prefill_hopper.num_splits(s.question, s.q_heads, s.kv_heads, b.device)
    kv_new = torch.randn(s.question, 2, s.kv_heads, s.head_dim, dtype=DTYPE, device=b.device)
    slots = torch.full((s.question,), -1, dtype=torch.int64, device=b.device)
    positions = rag_positions(b, inputs[0][3])
    outs = [torch.empty_like(i[0]) for i in inputs]

    def layer(q, k, v, pb, out, warps):
        rq = rope_write_kv(q, kv_new[:, 0], kv_new[:, 1], positions, slots, k, v, b.tables)
        ws_o, ws_lse = prefill_hopper.split_partials(rq, k, v, pb, b.tables, b.scale, splits)
        if warps:
            n, total_q, q_heads, head_dim = ws_o.shape
            _combine_kernel[(total_q * q_heads,)](ws_o, ws_lse, out, total_q * q_heads, n, out.stride(0),
                                                  out.stride(1), NUM_HEADS=q_heads, HEAD_DIM=head_dim,
                                                  BLOCK_S=min(16, triton.next_power_of_2(n)), num_warps=warps,
                                                  **pdl_options(out.device, "attention"))
        return out

    row = {"batch": 1, "splits": splits}
    for rnd in range(4):
        for warps in (4, 2, 1, 0):
            name = f"combine {warps} warps" if warps else "no combine"
            row[f"{name} r{rnd} us"] = graph_us(b, [functools.partial(layer, *i, o, warps)
                                                     for i, o in zip(inputs, outs)])
    print(json.dumps(row), flush=True)
    Path(out_path).write_text(json.dumps(row, indent=1))


def main() -> None:
    out_path = sys.argv[1]
    if sys.argv[2:] == ["merge"]:
        merge_section(rag_sweep_bench()[0], out_path)
        return
    batches = [int(x) for x in sys.argv[2:]] or [1, 8]
    b, copy_gbps, _, _ = rag_sweep_bench()
    s = b.s
    result = {"copy_gbps": copy_gbps, "rows": []}
    for batch in batches:
        kv_bytes = batch * (s.n_docs * s.doc_len + s.question) * s.kv_heads * s.head_dim * 2 * 2
        inputs, _ = rag_case(b, batch, False, copies=6)
        splits = prefill_hopper.num_splits(batch * s.question, s.q_heads, s.kv_heads, b.device)
        variants = {"s17": (prefill_hopper_s17, inputs), "this": (prefill_hopper, inputs),
                    "early": (prefill_hopper, [(q, k, v, documents_only(pb)) for q, k, v, pb in inputs])}
        row = {"batch": batch, "splits": splits, "kv_bytes": kv_bytes,
               "safe_pages": variants["early"][1][0][3].safe_pages.tolist()}
        q, k, v, pb = inputs[0]
        ref = paged_attention(q.float(), k.float(), v.float(), pb, b.tables, b.scale)
        kv_new = torch.randn(batch * s.question, 2, s.kv_heads, s.head_dim, dtype=DTYPE, device=b.device)
        slots = torch.full((batch * s.question,), -1, dtype=torch.int64, device=b.device)
        positions = rag_positions(b, pb)
        calls = {}
        for name, (module, ins) in variants.items():
            got = module.short_prefill_attention(*ins[0], b.tables, b.scale, splits)
            row[f"{name} max_abs_vs_ref"] = (got.float() - ref).abs().max().item()

            def attend(q, k, v, pb, apply_delta, module=module):
                return module.short_prefill_attention(q, k, v, pb, b.tables, b.scale, splits,
                                                      apply_delta=apply_delta)

            def layer(q, k, v, pb, apply_delta, attend=attend):
                rq = rope_write_kv(q, kv_new[:, 0], kv_new[:, 1], positions, slots, k, v, b.tables)
                return attend(rq, k, v, pb, apply_delta)

            for form, fn in (("attention", attend), ("layer", layer)):
                for deltas in (True, False):
                    calls[f"{name} {form}{'' if deltas else ', no deltas'}"] = [
                        functools.partial(fn, *i, deltas) for i in ins]
        for rnd in range(2):
            for name, fns in calls.items():
                us = graph_us(b, fns)
                row[f"{name} r{rnd} us"] = us
                row[f"{name} r{rnd} %copy"] = 100 * kv_bytes / us / 1e3 / copy_gbps
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        del inputs, variants, calls
        free_memory()
    Path(out_path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
