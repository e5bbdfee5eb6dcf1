"""The steady-state side of `lazyattn bench` (cli.py builds the parser and dispatches here): its options
(--rate-search, --steady, --cold-start, --smoke, --merge), the command that runs headline.py from them, and --merge.
`_floats` and `_meta` are cmd_bench's too: cli.py imports them from here, so neither module imports the other back.
"""

from __future__ import annotations

import argparse
import math
import platform
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

from lazyattn.engine.config import EngineConfig


def _floats(text: str) -> list[float]:
    return [math.inf if t.strip().lower() in ("inf", "sat", "saturation") else float(t) for t in text.split(",")]


def _meta(args: argparse.Namespace, options: dict) -> dict:
    meta = {
        "command": shlex.join(["lazyattn", *sys.argv[1:]]),  # argv[0] is __main__.py's path under python -m
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "model": args.model,
        "engine_options": options,
        "python": platform.python_version(),
        "host": platform.node(),
    }
    try:
        import torch

        meta["torch"] = torch.__version__
        if str(options.get("device", "")).startswith("cuda") and torch.cuda.is_available():
            meta["gpu"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    return meta


def add_steady_args(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group(
        "steady state (docs/benchmarks.md): open-loop Poisson points, each a warm-up until the document hit ratio "
        "holds steady then a measured window; the rate search; the cold-start curve; writes steady.{json,md} + PNGs"
    )
    s.add_argument(
        "--rate-search",
        action="store_true",
        help="per mode, the highest rate meeting each --ttft-target (x2 growth, then bisection to --search-tol)",
    )
    s.add_argument("--steady", action="store_true", help="the steady-state protocol at each --rate (no search)")
    s.add_argument("--ttft-target", default="100,1000", help="p99 TTFT targets, ms, comma-separated (100,1000)")
    s.add_argument("--window-s", type=float, default=None, help="least measured window, s (60; smoke: 0.8)")
    s.add_argument("--window-requests", type=int, default=None, help="least arrivals in the window (1000; smoke: 10)")
    s.add_argument("--warmup-min-s", type=float, default=None, help="least warm-up, s (10; smoke: 0.2)")
    s.add_argument("--warmup-max-s", type=float, default=None, help="most warm-up, s (120; smoke: 1)")
    s.add_argument(
        "--warmup-block",
        type=int,
        default=None,
        help="requests per hit-ratio block of the steadiness test (100; smoke: 5)",
    )
    s.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="total time, model load included: shared over the modes, windows shortened to fit (recorded), the search "
        "stopped unconverged when too little is left (smoke: 8 per mode; default: none)",
    )
    s.add_argument("--search-start", type=float, default=None, help="first rate of the search, req/s (4; smoke: 8)")
    s.add_argument(
        "--search-tol", type=float, default=None, help="stop at lowest fail / highest pass <= 1 + tol (0.1; smoke: 0.5)"
    )
    s.add_argument(
        "--search-growth",
        type=float,
        default=None,
        help="factor between the search's rates until each target has passed and failed once (2)",
    )
    s.add_argument(
        "--whole-windows",
        action="store_true",
        help="never shorten a window below --window-s / --window-requests to fit --budget-s: the search measures the "
        "whole windows that fit and stops there",
    )
    s.add_argument("--max-rate", type=float, default=1e4, help="the search's highest rate, req/s")
    s.add_argument("--max-points", type=int, default=12, help="the search's most points per mode (12)")
    s.add_argument("--keep-up", type=float, default=0.95, help="achieved / offered rate a pass needs (0.95)")
    s.add_argument("--min-point-s", type=float, default=None, help="no new point with less left, s (20; smoke: 1)")
    s.add_argument(
        "--no-prime",
        action="store_true",
        help="do not prime the document cache before the first point (by default the pool's most popular documents "
        "that fit are served once, unmeasured, so the first point starts from a long-running server's cache)",
    )
    s.add_argument(
        "--trace",
        default=None,
        metavar="FILE",
        help="write every point's measured window (plain runs: every load point) as a Chrome / Perfetto trace (engine "
        "steps, request queue / prefill / decode) and print what the p99 requests waited through (docs/benchmarks.md, "
        "'Tracing a window')",
    )
    s.add_argument("--cold-start", action="store_true", help="also the cold-start curve (empty cache) per mode")
    s.add_argument("--cold-start-rate", type=float, default=None, help="its rate, req/s (10; smoke: 4)")
    s.add_argument("--cold-start-s", type=float, default=None, help="its length, s (120; smoke: 1)")
    s.add_argument("--cold-start-bin-s", type=float, default=None, help="its time bins, s (10; smoke: 0.5)")
    s.add_argument(
        "--smoke",
        action="store_true",
        help="the whole steady-state run on the CPU with the tiny model in seconds (smoke shapes, short windows)",
    )
    s.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="RUN",
        help="no model: merge runs' steady.json (directories or files, one mode each) into --out",
    )


