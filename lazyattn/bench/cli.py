"""`lazyattn bench`: one seeded RAG trace per load point, replayed through every requested mode.

    lazyattn bench                                   # tiny model on the CPU, a small trace, seconds
    lazyattn bench --model benchmarks/models/llama-3.1-8b --random-weights --device cuda \\
        --modes lazy,block,prefix,full --num-docs 100 --doc-len 2048 --docs-per-request 5 --zipf 2.1 \\
        --question-len 32 --output-len 16 --rate 0.5,1,2,4,inf --num-requests 60 --seed 0 --out results/
    lazyattn bench --kv-budgets 1,10,50 --alphas 1.1,1.5,2.1 ...   # + simulated hit ratio vs KV budget
    lazyattn bench --hit-ratio-only --replicas-sim 1,2,4,8,16,32,64 ...  # + replicas behind each router, simulated

The steady state (bench/headline.py): per mode, the highest Poisson rate meeting each p99 TTFT target, each point
a warm-up until the document hit ratio holds steady then a measured window; steady.{json,md} and plots in --out.
    lazyattn bench --smoke                           # the whole protocol on the CPU, tiny model, seconds a mode
    lazyattn bench --model benchmarks/models/llama-3.1-8b --random-weights --workload paper --rate-search \
        --modes lazy --budget-s 470 --out results/lazy      # one mode per GPU; also --cold-start, --steady --rate
    lazyattn bench --merge results/lazy results/block --out results/merged

Prints vLLM's result block per mode and load, then one comparison table with ratios against lazy; with --out,
writes bench.json, ttft_vs_rate.png (several loads), hit_ratio_vs_budget.png (with --kv-budgets) and
replicas.png (with --replicas-sim).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from lazyattn.bench.steady_cli import _floats, _meta, add_steady_args, cmd_merge, cmd_steady
from lazyattn.bench.workloads import named_workload, workload_names
from lazyattn.engine.config import MODES, EngineConfig

SMALL = dict(num_docs=20, doc_len=128, num_requests=16)  # the tiny model's context is 4096 tokens


def add_bench_parser(
    sub, engine_args: Callable[..., None], engine_options: Callable[[argparse.Namespace], dict]
) -> None:
    p = sub.add_parser(
        "bench",
        help="RAG serving benchmark: one seeded trace replayed through every mode",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    engine_args(p, mode=False)
    p.set_defaults(mode=None)  # the engine options' mode: each replay sets its own
    p.add_argument(
        "--modes",
        "--mode",
        dest="modes",
        default=None,
        help=f"modes to compare, comma-separated (default: {','.join(MODES)}); --mode is the same option",
    )
    p.add_argument("--random-weights", action="store_true", help="read only config.json, draw the weights")
    w = p.add_argument_group(
        "workload (defaults: the benchmark protocol of docs/design.md, results in "
        "docs/benchmarks.md; with --model tiny a smaller pool and documents)"
    )
    w.add_argument("--num-docs", type=int, default=None, help="document pool size (100; tiny: 20)")
    w.add_argument("--doc-len", type=int, default=None, help="tokens per document (2048; tiny: 128)")
    w.add_argument("--docs-per-request", type=int, default=None, help="documents each request retrieves (5)")
    skew = w.add_mutually_exclusive_group()
    skew.add_argument("--zipf", type=float, default=None, help="Zipf alpha of document popularity (2.1)")
    skew.add_argument("--uniform", action="store_true", help="uniform document popularity")
    w.add_argument("--no-shuffle", action="store_true", help="documents in pool order, not shuffled per request")
    w.add_argument("--system-len", type=int, default=0, help="system prompt tokens after BOS")
    w.add_argument(
        "--workload",
        choices=workload_names(),
        default=None,
        help="a named workload (docs/benchmarks.md): paper 100 x 2048 tokens, 5 per request, Zipf 2.1; wide 200 x "
        "512, 10, Zipf 1.5; long 20 x 16384, 2, Zipf 2.1; -membound: a KV budget that holds a quarter of the pool "
        "plus 4 requests (overrides --kv-cache-gb). Explicit --num-docs etc. override its shapes",
    )
    w.add_argument("--question-len", type=int, default=None, help="question tokens after the documents (32)")
    w.add_argument("--output-len", type=int, default=None, help="exact output length, EOS ignored (16)")
    w.add_argument("--num-requests", type=int, default=None, help="requests per load point (60; tiny: 16)")
    w.add_argument("--rate", default=None, help="Poisson req/s, comma-separated; inf = all at t=0 (saturation)")
    w.add_argument("--concurrency", default=None, help="closed loop: requests kept in flight, comma-separated")
    w.add_argument("--warmup-requests", type=int, default=3, help="on documents outside the pool, not counted")
    w.add_argument(
        "--warm-cache",
        action="store_true",
        help="measure each point on the document cache an unmeasured pass of its trace left (default: cold)",
    )
    add_steady_args(p)
    h = p.add_argument_group("hit ratio vs KV budget (simulated through the engine's cache, no model run)")
    h.add_argument("--kv-budgets", default=None, help="GB, comma-separated, e.g. 1,10,50")
    h.add_argument("--alphas", default="1.1,1.5,2.1", help="Zipf alphas ('uniform' allowed)")
    h.add_argument("--hit-requests", type=int, default=1000, help="requests per simulated trace")
    h.add_argument("--hit-ratio-only", action="store_true", help="only the simulation: no model is loaded")
    h.add_argument(
        "--host-gb",
        type=float,
        default=0.0,
        help="host tier (GiB) behind every KV budget: adds GPU / host / effective hit columns (0: none)",
    )
    h.add_argument(
        "--disk-gb",
        type=float,
        default=0.0,
        help="disk tier (GiB) below the host tier, lazy and block mode: adds a disk hit column (0: none)",
    )
    r = p.add_argument_group(
        "replicas behind a router (simulated: the routing policies of lazyattn serve "
        "--replicas over the engine's cache, no model run; bench/replicas.py)"
    )
    r.add_argument("--replicas-sim", default=None, help="replica counts, comma-separated, e.g. 1,2,4,8,16,32,64")
    r.add_argument(
        "--routers",
        default="round-robin,least-loaded,prefix-affinity,document-affinity",
        help="routing policies to compare",
    )
    r.add_argument(
        "--sim-variants",
        default="paper,zipf-1.1,uniform,pool-order",
        help="workload variants: paper (the protocol's), zipf-1.1, uniform, pool-order (unshuffled)",
    )
    r.add_argument("--sim-kv-gb", type=float, default=4.0, help="KV budget of each replica, GB (4)")
    r.add_argument("--sim-rate", type=float, default=8.0, help="Poisson arrivals per replica, req/s (8)")
    r.add_argument("--sim-requests", type=int, default=2000, help="requests per simulated trace (2000)")
    r.add_argument("--load-margin", type=int, default=2, help="the affinity routers' load bound (2)")
    o = p.add_argument_group("output")
    o.add_argument("--out", default=None, help="directory for bench.json and the plots")
    o.add_argument("--no-progress", action="store_true", help="no progress bars")
    o.add_argument("--max-seconds", type=float, default=math.inf, help="abort a load point after this long")
    # --cpu-threads is every model command's (lazyattn/cli.py); bench's default is 1: small models' ops gain nothing
    # from intra-op threads, and on a busy CPU the threads stall each other (a tiny-model replay measured many times
    # slower with two threads than with one on a loaded box: docs/benchmarks.md, "Kernel constants").
    p.set_defaults(func=lambda args: cmd_bench(args, engine_options), cpu_threads=1)


def workload_spec(args: argparse.Namespace, tiny: bool):
    """The workload: --workload's shapes (smoke shapes with --smoke), each overridden by an explicit option; without
    --workload the protocol's defaults (tiny: a smaller pool and documents)."""
    from lazyattn.bench.workload import WorkloadSpec

    if args.workload:
        num_docs, doc_len, per_request, alpha = named_workload(args.workload, smoke=args.smoke)
    elif args.smoke:
        num_docs, doc_len, per_request, alpha = named_workload("paper", smoke=True)
    else:
        num_docs, doc_len = (SMALL["num_docs"], SMALL["doc_len"]) if tiny else (100, 2048)
        per_request, alpha = 5, 2.1
    pick = lambda v, default: default if v is None else v  # noqa: E731
    return WorkloadSpec(
        num_docs=pick(args.num_docs, num_docs),
        doc_len=pick(args.doc_len, doc_len),
        docs_per_request=pick(args.docs_per_request, per_request),
        zipf_alpha=None if args.uniform else pick(args.zipf, alpha),
        shuffle=not args.no_shuffle,
        question_len=pick(args.question_len, 8 if args.smoke else 32),
        output_len=pick(args.output_len, 4 if args.smoke else 16),
        num_requests=args.num_requests or (SMALL["num_requests"] if tiny else 60),
        system_len=args.system_len,
        seed=args.seed,
    )


