"""Session 21: the short prefill's load warp issuing its first tiles before the PDL wait, against the kernel as it
is, at batch 1, 2 and 8 of kernels.py's RAG case, at the engine's split count.

The load warp now waits for the kernel before this one (the RoPE launch, which writes the question's K/V) before its
first copy. Cached documents' pages were written by kernels that finished before that one started, so their tiles
may come earlier. The variant "early" issues the leading tiles of a program's range (up to one per ring slot) before
the wait, for as long as a page holds only keys before the entry's question. That is a page whose keys, at positions
[start, start + valid), all lie before q_start.

In the engine that test alone is not enough: an entry may read, in the same step, a document that another entry of
the batch encodes (engine/modes.py). This probe only measures what the early copies would save. Each form is timed as
the targets are (graph_us), alone ("attention") and after the RoPE launch ("layer"), ROUNDS alternated rounds.
Output: max |early - kernel| (0 expected).

    python benchmarks/results/engine_perf/s21/early_tiles.py OUT.json [BATCHES]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import patched_module, probe_rows, rag_sweep_bench, short_prefill_ab  # noqa: E402

from lazyattn.kernels import prefill_hopper  # noqa: E402

ROUNDS = 3
EARLY = [
    ("""def _load_tiles(k_desc, v_desc, pages_row, k_bufs, v_bufs, ready, empty, kv_head, page_lo, n_tiles):""",
     """def _load_tiles(k_desc, v_desc, pages_row, starts_row, valid_row, pos0, k_bufs, v_bufs, ready, empty, kv_head,
                page_lo, n_tiles):"""),
    ("""    page_next = gl.load(pages_row + page_lo, mask=n_tiles > 0, other=0)
    _wait_for_producers()
    for t in range(n_tiles):
        page = page_next
""", """    early = gl.minimum(n_tiles, STAGE_COUNT)
    t0 = 0
    go = early > 0
    while go:
        p = page_lo + t0
        old = gl.load(starts_row + p) + gl.load(valid_row + p) <= pos0
        if old:
            page = gl.load(pages_row + p)
            mbarrier.expect(ready.index(t0), 2 * k_desc.block_type.nbytes)
            _tma_load(k_desc, [page * _KPAGE_SIZE, column], ready.index(t0), k_bufs.index(t0))
            _tma_load(v_desc, [page * _KPAGE_SIZE, column], ready.index(t0), v_bufs.index(t0))
            t0 += 1
        go = old & (t0 < early)
    page_next = gl.load(pages_row + page_lo + t0, mask=t0 < n_tiles, other=0)
    _wait_for_producers()
    for t in range(t0, n_tiles):
        page = page_next
"""),
    ("""    loads = (k_desc, v_desc, pages + table, k_bufs, v_bufs, ready, empty, kv_head, page_lo, n_tiles)""",
     """    loads = (k_desc, v_desc, pages + table, starts_row, valid_row, pos0, k_bufs, v_bufs, ready, empty, kv_head,
             page_lo, n_tiles)"""),
]


def main() -> None:
    out_path = sys.argv[1]
    batches = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,2,8").split(",")]
    b, copy_gbps, kv_bytes, copies = rag_sweep_bench()
    tmp = tempfile.TemporaryDirectory()
    early = patched_module(Path(prefill_hopper.__file__), Path(tmp.name), "prefill_hopper_early", EARLY)

    def row(batch: int) -> dict:
        modules = {"kernel": prefill_hopper, "early": early}
        result, outs, _ = short_prefill_ab(b, batch, max(4, copies // batch), modules, ROUNDS, kv_bytes, copy_gbps)
        result["max |early - kernel|"] = (outs["early"] - outs["kernel"]).abs().max().item()
        return result

    probe_rows(out_path, {"rounds": ROUNDS}, batches, row)


if __name__ == "__main__":
    main()
