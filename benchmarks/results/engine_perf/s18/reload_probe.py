"""Session 18: what a new document's Q rotation costs the Gluon short prefill (kernels/prefill_hopper.py), timed
as kernels.py's targets section runs it (`graph_us`), the RAG case at batch 1 and 8, attention alone (kernel + merge)
and after the RoPE launch, four alternated rounds. Variants are this tree's kernel with its rotation test rewritten
(timing only: "never" and "every tile" give wrong results):

- "this": a consumer rotates Q again where a tile's delta differs from the one its Q holds (a document boundary);
- "no deltas": the rotation compiled out (apply_delta=False), the deferred-RoPE overhead's baseline;
- "never": deltas on, Q never rotated again after the first tile;
- "every tile": deltas on, Q rotated again before every tile (the cost of one rotation, times the tiles).

    python benchmarks/results/engine_perf/s18/reload_probe.py OUT.json
"""

from __future__ import annotations

import functools
import json
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import DTYPE, free_memory, graph_us, module_from, rag_case, rag_positions, rag_sweep_bench  # noqa: E402

from lazyattn.kernels import prefill_hopper  # noqa: E402
from lazyattn.kernels.cache_ops import rope_write_kv  # noqa: E402

TEST = "        if delta != held:\n"
# Run-time conditions: one Triton folds (`delta != delta`) fails to compile under Triton 3.6.
REWRITES = {"never": "        if (delta != held) & (n_tiles < 0):\n",
            "every tile": "        if (delta != held) | (n_tiles > 0):\n"}


def variant(name: str, source: str, folder: Path):
    """prefill_hopper with its rotation test rewritten, as a module of its own (Gluon reads a kernel's source)."""
    assert source.count(TEST) == 1
    path = folder / f"prefill_hopper_{name.replace(' ', '_')}.py"
    path.write_text(source.replace(TEST, REWRITES[name]))
    return module_from(path, path.stem)


def batch_row(b, batch: int, modules: dict) -> dict:
    s = b.s
    inputs, _ = rag_case(b, batch, False, copies=6)
    splits = prefill_hopper.num_splits(batch * s.question, s.q_heads, s.kv_heads, b.device)
    kv_new = torch.randn(batch * s.question, 2, s.kv_heads, s.head_dim, dtype=DTYPE, device=b.device)
    slots = torch.full((batch * s.question,), -1, dtype=torch.int64, device=b.device)
    positions = rag_positions(b, inputs[0][3])

    def attend(module, apply_delta, q, k, v, pb):
        return module.short_prefill_attention(q, k, v, pb, b.tables, b.scale, splits, apply_delta=apply_delta)

    def layer(module, apply_delta, q, k, v, pb):
        rq = rope_write_kv(q, kv_new[:, 0], kv_new[:, 1], positions, slots, k, v, b.tables)
        return attend(module, apply_delta, rq, k, v, pb)

    forms = {name: (module, True) for name, module in modules.items()}
    forms["no deltas"] = (prefill_hopper, False)
    row = {"batch": batch, "splits": splits}
    for rnd in range(4):
        for name, (module, apply_delta) in forms.items():
            for form, fn in (("attention", attend), ("layer", layer)):
                row[f"{name} {form} r{rnd} us"] = graph_us(b, [functools.partial(fn, module, apply_delta, *i)
                                                                for i in inputs])
    return row


def main() -> None:
    b, copy_gbps, _, _ = rag_sweep_bench()
    folder = Path(tempfile.mkdtemp())
    source = Path(prefill_hopper.__file__).read_text()
    modules = {"this": prefill_hopper, **{n: variant(n, source, folder) for n in REWRITES}}
    rows = []
    for batch in (1, 8):
        rows.append(batch_row(b, batch, modules))
        print(json.dumps(rows[-1]), flush=True)
        free_memory()
    Path(sys.argv[1]).write_text(json.dumps({"copy_gbps": copy_gbps, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
