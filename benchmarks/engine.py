"""Engine benchmark: the request path against the hardware limit, through the public engine API.

On the GPU (about 1–2 minutes on an H100; Llama-3.1-8B shapes, random bf16 weights, lazy mode, CUDA graphs on):

    python -m benchmarks.engine --out OUT/engine_h100

writes engine_h100.json and engine_h100.md and prints the table. `--quick` runs the built-in tiny model with
small shapes (on a CPU too: a smoke test of the script, its numbers mean nothing).

Tensor parallelism (docs/design.md): `--tensor-parallel-size 2` spreads the engine over GPUs 0 and 1; the limits are
then one GPU's share of the bytes (its weight shard, its KV heads) over the slowest GPU's measured bandwidth: the
weight-read roofline of the group, collectives not counted. `--model benchmarks/models/llama-3.1-70b` runs the 70B
shapes; `--sections` and `--batches` pick what to measure (e.g. `--sections decode_short,ttft_rag --batches 16`).
`--deterministic` runs the engine in its batch-invariant mode: the same command with and without it gives the
mode's cost per section (docs/design.md, "Deterministic mode").

What is measured (docs/design.md, Goals; each beside its limit measured in the same run):

- read bandwidth: a large device-to-device copy, bytes read + bytes written over its median time;
- decode time per token at batch 1, short context and over 5 × 2048 cached document tokens; decode step time
  at batch 16 and 64 with 2K-token contexts. Each limit is the bytes one step must read (every weight but the
  embedding table, of which only the batch's rows are read, plus every sequence's cached K and V) over the
  measured bandwidth;
- TTFT of the cached RAG request (BOS + 31-token system segment, 5 cached 2048-token documents, 32-token
  question) on an idle engine, against one decode step at the same context (goal ≤ 1.2×) and its byte limit;
- launches per prefill step (that request's first step) and per decode step, from torch.profiler: kernels the
  device ran, and the host's launch calls (a replayed CUDA graph is one call).

Steps are timed on the host around `LLMEngine.step` (which waits for the step's tokens), median over the steps
of a steady phase. With overlapped scheduling (the default on CUDA; `--no-async-scheduling` turns it off) a call
queues the next step before it waits for the previous one's tokens, and the time between calls is the step period.
Token ids are random (never zeros); the document cache is warmed before anything is timed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

if not torch.cuda.is_available():  # must precede the first triton import
    os.environ.setdefault("TRITON_INTERPRET", "1")

from lazyattn import LLM, SamplingParams  # noqa: E402
from lazyattn.engine.llm_engine import LLMEngine  # noqa: E402
from lazyattn.engine.prompt import RenderedPrompt  # noqa: E402
from lazyattn.kernels.launch import pdl_on  # noqa: E402

CONFIG_8B = Path(__file__).resolve().parent / "models" / "llama-3.1-8b"
BOS = 128000


@dataclass(frozen=True)
class Shapes:
    model: str = str(CONFIG_8B)
    system_len: int = 32  # BOS + 31
    doc_len: int = 2048
    n_docs: int = 5
    question: int = 32
    short_prompt: int = 32
    batch_context: int = 2048
    batches: tuple[int, ...] = (16, 64)
    decode_steps: int = 48  # timed decode steps at batch 1
    batch_tokens: int = 64  # max_tokens per sequence of the batched runs
    ttft_repeats: int = 40  # with 10 the median moved ±0.4 ms between runs
    kv_cache_gb: float = 24.0
    max_model_len: int = 16384
    copy_mib: int = 2048
    copy_repeats: int = 20
    tensor_parallel_size: int = 1
    cuda_graphs: bool = True
    async_scheduling: bool | None = None  # None: the engine's default (on CUDA: on)
    sections: tuple[str, ...] | None = None  # None: every section
    deterministic: bool = False  # the batch-invariant mode (docs/design.md, "Deterministic mode")


QUICK = Shapes(
    model="tiny",
    system_len=8,
    doc_len=64,
    n_docs=3,
    question=8,
    short_prompt=8,
    batch_context=64,
    batches=(2, 4),
    decode_steps=4,
    batch_tokens=6,
    ttft_repeats=2,
    kv_cache_gb=0.05,
    max_model_len=1024,
    copy_mib=16,
    copy_repeats=3,
)


def random_tokens(n: int, seed: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1000 % vocab, vocab, (n,), generator=g).tolist()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, mib: int, repeats: int) -> float:
    """Bytes/s of a device-to-device copy, counting bytes read plus bytes written (median of `repeats`)."""
    n = mib * 2**20 // 2
    src = torch.randn(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 2):
        sync(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    assert torch.equal(dst, src)
    return 2 * src.numel() * src.element_size() / statistics.median(times[2:])


class Bench:
    def __init__(self, shapes: Shapes, device: torch.device, bandwidth: float) -> None:
        self.s = shapes
        self.device = device
        self.bandwidth = bandwidth
        self.llm = LLM(
            model=shapes.model,
            mode="lazy",
            device=device.type,
            random_weights=True,
            kv_cache_gb=shapes.kv_cache_gb,
            max_model_len=shapes.max_model_len,
            max_num_seqs=max(shapes.batches),
            progress=False,
            tensor_parallel_size=shapes.tensor_parallel_size,
            cuda_graphs=shapes.cuda_graphs,
            async_scheduling=shapes.async_scheduling,
            deterministic=shapes.deterministic,
        )
        self.engine: LLMEngine = self.llm.engine
        cfg = self.engine.model_config
        self.vocab = cfg.vocab_size
        self.bos = cfg.bos_token_id if cfg.bos_token_id is not None else BOS
        model = self.engine.executor.model  # under tensor parallelism: the driver's shard, the size of every rank's
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        if model.lm_head is not None:  # untied: a step reads only its rows of the embedding table
            weights -= model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
        self.weight_bytes = weights
        dtype_bytes = torch.empty((), dtype=self.engine.config.torch_dtype).element_size()
        kv_heads = cfg.num_kv_heads // shapes.tensor_parallel_size  # one rank's
        self.kv_bytes_per_token = cfg.num_layers * 2 * kv_heads * cfg.head_dim * dtype_bytes
        self._ids = 0
        self.system = [self.bos] + random_tokens(shapes.system_len - 1, 1, self.vocab)
        self.docs = [random_tokens(shapes.doc_len, 10 + i, self.vocab) for i in range(shapes.n_docs)]

    # -- helpers --------------------------------------------------------------------------------------------

    def limit_s(self, batch: int, context_tokens: float) -> float:
        """The byte limit of one step: weights + `batch` rows of the embedding + every cached key and value."""
        return (self.weight_bytes + context_tokens * self.kv_bytes_per_token) / self.bandwidth

    def add(self, prompt: RenderedPrompt, params: SamplingParams | None) -> str:
        self._ids += 1
        rid = f"bench-{self._ids}"
        self.engine.add_request(rid, prompt, params)
        return rid

    def timed_step(self) -> tuple[float, list]:
        # Overlapped: a call queues the next step and returns the previous one's outputs, waiting for its tokens,
        # so in a steady phase the time between calls is the step period; a device sync would undo the overlap.
        overlapped = self.engine.config.async_scheduling_on
        if not overlapped:
            sync(self.device)
        t0 = time.perf_counter()
        outs = self.engine.step()
        if not overlapped:
            sync(self.device)
        return time.perf_counter() - t0, outs

    def drain(self) -> None:
        while self.engine.has_unfinished():
            self.engine.step()

    def cache_documents(self) -> None:
        self.add(RenderedPrompt(segments=[self.system] + self.docs, final=[]), None)
        self.drain()

    def rag_prompt(self, seed: int) -> RenderedPrompt:
        question = random_tokens(self.s.question, seed, self.vocab)
        return RenderedPrompt(segments=[self.system] + self.docs, final=question)

    # -- measurements ---------------------------------------------------------------------------------------

    def decode_batch1(self, prompt: RenderedPrompt) -> dict:
        """Median decode step of one sequence after its first token, and the context it ran at."""
        context = sum(map(len, prompt.segments)) + len(prompt.final)
        params = SamplingParams(max_tokens=self.s.decode_steps + 4, temperature=0.0, ignore_eos=True)
        self.add(prompt, params)
        times = []
        step = 0
        while self.engine.has_unfinished():
            dt, _ = self.timed_step()
            step += 1
            if step > 2:  # the prefill step and the first decode step are not steady
                times.append(dt)
        tpot = statistics.median(times)
        mean_context = context + 2 + len(times) / 2
        limit = self.limit_s(1, mean_context)
        return {
            "batch": 1,
            "context": round(mean_context),
            "step_ms": 1e3 * tpot,
            "limit_ms": 1e3 * limit,
            "of_limit": limit / tpot,
            "steps": len(times),
        }

    def decode_batched(self, batch: int) -> dict:
        """Median pure-decode step of `batch` sequences of `batch_context` prompt tokens each (all running, none
        finished), and the mean context over those steps."""
        params = SamplingParams(max_tokens=self.s.batch_tokens, temperature=0.0, ignore_eos=True)
        prompts = [
            RenderedPrompt(segments=[], final=random_tokens(self.s.batch_context, 1000 + 7 * batch + i, self.vocab))
            for i in range(batch)
        ]
        ids = [self.add(p, params) for p in prompts]
        generated = dict.fromkeys(ids, 0)
        times, contexts = [], []
        while self.engine.has_unfinished():
            all_decoding = all(n > 0 for n in generated.values())
            before = sum(generated.values())
            dt, outs = self.timed_step()
            for out in outs:
                generated[out.request_id] = len(out.token_ids)
            finished = any(out.finished for out in outs)
            if all_decoding and not finished:
                times.append(dt)
                contexts.append(batch * self.s.batch_context + before)
        step = statistics.median(times)
        mean_context = statistics.mean(contexts)
        limit = self.limit_s(batch, mean_context)
        return {
            "batch": batch,
            "context": round(mean_context / batch),
            "step_ms": 1e3 * step,
            "limit_ms": 1e3 * limit,
            "of_limit": limit / step,
            "tokens_per_s": batch / step,
            "steps": len(times),
        }

    def ttft(self) -> dict:
        """The cached RAG request on an idle engine: add_request until `step` returns its first token, median.

        `ttft_synced_ms` also reports the clock stopped after a device synchronize that follows the step: the token
        is on the host when `step` returns it and the GPU is idle by then, so that synchronize times only its own
        call (~65 µs on an H100's host)."""
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        times, synced = [], []
        for r in range(self.s.ttft_repeats + 1):
            prompt = self.rag_prompt(500 + r)  # the request exists before it is submitted
            sync(self.device)
            t0 = time.perf_counter()
            self.add(prompt, params)
            while self.engine.has_unfinished():
                self.engine.step()
            times.append(time.perf_counter() - t0)
            sync(self.device)
            synced.append(time.perf_counter() - t0)
        context = self.s.system_len + self.s.n_docs * self.s.doc_len + self.s.question
        return {
            "context": context,
            "ttft_ms": 1e3 * statistics.median(times[1:]),
            "ttft_synced_ms": 1e3 * statistics.median(synced[1:]),
            "limit_ms": 1e3 * self.limit_s(1, context),
            "repeats": len(times) - 1,
        }

    def launches(self) -> dict:
        """Kernels and host launch calls of the cached RAG request's prefill step and of one decode step."""
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
        self.add(self.rag_prompt(900), params)
        counted = {}
        for name in ("prefill", "decode", "decode_2"):
            with profile(activities=activities) as prof:
                self.engine.step()
                sync(self.device)
            counted[name] = count_launches(prof.events())
        self.drain()
        return {"prefill": counted["prefill"], "decode": counted["decode_2"]}


_LAUNCH_CALLS = (
    "cudaLaunchKernel",
    "cuLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernelEx",
    "cudaGraphLaunch",
    "cudaMemcpyAsync",
    "cudaMemsetAsync",
)


def count_launches(events) -> dict:
    """Device kernels (memcpy/memset apart) and host-side launch API calls in one profiled region, the time the
    device spent in kernels (busy), and the kernels that took most of it."""
    kernels = copies = calls = graphs = aten = 0
    busy_us: dict[str, float] = {}
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CUDA:
            if e.name.startswith(("Memcpy", "Memset")):
                copies += 1
            else:
                kernels += 1
                busy_us[e.name] = busy_us.get(e.name, 0.0) + e.time_range.elapsed_us()
        elif e.name in _LAUNCH_CALLS:
            calls += 1
            graphs += e.name == "cudaGraphLaunch"
        elif e.name.startswith("aten::"):
            aten += 1
    top = sorted(busy_us.items(), key=lambda kv: -kv[1])[:8]
    return {
        "kernels": kernels,
        "copies": copies,
        "launch_calls": calls,
        "graph_launches": graphs,
        "aten_ops": aten,
        "gpu_busy_ms": sum(busy_us.values()) / 1e3,
        "top_kernels_us": [[name[:80], us] for name, us in top],
    }


def run(shapes: Shapes, device: torch.device) -> dict:
    gpus = [torch.device("cuda", i) for i in range(shapes.tensor_parallel_size)] if device.type == "cuda" else [device]
    per_gpu = []
    for d in gpus:  # events and copies on that GPU's own stream
        with torch.cuda.device(d) if d.type == "cuda" else contextlib.nullcontext():
            per_gpu.append(copy_bandwidth(d, shapes.copy_mib, shapes.copy_repeats))
    if device.type == "cuda":
        torch.cuda.empty_cache()
    bandwidth = min(per_gpu)  # the ranks wait for each other: the slowest sets the pace
    bench = Bench(shapes, device, bandwidth)
    results: dict = {
        "bandwidth_gbs": bandwidth / 1e9,
        "bandwidth_gbs_per_gpu": [b / 1e9 for b in per_gpu],
        "tensor_parallel_size": shapes.tensor_parallel_size,
        "weight_bytes": bench.weight_bytes,
        "kv_bytes_per_token": bench.kv_bytes_per_token,
        "pdl": pdl_on(device),
        "decode_fusion": bench.engine.config.env.decode_fusion,
    }
    if bench.engine.config.tensor_parallel_size > 1:  # which all-reduce the ranks use (parallel/all_reduce.py)
        results["all_reduce_path"] = bench.engine.executor.tp.all_reduce_path
    sections: list[tuple[str, Callable[[], dict]]] = [
        (
            "decode_short",
            lambda: bench.decode_batch1(
                RenderedPrompt(segments=[], final=[bench.bos] + random_tokens(shapes.short_prompt - 1, 3, bench.vocab))
            ),
        ),
        ("cache_documents", lambda: bench.cache_documents() or {}),
        ("decode_rag", lambda: bench.decode_batch1(bench.rag_prompt(7))),
        ("ttft_rag", bench.ttft),
        ("launches", bench.launches),
    ] + [(f"decode_batch{b}", lambda b=b: bench.decode_batched(b)) for b in shapes.batches]
    if shapes.sections is not None:
        wanted = set(shapes.sections)
        if wanted & {"decode_rag", "ttft_rag", "launches"}:
            wanted.add("cache_documents")
        sections = [(name, f) for name, f in sections if name in wanted or name.startswith("decode_batch")]
    for name, section in sections:
        t0 = time.perf_counter()
        try:
            results[name] = section()
        except Exception as error:  # one failing section must not lose the others' numbers
            results[name] = {"error": f"{type(error).__name__}: {error}"}
            for request_id in list(bench.engine.requests):
                bench.engine.abort(request_id)
        print(f"[{name}] {time.perf_counter() - t0:.1f} s: {results[name]}", flush=True)
    if "ttft_ms" in results.get("ttft_rag", {}) and "step_ms" in results.get("decode_rag", {}):
        results["ttft_rag"]["decode_step_ms"] = results["decode_rag"]["step_ms"]
        results["ttft_rag"]["of_decode_step"] = results["ttft_rag"]["ttft_ms"] / results["decode_rag"]["step_ms"]
    results["async_scheduling"] = bench.engine.config.async_scheduling_on
    results["overlapped_steps"] = bench.engine.pipeline.overlapped_steps
    graphs = bench.engine.executor.runner.graphs
    results["cuda_graph_batch_sizes"] = sorted(graphs.graphs) if graphs is not None else []  # captured
    bench.llm.shutdown()
    return results


def markdown(results: dict) -> str:
    tp = results.get("tensor_parallel_size", 1)
    per_gpu = ", ".join(f"{b:.0f}" for b in results.get("bandwidth_gbs_per_gpu", []))
    where = (
        f"tensor parallel over {tp} GPUs (per GPU: {per_gpu} GB/s; the slowest sets the limit), per GPU: "
        if tp > 1
        else ""
    )
    lines = [
        f"Read bandwidth (device-to-device copy, read + write): **{results['bandwidth_gbs']:.0f} GB/s**; "
        f"{where}weights read per step {results['weight_bytes'] / 1e9:.2f} GB, KV "
        f"{results['kv_bytes_per_token']} B/token. Overlapped scheduling "
        f"{'on' if results.get('async_scheduling') else 'off'} ({results.get('overlapped_steps', 0)} steps "
        "scheduled while the one before them ran).",
        "",
        "| what | context / seq | measured | limit (bytes / bandwidth) | of limit | goal |",
        "|---|---|---|---|---|---|",
    ]
    goals = {"decode_short": "≥ 90 %", "decode_rag": "≥ 85 %"}
    for name, label in (
        ("decode_short", "decode TPOT, batch 1, short"),
        ("decode_rag", "decode TPOT, batch 1, 5 × 2048 cached docs"),
    ):
        r = results.get(name, {})
        if "step_ms" in r:
            lines.append(
                f"| {label} | {r['context']} | {r['step_ms']:.2f} ms | {r['limit_ms']:.2f} ms | "
                f"{100 * r['of_limit']:.0f} % | {goals[name]} |"
            )
    for name, r in results.items():
        if name.startswith("decode_batch") and "step_ms" in r:
            lines.append(
                f"| decode step, batch {r['batch']} ({r['tokens_per_s']:.0f} tok/s) | {r['context']} | "
                f"{r['step_ms']:.2f} ms | {r['limit_ms']:.2f} ms | {100 * r['of_limit']:.0f} % | ≥ 80 % |"
            )
    r = results.get("ttft_rag", {})
    if "ttft_ms" in r:
        vs = f"{r['of_decode_step']:.2f}× one decode step" if "of_decode_step" in r else "—"
        lines.append(
            f"| TTFT, cached RAG request, idle | {r['context']} | {r['ttft_ms']:.2f} ms | "
            f"{r['limit_ms']:.2f} ms | {vs} | ≤ 1.2× decode step |"
        )
    launches = results.get("launches", {})
    if "prefill" in launches:
        lines += [
            "",
            "| step | device kernels | memcpy/memset | host launch calls (graph replays) | aten ops | GPU busy |",
            "|---|---|---|---|---|---|",
        ]
        for step in ("prefill", "decode"):
            c = launches[step]
            lines.append(
                f"| {step} | {c['kernels']} | {c['copies']} | {c['launch_calls']} ({c['graph_launches']}) |"
                f" {c['aten_ops']} | {c.get('gpu_busy_ms', 0):.2f} ms |"
            )
        if results.get("pdl"):
            lines.append(
                "\nProgrammatic dependent launch is on: a kernel's programs start while the kernel before it "
                "finishes and wait there, so GPU busy and the kernel times below count that wait (they add "
                "up to more than the step). `LAZYATTN_PDL=0` gives a breakdown without the overlap."
            )
        for step in ("prefill", "decode"):
            top = ", ".join(f"{name[:40]} {us:.0f} µs" for name, us in launches[step].get("top_kernels_us", []))
            if top:
                lines.append(f"\nTop kernels, {step} step: {top}")
    errors = [f"- {name}: {r['error']}" for name, r in results.items() if isinstance(r, dict) and "error" in r]
    return "\n".join(lines + ([""] + errors if errors else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    parser.add_argument("--quick", action="store_true", help="tiny model, small shapes (smoke test; runs on a CPU)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default=None, help="a config directory (default: Llama-3.1-8B shapes)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs the engine spans (default: 1)")
    parser.add_argument(
        "--sections", default=None, help="comma-separated: decode_short, decode_rag, ttft_rag, launches (default: all)"
    )
    parser.add_argument("--batches", default=None, help="decode batch sizes, comma-separated (default: 16,64)")
    parser.add_argument("--no-cuda-graphs", action="store_true", help="eager decode steps")
    parser.add_argument(
        "--no-async-scheduling",
        action="store_true",
        help="synchronous steps: the host schedules the next step only after reading this one's tokens",
    )
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="the batch-invariant mode (docs/design.md, Deterministic mode): run once with and once without to "
        "read its cost",
    )
    args = parser.parse_args(argv)
    shapes = QUICK if args.quick else Shapes()
    shapes = replace(
        shapes,
        tensor_parallel_size=args.tensor_parallel_size,
        cuda_graphs=not args.no_cuda_graphs,
        async_scheduling=False if args.no_async_scheduling else None,
        sections=tuple(args.sections.split(",")) if args.sections else None,
        deterministic=args.deterministic,
    )
    if args.model:
        shapes = replace(shapes, model=args.model)
    if args.batches:
        shapes = replace(shapes, batches=tuple(int(b) for b in args.batches.split(",")))
    device = torch.device(args.device)
    results = run(shapes, device)
    meta = {
        "command": " ".join(["python", "benchmarks/engine.py"] + (argv if argv is not None else sys.argv[1:])),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "shapes": asdict(shapes),
    }
    table = markdown(results)
    print(table)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
        args.out.with_suffix(".md").write_text(
            f"`{meta['command']}` on {meta['device']}, torch {meta['torch']}\n\n" + table
        )
    failed = [name for name, r in results.items() if isinstance(r, dict) and "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
