"""Probe (H100): the host cost of CUDAGraph.replay() for straight-line graphs by kernel count, and the wall time of
360 bandwidth-bound products as one graph vs the same products split into pieces (launch overlapped with work).

    python benchmarks/results/engine_perf/s4_graph_launch_probe.py
"""

import statistics
import time

import torch

DEV = "cuda"


def build(n_kernels: int, kind: str) -> torch.cuda.CUDAGraph:
    if kind == "tiny":
        x = torch.zeros(1024, device=DEV)

        def body():
            x.add_(1.0)
    else:  # a [1, 4096] x [4096, 4096] bf16 product: ~10 us of weight reads
        w = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16)
        a = torch.randn(1, 4096, device=DEV, dtype=torch.bfloat16)
        o = torch.empty(1, 4096, device=DEV, dtype=torch.bfloat16)

        def body():
            torch.mm(a, w.t(), out=o)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            body()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n_kernels):
            body()
    return graph


def wall_us(graphs: list[torch.cuda.CUDAGraph]) -> float:
    times = []
    for i in range(23):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for g in graphs:
            g.replay()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    res = {}
    for n in (10, 90, 360, 720):
        g = build(n, "tiny")
        for _ in range(5):
            g.replay()
        times = []
        for _ in range(30):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            g.replay()
            times.append(time.perf_counter() - t0)
        res[f"launch_host_us_tiny_{n}"] = statistics.median(times) * 1e6
    one = build(360, "gemm")
    res["wall_us_one_graph_360"] = wall_us([one])
    for split in ((12, 348), (12, 36, 96, 216), (4, 8, 24, 60, 264)):
        res[f"wall_us_pieces_{'-'.join(map(str, split))}"] = wall_us([build(n, "gemm") for n in split])
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    one.replay()
    start.record()
    for _ in range(10):
        one.replay()
    end.record()
    torch.cuda.synchronize()
    res["gpu_us_one_graph_360"] = start.elapsed_time(end) * 100
    print(res)


if __name__ == "__main__":
    main()
