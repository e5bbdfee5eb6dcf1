"""RAG serving benchmark on one GPU: the three experiments of the benchmark protocol (docs/design.md), sized to
fit ~8 minutes.

    bash benchmarks/serving.sh OUT_DIR           # H100 / H200, Llama-3.1-8B shapes, random bf16 weights
    bash benchmarks/serving.sh OUT_DIR --smoke   # the tiny model on the CPU: checks the script end to end

1. Rate sweep: TTFT and throughput against Poisson request rate and at saturation, Zipf 2.1 and uniform
   document popularity, modes lazy / block / prefix / full. Protocol: pool of 100 documents x 2048 tokens,
   5 documents per request in random order, 32-token question, 16 output tokens; fewer requests per point
   than a full run (the plan below), every point from an empty document cache.
2. Document hit ratio against KV budget (1 / 10 / 50 GB, Zipf 1.1 / 1.5 / 2.1, lazy / block / prefix):
   *simulated* through the engine's own DocumentCache and PagePool with Llama-3.1-8B's page size (no model,
   CPU, in a side process), 1000 requests each; plus *real engine runs* at the key point (1 GB, Zipf 2.1)
   over the first requests of the same trace, checked against the simulation of exactly those requests.
   Budget readings: lazyattn/bench/hitratio.py (a 1 GB pool cannot hold one 5 x 2048-token request at 8B).
3. One 16K-token document shared by 1..256 concurrent requests: peak KV memory and throughput per mode.

One engine per mode serves all its points (KV pool fixed, the hit-ratio runs use a smaller part of it via
bench.replay.kv_budget). Each mode gets a slice of the remaining time; a point that does not fit its slice
is skipped and recorded, a point that runs over is cut and marked partial, an error is recorded and the run
goes on. OUT_DIR/serving.json is rewritten after every point; serving.md (also printed last) and three
PNGs are written at the end.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

if not torch.cuda.is_available():  # the CPU smoke run: Triton (if ever reached) interprets
    os.environ.setdefault("TRITON_INTERPRET", "1")

from lazyattn.bench import plots, report  # noqa: E402
from lazyattn.bench.hitratio import page_accounting, pool_pages, simulate, sweep, working_set_pages  # noqa: E402
from lazyattn.bench.replay import free_device_memory, kv_budget, make_engine, replay, warm_up  # noqa: E402
from lazyattn.bench.summary import summary_markdown  # noqa: E402
from lazyattn.bench.workload import Load, WorkloadSpec, make_trace, token_space, warmup_trace  # noqa: E402
from lazyattn.engine.config import EngineConfig  # noqa: E402
from lazyattn.model.config import ModelConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
INF = math.inf


@dataclass(frozen=True)
class Plan:
    model: str
    device: str
    kv_cache_gb: float  # the pool every mode gets (experiments 1 and 3)
    spec: WorkloadSpec  # the protocol at Zipf 2.1; uniform is the same with zipf_alpha None
    # (popularity, rate or INF for saturation, requests), most important first: when a mode runs short of
    # time, the last points are the ones skipped
    rate_points: tuple[tuple[str, float, int], ...]
    shared_doc_len: int
    shared_concurrency: tuple[int, ...]
    shared_concurrency_full: tuple[int, ...]  # full re-encodes the document per request: fewer points
    hit_budgets_gb: tuple[float, ...]
    hit_alphas: tuple[float, ...]
    hit_sim_requests: int
    hit_engine_requests: int
    hit_engine_budget_gb: float
    hit_engine_alpha: float
    hit_engine_output_len: int  # the final segment's pages are the same at 1 or 16 output tokens
    warmup_requests: int
    shared_after: int = 3  # the shared-document points run after this many rate points
    page_size: int = 64
    max_point_s: float = 90.0
    modes: tuple[str, ...] = ("lazy", "block", "prefix", "full")
    # Expected time shares (estimated at 8B: ~70 / 75 / 100 / 90 s of points): prefix and full prefill more.
    mode_weights: tuple[float, ...] = (1.0, 1.05, 1.4, 1.25)


GPU = Plan(
    model=str(ROOT / "benchmarks/models/llama-3.1-8b"),
    device="cuda",
    kv_cache_gb=40.0,
    spec=WorkloadSpec(
        num_docs=100,
        doc_len=2048,
        docs_per_request=5,
        zipf_alpha=2.1,
        question_len=32,
        output_len=16,
        num_requests=40,
        seed=0,
    ),
    # Poisson points hold ~8-12 s of arrivals each: at low rates arrival time, not GPU time, is the cost.
    rate_points=(
        ("zipf 2.1", INF, 40),
        ("zipf 2.1", 4.0, 32),
        ("zipf 2.1", 2.0, 16),
        ("uniform", INF, 40),
        ("zipf 2.1", 1.0, 8),
        ("uniform", 2.0, 16),
        ("zipf 2.1", 0.5, 6),
    ),
    shared_doc_len=16384,
    shared_concurrency=(1, 16, 64, 256),
    shared_concurrency_full=(1, 16),
    hit_budgets_gb=(1.0, 10.0, 50.0),
    hit_alphas=(1.1, 1.5, 2.1),
    hit_sim_requests=1000,
    hit_engine_requests=40,
    hit_engine_budget_gb=1.0,
    hit_engine_alpha=2.1,
    hit_engine_output_len=1,
    warmup_requests=3,
)

SMOKE = Plan(
    model="tiny",
    device="cpu",
    kv_cache_gb=0.25,
    spec=WorkloadSpec(
        num_docs=20,
        doc_len=128,
        docs_per_request=5,
        zipf_alpha=2.1,
        question_len=32,
        output_len=8,
        num_requests=8,
        seed=0,
    ),
    rate_points=(("zipf 2.1", INF, 8), ("zipf 2.1", 8.0, 8), ("uniform", INF, 8)),
    shared_doc_len=512,
    shared_concurrency=(1, 4, 8),
    shared_concurrency_full=(1, 4),
    hit_budgets_gb=(0.001, 0.01, 0.05),
    hit_alphas=(1.1, 1.5, 2.1),
    hit_sim_requests=200,
    hit_engine_requests=12,
    hit_engine_budget_gb=0.001,
    hit_engine_alpha=2.1,
    hit_engine_output_len=1,
    warmup_requests=2,
    max_point_s=60.0,
)


class Clock:
    """The run's deadline, and each mode's slice of what is left of it."""

    def __init__(self, budget_s: float, reserve_s: float) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + budget_s - reserve_s

    def now(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def mode_deadline(self, weight: float, weights_left: float) -> float:
        return time.monotonic() + max(0.0, self.left()) * weight / weights_left


class Run:
    """Everything measured so far, as the JSON written after every point."""

    def __init__(self, out: Path, plan: Plan, clock: Clock, meta: dict) -> None:
        self.out, self.clock = out, clock
        self.data: dict = {
            "meta": meta,
            "plan": _plan_dict(plan),
            "rate_sweep": [],
            "shared_document": [],
            "hit_ratio": {"sim": None, "engine": []},
            "skipped": [],
            "errors": [],
        }

    def log(self, text: str) -> None:
        print(f"[{self.clock.now():6.1f}s] {text}", flush=True)

    def add(self, key: str, item: dict) -> None:
        self.data[key].append(item)
        self.save()

    def error(self, where: str, e: BaseException) -> None:
        self.log(f"ERROR in {where}: {e!r}")
        traceback.print_exc()
        self.data["errors"].append({"where": where, "error": repr(e), "at_s": self.clock.now()})
        self.save()

    def skip(self, what: str, why: str) -> None:
        self.log(f"skip {what}: {why}")
        self.data["skipped"].append({"what": what, "why": why})

    def save(self) -> None:
        self.data["wall_s"] = self.clock.now()
        report.write_json(self.out / "serving.json", self.data)


def _plan_dict(plan: Plan) -> dict:
    d = asdict(plan)
    d["rate_points"] = [[g, None if math.isinf(r) else r, n] for g, r, n in plan.rate_points]
    return d


def _point_line(mode: str, what: str, s) -> str:
    return (
        f"{mode:<6} {what:<28} {s.completed}/{s.total} done, TTFT mean {s.ttft.mean:8.1f} ms p99 "
        f"{s.ttft.p99:8.1f}, {s.request_throughput:6.2f} req/s, {s.output_throughput:7.1f} tok/s, "
        f"hit {100 * s.doc_hit_ratio:5.1f} %, peak KV {s.peak_kv_gb:6.2f} GiB"
    )


# -- the experiments -----------------------------------------------------------------------------------------


def hit_sim_jobs(plan: Plan) -> list[tuple]:
    """Arguments of `sweep` for the simulated hit-ratio experiment, one job per alpha."""
    mc = ModelConfig.tiny() if plan.model == "tiny" else ModelConfig.from_dir(plan.model)
    acct = page_accounting(mc, plan.page_size, EngineConfig(model=plan.model, device=plan.device).torch_dtype)
    spec = replace(plan.spec, num_requests=plan.hit_sim_requests)
    return [(spec, [alpha], plan.hit_budgets_gb, acct, *token_space(mc)) for alpha in plan.hit_alphas]


def _low_priority() -> None:
    os.nice(15)  # the simulation must not slow down the process driving the GPU


def hit_ratio_engine(run: Run, plan: Plan, engine, mode: str, until: float) -> None:
    """Experiment 2's real engine run: one request at a time, with the pool the budget reading gives."""
    mc = engine.model_config
    spec = replace(
        plan.spec,
        zipf_alpha=plan.hit_engine_alpha,
        num_requests=plan.hit_engine_requests,
        output_len=plan.hit_engine_output_len,
    )
    trace = make_trace(spec, Load(concurrency=1), *token_space(mc))
    acct = page_accounting(mc, plan.page_size, engine.config.torch_dtype)
    budget = int(plan.hit_engine_budget_gb * 2**30)
    pages = pool_pages(budget, "pool_plus_request", spec, trace.system_len, acct)
    if pages < working_set_pages(mode, spec, trace.system_len, plan.page_size):
        run.skip(f"{mode} hit-ratio engine run", "the pool cannot hold one request")
        return
    with kv_budget(engine, pages):
        result = replay(engine, trace, max_seconds=max(1.0, until - time.monotonic()))
    sim = simulate(trace, mode, pages, plan.page_size)
    s = result.summary
    row = {
        "mode": mode,
        "policy": "pool_plus_request",
        "budget_gb": plan.hit_engine_budget_gb,
        "alpha": plan.hit_engine_alpha,
        "pool_gb": pages * acct.page_bytes / 2**30,
        "requests": s.total,
        "completed": s.completed,
        "doc_hit_ratio": s.doc_hit_ratio,
        "token_reuse_ratio": s.token_reuse_ratio,
        "sim_same_requests_hit_ratio": sim.doc_hit_ratio,
        "timed_out": result.timed_out,
        "wall_s": result.wall_s,
        "evictions": s.evictions,
        "sim_evictions": sim.evictions,
    }
    run.data["hit_ratio"]["engine"].append(row)
    run.save()
    run.log(
        f"{mode:<6} hit ratio @ {plan.hit_engine_budget_gb:g} GB (+1 block request), zipf "
        f"{plan.hit_engine_alpha:g}: engine {100 * s.doc_hit_ratio:.2f} % over {s.completed} requests, "
        f"simulation of the same requests {100 * sim.doc_hit_ratio:.2f} %"
    )


