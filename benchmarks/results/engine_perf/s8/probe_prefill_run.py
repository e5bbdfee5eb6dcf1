"""Session 8, call 11: PrefillGraphs.run timed line by line inside the cached RAG request's path (the method
replaced by a copy of it with timers; median over 40 requests after 3). From the repository root, on the GPU:

    PYTHONPATH=$PWD python benchmarks/results/engine_perf/s8/probe_prefill_run.py

Output (H100, µs): {'sync': 4.5, 'fill': 67.9, 'upto': 15.8, 'copy_': 25.4, 'record': 22.2, 'lookup': 1.1,
'replay': 15.1, 'slice': 3.4}
"""

import statistics
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
import engine as eb  # noqa: E402  (benchmarks/engine.py)

from lazyattn import SamplingParams  # noqa: E402
from lazyattn.engine import prefill_graphs  # noqa: E402

NAMES = ("sync", "fill", "upto", "copy_", "record", "lookup", "replay", "slice")
marks: dict[str, list[float]] = {}


def run(self, step, bucket):
    t = [time.perf_counter()]
    tokens, entries = bucket
    self.copied.synchronize()
    t.append(time.perf_counter())
    self.layout.fill(self.staging, step, tokens, entries)
    t.append(time.perf_counter())
    dst, src = self.static.upto(entries), self.staging.upto(entries)
    t.append(time.perf_counter())
    dst.copy_(src, non_blocking=True)
    t.append(time.perf_counter())
    self.copied.record()
    t.append(time.perf_counter())
    graph, logits = self.graphs[bucket]
    t.append(time.perf_counter())
    graph.replay()
    t.append(time.perf_counter())
    self.replays += 1
    out = logits[: len(step.logits_rows)]
    t.append(time.perf_counter())
    for i, name in enumerate(NAMES):
        marks.setdefault(name, []).append(1e6 * (t[i + 1] - t[i]))
    return out


def main() -> None:
    prefill_graphs.PrefillGraphs.run = run
    bench = eb.Bench(eb.Shapes(batches=(1,)), torch.device("cuda"), 3e12)
    bench.cache_documents()
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    for i in range(43):
        prompt = bench.rag_prompt(9000 + i)
        torch.cuda.synchronize()
        bench.add(prompt, params)
        bench.drain()
        if i == 2:
            marks.clear()
    print({k: round(statistics.median(v), 1) for k, v in marks.items()})
    bench.llm.shutdown()


if __name__ == "__main__":
    main()
