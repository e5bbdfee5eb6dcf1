"""The host tier against GPU-only caching (docs/benchmarks.md, "Host tier"), one command:

    python -m benchmarks.host_tier --plan h100 --out OUT/host_tier/          # on the GPU, ~5 minutes
    python -m benchmarks.host_tier --plan cpu --out /tmp/host_tier/                     # tiny model, a smoke run

One engine (lazy mode, Llama-3.1-8B shapes, random bf16 weights); its KV pool is cut to each GPU budget with
`set_kv_budget` and its host tier to 0 or the plan's size with `set_host_budget`. Every point starts the same way:
the workload's documents are registered ahead (prefill-only requests, least popular first, as a server registers
its corpus), so both configurations start warm and a point measures steady-state reuse, not the cold misses every
cache pays once. Then the trace's requests run as a closed loop of `concurrency` in flight. Reported per point:
document hit ratio on the GPU and on the host (effective = both), TTFT mean/p99, throughput, promotions and their
achieved bandwidth (copy-stream time from CUDA events) against a pinned host-to-device copy measured in the same run.

Workloads: the paper's (100 documents x 2048 tokens, Zipf 2.1) and one with 10x more documents than fit in the
4 GiB budget (160 documents = 40 GiB, uniform popularity). Writes host_tier.json and host_tier.md under --out
after every point, so a run cut short still leaves what it measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from lazyattn.bench.plots import plot_host_tier  # noqa: E402
from lazyattn.bench.replay import replay  # noqa: E402
from lazyattn.bench.report import write_json  # noqa: E402
from lazyattn.bench.workload import Load, Trace, WorkloadSpec, make_trace, token_space  # noqa: E402
from lazyattn.engine.config import EngineConfig  # noqa: E402
from lazyattn.engine.llm_engine import LLMEngine  # noqa: E402
from lazyattn.engine.prompt import RenderedPrompt  # noqa: E402

GiB = 2**30


@dataclass(frozen=True)
class Workload:
    name: str
    spec: WorkloadSpec
    budgets_gb: tuple[float, ...]


@dataclass(frozen=True)
class Plan:
    model: str
    device: str
    pool_gb: float  # the KV pool allocated once; each budget uses part of it
    host_gb: float
    workloads: tuple[Workload, ...]
    concurrency: int = 4
    page_size: int = 64
    max_model_len: int = 16384
    options: dict = field(default_factory=dict)


PAPER = WorkloadSpec(num_docs=100, doc_len=2048, zipf_alpha=2.1, num_requests=32, seed=0)
PLANS = {
    "h100": Plan(
        model=str(ROOT / "benchmarks/models/llama-3.1-8b"),
        device="cuda",
        pool_gb=16.0,
        host_gb=64.0,
        workloads=(
            Workload("paper", PAPER, (2, 4, 8, 16)),
            Workload("10x", replace(PAPER, num_docs=160, zipf_alpha=None, num_requests=24), (2, 4, 8)),
        ),
    ),
    "cpu": Plan(
        model="tiny",
        device="cpu",
        pool_gb=0.02,
        host_gb=0.05,
        page_size=16,
        max_model_len=4096,
        workloads=(Workload("paper", replace(PAPER, num_docs=20, doc_len=128, num_requests=8), (0.004, 0.008)),),
        options={"dtype": "float32"},
    ),
}


def register(engine: LLMEngine, trace: Trace) -> float:
    """Encode every document of the trace's pool ahead, least popular (highest id) first; seconds taken."""
    start = time.monotonic()
    for i in reversed(range(len(trace.documents))):
        engine.add_request(f"register-{i}", RenderedPrompt([trace.documents[i]], []), None)
    while engine.has_unfinished():
        engine.step()
    return time.monotonic() - start


