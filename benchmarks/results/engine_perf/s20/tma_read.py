"""Session 20: what a launch that reads exactly the batch-1 decode case's K/V tiles by the copy engine reaches.

Session 19's one-launch read (kernels.py `read_kernel`) loads into registers: one program per SM reached 26 % of copy
bandwidth there, and only 528 programs of 8 warps reached 78.8 %. The decode kernel itself runs one program per SM and
keeps its tiles in flight by asynchronous copies, so that read is not its ceiling. This probe is: a Gluon kernel whose
only work is the decode case's tiles (each kv head's pages of K and V, [64, 128] bf16 boxes of the pool, by TMA into a
ring of STAGES slots of 32 KiB, each refilled as soon as its bytes have landed). Nothing reads the shared memory.

Work split, over the (kv head, page) tiles of the entry (8 heads x 161 pages at 10 304 keys):
- "heads": S splits of each kv head's pages (balanced: 10 or 11 pages at S = 16), grid S x 8, as decode splits;
- "flat": P programs over the tiles in (head, page) order, each a balanced range that may cross a head boundary
  (P = 132: 9 or 10 tiles each, against 11 for the heads split's longest program).

Beside it, in the same run and graph form (kernels.py `graph_us`: 32 launches a graph, 4 input copies past L2, PDL as
the engine launches): the engine's decode kernel over the same inputs, and Session 19's read of the same bytes.

    python benchmarks/results/engine_perf/s20/tma_read.py OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import attention, decode_inputs, graph_rounds, rag_sweep_bench, read_ceiling  # noqa: E402

from lazyattn.kernels.launch import sm_count  # noqa: E402
from lazyattn.kernels.prefill_hopper import _descriptor, _tma_load, _wait_for_producers  # noqa: E402

CONTEXT = 10304
ROUNDS = 3


@gluon.jit
def _issue(k_desc, v_desc, pages, f, pred, n_pages, bar, k_buf, v_buf):
    """Flat tile f (kv head f // n_pages, page f % n_pages of the entry) into one ring slot, where pred."""
    head = f // n_pages
    page = gl.load(pages + f % n_pages, mask=pred, other=0)
    mbarrier.expect(bar, 2 * k_desc.block_type.nbytes, pred)
    _tma_load(k_desc, [page * 64, head * 128], bar, k_buf, pred)
    _tma_load(v_desc, [page * 64, head * 128], bar, v_buf, pred)


@gluon.jit
def tma_read_kernel(k_desc, v_desc, pages, Out, n_pages, kv_heads, splits, FLAT: gl.constexpr, STAGES: gl.constexpr,
                    WARPS: gl.constexpr, USE_PDL: gl.constexpr):
    pid = gl.program_id(0)
    if FLAT:
        total = n_pages * kv_heads
        lo = pid * total // gl.num_programs(0)
        hi = (pid + 1) * total // gl.num_programs(0)
    else:
        head = pid // splits
        s = pid % splits
        lo = head * n_pages + s * n_pages // splits
        hi = head * n_pages + (s + 1) * n_pages // splits
    n = hi - lo
    dtype: gl.constexpr = k_desc.block_type.element_ty
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, 64, 128], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, 64, 128], v_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    if USE_PDL:
        _wait_for_producers()
    for i in gl.static_range(STAGES):
        _issue(k_desc, v_desc, pages, lo + i, i < n, n_pages, ready.index(i), k_bufs.index(i), v_bufs.index(i))
    for t in range(n):
        slot = t % STAGES
        mbarrier.wait(ready.index(slot), (t // STAGES) & 1)
        _issue(k_desc, v_desc, pages, lo + t + STAGES, t + STAGES < n, n_pages, ready.index(slot),
               k_bufs.index(slot), v_bufs.index(slot))
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    one = gl.arange(0, 32 * WARPS, layout=layout)
    gl.store(Out + pid + one * 0, n + one * 0, mask=one == 0)


def main() -> None:
    out_path = sys.argv[1]
    b, copy_gbps, _, _ = rag_sweep_bench()
    s = b.s
    inputs, nbytes = decode_inputs(b, 1, CONTEXT, 2)
    sms = sm_count(b.device)
    out = torch.empty(4 * sms, dtype=torch.int32, device=b.device)
    n_pages = int(inputs[0][3].num_pages[0])
    descs = [(_descriptor(k), _descriptor(v), pb.pages) for _, k, v, pb in inputs]

    def read(d, programs, splits, flat, stages, warps=4, pdl=True):
        k_desc, v_desc, pages = d
        extra = {"launch_pdl": True} if pdl else {}
        tma_read_kernel[(programs,)](k_desc, v_desc, pages, out, n_pages, s.kv_heads, splits, FLAT=flat,
                                     STAGES=stages, WARPS=warps, USE_PDL=pdl, num_warps=warps, **extra)

    calls = {}
    for stages in (2, 4, 6):
        calls[f"tma heads 16 x 8, {stages} stages"] = [
            lambda d=d, st=stages: read(d, 16 * s.kv_heads, 16, False, st) for d in descs]
    for stages in (4, 6):
        calls[f"tma flat {sms}, {stages} stages"] = [lambda d=d, st=stages: read(d, sms, 1, True, st) for d in descs]
    calls["tma flat 132, 6 stages, 1 warp"] = [lambda d=d: read(d, sms, 1, True, 6, warps=1) for d in descs]
    calls["tma flat 132, 6 stages, no PDL"] = [lambda d=d: read(d, sms, 1, True, 6, pdl=False) for d in descs]
    calls[f"tma flat {2 * sms}, 3 stages"] = [lambda d=d: read(d, 2 * sms, 1, True, 3) for d in descs]
    calls["tma heads 33 x 8, 3 stages"] = [lambda d=d: read(d, 33 * s.kv_heads, 33, False, 3) for d in descs]
    fn = attention(True)
    calls["decode (engine)"] = [lambda i=i: fn(*i, b.tables, b.scale) for i in inputs]
    row = {"copy_gbps": copy_gbps, "bytes": nbytes, "sms": sms, "pages": n_pages,
           "read_kernel ceiling us": read_ceiling(b, nbytes)}
    row.update(graph_rounds(b, calls, ROUNDS, nbytes, copy_gbps))
    print(json.dumps(row, indent=1), flush=True)
    Path(out_path).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
