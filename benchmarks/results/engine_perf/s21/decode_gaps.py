"""Session 21: is the GPU idle between batch-1 decode steps? The engine's overlapped scheduling queues step N+1 while
step N runs. At short context `engine.py` measures 5.62 ms a step, and s21/c7's profile of one step, run alone,
measured a span of 5.45 ms on the GPU.

STEPS consecutive steady decode steps (the engine as benchmarks/engine.py builds it, overlap on) are profiled in one
region (torch.profiler, CUDA activity: kernels, copies and sets). Reported: the wall time per step, the GPU span and
busy time per step, and every idle gap over 5 us on the GPU, with the events on either side. The host side
(`engine.step` as a whole, and the ranges the profiler names) is summed per step as well.

    python benchmarks/results/engine_perf/s21/decode_gaps.py OUT.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

import engine as eng  # noqa: E402  (benchmarks/engine.py)

from lazyattn import SamplingParams  # noqa: E402
from lazyattn.engine.prompt import RenderedPrompt  # noqa: E402

STEPS = 6


def main() -> None:
    out_path = sys.argv[1]
    device = torch.device("cuda")
    shapes = eng.Shapes(batches=(1,))
    bandwidth = eng.copy_bandwidth(device, shapes.copy_mib, shapes.copy_repeats)
    bench = eng.Bench(shapes, device, bandwidth)
    prompt = RenderedPrompt(segments=[], final=[bench.bos] + eng.random_tokens(31, 3, bench.vocab))
    bench.add(prompt, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    for _ in range(8):
        bench.engine.step()
    walls = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            t0 = time.perf_counter()
            bench.engine.step()
            walls.append(1e6 * (time.perf_counter() - t0))
    bench.drain()
    events = prof.events()
    gpu = sorted(((e.time_range.start, e.time_range.end, e.name) for e in events
                  if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda k: k[0])
    span = gpu[-1][1] - gpu[0][0]
    busy = sum(end - start for start, end, _ in gpu)
    gaps = []
    for i in range(len(gpu) - 1):
        idle = gpu[i + 1][0] - gpu[i][1]
        if idle > 5:
            gaps.append({"idle_us": idle, "after": gpu[i][2][:70], "before": gpu[i + 1][2][:70],
                         "at_us": gpu[i][1] - gpu[0][0]})
    host: dict[str, float] = {}
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CPU and not e.name.startswith("aten::"):
            host[e.name] = host.get(e.name, 0.0) + e.time_range.elapsed_us()
    top_host = sorted(host.items(), key=lambda kv: -kv[1])[:25]
    result = {"steps": STEPS, "wall_us_per_step": walls, "gpu_span_us_per_step": span / STEPS,
              "gpu_busy_us_per_step": busy / STEPS, "gpu_events": len(gpu), "gaps_over_5us": gaps,
              "host_ranges_us_per_step": [[name[:80], us / STEPS] for name, us in top_host]}
    print(json.dumps(result, indent=1), flush=True)
    Path(out_path).write_text(json.dumps(result, indent=1))
    bench.llm.shutdown()


if __name__ == "__main__":
    main()
