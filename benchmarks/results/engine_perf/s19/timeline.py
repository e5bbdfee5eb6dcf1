"""Session 19: where a batch-1 short prefill's time goes inside the Gluon kernel (kernels/prefill_hopper.py). A copy of
the kernel with clock stamps: each program's first consumer warpgroup writes the SM's cycle counter (%clock64) at
its phases, and the kernel's entry and the consumer's end also write the GPU's global timer (ns), so programs line up
across SMs. The case is kernels.py's RAG case at batch 1 (5 x 2048 cached documents at their deltas + a 32-token
question), after the RoPE launch, in a CUDA graph of 32 layers as `graph_us` times it; the stamps are the last layer's.

Phases of a program (cycles, then us at the SM clock measured from the stamps):
- entry -> consumer start: the kernel's scans (its entry, its visible pages), barrier set-up, warp specialisation;
- consumer start -> after the PDL wait: the first tile's tables and rotation, then waiting for the RoPE launch;
- -> Q stored: q loaded and rotated into shared memory;
- -> first tile landed: the rest of the first K/V tile's copy;
- -> loop end: the tiles;
- -> end: the partial's store.

    python benchmarks/results/engine_perf/s19/timeline.py OUT.json

The stamps patch the kernel's text as call 8 found it, before the partial-store change (d4d4f41): run the probe on the
tree of commit e21e21a (`git checkout e21e21a`).
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import DTYPE, graph_us, module_from, rag_case, rag_positions, rag_sweep_bench  # noqa: E402

from lazyattn.kernels import prefill_hopper  # noqa: E402
from lazyattn.kernels.cache_ops import rope_write_kv  # noqa: E402

SLOTS = 10  # per program: 0-6 clock64 at K0 E0 E1 E2 E3 E4 E5, 7 globaltimer at K0, 8 at E5
STAMP = '''

@gluon.jit
def _stamp(Stamps, pid, slot, pred, GLOBAL: gl.constexpr = False):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    offs = gl.arange(0, 128, layout=layout)
    if GLOBAL:
        t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer; // $1", "=l,r", [offs], dtype=gl.int64,
                                      is_pure=False, pack=1)
    else:
        t = gl.inline_asm_elementwise("mov.u64 $0, %clock64; // $1", "=l,r", [offs], dtype=gl.int64,
                                      is_pure=False, pack=1)
    gl.store(Stamps + pid.to(gl.int64) * 10 + slot + offs * 0, t, mask=(offs == 0) & pred)
'''
PATCHES = [
    ("def _short_prefill_kernel(Q, k_desc, v_desc, WsO, WsLse, Cos, Sin,",
     "def _short_prefill_kernel(Q, k_desc, v_desc, WsO, WsLse, Stamps, Cos, Sin,"),
    ("q, _descriptor(k_cache), _descriptor(v_cache), ws_o, ws_lse, cos, sin,",
     "q, _descriptor(k_cache), _descriptor(v_cache), ws_o, ws_lse, STAMPS[0], cos, sin,"),
    ("Q, WsO, WsLse, Cos, Sin,", "Q, WsO, WsLse, Stamps, Cos, Sin,"),  # _consume's signature and both tuples
    ("    split = gl.program_id(2)\n",
     "    split = gl.program_id(2)\n    kpid = split * gl.num_programs(1) + kv_head\n"
     "    _stamp(Stamps, kpid, 0, True)\n    _stamp(Stamps, kpid, 7, True, True)\n"),
    ("    # Row identities in each layout that uses them.\n",
     "    cpid = split * gl.num_programs(1) + kv_head\n    mine0 = half == 0\n    _stamp(Stamps, cpid, 1, mine0)\n"
     "    # Row identities in each layout that uses them.\n"),
    ("    _wait_for_producers()\n    # q as the RoPE launch left it",
     "    _wait_for_producers()\n    _stamp(Stamps, cpid, 2, mine0)\n    # q as the RoPE launch left it"),
    ("    _store_q(q_smem, q_in, cos, sin, interleaved)\n    mbarrier.wait(ready.index(0), 0, pred=has_tiles)\n",
     "    _store_q(q_smem, q_in, cos, sin, interleaved)\n    _stamp(Stamps, cpid, 3, mine0)\n"
     "    mbarrier.wait(ready.index(0), 0, pred=has_tiles)\n    _stamp(Stamps, cpid, 4, mine0)\n"),
    ("    # The partial, from the blocked layout of the loads",
     "    _stamp(Stamps, cpid, 5, mine0)\n    # The partial, from the blocked layout of the loads"),
    ("        gl.store(WsO + mine[:, None] * _KHEAD_DIM + dims[None, :], out, mask=ok_load[:, None])\n",
     "        gl.store(WsO + mine[:, None] * _KHEAD_DIM + dims[None, :], out, mask=ok_load[:, None])\n"
     "    _stamp(Stamps, cpid, 6, mine0)\n    _stamp(Stamps, cpid, 8, mine0, True)\n"),
]
PHASES = ("entry -> consumer", "consumer -> after wait", "-> q stored", "-> first tile", "-> loop end", "-> end")


def stamped_module(folder: Path):
    source = Path(prefill_hopper.__file__).read_text()
    for old, new in PATCHES:
        assert source.count(old) == (3 if old.startswith("Q, WsO") else 1), old
        source = source.replace(old, new)
    source = source.replace("\n@gluon.jit\ndef _find_block", STAMP + "\n\n@gluon.jit\ndef _find_block", 1)
    path = folder / "prefill_hopper_stamped.py"
    path.write_text(source)
    return module_from(path, path.stem)


def main() -> None:
    out_path = sys.argv[1]
    b, copy_gbps, _, _ = rag_sweep_bench()
    s = b.s
    inputs, _ = rag_case(b, 1, False, copies=6)
    splits = prefill_hopper.num_splits(s.question, s.q_heads, s.kv_heads, b.device)
    programs = splits * s.kv_heads
    stamps = torch.zeros(programs, SLOTS, dtype=torch.int64, device=b.device)
    kv_new = torch.randn(s.question, 2, s.kv_heads, s.head_dim, dtype=DTYPE, device=b.device)
    slots = torch.full((s.question,), -1, dtype=torch.int64, device=b.device)
    positions = rag_positions(b, inputs[0][3])
    with tempfile.TemporaryDirectory() as tmp:
        module = stamped_module(Path(tmp))
        module.STAMPS = [stamps]

        def layer(mod, q, k, v, pb):
            rq = rope_write_kv(q, kv_new[:, 0], kv_new[:, 1], positions, slots, k, v, b.tables)
            return mod.short_prefill_attention(rq, k, v, pb, b.tables, b.scale, splits)

        row = {"splits": splits, "programs": programs}
        for rnd in range(2):
            for name, mod in (("stamped", module), ("this", prefill_hopper)):
                row[f"{name} layer r{rnd} us"] = graph_us(b, [functools.partial(layer, mod, *i) for i in inputs])
        torch.cuda.synchronize()
        st = stamps.cpu().tolist()
    clocks = [[p[i + 1] - p[i] for i in range(6)] for p in st]
    ns = [(p[8] - p[7]) for p in st]
    cyc = [p[6] - p[0] for p in st]
    ghz = statistics.median(c / n for c, n in zip(cyc, ns) if n > 0)
    row["sm_ghz"] = ghz
    for i, name in enumerate(PHASES):
        vals = sorted(c[i] / ghz / 1e3 for c in clocks)
        row[f"{name} us"] = {"min": vals[0], "median": statistics.median(vals), "max": vals[-1]}
    t0 = min(p[7] for p in st)
    starts = sorted((p[7] - t0) / 1e3 for p in st)
    ends = sorted((p[8] - t0) / 1e3 for p in st)
    row["program start us (global)"] = {"min": starts[0], "median": statistics.median(starts), "max": starts[-1]}
    row["program end us (global)"] = {"min": ends[0], "median": statistics.median(ends), "max": ends[-1]}
    row["raw"] = st
    print(json.dumps({k: v for k, v in row.items() if k != "raw"}, indent=1), flush=True)
    Path(out_path).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
