"""Where a cached RAG request's first token waits for the host (the GPU: 8B shapes, bf16, CUDA graphs).

Measurements in one process, each printed as a table and written to OUT.json:

- `graphs`: how long `CUDAGraph.replay` holds the host for graphs of N kernels (a trivial Triton kernel with and
  without programmatic dependent launch, and PyTorch's add_), and when the GPU starts a graph relative to its
  launch. Each graph begins and ends with a kernel that writes the GPU's %globaltimer; a stamp launched eagerly
  just before the replay is the reference. With a small graph then a large one launched back to back, the small
  one's start says whether the GPU begins before the host has launched the large one.
- `engine_graphs`: the engine's own prefill graph (the cached RAG request's bucket) and batch-1 decode graph: host
  time of the replay, and its GPU span from an event before the replay to one after it, with the GPU idle
  (the span includes waiting for the launch) and with the GPU busy on a sleep queued first (the span is then the
  graph's GPU time alone). The difference is what the launch leaves exposed.
- `phases`: the first token's host timeline, by phase (add_request, scheduling, staging, replay, sampling, the
  wait, output), median µs from the request's submission, over `--repeats` requests.
- `host_calls`: the CUDA-side calls the prefill-graph path makes before its replay, each alone on an idle GPU.
- `gc`: TTFT with Python's garbage collector as it is, frozen after warm-up and disabled, alternated.
- `waits`: TTFT with the host waiting for the token as the engine does (`Event.synchronize`, the CUDA driver's
  wait) and by a bare `Event.query` loop from Python, alternated.

    python -m benchmarks.ttft_anatomy --out OUT [--sections graphs,engine_graphs,phases,host_calls,gc,waits]  # GPU
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl

from benchmarks import engine as eb  # the shapes and the RAG request
from lazyattn import SamplingParams  # noqa: E402
from lazyattn.engine import (  # noqa: E402
    intake,
    limits,
    llm_engine,
    model_runner,
    prefill_graphs,
    scheduler,
    step_launch,
)
from lazyattn.kernels.launch import pdl_options, wait_for_producers  # noqa: E402


@triton.jit
def _stamp(out_ptr, i):
    x = tl.load(out_ptr + i)
    t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,l", [x], dtype=tl.int64, is_pure=False, pack=1)
    tl.store(out_ptr + i, t)


@triton.jit
def _noop(x_ptr, USE_PDL: tl.constexpr):
    wait_for_producers(USE_PDL)
    tl.store(x_ptr + tl.program_id(0), tl.load(x_ptr + tl.program_id(0)) + 1.0)


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def graph_launches(device: torch.device, sizes=(16, 64, 234), repeats: int = 30) -> list[dict]:
    stamps = torch.zeros(8, dtype=torch.int64, device=device)
    x = torch.zeros(132, device=device)
    kinds: dict[str, Callable[[], None]] = {
        "triton": lambda: _noop[(132,)](x, USE_PDL=False),
        "triton_pdl": lambda: _noop[(132,)](x, **pdl_options(device, "norm")),
        "torch_add": lambda: x.add_(1.0),
    }
    rows = []
    for kind, launch in kinds.items():
        launch()
        torch.cuda.synchronize()
        graphs = {}
        for n in sizes + (8,):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                _stamp[(1,)](stamps, 1 if n == 8 else 2)
                for _ in range(n):
                    launch()
                _stamp[(1,)](stamps, 3 if n == 8 else 4)
            graphs[n] = g
        for n in sizes:
            host, start, span = [], [], []
            pair_small, pair_big, pair_host = [], [], []
            for r in range(repeats + 3):
                torch.cuda.synchronize()
                _stamp[(1,)](stamps, 0)
                t0 = time.perf_counter()
                graphs[n].replay()
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                s = stamps.tolist()
                if r >= 3:
                    host.append(1e6 * (t1 - t0))
                    start.append((s[2] - s[0]) / 1e3)
                    span.append((s[4] - s[0]) / 1e3)
                # a small graph, then this one
                torch.cuda.synchronize()
                _stamp[(1,)](stamps, 0)
                t0 = time.perf_counter()
                graphs[8].replay()
                t1 = time.perf_counter()
                graphs[n].replay()
                t2 = time.perf_counter()
                torch.cuda.synchronize()
                s = stamps.tolist()
                if r >= 3:
                    pair_small.append((s[1] - s[0]) / 1e3)
                    pair_big.append((s[2] - s[0]) / 1e3)
                    pair_host.append((1e6 * (t1 - t0), 1e6 * (t2 - t1)))
            rows.append(
                {
                    "kind": kind,
                    "kernels": n,
                    "replay_host_us": _median(host),
                    "host_us_per_kernel": _median(host) / n,
                    "gpu_start_after_stamp_us": _median(start),
                    "gpu_end_after_stamp_us": _median(span),
                    "pair_small_host_us": _median([p[0] for p in pair_host]),
                    "pair_big_host_us": _median([p[1] for p in pair_host]),
                    "pair_small_start_us": _median(pair_small),
                    "pair_big_start_us": _median(pair_big),
                }
            )
            print(rows[-1], flush=True)
    return rows


def _span(graph: torch.cuda.CUDAGraph, busy_ms: float) -> tuple[float, float]:
    """(host µs of replay, GPU µs from an event before it to one after it), the GPU idle or first busy."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    if busy_ms:
        torch.cuda._sleep(int(busy_ms * 1.98e6))  # cycles at ~1.98 GHz
    a.record()
    t0 = time.perf_counter()
    graph.replay()
    t1 = time.perf_counter()
    b.record()
    b.synchronize()
    return 1e6 * (t1 - t0), 1e3 * a.elapsed_time(b)


