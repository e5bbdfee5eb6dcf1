"""Session 21: where a batch-1 decode step's time goes, kernel by kernel, at short context (Llama-3.1-8B shapes,
random weights, CUDA graphs, the engine as benchmarks/engine.py builds it with overlapped scheduling off).

One steady decode step is profiled (torch.profiler, CUDA activity). Its kernels are cut into layers at each decode
attention launch, and each position within a layer gets its median time over the 32 layers. With LAZYATTN_PDL=0 the
times are each kernel's own; with PDL on, a kernel's time also counts its wait for the one before. Also printed: the
step's span on the GPU (first kernel start to last kernel end), the sum of kernel times, and the gaps between them.

    LAZYATTN_PDL=0 python benchmarks/results/engine_perf/s21/decode_profile.py OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

import engine as eng  # noqa: E402  (benchmarks/engine.py)

from lazyattn import SamplingParams  # noqa: E402
from lazyattn.engine.prompt import RenderedPrompt  # noqa: E402
from lazyattn.kernels.launch import pdl_on  # noqa: E402

ATTENTION = "_decode_split_kernel"
# Weight bytes of each product of a layer at Llama-3.1-8B shapes (bf16), for the reader: qkv 50.3 MB, o 33.6 MB,
# gate_up 234.9 MB, down 117.4 MB; lm_head 1050.7 MB.


def main() -> None:
    out_path = sys.argv[1]
    device = torch.device("cuda")
    shapes = eng.Shapes(batches=(1,), async_scheduling=False)
    bandwidth = eng.copy_bandwidth(device, shapes.copy_mib, shapes.copy_repeats)
    bench = eng.Bench(shapes, device, bandwidth)
    prompt = RenderedPrompt(segments=[], final=[bench.bos] + eng.random_tokens(31, 3, bench.vocab))
    bench.add(prompt, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    for _ in range(6):  # the prefill step and the first decode steps (graph capture, warm-up)
        bench.engine.step()
    eng.sync(device)
    steps = []
    for _ in range(3):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            bench.engine.step()
            eng.sync(device)
        kernels = sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                          if e.device_type == torch.autograd.DeviceType.CUDA
                          and not e.name.startswith(("Memcpy", "Memset"))), key=lambda k: k[0])
        steps.append(kernels)
    bench.drain()
    kernels = steps[-1]
    span = kernels[-1][1] - kernels[0][0]
    busy = sum(end - start for start, end, _ in kernels)
    gaps = sum(max(0.0, kernels[i + 1][0] - kernels[i][1]) for i in range(len(kernels) - 1))
    marks = [i for i, k in enumerate(kernels) if k[2] == ATTENTION]
    layers = [kernels[a:b] for a, b in zip(marks, marks[1:])]  # from one attention launch to the next
    width = min(len(layer) for layer in layers) if layers else 0
    per_position = []
    for pos in range(width):
        times = [layer[pos][1] - layer[pos][0] for layer in layers]
        per_position.append({"position": pos, "kernel": layers[0][pos][2][:60], "median_us": statistics.median(times),
                             "min_us": min(times), "max_us": max(times)})
    head = [{"kernel": name[:60], "us": end - start} for start, end, name in kernels[:marks[0]]] if marks else []
    tail = [{"kernel": name[:60], "us": end - start} for start, end, name in kernels[marks[-1]:]] if marks else []
    result = {"pdl": pdl_on(device), "bandwidth_gbs": bandwidth / 1e9, "kernels": len(kernels),
              "span_us": span, "busy_us": busy, "gaps_us": gaps,
              "spans_us_all_steps": [s[-1][1] - s[0][0] for s in steps],
              "before_first_attention": head, "layer_positions": per_position, "last_layer_and_after": tail}
    print(json.dumps(result, indent=1), flush=True)
    Path(out_path).write_text(json.dumps(result, indent=1))
    bench.llm.shutdown()


if __name__ == "__main__":
    main()