def serve_point(run: Run, plan: Plan, engine, mode: str, key: str, group: str, trace, until: float) -> None:
    result = replay(engine, trace, max_seconds=min(plan.max_point_s, until - time.monotonic()))
    run.add(key, {"experiment": key, **report.PointResult.of(group, result).to_dict()})
    what = f"{group} {trace.load.label}"
    run.log(_point_line(mode, what, result.summary) + (" (cut: partial)" if result.timed_out else ""))


def run_mode(run: Run, plan: Plan, mode: str, weight: float, weights_left: float) -> None:
    options = dict(
        model=plan.model,
        device=plan.device,
        kv_cache_gb=plan.kv_cache_gb,
        page_size=plan.page_size,
        random_weights=True,
        seed=0,
    )
    t = time.monotonic()
    engine = make_engine(options, mode)
    mc = engine.model_config
    high, bos = token_space(mc)
    shared = WorkloadSpec(
        num_docs=1,
        doc_len=plan.shared_doc_len,
        docs_per_request=1,
        zipf_alpha=None,
        question_len=plan.spec.question_len,
        output_len=plan.spec.output_len,
        num_requests=1,
        seed=plan.spec.seed,
    )
    warm_up(engine, warmup_trace(plan.spec, plan.warmup_requests, high, bos))
    warm_up(engine, warmup_trace(shared, 1, high, bos))
    # The slice starts after the warm-up: the first mode's kernel compilation is shared by all modes.
    until = run.clock.mode_deadline(weight, weights_left)
    run.log(
        f"{mode}: engine built and warmed up in {time.monotonic() - t:.1f} s ({engine.num_pages} pages "
        f"of {engine.executor.page_bytes / 2**20:g} MiB); {until - time.monotonic():.0f} s for its points"
    )

    tasks = []  # (label, expected seconds or None, callable), in priority order
    if mode != "full":
        tasks.append(("hit-ratio engine run", None, lambda: hit_ratio_engine(run, plan, engine, mode, until)))
    concurrency = plan.shared_concurrency_full if mode == "full" else plan.shared_concurrency

    def rate_task(group: str, rate: float, n: int):
        spec = replace(plan.spec, num_requests=n, zipf_alpha=None if group == "uniform" else plan.spec.zipf_alpha)
        trace = make_trace(spec, Load(rate=rate), high, bos)
        return lambda: serve_point(run, plan, engine, mode, "rate_sweep", group, trace, until)

    def shared_task(c: int):
        # c requests, all in flight at once: a closed loop of c over c requests
        trace = make_trace(replace(shared, num_requests=c), Load(concurrency=c), high, bos)
        return lambda: serve_point(
            run, plan, engine, mode, "shared_document", f"shared {plan.shared_doc_len}", trace, until
        )

    rate_tasks = [
        (
            f"{group} {'saturation' if math.isinf(rate) else f'rate {rate:g}'}",
            None if math.isinf(rate) else n / rate + 2.0,
            rate_task(group, rate, n),
        )
        for group, rate, n in plan.rate_points
    ]
    shared_tasks = [(f"shared document x{c}", None, shared_task(c)) for c in concurrency]
    tasks += rate_tasks[: plan.shared_after] + shared_tasks + rate_tasks[plan.shared_after :]

    for label, expected, task in tasks:
        left = until - time.monotonic()
        if left < (expected or 5.0):
            run.skip(f"{mode} {label}", f"{left:.0f} s left in this mode's slice")
            continue
        try:
            task()
        except Exception as e:
            run.error(f"{mode} {label}", e)
            if engine.has_unfinished():  # the engine is in an unknown state: drop the mode's other points
                run.skip(f"{mode}: remaining points", "engine left with unfinished requests after an error")
                break
    engine = None
    free_device_memory()


