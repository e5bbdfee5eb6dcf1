"""Session 20: where a batch-1 decode step's attention time goes (kernels/decode.py), by clock stamps.

A copy of decode.py whose programs write the SM's cycle counter (%clock64) at their phases and the GPU's global timer
(ns) at entry and end, so programs line up across SMs. The case is the attention target's: batch 1 over 10 304 keys
(kernels.py `decode_case`, segments of 2048 at random deltas), attention alone, in a CUDA graph of 32 launches as
`graph_us` times it (4 input copies past L2); the stamps are the last launch's.

Phases of a program (cycles, converted at the SM clock the stamps measure):
- entry -> after the PDL wait: the page tables' loads, then waiting for the kernel before;
- -> loop end: q, the tiles (the loop is pipelined, so q's load and the first tile's latency are in here);
- -> counted: the partial's store and the arrival count;
- merger only: -> merged (the last split's loads of every partial, the sums, the output's store).
Global: program starts and ends against the first start; the launch's span (first start to the merger's end) against
the per-launch time of the graph, which also holds the gap to the next launch.

    python benchmarks/results/engine_perf/s20/decode_timeline.py OUT.json

Calls 1 and 4 ran it on the decode.py of commits 8c96869 and 91606e6 (the wait's stamp then followed
`wait_for_producers(USE_PDL)\n\n    g = tl.arange`); the patches now match the later decode.py (b6cd0f2 on).
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
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import decode_inputs, decode_layer, graph_us, patched_module, rag_sweep_bench  # noqa: E402

from lazyattn.kernels import decode  # noqa: E402

CONTEXT = 10304
SLOTS = 10  # per program: 0-4 clock64 at entry, after wait, loop end, counted, merged; 5 its SM; 7-9 globaltimer at
# 0, 3, 4
STAMP = '''

@triton.jit
def _stamp(Stamps, pid, slot, pred, GLOBAL: tl.constexpr = False, SMID: tl.constexpr = False):
    if SMID:
        t = tl.inline_asm_elementwise("mov.u32 $0, %smid; // $1", "=r,r", [pid], dtype=tl.int32, is_pure=False,
                                      pack=1).to(tl.int64)
    elif GLOBAL:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer; // $1", "=l,r", [pid], dtype=tl.int64,
                                      is_pure=False, pack=1)
    else:
        t = tl.inline_asm_elementwise("mov.u64 $0, %clock64; // $1", "=l,r", [pid], dtype=tl.int64,
                                      is_pure=False, pack=1)
    tl.store(Stamps + pid.to(tl.int64) * 10 + slot, t, mask=pred)
'''
PATCHES = [
    # the scratch pointers of the kernel's and _decode_split's signatures and the call between them
    ("q_ptr, k_ptr, v_ptr, k_desc, v_desc, out_ptr, acc_ptr, m_ptr, l_ptr, counters_ptr,",
     "q_ptr, k_ptr, v_ptr, k_desc, v_desc, out_ptr, acc_ptr, m_ptr, l_ptr, counters_ptr, Stamps,", 3),
    ("q, k_cache, v_cache, k_desc, v_desc, out, acc, m, l, arrivals,",
     "q, k_cache, v_cache, k_desc, v_desc, out, acc, m, l, arrivals, STAMPS[0],", 1),
    ("    per_split = tl.cdiv(n_pages, splits)\n",
     "    spid = kv_head * num_splits + split\n    _stamp(Stamps, spid, 0, True)\n"
     "    _stamp(Stamps, spid, 7, True, True)\n    _stamp(Stamps, spid, 5, True, False, True)\n"
     "    per_split = tl.cdiv(n_pages, splits)\n", 1),
    ("    wait_for_producers(USE_PDL)\n\n    heads = kv_head",
     "    wait_for_producers(USE_PDL)\n    _stamp(Stamps, spid, 1, True)\n\n    heads = kv_head", 1),
    ("    if DIRECT or splits == 1:\n", "    _stamp(Stamps, spid, 2, True)\n    if DIRECT or splits == 1:\n", 1),
    ("        if tl.atomic_add(counter, 1, sem=\"acq_rel\", scope=\"gpu\") == splits - 1:\n",
     "        arrived = tl.atomic_add(counter, 1, sem=\"acq_rel\", scope=\"gpu\")\n"
     "        _stamp(Stamps, spid, 3, True)\n        _stamp(Stamps, spid, 8, True, True)\n"
     "        if arrived == splits - 1:\n", 1),
    ("            tl.store(counter, 0)\n",
     "            tl.store(counter, 0)\n            _stamp(Stamps, spid, 4, True)\n"
     "            _stamp(Stamps, spid, 9, True, True)\n", 1),
]
PHASES = ("entry -> after wait", "-> loop end", "-> counted", "-> merged (merger)")


def stamped_module(folder: Path):
    helper = ("\n@triton.jit\ndef _pair_layout", STAMP + "\n\n@triton.jit\ndef _pair_layout")
    return patched_module(Path(decode.__file__), folder, "decode_stamped", [*PATCHES, helper])


def spread(vals: list[float]) -> dict:
    vals = sorted(vals)
    return {"min": vals[0], "median": statistics.median(vals), "max": vals[-1]} if vals else {}


def analyse(st: list[list[int]]) -> dict:
    row = {}
    ghz = statistics.median((p[3] - p[0]) / (p[8] - p[7]) for p in st if p[8] > p[7])
    row["sm_ghz"] = ghz
    row["programs"] = len(st)
    per = [[(p[i + 1] - p[i]) / ghz / 1e3 for i in range(3)] for p in st]
    for i, name in enumerate(PHASES[:3]):
        row[f"{name} us"] = spread([x[i] for x in per])
    mergers = [p for p in st if p[9] > p[8]]  # (an earlier launch's merger may have been another program)
    row[f"{PHASES[3]} us"] = spread([(p[4] - p[3]) / ghz / 1e3 for p in mergers])
    t0 = min(p[7] for p in st)
    row["program start us (global)"] = spread([(p[7] - t0) / 1e3 for p in st])
    row["program counted us (global)"] = spread([(p[8] - t0) / 1e3 for p in st])
    row["merger end us (global)"] = spread([(p[9] - t0) / 1e3 for p in mergers])
    row["span us (first start to last merger end)"] = (max(p[9] for p in mergers) - t0) / 1e3 if mergers else None
    # Programs that shared an SM with another of the launch, against those alone on theirs (call 4 on).
    on_sm: dict[int, int] = {}
    for p in st:
        on_sm[p[5]] = on_sm.get(p[5], 0) + 1
    for label, keep in (("alone on its SM", lambda p: on_sm[p[5]] == 1), ("sharing its SM", lambda p: on_sm[p[5]] > 1)):
        loops = [(p[2] - p[1]) / ghz / 1e3 for p in st if keep(p)]
        row[f"loop us, {label}"] = {"programs": len(loops), **spread(loops)}
    row["raw"] = st
    return row


def main() -> None:
    out_path = sys.argv[1]
    b, copy_gbps, _, _ = rag_sweep_bench()
    s = b.s
    inputs, nbytes = decode_inputs(b, 1, CONTEXT, 2)
    n_pages = int(inputs[0][3].num_pages[0])
    rule = decode._default_rule(inputs[0][0], s.kv_heads)
    grid_splits = rule.unrounded(n_pages)
    stamps = torch.zeros(grid_splits * s.kv_heads, SLOTS, dtype=torch.int64, device=b.device)
    rope_then = decode_layer(b, 1)
    result = {"copy_gbps": copy_gbps, "bytes": nbytes, "pages": n_pages, "grid splits": grid_splits,
              "splits": rule.splits(n_pages)}
    with tempfile.TemporaryDirectory() as tmp:
        module = stamped_module(Path(tmp))
        module.STAMPS = [stamps]

        def attend(mod, counters, q, k, v, pb):
            return mod.decode_attention(q, k, v, pb, b.tables, b.scale, counters=counters)

        def layer(mod, counters, q, k, v, pb):
            return rope_then(functools.partial(attend, mod, counters), q, k, v, pb)

        for form, fn in (("attention", attend), ("layer", layer)):
            row = {}
            for rnd in range(2):
                for name, mod in (("this", decode), ("stamped", module)):  # the stamped graph last: its stamps
                    counters = mod.ArrivalCounters()
                    row[f"{name} r{rnd} us"] = graph_us(b, [functools.partial(fn, mod, counters, *i) for i in inputs])
            torch.cuda.synchronize()
            row.update(analyse([p for p in stamps.cpu().tolist() if p[7] > 0]))  # (programs past the splits: none)
            print(form, json.dumps({k: v for k, v in row.items() if k != "raw"}, indent=1), flush=True)
            result[form] = row
    Path(out_path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
