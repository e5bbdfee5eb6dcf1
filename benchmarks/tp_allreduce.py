"""All-reduce latency of a tensor-parallel group, by route (parallel/all_reduce.py): NCCL, and torch's symmetric
memory one-shot and two-shot, for the row blocks the model sums (decode batches, small prefill buckets, long chunks),
eagerly and captured in a CUDA graph; and each route's sum checked against NCCL's (fp32, exact).

    python -m benchmarks.tp_allreduce --out OUT.json [--hidden 4096,8192] [--rows 1,16,64,128,256,512,2048]
        [--world-size 4]

Needs --world-size CUDA GPUs (2 by default; NCCL_NVLS_ENABLE=0 etc. are set by lazyattn.parallel.group). Prints one
line per message size; writes the table as JSON. Two ranks' sums are exact (a + b either way); over more ranks the
routes may add in different orders, so sums are compared to fp32 rounding there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.multiprocessing as mp

from lazyattn.envs import read_env  # noqa: E402
from lazyattn.parallel import group as tp_group  # noqa: E402
from lazyattn.parallel.all_reduce import BUFFER_BYTES  # noqa: E402


def _time_us(fn, iters: int = 50, warm: int = 5) -> float:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3


def _graph_us(body, inner: int = 32) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for _ in range(inner):
            body()
    return _time_us(graph.replay, iters=10, warm=2) / inner


def _same(a: torch.Tensor, b: torch.Tensor, size: int) -> bool:
    return bool(torch.equal(a, b)) if size == 2 else torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def _chain_check(symm, device: torch.device, rank: int, size: int) -> bool:
    """Back to back, each input computed from the last sum (what a decode graph does): a rank that overwrote its
    buffer while a peer still read it would change the result. fp32, both routes, against NCCL's chain."""

    def chain(reduce, x: torch.Tensor) -> torch.Tensor:
        for _ in range(64):
            x = reduce(x * 0.5 + rank)
        return x

    def nccl(x):
        torch.distributed.all_reduce(x)
        return x

    ok = True
    for how, rows in (("one_shot", 4), ("two_shot", 256)):  # 64 KiB, 4 MiB
        start = torch.randn(rows, 4096, device=device, generator=torch.Generator(device=device).manual_seed(rank))
        want = chain(nccl, start.clone())
        static = start.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())

        def reduce(x, how=how):
            return symm(x, how)

        with torch.cuda.stream(stream):
            chain(reduce, static)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            got = chain(reduce, static)
        for _ in range(3):
            graph.replay()
        ok = ok and _same(got, want, size)
    return ok


def _rank(rank: int, size: int, port: int, rows: list[int], hidden: list[int], out: str) -> None:
    device = torch.device("cuda", rank)
    tp = tp_group.join(tp_group.connect_store(port, size), rank, size, device, read_env())
    symm = tp.symmetric
    table = {"all_reduce_path": tp.all_reduce_path}
    for h in hidden:
        for r in rows:
            key = f"{r}x{h}"
            x = torch.randn(r, h, dtype=torch.bfloat16, device=device)
            row = {"bytes": x.numel() * 2}

            def nccl(x=x):
                torch.distributed.all_reduce(x)

            routes = {"nccl": nccl}
            if symm is not None and x.numel() * 2 <= BUFFER_BYTES:
                routes["one_shot"] = lambda x=x: symm(x, "one_shot")
                routes["two_shot"] = lambda x=x: symm(x, "two_shot")
            for name, fn in routes.items():
                row[f"{name}_eager_us"] = _time_us(fn)
                row[f"{name}_graph_us"] = _graph_us(fn)
            if symm is not None and x.numel() * 4 <= BUFFER_BYTES:  # exact fp32 sums, every route
                g = torch.Generator(device=device).manual_seed(rank + 7 * r)
                y = torch.randn(r, h, dtype=torch.float32, device=device, generator=g)
                want = y.clone()
                torch.distributed.all_reduce(want)
                row["same_sum"] = all(_same(symm(y, how), want, size) for how in ("one_shot", "two_shot"))
            table[key] = row
            if rank == 0:
                print(key, {k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    if symm is not None:
        table["chained_same_as_nccl"] = _chain_check(symm, device, rank, size)
        if rank == 0:
            print("64 chained all-reduces in one graph, symmetric memory == NCCL:", table["chained_same_as_nccl"])
    torch.distributed.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps(table, indent=1))
    tp_group.leave()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--rows", default="1,16,64,128,256,512,2048")
    p.add_argument("--hidden", default="4096,8192")
    p.add_argument("--world-size", type=int, default=2, help="ranks, one GPU each (2)")
    args = p.parse_args()
    rows = [int(v) for v in args.rows.split(",")]
    hidden = [int(v) for v in args.hidden.split(",")]
    size = args.world_size
    store = tp_group.serve_store(size)  # the ranks meet through this process's loopback TCP store, as the engine's do
    mp.spawn(_rank, args=(size, store.port, rows, hidden, args.out), nprocs=size)


if __name__ == "__main__":
    main()