def collect_sim(run: Run, plan: Plan, futures: list | None) -> None:
    try:
        if futures is None:  # no side processes: simulate here, now
            rows = [row for job in hit_sim_jobs(plan) for row in sweep(*job)]
        else:
            rows = [row for f in futures for row in f.get(timeout=max(1.0, run.clock.left()))]
        run.data["hit_ratio"]["sim"] = {
            "rows": rows,
            "requests": plan.hit_sim_requests,
            "concurrency": 1,
            "simulated": True,
        }
        run.save()
    except Exception as e:
        run.error("hit-ratio simulation", e)


def write_outputs(run: Run, plan: Plan) -> None:
    d = run.data
    title = f"{d['meta'].get('gpu', d['meta']['device'])}, {Path(plan.model).name}"
    rate = [report.PointResult.from_dict(p) for p in d["rate_sweep"]]
    shared = [report.PointResult.from_dict(p) for p in d["shared_document"]]
    for name, fn in (
        ("rate_sweep.png", lambda path: plots.plot_rate_sweep(rate, path, title)),
        ("shared_document.png", lambda path: plots.plot_shared_document(shared, path, title)),
        (
            "hit_ratio.png",
            lambda path: plots.plot_hit_ratio(
                (d["hit_ratio"]["sim"] or {}).get("rows", []),
                path,
                d["hit_ratio"]["engine"],
                title + ": simulated lines, engine runs circled",
            ),
        ),
    ):
        try:
            fn(run.out / name)
        except Exception as e:
            run.error(f"plot {name}", e)
    md = summary_markdown(d)
    (run.out / "serving.md").write_text(md)
    run.save()
    print("\n" + md, flush=True)