def cmd_steady(args: argparse.Namespace, options: dict, spec, modes: list[str], t_start: float) -> int:
    from lazyattn.bench import headline, steady_report
    from lazyattn.bench.hitratio import page_accounting
    from lazyattn.bench.search import SearchConfig
    from lazyattn.bench.workload import token_space
    from lazyattn.bench.workloads import MEMBOUND, membound_kv_gb
    from lazyattn.model.config import ModelConfig

    smoke = args.smoke
    model_cfg = ModelConfig.tiny() if args.model == "tiny" else ModelConfig.from_dir(args.model)
    vocab_high, bos = token_space(model_cfg)
    name = args.workload or ("paper" if smoke else "custom")
    if name.endswith(MEMBOUND):
        acct = page_accounting(model_cfg, options["page_size"], EngineConfig(**options).kv_torch_dtype)
        options["kv_cache_gb"] = membound_kv_gb(spec, acct.token_bytes, options["page_size"])
    phases = headline.phases_from_args(args, smoke)
    targets = tuple(float(t) for t in args.ttft_target.split(","))
    search_cfg = None
    if args.rate_search or (smoke and not args.steady):
        search_cfg = SearchConfig(
            targets_ms=targets,
            start=args.search_start or (8.0 if smoke else 4.0),
            tol=args.search_tol if args.search_tol is not None else (0.5 if smoke else 0.1),
            growth=args.search_growth or 2.0,
            whole_windows=args.whole_windows,
            max_rate=args.max_rate,
            keep_up=args.keep_up,
            max_points=args.max_points,
        )
    rates = [r for r in _floats(args.rate) if math.isfinite(r)] if args.rate else []
    if args.steady and not rates:
        print("error: --steady needs --rate (finite Poisson rates)", file=sys.stderr)
        return 2
    budget = args.budget_s if args.budget_s is not None else (8.0 * len(modes) if smoke else None)
    cold = None
    if args.cold_start or smoke:
        cold = (
            args.cold_start_rate or (4.0 if smoke else 10.0),
            args.cold_start_s or (1.0 if smoke else 120.0),
            args.cold_start_bin_s or (0.5 if smoke else 10.0),
        )
    data = {
        "meta": _meta(args, options),
        "workload": {
            "name": name,
            "spec": spec.to_dict(),
            "kv_cache_gb": options.get("kv_cache_gb"),
            "host_cache_gb": options.get("host_cache_gb"),
        },
        "phases": headline.phases_dict(phases),
        "search": None if search_cfg is None else asdict(search_cfg),
        "budget_s": budget,
    }
    print(
        f"lazyattn bench (steady state): model {args.model} on {options['device']}, modes {','.join(modes)}, "
        f"workload {name} ({spec.num_docs} x {spec.doc_len}, {spec.docs_per_request} per request, {spec.popularity}), "
        f"KV {options.get('kv_cache_gb') or 'auto'} GiB, host tier {options.get('host_cache_gb')}, "
        f"budget {budget or 'none'} s\n",
        flush=True,
    )
    out = Path(args.out) if args.out else None
    recorder = None
    if args.trace:
        from lazyattn.bench.trace import TraceRecorder

        recorder = TraceRecorder()
    headline.run_modes(
        modes=modes,
        options=options,
        spec=spec,
        vocab_high=vocab_high,
        bos=bos,
        phases=phases,
        search_cfg=search_cfg,
        rates=rates,
        cold_start=cold,
        deadline=t_start + budget if budget is not None else math.inf,
        min_point_s=args.min_point_s if args.min_point_s is not None else (1.0 if smoke else 20.0),
        warmup_requests=args.warmup_requests,
        data=data,
        out=out,
        prime=not args.no_prime,
        recorder=recorder,
    )
    print("\n" + steady_report.summary_markdown(data), flush=True)
    if recorder is not None:
        from lazyattn.bench.trace import summary

        recorder.write(Path(args.trace))
        print("\n".join([*summary(recorder.document()), f"wrote {args.trace}"]), flush=True)
    if out is not None:
        print("wrote " + ", ".join(str(p) for p in headline.write_outputs(data, out)))
    return 1 if any(e.get("error") for e in data["modes"].values()) else 0


def cmd_merge(args: argparse.Namespace) -> int:
    from lazyattn.bench import headline, steady_report

    data = headline.merge(args.merge, Path(args.out) if args.out else None)
    print(steady_report.summary_markdown(data))
    if args.out:
        print(f"wrote {args.out}/steady.json, steady.md and the plots")
    return 0