def parse_alphas(text: str) -> list[float | None]:
    return [None if t.strip().lower() == "uniform" else float(t) for t in text.split(",")]


def cmd_bench(args: argparse.Namespace, engine_options: Callable[[argparse.Namespace], dict]) -> int:
    t_start = time.monotonic()  # --budget-s counts from here: model load and warm-up included
    from lazyattn.bench import plots, report
    from lazyattn.bench.hitratio import DISK_HIT_COLUMNS, HIT_COLUMNS, HOST_HIT_COLUMNS, page_accounting, pivot, sweep
    from lazyattn.bench.replay import free_device_memory, make_engine, replay, warm_up
    from lazyattn.bench.workload import Load, make_trace, token_space, warmup_trace
    from lazyattn.model.config import ModelConfig

    if args.merge:
        return cmd_merge(args)
    if args.smoke:
        args.model, args.device = "tiny", "cpu"
    options = engine_options(args)
    options.pop("mode")
    options["random_weights"] = args.random_weights
    if args.smoke:
        options["page_size"] = 16
    modes = args.modes.split(",") if args.modes else list(MODES)
    bad = [m for m in modes if m not in MODES]
    if bad:
        print(f"error: unknown mode(s) {', '.join(bad)}; choose from {', '.join(MODES)}", file=sys.stderr)
        return 2
    tiny = args.model == "tiny"
    spec = workload_spec(args, tiny)
    if args.rate_search or args.steady or args.cold_start or args.smoke:
        return cmd_steady(args, options, spec, modes, t_start)
    loads = [Load(rate=r) for r in _floats(args.rate)] if args.rate else []
    loads += [Load(concurrency=int(c)) for c in args.concurrency.split(",")] if args.concurrency else []
    loads = loads or [Load()]
    model_cfg = ModelConfig.tiny() if tiny else ModelConfig.from_dir(args.model)
    vocab_high, bos = token_space(model_cfg)
    traces = [make_trace(spec, load, vocab_high, bos) for load in loads]
    warm = warmup_trace(spec, args.warmup_requests, vocab_high, bos)
    print(
        f"lazyattn bench: model {args.model} on {options['device']}, KV cache {options['kv_cache_dtype']}, modes "
        f"{','.join(modes)}\n"
        f"workload: {spec.num_docs} docs x {spec.doc_len} tokens, {spec.docs_per_request} per request "
        f"({'shuffled' if spec.shuffle else 'pool order'}), {spec.popularity}, question {spec.question_len}, "
        f"output {spec.output_len}, {spec.num_requests} requests per load, seed {spec.seed}\n"
        f"loads: {', '.join(load.label for load in loads)}\n",
        flush=True,
    )

    recorder = None
    if args.trace:
        from lazyattn.bench.trace import TraceRecorder

        recorder = TraceRecorder()
    results: list[report.PointResult] = []
    for mode in [] if args.hit_ratio_only else modes:
        try:
            engine = make_engine(options, mode)
            if warm.requests:
                warm_up(engine, warm)
        except Exception as e:  # a mode that cannot start is reported, the others still run
            traceback.print_exc()
            results += [report.PointResult.failed(spec.popularity, mode, load.label, repr(e)) for load in loads]
            continue
        for trace in traces:
            try:
                run = replay(
                    engine,
                    trace,
                    max_seconds=args.max_seconds,
                    progress=not args.no_progress,
                    desc=f"{mode} {trace.load.label}",
                    cache="warm" if args.warm_cache else "cold",
                    recorder=recorder,
                )
            except Exception as e:
                traceback.print_exc()
                results.append(report.PointResult.failed(spec.popularity, mode, trace.load.label, repr(e)))
                break  # the engine may be in any state: its remaining loads are not run
            results.append(report.PointResult.of(spec.popularity, run))
            print(
                report.result_block(mode, trace.load.label, run.summary, "timed out: partial" if run.timed_out else ""),
                flush=True,
            )
        engine = None
        free_device_memory()

    if recorder is not None:
        from lazyattn.bench.trace import summary

        recorder.write(Path(args.trace))
        print("\n".join(["", *summary(recorder.document()), f"wrote {args.trace}"]), flush=True)
    rows = report.comparison_rows(results)
    if rows:
        print("\nComparison (ratios: this mode / lazy at the same load)\n" + report.text_table(rows), flush=True)
    data = {
        "meta": _meta(args, options),
        "workload": spec.to_dict(),
        "loads": [ld.to_dict() for ld in loads],
        "points": [r.to_dict() for r in results],
        "comparison": rows,
    }

    if args.kv_budgets:
        acct = page_accounting(model_cfg, options["page_size"], EngineConfig(**options).kv_torch_dtype)
        hit_spec = replace(spec, num_requests=args.hit_requests)
        budgets = _floats(args.kv_budgets)
        hit_rows = sweep(
            hit_spec,
            parse_alphas(args.alphas),
            budgets,
            acct,
            vocab_high,
            bos,
            host_gb=args.host_gb,
            disk_gb=args.disk_gb,
        )
        host = f", host tier {args.host_gb:g} GiB" if args.host_gb else ""
        host += f", disk tier {args.disk_gb:g} GiB" if args.disk_gb else ""
        columns = DISK_HIT_COLUMNS if args.disk_gb else HOST_HIT_COLUMNS if args.host_gb else HIT_COLUMNS
        print(
            f"\nDocument hit ratio vs KV budget (simulated, {args.hit_requests} requests one at a time, "
            f"{acct.token_bytes / 1024:g} KiB of KV per token{host})\n" + report.text_table(pivot(hit_rows), columns),
            flush=True,
        )
        data["hit_ratio"] = {
            "simulated": True,
            "requests": args.hit_requests,
            "page_bytes": acct.page_bytes,
            "host_gb": args.host_gb,
            "disk_gb": args.disk_gb,
            "rows": hit_rows,
        }
    if args.replicas_sim:
        data["replicas"] = _replica_sweep(args, spec, model_cfg, options, vocab_high, bos)
    if args.out:
        out = Path(args.out)
        report.write_json(out / "bench.json", data)
        written = [out / "bench.json"]
        if plots.plot_rate_sweep(results, out / "ttft_vs_rate.png", title=f"{args.model}, {spec.popularity}"):
            written.append(out / "ttft_vs_rate.png")
        if args.kv_budgets and plots.plot_hit_ratio(
            data["hit_ratio"]["rows"],
            out / "hit_ratio_vs_budget.png",
            title=f"{args.model}: simulated document hit ratio",
        ):
            written.append(out / "hit_ratio_vs_budget.png")
        if args.replicas_sim and plots.plot_replicas(
            data["replicas"]["rows"],
            out / "replicas.png",
            title=f"{args.model}: replicas behind each router (simulated)",
        ):
            written.append(out / "replicas.png")
        print("\nwrote " + ", ".join(str(p) for p in written))
    return 1 if any(r.error for r in results) else 0