def pinned_bandwidth(engine: LLMEngine, nbytes: int = GiB, repeats: int = 5) -> dict:
    """GB/s (1e9) of plain copies between the tier's pinned memory and the GPU, median of `repeats`."""
    import torch

    mover = engine.tier.mover
    mover.lock(-(-nbytes // mover.page_bytes))  # the host pool is locked as the tier grows: lock what is copied
    host = mover.host_kv.view(-1)
    n = min(nbytes // host.element_size(), mover.locked_bytes // host.element_size())
    host = host[:n]
    dev = torch.empty(n, dtype=host.dtype, device=engine.device)
    out = {}
    for name, dst, src in (("h2d", dev, host), ("d2h", host, dev)):
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        out[f"{name}_gbps"] = n * host.element_size() / statistics.median(times) / 1e9
    return out


def lock_probe(device: str, nbytes: int = 2 * GiB, iters: int = 400) -> dict:
    """Does page-locking on a second thread hold up the main thread's CUDA work? Times a loop of small kernels,
    each waited for, alone and while another thread registers `nbytes` (as the host tier's background locker
    does); also the lock's own time."""
    import threading

    import torch

    from lazyattn.cache.kv_transfer import _register

    a = torch.randn(1024, 1024, device=device)

    def loop() -> list[float]:
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            a.mul_(1.0)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        return times

    loop()
    alone = loop()
    host = torch.empty(nbytes, dtype=torch.uint8)
    took = {}

    def lock() -> None:
        t = time.perf_counter()
        took["ok"] = _register(host, host)
        took["s"] = time.perf_counter() - t

    thread = threading.Thread(target=lock)
    start = time.perf_counter()
    thread.start()
    beside, ends = [], []
    while thread.is_alive() and len(beside) < 20 * iters:
        t = time.perf_counter()
        a.mul_(1.0)
        torch.cuda.synchronize()
        beside.append(time.perf_counter() - t)
        ends.append(time.perf_counter() - start)
    thread.join()
    return {
        "lock_gib": nbytes / GiB,
        "lock_s": took.get("s"),
        "registered": took.get("ok"),
        "alone_median_us": 1e6 * statistics.median(alone),
        "alone_max_us": 1e6 * max(alone),
        "beside_n": len(beside),
        "beside_median_us": 1e6 * statistics.median(beside) if beside else None,
        "beside_max_us": 1e6 * max(beside) if beside else None,
        "beside_loop_s": ends[-1] if ends else None,
    }


def cuda_counters() -> dict:
    """The caching allocator's counters (cudaMalloc/cudaFree calls, free-and-retry after an OOM)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    m = torch.cuda.memory_stats()
    return {
        "alloc_retries": m.get("num_alloc_retries", 0),
        "device_allocs": m.get("num_device_alloc", 0),
        "device_frees": m.get("num_device_free", 0),
        "reserved_gb": m.get("reserved_bytes.all.current", 0) / 1e9,
    }


def traced_steps(engine: LLMEngine, limit: int) -> tuple[list, object]:
    """Wrap engine.step to record its first `limit` calls: [start ms, duration ms, promotions in flight before,
    requests unfinished, host hits, demotions, promotions landed (in the step), page-locking ms, new tokens];
    returns the record and the original step (to restore)."""
    original = engine.step
    steps: list = []
    zero = time.perf_counter()
    mover = engine.tier.mover

    def step():
        t = time.perf_counter()
        promoting, h0, pin0 = engine.cache.promoting, engine.tier.stats(), mover.pin_seconds
        out = original()
        if len(steps) < limit:
            h1 = engine.tier.stats()
            steps.append(
                [
                    round(1e3 * (t - zero), 1),
                    round(1e3 * (time.perf_counter() - t), 1),
                    promoting,
                    len(engine.requests),
                    h1.hits - h0.hits,
                    h1.demotions - h0.demotions,
                    h1.promotions - h0.promotions,
                    round(1e3 * (mover.pin_seconds - pin0), 1),
                    len(out),
                ]
            )
        return out

    engine.step = step
    return steps, original


def point(
    engine: LLMEngine, workload: Workload, trace: Trace, budget_gb: float, host_gb: float, profile: Path | None = None
) -> dict:
    """One point; `profile`: run the replay under torch.profiler, write its tables there and time the first
    steps (the diagnosis of the first requests' stall, docs/benchmarks.md)."""
    engine.set_kv_budget(int(budget_gb * GiB) // engine.executor.page_bytes)
    engine.set_host_budget(None if host_gb else 0)
    pin0 = engine.tier.mover.pin_seconds if engine.tier is not None and engine.tier.mover is not None else 0.0
    registered_s = register(engine, trace)
    before = engine.stats()
    counters0 = cuda_counters()
    steps = None
    if profile is not None:
        import torch

        steps, original = traced_steps(engine, 60)
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        ) as prof:
            run = replay(engine, trace, cache="as_is")
        engine.step = original
        averages = prof.key_averages()
        profile.write_text(
            "## by CPU time (self)\n"
            + averages.table(sort_by="self_cpu_time_total", row_limit=40)
            + "\n## by CUDA time (self)\n"
            + averages.table(sort_by="self_device_time_total", row_limit=25)
        )
    else:
        run = replay(engine, trace, cache="as_is")
    after = engine.stats()
    counters1 = cuda_counters()
    s = run.summary
    docs = sum(r.num_docs for r in run.records)
    host_docs = (after.cache.host_tokens_reused - before.cache.host_tokens_reused) // workload.spec.doc_len
    row = {
        "workload": workload.name,
        "budget_gb": budget_gb,
        "host_gb": host_gb,
        "requests": s.completed,
        "eff_hit": 100 * s.doc_hit_ratio,
        "host_hit": 100 * host_docs / docs,
        "ttft_mean_ms": s.ttft.mean,
        "ttft_p99_ms": s.ttft.p99,
        "req_s": s.request_throughput,
        "out_tok_s": s.output_throughput,
        "preemptions": s.preemptions,
        "register_s": registered_s,
        "wall_s": run.wall_s,
        "ttfts_ms": [round(1e3 * r.ttft, 1) for r in run.records if r.ttft is not None],
    }
    row["gpu_hit"] = row["eff_hit"] - row["host_hit"]
    row.update({k: counters1[k] - counters0[k] for k in counters0 if k != "reserved_gb"})
    if counters1:
        row["reserved_gb"] = counters1["reserved_gb"]
    if steps is not None:
        row["steps"] = steps
    if after.host is not None:
        h0, h1 = before.host, after.host
        seconds = h1.seconds_to_device - h0.seconds_to_device
        row.update(
            promotions=h1.promotions - h0.promotions,
            demotions=h1.demotions - h0.demotions,
            gb_to_device=(h1.bytes_to_device - h0.bytes_to_device) / 1e9,
            gb_to_host=(h1.bytes_to_host - h0.bytes_to_host) / 1e9,
            promotion_gbps=(h1.bytes_to_device - h0.bytes_to_device) / seconds / 1e9 if seconds else None,
            locked_gb=h1.locked_pages * h1.page_bytes / GiB,
            pin_s=engine.tier.mover.pin_seconds - pin0 if engine.tier.mover is not None else 0.0,
        )
    return row


COLUMNS = [
    ("workload", "workload", "{}"),
    ("GPU GiB", "budget_gb", "{:g}"),
    ("host GiB", "host_gb", "{:g}"),
    ("GPU hit %", "gpu_hit", "{:.1f}"),
    ("host hit %", "host_hit", "{:.1f}"),
    ("eff hit %", "eff_hit", "{:.1f}"),
    ("TTFT mean ms", "ttft_mean_ms", "{:.1f}"),
    ("TTFT p99 ms", "ttft_p99_ms", "{:.1f}"),
    ("req/s", "req_s", "{:.2f}"),
    ("out tok/s", "out_tok_s", "{:.1f}"),
    ("promotions", "promotions", "{}"),
    ("promo GB/s", "promotion_gbps", "{:.1f}"),
    ("GB to host", "gb_to_host", "{:.1f}"),
]


def markdown(rows: list[dict], meta: dict) -> str:
    def cell(row, key, fmt):
        v = row.get(key)
        return "-" if v is None else fmt.format(v)

    lines = [
        f"# Host tier, {meta['device_name']}",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Pinned copy bandwidth (1 GiB, median of 5): host to device {meta['pinned']['h2d_gbps']:.1f} GB/s, "
        f"device to host {meta['pinned']['d2h_gbps']:.1f} GB/s."
        if meta.get("pinned")
        else "",
        "",
        "| " + " | ".join(h for h, _, _ in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(cell(r, k, f) for _, k, f in COLUMNS) + " |" for r in rows]
    lines += ["", "Mean TTFT, GPU only / with the host tier, at the same GPU budget:", ""]
    for r in rows:
        if r["host_gb"]:
            base = next(
                (
                    b
                    for b in rows
                    if b["workload"] == r["workload"] and b["budget_gb"] == r["budget_gb"] and not b["host_gb"]
                ),
                None,
            )
            if base:
                ratio = base["ttft_mean_ms"] / r["ttft_mean_ms"]
                lines.append(
                    f"- {r['workload']} at {r['budget_gb']:g} GiB: {ratio:.2f}x "
                    f"(GPU-only hit {base['gpu_hit']:.1f} %, effective with the tier {r['eff_hit']:.1f} %)"
                )
    return "\n".join(lines) + "\n"


def plot(results: Path) -> int:
    data = json.loads(results.read_text())
    if plot_host_tier(
        data["rows"],
        results.with_suffix(".png"),
        title=f"Host tier, {data['meta']['device_name']}: {data['meta']['command']}",
    ):
        print(f"plot: {results.with_suffix('.png')}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", choices=sorted(PLANS), default="h100")
    p.add_argument("--out", default=str(ROOT / "out/host_tier"))
    p.add_argument("--budgets", default=None, help="GPU budgets (GiB, comma-separated) instead of the plan's")
    p.add_argument("--host-gb", type=float, default=None, help="host tier instead of the plan's")
    p.add_argument("--workloads", default=None, help="workload names to run (comma-separated; default: all)")
    p.add_argument(
        "--profile",
        action="store_true",
        help="profile the first point with the tier (torch.profiler tables and step times under --out)",
    )
    p.add_argument(
        "--lock-probe",
        action="store_true",
        help="measure whether page-locking on a second thread holds up CUDA work on the main thread",
    )
    p.add_argument("--deadline", type=float, default=float("inf"), help="start no point after this many seconds")
    p.add_argument(
        "--plot",
        metavar="JSON",
        default=None,
        help="only draw the plot of an earlier run's host_tier.json (written beside it as .png)",
    )
    args = p.parse_args()
    if args.plot:
        return plot(Path(args.plot))
    plan = PLANS[args.plan]
    if args.workloads:
        plan = replace(plan, workloads=tuple(w for w in plan.workloads if w.name in args.workloads.split(",")))
    if args.budgets:
        budgets = tuple(float(b) for b in args.budgets.split(","))
        plan = replace(plan, workloads=tuple(replace(w, budgets_gb=budgets) for w in plan.workloads))
    if args.host_gb is not None:
        plan = replace(plan, host_gb=args.host_gb)
    clock = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    built = time.monotonic()
    engine = LLMEngine(
        EngineConfig(
            model=plan.model,
            mode="lazy",
            device=plan.device,
            kv_cache_gb=plan.pool_gb,
            host_cache_gb=plan.host_gb,
            page_size=plan.page_size,
            random_weights=True,
            max_model_len=plan.max_model_len,
            progress=False,
            **plan.options,
        )
    )
    meta = {
        "command": " ".join(sys.argv),
        "plan": asdict(plan),
        "engine_build_s": time.monotonic() - built,
        "page_bytes": engine.executor.page_bytes,
        "host_pages": engine.tier.num_pages,
        "device_name": plan.device,
        "pin_s_at_build": engine.tier.mover.pin_seconds,
    }
    if plan.device == "cuda":
        import torch

        meta["device_name"] = torch.cuda.get_device_name()
        meta["pinned"] = pinned_bandwidth(engine)
        meta["pinned"]["is_pinned"] = engine.tier.mover.host_kv[:1].is_pinned()
        if args.lock_probe:
            meta["lock_probe"] = lock_probe(engine.device)
    print(json.dumps({k: v for k, v in meta.items() if k != "plan"}), flush=True)
    vocab_high, bos = token_space(engine.model_config)
    rows: list[dict] = []
    traces = {w.name: make_trace(w.spec, Load(concurrency=plan.concurrency), vocab_high, bos) for w in plan.workloads}
    # Discarded: a small workload of its own documents at the smallest budget with the tier on, so that the first
    # measured point pays for no first-use cost (allocator pools, the copies' kernels).
    first = plan.workloads[0]
    warm = Workload(
        "warm-up", replace(first.spec, num_docs=12, num_requests=6, seed=first.spec.seed + 1), first.budgets_gb[:1]
    )
    warm_trace = make_trace(warm.spec, Load(concurrency=plan.concurrency), vocab_high, bos)
    meta["warm_up"] = point(engine, warm, warm_trace, warm.budgets_gb[0], plan.host_gb)
    print(json.dumps(meta["warm_up"]), flush=True)
    # Smallest budgets first: they are where the tier matters, and what a run cut short by --deadline keeps.
    points = sorted(((b, i, w) for i, w in enumerate(plan.workloads) for b in w.budgets_gb), key=lambda x: x[:2])
    profile = args.profile
    for budget, _, workload in points:
        for host in (0.0, plan.host_gb):
            if time.monotonic() - clock > args.deadline:
                print(f"deadline: skipping {workload.name} {budget:g} GiB host {host:g}", flush=True)
                continue
            where = out / f"profile_{workload.name}_{budget:g}.txt" if profile and host else None
            profile = profile and not where
            row = point(engine, workload, traces[workload.name], budget, host, where)
            rows.append(row)
            print(json.dumps(row), flush=True)
            write_json(out / "host_tier.json", {"meta": meta, "rows": rows})
            (out / "host_tier.md").write_text(markdown(rows, meta))
    engine.shutdown()
    plot(out / "host_tier.json")
    print(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