def environment(plan: Plan) -> dict:
    meta = {
        "command": " ".join(sys.argv),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "model": plan.model,
        "device": plan.device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "host": platform.node(),
    }
    if plan.device == "cuda" and torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name()
        meta["gpu_memory_gb"] = torch.cuda.get_device_properties(0).total_memory / 2**30
        try:
            import triton

            meta["triton"] = triton.__version__
        except ImportError:
            pass
    try:
        meta["commit"] = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        meta["commit"] = None
    return meta


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="output directory")
    p.add_argument("--smoke", action="store_true", help="tiny model on the CPU, small shapes (structure check)")
    p.add_argument("--budget-s", type=float, default=None, help="total wall-clock budget (GPU 480, smoke 240)")
    p.add_argument("--modes", default=None, help="comma-separated subset of lazy,block,prefix,full")
    p.add_argument("--kv-cache-gb", type=float, default=None, help="override the plan's KV pool")
    args = p.parse_args(argv)
    plan = SMOKE if args.smoke else GPU
    if args.modes:
        keep = args.modes.split(",")
        weights = dict(zip(plan.modes, plan.mode_weights))
        plan = replace(plan, modes=tuple(keep), mode_weights=tuple(weights.get(m, 1.0) for m in keep))
    if args.kv_cache_gb:
        plan = replace(plan, kv_cache_gb=args.kv_cache_gb)
    if plan.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU; use --smoke for the CPU structure check", file=sys.stderr)
        return 2
    if plan.device == "cpu":
        torch.set_num_threads(1)  # tiny's ops gain nothing from threads, which stall each other on a busy CPU
    data = run_plan(plan, Path(args.out), args.budget_s or (240.0 if args.smoke else 480.0))
    return 1 if data["errors"] else 0


