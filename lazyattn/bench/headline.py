"""The steady-state headline of `lazyattn bench --rate-search | --steady | --cold-start | --merge`.

Per mode: one engine, the protocol's discarded warm-up requests, then (with --cold-start) the cold-start curve from
an empty cache, then the cache primed to a long-running server's state (prime.py; not with --no-prime), then the
steady-state points, either the listed --rate values or the rate search (search.py), the cache carried from point
to point (each point's warm-up waits for its own steady hit ratio). steady.json is
rewritten after every point, so a run stopped from outside keeps what it measured; steady.md (its Markdown:
steady_report.py) and the plots are written at the end, and rebuilt from several runs' steady.json by --merge (modes
run on separate GPUs). The command-line side of these runs is steady_cli.py.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import traceback
from dataclasses import asdict
from pathlib import Path

from lazyattn.bench import report
from lazyattn.bench.metrics import percentile
from lazyattn.bench.search import SearchConfig, SearchResult, search
from lazyattn.bench.steady import PhaseConfig, PointResult, base_trace, cold_start_bins, run_point
from lazyattn.bench.steady_report import summary_markdown

SMOKE_PHASES = PhaseConfig(
    window_s=0.8, window_requests=10, warmup_min_s=0.2, warmup_max_s=1.0, warmup_block=5, warmup_tol=0.1, drain_s=1.0
)


def run_modes(
    *,
    modes: list[str],
    options: dict,
    spec,
    vocab_high: int,
    bos: int | None,
    phases: PhaseConfig,
    search_cfg: SearchConfig | None,
    rates: list[float],
    cold_start: tuple[float, float, float] | None,  # (rate, seconds, bin seconds)
    deadline: float,
    min_point_s: float,
    warmup_requests: int,
    data: dict,
    out: Path | None,
    prime: bool = True,
    recorder=None,
) -> dict:
    """Measure every mode into data["modes"]; the deadline (time.monotonic()) is shared out evenly over the modes
    still to run. `recorder` (bench/trace.py): traces every point's measured window."""
    from lazyattn.bench.replay import free_device_memory, make_engine, warm_up
    from lazyattn.bench.workload import warmup_trace

    trace = base_trace(spec, vocab_high, bos)
    warm = warmup_trace(spec, warmup_requests, vocab_high, bos)
    data.setdefault("modes", {})
    for k, mode in enumerate(modes):
        mode_deadline = time.monotonic() + (deadline - time.monotonic()) / (len(modes) - k)
        entry: dict = {
            "points": [],
            "converged": None,
            "stopped": "",
            "sustainable": [],
            "cold_start": None,
            "primed": None,
        }
        data["modes"][mode] = entry
        t_load = time.monotonic()
        engine = None
        try:
            engine = make_engine(options, mode)
            if warm.requests:
                warm_up(engine, warm)
            engine.reset_cache()
            entry["startup_s"] = time.monotonic() - t_load
            run = _ModeRun(engine, trace, vocab_high, entry, data, out, search_cfg, recorder)
            if cold_start is not None and mode_deadline - time.monotonic() >= min_point_s:
                run.cold_start(*cold_start, deadline=mode_deadline)
            # Priming stops a point's time before the deadline, so that the first point still gets measured.
            if prime and (search_cfg is not None or rates) and mode_deadline - time.monotonic() >= 2 * min_point_s:
                run.prime(deadline=mode_deadline - min_point_s)
            if search_cfg is not None:
                result = search(
                    run.measure,
                    mode,
                    phases,
                    search_cfg,
                    deadline=mode_deadline,
                    min_point_s=min_point_s,
                    on_point=run.searched,
                )
                run.searched(result)
            else:
                for rate in rates:
                    if mode_deadline - time.monotonic() < min_point_s:
                        entry["stopped"] = "budget"
                        break
                    run.measure(rate, phases, False, mode_deadline)
        except Exception as e:  # a mode that fails is reported, the others still run
            traceback.print_exc()
            entry["error"] = repr(e)
        entry["elapsed_s"] = time.monotonic() - t_load
        _checkpoint(data, out)
        engine = run = None
        free_device_memory()
    return data


