"""Where the TTFT of the cached RAG request goes (benchmarks/engine.py's shapes; on the GPU: 8B, bf16): host phases
against the GPU span from a torch.profiler timeline, then a cProfile of the host code. From the repository root:

    python benchmarks/results/engine_perf/s4_ttft_profile.py OUT_DIR
"""

import cProfile
import dataclasses
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import engine as eb  # noqa: E402

from lazyattn import SamplingParams  # noqa: E402

CUDA = torch.cuda.is_available()


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    shapes = dataclasses.replace(eb.Shapes() if CUDA else eb.QUICK, batches=(1,),
                                 sections=("cache_documents", "ttft_rag"))
    bench = eb.Bench(shapes, torch.device("cuda" if CUDA else "cpu"), 3e12)
    bench.cache_documents()
    bench.drain()
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

    def one(seed: int) -> tuple[float, float, int]:
        prompt = bench.rag_prompt(seed)
        sync()
        t0 = time.perf_counter()
        with torch.profiler.record_function("ttft_add"):
            bench.add(prompt, params)
        t1 = time.perf_counter()
        n = 0
        while bench.engine.has_unfinished():
            with torch.profiler.record_function(f"ttft_step{n}"):
                bench.engine.step()
            n += 1
        sync()
        return (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3, n

    for s in range(3):
        one(900 + s)
    plain = [one(1000 + s) for s in range(10)]
    print("plain: add ms median", statistics.median(p[0] for p in plain), "steps ms",
          statistics.median(p[1] for p in plain), "nsteps", plain[0][2])
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if CUDA else [])
    with torch.profiler.profile(activities=activities) as prof:
        for s in range(3):
            one(2000 + s)
    trace = out / "ttft_trace.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    trace.unlink()
    marks = sorted((e for e in events if e.get("name", "").startswith("ttft_") and e.get("ph") == "X"
                    and e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    gpu_cats = ("kernel", "gpu_memcpy", "gpu_memset")
    device = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in gpu_cats), key=lambda e: e["ts"])
    for m in marks:
        a, b = m["ts"], m["ts"] + m["dur"]
        ks = [k for k in device if a <= k["ts"] <= b + 20000]
        print({"name": m["name"], "dur_us": m["dur"], "n_gpu": len(ks),
               "first_gpu_after_us": (ks[0]["ts"] - a) if ks else None,
               "last_gpu_end_before_end_us": (b - max(k["ts"] + k["dur"] for k in ks)) if ks else None,
               "gpu_busy_us": sum(k["dur"] for k in ks)})
    host_cats = ("cpu_op", "cuda_runtime", "cuda_driver")
    host = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in host_cats), key=lambda e: -e["dur"])
    print("longest cpu/runtime events:", [(e["name"][:50], e["dur"]) for e in host[:25]])
    profile = cProfile.Profile()
    profile.enable()
    for s in range(10):
        one(3000 + s)
    profile.disable()
    for order, rows in (("cumulative", 45), ("tottime", 30)):
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats(order).print_stats(rows)
        print(text.getvalue())
    bench.llm.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