def _replica_sweep(args: argparse.Namespace, spec, model_cfg, options: dict, vocab_high: int, bos: int | None) -> dict:
    from lazyattn.bench import report
    from lazyattn.bench.hitratio import page_accounting
    from lazyattn.bench.replicas import REPLICA_COLUMNS, sweep_replicas, table_rows

    acct = page_accounting(model_cfg, options["page_size"], EngineConfig(**options).kv_torch_dtype)
    counts = [int(n) for n in args.replicas_sim.split(",")]
    t0 = time.monotonic()
    rows = sweep_replicas(
        replace(spec, num_requests=args.sim_requests),
        args.sim_variants.split(","),
        counts,
        args.routers.split(","),
        args.sim_kv_gb,
        acct,
        vocab_high,
        bos,
        rate_per_replica=args.sim_rate,
        load_margin=args.load_margin,
    )
    print(
        f"\nReplicas behind a router (simulated, {args.sim_requests} requests, {args.sim_kv_gb:g} GB of KV per "
        f"replica, {args.sim_rate:g} req/s per replica, load margin {args.load_margin}; "
        f"{time.monotonic() - t0:.1f} s)\n" + report.text_table(table_rows(rows), REPLICA_COLUMNS),
        flush=True,
    )
    return {
        "simulated": True,
        "requests": args.sim_requests,
        "kv_gb_per_replica": args.sim_kv_gb,
        "rate_per_replica": args.sim_rate,
        "load_margin": args.load_margin,
        "rows": rows,
    }