class _ModeRun:
    """One mode's engine and its entry of the result document, checkpointed after every point."""

    def __init__(self, engine, trace, vocab_high: int, entry: dict, data: dict, out, search_cfg, recorder=None) -> None:
        self.engine, self.trace, self.vocab_high = engine, trace, vocab_high
        self.entry, self.data, self.out, self.search_cfg = entry, data, out, search_cfg
        self.recorder = recorder

    def cold_start(self, rate: float, seconds: float, bin_s: float, *, deadline: float) -> None:
        phases = PhaseConfig(window_s=seconds, window_requests=0, drain_s=max(2.0, seconds / 4), warmup=False)
        left = deadline - time.monotonic()
        if left < seconds + phases.drain_s:  # the budget's share: 80 % traffic, 20 % for the last answers
            phases = PhaseConfig(window_s=0.8 * left, window_requests=0, drain_s=0.2 * left, warmup=False)
        self.engine.reset_cache()
        point = run_point(self.engine, self.trace, rate, phases, self.vocab_high, point=10_000, deadline=deadline)
        self.entry["cold_start"] = {
            "rate": rate,
            "seconds": point.window_s,
            "bin_s": bin_s,
            "bins": cold_start_bins(point, bin_s),
            "point": point.to_dict(timeline=True),
        }
        _checkpoint(self.data, self.out)

    def prime(self, *, deadline: float) -> None:
        """The cache as a long-running server keeps it, before the first point (prime.py)."""
        from lazyattn.bench.prime import prime_cache

        primed = prime_cache(self.engine, self.trace, self.vocab_high, deadline=deadline)
        self.entry["primed"] = primed.to_dict()
        print(
            f"{self.engine.mode.name:>6} primed {primed.documents} documents ({primed.requests} requests) in "
            f"{primed.seconds:.1f} s: cache {primed.kv_gib:.3g} GiB{' (timed out)' if primed.timed_out else ''}",
            flush=True,
        )
        _checkpoint(self.data, self.out)

    def measure(self, rate: float, phases: PhaseConfig, shortened: bool, deadline: float) -> PointResult:
        n = len(self.entry["points"])
        p = run_point(
            self.engine,
            self.trace,
            rate,
            phases,
            self.vocab_high,
            point=n,
            deadline=deadline,
            shortened=shortened,
            recorder=self.recorder,
            label=f"{self.engine.mode.name} {rate:g} req/s (point {n})",
        )
        self.entry["points"].append(p.to_dict())
        print(_point_line(p, self.search_cfg), flush=True)
        _checkpoint(self.data, self.out)
        return p

    def searched(self, result: SearchResult) -> None:
        _fill_search(self.entry, result)
        _checkpoint(self.data, self.out)


def _fill_search(entry: dict, result: SearchResult) -> None:
    entry["converged"] = result.converged
    entry["stopped"] = result.stopped
    entry["sustainable"] = result.sustainable()


def _checkpoint(data: dict, out: Path | None) -> None:
    if out is not None:
        report.write_json(out / "steady.json", data)


def _point_line(p: PointResult, search_cfg: SearchConfig | None) -> str:
    targets = search_cfg.targets_ms if search_cfg else ()
    verdict = " ".join(f"{t:g}ms:{'pass' if p.meets(t, search_cfg.keep_up) else 'fail'}" for t in targets)
    return (
        f"{p.mode:>6} rate {p.rate:8.3f}  window {p.window_s:6.1f} s / {p.window_requests:5d} req"
        f"{' (shortened)' if p.shortened else ''}  warm-up {p.warmup_s:5.1f} s{'' if p.warmup_steady else ' (cap)'}"
        f"  hit {100 * p.hit_ratio:5.1f} %  TTFT p50/p99 {p.ttft_ms.get('p50', math.nan):8.1f} /"
        f" {p.ttft_ms.get('p99', math.nan):8.1f} ms  keep-up {100 * p.keep_up:5.1f} %  idle {len(p.idle_ttfts_ms):4d}"
        f" (p50 {percentile(p.idle_ttfts_ms, 50):8.1f} ms)  {verdict}"
    )


def write_outputs(data: dict, out: Path) -> list[Path]:
    from lazyattn.bench import plots

    report.write_json(out / "steady.json", data)
    (out / "steady.md").write_text(summary_markdown(data))
    written = [out / "steady.json", out / "steady.md"]
    name = data["workload"]["name"]
    targets = sorted({r["target_ms"] for e in data["modes"].values() for r in e.get("sustainable", [])})
    if plots.plot_steady(data, out / f"ttft_vs_rate_{name}.png", targets):
        written.append(out / f"ttft_vs_rate_{name}.png")
    if plots.plot_cold_start(data, out / f"cold_start_{name}.png"):
        written.append(out / f"cold_start_{name}.png")
    return written


def merge(paths: list[str], out: Path | None) -> dict:
    """One document from several runs' steady.json (a directory holding one, or the file): their modes side by
    side. The runs must share a workload."""
    merged: dict | None = None
    for p in paths:
        path = Path(p)
        doc = json.loads((path / "steady.json" if path.is_dir() else path).read_text())
        if merged is None:
            merged = {**doc, "modes": {}, "merged_from": []}
        elif doc["workload"] != merged["workload"]:
            raise ValueError(f"{p}: workload {doc['workload']} differs from {merged['workload']}")
        for mode, entry in doc["modes"].items():
            if mode in merged["modes"]:
                raise ValueError(f"{p}: mode {mode} is already in an earlier run")
            merged["modes"][mode] = entry
        merged["merged_from"].append({"path": str(p), "command": doc.get("meta", {}).get("command")})
    if merged is None:
        raise ValueError("--merge needs at least one steady.json")
    if out is not None:
        write_outputs(merged, out)
    return merged


def phases_from_args(args: argparse.Namespace, smoke: bool) -> PhaseConfig:
    base = SMOKE_PHASES if smoke else PhaseConfig()
    pick = lambda name, default: default if getattr(args, name) is None else getattr(args, name)  # noqa: E731
    return PhaseConfig(
        window_s=pick("window_s", base.window_s),
        window_requests=pick("window_requests", base.window_requests),
        warmup_min_s=pick("warmup_min_s", base.warmup_min_s),
        warmup_max_s=pick("warmup_max_s", base.warmup_max_s),
        warmup_block=pick("warmup_block", base.warmup_block),
        warmup_tol=base.warmup_tol,
        drain_s=base.drain_s,
    )


def phases_dict(phases: PhaseConfig) -> dict:
    return asdict(phases)