def run_plan(plan: Plan, out: Path, budget_s: float) -> dict:
    """Run every experiment of `plan` within `budget_s`; returns the JSON document (also in out/serving.json)."""
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock(budget_s, reserve_s=min(15.0, budget_s / 10))
    run = Run(out, plan, clock, environment(plan))
    run.log(
        f"plan: model {plan.model} on {plan.device}, modes {','.join(plan.modes)}, KV pool "
        f"{plan.kv_cache_gb:g} GiB, deadline {clock.deadline - clock.start:.0f} s"
    )
    run.save()
    # Side processes are forked before CUDA is initialised (fork after CUDA init is unsafe); terminated at the
    # end whatever state they are in, so a stuck one cannot hold the run past its deadline.
    sim_pool, futures = None, None
    try:
        sim_pool = multiprocessing.get_context("fork").Pool(len(plan.hit_alphas), initializer=_low_priority)
        futures = [sim_pool.apply_async(sweep, job) for job in hit_sim_jobs(plan)]
    except Exception as e:
        run.log(f"hit-ratio simulation will run inline at the end: {e!r}")
    try:
        weights = list(plan.mode_weights)
        for i, mode in enumerate(plan.modes):
            if clock.left() < 30.0:  # building and warming up an engine alone takes about that long at 8B
                run.skip(f"{mode}: every point", f"{clock.left():.0f} s left in the run")
                continue
            run.log(f"== {mode}")
            try:
                run_mode(run, plan, mode, weights[i], sum(weights[i:]))
            except Exception as e:
                run.error(f"{mode} engine", e)
            free_device_memory()  # here, not in the except block: its traceback still holds the engine
        collect_sim(run, plan, futures)
    finally:
        if sim_pool is not None:
            sim_pool.terminate()
        write_outputs(run, plan)
    run.log("done")
    return run.data


if __name__ == "__main__":
    sys.exit(main())