def engine_graphs(bench: eb.Bench, repeats: int = 20) -> dict:
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    bench.add(bench.rag_prompt(77), params)
    while bench.engine.has_unfinished():
        bench.engine.step()
    torch.cuda.synchronize()
    runner = bench.engine.executor.runner
    out = {}
    picks = {"decode_b1": runner.graphs.graphs[1][0]}
    # the RAG request's bucket: its prefill step is one entry (the question over the placed documents) + padding
    picks.update(
        {
            f"prefill_{t}x{e}": g
            for (t, e), (g, _) in runner.prefill_graphs.graphs.items()
            if t == bench.s.question and e == 2
        }
    )
    for name, graph in picks.items():
        idle = [_span(graph, 0) for _ in range(repeats)]
        busy = [_span(graph, 3.0) for _ in range(repeats)]
        out[name] = {
            "replay_host_us_idle": _median([h for h, _ in idle]),
            "replay_host_us_busy": _median([h for h, _ in busy]),
            "gpu_span_us_idle": _median([s for _, s in idle]),
            "gpu_span_us_busy": _median([s for _, s in busy]),
            "exposed_us": _median([s for _, s in idle]) - _median([s for _, s in busy]),
        }
        print(name, out[name], flush=True)
    return out


def host_calls(bench: eb.Bench, repeats: int = 200) -> dict:
    """Host µs of the CUDA-side calls the prefill-graph path makes before its replay (PrefillGraphs.run), on an idle
    GPU, median of `repeats`: the event wait, the two buffer views, the staging copy, the event record."""
    pg = bench.engine.executor.runner.prefill_graphs
    entries = 2
    times: dict[str, list[float]] = {}

    def timed(name: str, fn) -> None:
        t0 = time.perf_counter()
        fn()
        times.setdefault(name, []).append(1e6 * (time.perf_counter() - t0))

    dst, src = pg.static.upto(entries), pg.staging.upto(entries)
    for _ in range(repeats):
        torch.cuda.synchronize()
        timed("copied.synchronize", pg.copied.synchronize)
        timed("upto x2", lambda: (pg.static.upto(entries), pg.staging.upto(entries)))
        timed("copy_ (pinned -> device)", lambda: dst.copy_(src, non_blocking=True))
        timed("copied.record", pg.copied.record)
        timed("tensor index + int()", lambda: int(src[0]))
    out = {name: _median(ts) for name, ts in times.items()}
    out["staged_bytes"] = src.numel()
    out["staging_pinned"] = bool(src.is_pinned())
    print("host_calls", out, flush=True)
    return out


def _ttft_ms(bench: eb.Bench, seed: int) -> float:
    """One cached RAG request on an idle engine, as benchmarks/engine.py times it: add_request until `step` returns
    its first (and only) token."""
    prompt = bench.rag_prompt(seed)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    bench.add(prompt, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    while bench.engine.has_unfinished():
        bench.engine.step()
    return 1e3 * (time.perf_counter() - t0)


def gc_effect(bench: eb.Bench, repeats: int, rounds: int = 3) -> dict:
    """TTFT (add_request until step returns the token, as benchmarks/engine.py times it) with Python's cyclic garbage
    collector as it is, with the objects alive after warm-up frozen out of it (gc.freeze), and disabled; alternated
    `rounds` times, median of `repeats` each; and how many collections of each generation ran per request."""
    collections = [0, 0, 0]

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            collections[info["generation"]] += 1

    out: dict = {}
    gc.callbacks.append(count)
    try:
        for r in range(rounds):
            for mode in ("default", "freeze", "disable"):
                if mode == "freeze":
                    gc.collect()
                    gc.freeze()
                elif mode == "disable":
                    gc.disable()
                before = list(collections)
                times = [_ttft_ms(bench, 5000 + 100 * r + i) for i in range(repeats)]
                per = [(a - b) / repeats for a, b in zip(collections, before)]
                gc.enable()
                gc.unfreeze()
                out.setdefault(mode, []).append({"ttft_ms": _median(times), "collections_per_request": per})
                print("gc", r, mode, out[mode][-1], flush=True)
    finally:
        gc.callbacks.remove(count)
        gc.enable()
        gc.unfreeze()
    out["tracked_objects"] = len(gc.get_objects())
    return out


def wait_effect(bench: eb.Bench, repeats: int, rounds: int = 3) -> dict:
    """TTFT (as benchmarks/engine.py times it) with LaunchedStep.wait as it is and as a bare loop over Event.query,
    alternated `rounds` times, median of `repeats` each."""
    original = step_launch.LaunchedStep.wait

    def polled(step: step_launch.LaunchedStep) -> step_launch.StepOutput:
        if step.done is not None:
            while not step.done.query():
                pass
        return step.output

    out: dict = {}
    try:
        for r in range(rounds):
            for mode, wait in (("synchronize", original), ("query_loop", polled)):
                step_launch.LaunchedStep.wait = wait
                out.setdefault(mode, []).append(_median([_ttft_ms(bench, 7000 + 100 * r + i) for i in range(repeats)]))
                print("waits", r, mode, out[mode][-1], flush=True)
    finally:
        step_launch.LaunchedStep.wait = original
    return out


class Timeline:
    """Wraps engine functions to record (name, start, end) host times."""

    def __init__(self) -> None:
        self.events: list[tuple[str, float, float]] = []
        self._undo: list[tuple[object, str, object]] = []

    def wrap(self, owner: object, attr: str, name: str) -> None:
        original = getattr(owner, attr)
        events = self.events

        @functools.wraps(original)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                events.append((name, t0, time.perf_counter()))

        own = attr in vars(owner)  # a module's or class's own attribute, or an instance reading its class's
        setattr(owner, attr, timed)
        self._undo.append((owner, attr, original if own else None))

    def restore(self) -> None:
        for owner, attr, original in reversed(self._undo):
            if original is not None:
                setattr(owner, attr, original)
            else:
                delattr(owner, attr)  # the instance reads its class's again


def phases(bench: eb.Bench, repeats: int) -> dict:
    tl_ = Timeline()
    for owner, attr, name in (
        (llm_engine.LLMEngine, "add_request", "add_request"),
        (intake.RequestIntake, "_segment_keys", "segment_keys"),
        (limits.RequestLimits, "check", "validate"),
        (scheduler.Scheduler, "schedule", "schedule"),
        (model_runner.ModelRunner, "describe", "describe"),
        (prefill_graphs.StepLayout, "fill", "fill"),
        (torch.cuda.CUDAGraph, "replay", "replay"),
        (prefill_graphs.PrefillGraphs, "run", "prefill_graphs.run"),
        (step_launch.StepLauncher, "_sample", "sample"),
        (step_launch, "launched", "launched"),
        (step_launch.LaunchedStep, "wait", "wait"),
        (scheduler.Scheduler, "update", "process"),
        (scheduler.Scheduler, "finish", "finish"),
        (scheduler.Scheduler, "release_ended", "release_finished"),
        (torch.cuda, "synchronize", "cuda.synchronize"),
        (bench.engine.outputs, "new_token", "new_token"),  # the instance's: the class holds static methods too
        (bench.engine.outputs, "output", "output"),
        (llm_engine.LLMEngine, "step", "step"),
    ):
        tl_.wrap(owner, attr, name)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    per: dict[str, list[tuple[float, float]]] = {}
    totals = []
    try:
        for r in range(repeats + 3):
            prompt = bench.rag_prompt(3000 + r)
            torch.cuda.synchronize()
            tl_.events.clear()
            t0 = time.perf_counter()
            bench.add(prompt, params)
            while bench.engine.has_unfinished():
                bench.engine.step()
            torch.cuda.synchronize()
            t_end = time.perf_counter()
            if r < 3:
                continue
            totals.append(1e6 * (t_end - t0))
            seen: dict[str, int] = {}
            for name, a, b in tl_.events:
                k = seen.get(name, 0)
                seen[name] = k + 1
                per.setdefault(f"{name}#{k}", []).append((1e6 * (a - t0), 1e6 * (b - a)))
    finally:
        tl_.restore()
    rows = sorted(
        (
            {"phase": k, "start_us": _median([s for s, _ in v]), "dur_us": _median([d for _, d in v]), "n": len(v)}
            for k, v in per.items()
        ),
        key=lambda row: row["start_us"],
    )
    for row in rows:
        print(f"{row['phase']:24s} start {row['start_us']:9.1f} µs  dur {row['dur_us']:9.1f} µs  (n={row['n']})")
    print(f"TTFT median {_median(totals):.1f} µs", flush=True)
    return {"rows": rows, "ttft_us": _median(totals)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--sections", default="graphs,engine_graphs,phases")
    args = parser.parse_args()
    device = torch.device("cuda")
    sections = set(args.sections.split(","))
    results: dict = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    if "graphs" in sections:
        results["graphs"] = graph_launches(device)
    if sections & {"engine_graphs", "phases", "host_calls", "gc", "waits"}:
        bench = eb.Bench(eb.Shapes(batches=(1,)), device, 3e12)
        bench.cache_documents()
        bench.drain()
        if "engine_graphs" in sections:
            results["engine_graphs"] = engine_graphs(bench)
        if "host_calls" in sections:
            results["host_calls"] = host_calls(bench)
        if "gc" in sections:
            results["gc"] = gc_effect(bench, args.repeats)
        if "waits" in sections:
            results["waits"] = wait_effect(bench, args.repeats)
        if "phases" in sections:
            results["phases"] = phases(bench, args.repeats)
        bench.llm.shutdown()
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
