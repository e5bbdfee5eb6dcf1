"""Text, markdown and JSON for benchmark results: vLLM's result block per mode, one comparison table."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lazyattn.bench.metrics import Summary
from lazyattn.bench.replay import PointRun

WIDTH = 50


@dataclass(frozen=True)
class PointResult:
    """One mode at one load point of one experiment: what the tables, plots and JSON are made of."""

    group: str  # rows compared against lazy share a group and a load label (e.g. "zipf 2.1")
    mode: str
    load: str
    rate: float | None  # req/s of a Poisson point; None for saturation and closed loops
    concurrency: int | None
    summary: Summary | None
    wall_s: float = 0.0
    timed_out: bool = False
    error: str | None = None
    extra: dict | None = None  # experiment-specific values (e.g. the per-request arrays)

    @staticmethod
    def of(group: str, run: PointRun, extra: dict | None = None) -> PointResult:
        return PointResult(
            group,
            run.mode,
            run.load.label,
            None if math.isinf(run.load.rate) else run.load.rate,
            run.load.concurrency,
            run.summary,
            run.wall_s,
            run.timed_out,
            extra={**per_request(run), **(extra or {})},
        )

    @staticmethod
    def failed(group: str, mode: str, load: str, error: str) -> PointResult:
        return PointResult(group, mode, load, None, None, None, error=error)

    @staticmethod
    def from_dict(d: dict) -> PointResult:
        summary = Summary.from_dict(d["summary"]) if d.get("summary") else None
        return PointResult(
            d["group"],
            d["mode"],
            d["load"],
            d.get("rate"),
            d.get("concurrency"),
            summary,
            d.get("wall_s", 0.0),
            d.get("timed_out", False),
            d.get("error"),
        )

    def to_dict(self) -> dict:
        return {
            "group": self.group,
            "mode": self.mode,
            "load": self.load,
            "rate": self.rate,
            "concurrency": self.concurrency,
            "summary": None if self.summary is None else self.summary.to_dict(),
            "wall_s": self.wall_s,
            "timed_out": self.timed_out,
            "error": self.error,
            **(self.extra or {}),
        }


def per_request(run: PointRun) -> dict:
    """Per-request values for the JSON (arrival order), in ms."""
    ms = lambda v: None if v is None else round(v * 1e3, 3)  # noqa: E731
    return {
        "requests": {
            "arrival_ms": [ms(r.arrival) for r in run.records],
            "ttft_ms": [ms(r.ttft) for r in run.records],
            "e2el_ms": [ms(r.e2e) for r in run.records],
            "output_tokens": [len(r.token_times) for r in run.records],
            "doc_hits": [r.doc_hits for r in run.records],
            "cached_tokens": [r.cached_tokens for r in run.records],
            "prefilled_tokens": [r.prefilled_tokens for r in run.records],
        }
    }


# -- vLLM's result block ---------------------------------------------------------------------------------


def _line(label: str, value: Any) -> str:
    if isinstance(value, float):
        return f"{label:<40} {value:<10.2f}"
    return f"{label:<40} {value!s:<10}"


def _rule(title: str, fill: str = "-") -> str:
    return f"{title:{fill}^{WIDTH}}"


def result_block(mode: str, load: str, s: Summary, note: str = "") -> str:
    lines = [_rule(" Serving Benchmark Result ", "="), _line("Mode:", mode), _line("Load:", load)]
    if note:
        lines.append(_line("Note:", note))
    lines += [
        _line("Successful requests:", s.completed),
        _line("Benchmark duration (s):", s.duration_s),
        _line("Total input tokens:", s.input_tokens),
        _line("Total generated tokens:", s.output_tokens),
        _line("Request throughput (req/s):", s.request_throughput),
        _line("Output token throughput (tok/s):", s.output_throughput),
        _line("Total Token throughput (tok/s):", s.total_token_throughput),
    ]
    for title, short, stat in (
        ("Time to First Token", "TTFT", s.ttft),
        ("Time per Output Token (excl. 1st token)", "TPOT", s.tpot),
        ("Inter-token Latency", "ITL", s.itl),
        ("End-to-end Latency", "E2EL", s.e2el),
    ):
        lines += [
            _rule(title),
            _line(f"Mean {short} (ms):", stat.mean),
            _line(f"Median {short} (ms):", stat.median),
            _line(f"P99 {short} (ms):", stat.p99),
        ]
    lines += [
        _rule("Document Cache"),
        _line("Document hit ratio (%):", 100 * s.doc_hit_ratio),
        _line("Context tokens reused (%):", 100 * s.token_reuse_ratio),
        _line("Tokens prefilled:", s.prefill_tokens),
        _line("Document tokens encoded:", s.doc_tokens_encoded),
        _line("Peak KV memory (GiB):", s.peak_kv_gb),
        _line("KV pool (GiB):", s.pool_gb),
        _line("Preemptions:", s.preemptions),
        _line("Evictions:", s.evictions),
        "=" * WIDTH,
    ]
    return "\n".join(lines)


# -- the comparison table ----------------------------------------------------------------------------------

COLUMNS = [  # (header, key, format)
    ("group", "group", "{}"),
    ("load", "load", "{}"),
    ("mode", "mode", "{}"),
    ("done", "done", "{}"),
    ("TTFT mean ms", "ttft_mean", "{:.1f}"),
    ("TTFT p50", "ttft_p50", "{:.1f}"),
    ("TTFT p99", "ttft_p99", "{:.1f}"),
    ("TPOT ms", "tpot_mean", "{:.2f}"),
    ("ITL ms", "itl_mean", "{:.2f}"),
    ("E2EL ms", "e2el_mean", "{:.1f}"),
    ("req/s", "req_s", "{:.3f}"),
    ("out tok/s", "tok_s", "{:.1f}"),
    ("doc hit %", "hit_pct", "{:.1f}"),
    ("prefilled", "prefill_tokens", "{}"),
    ("peak KV GiB", "peak_kv_gb", "{:.3g}"),
    ("TTFT / lazy", "ttft_vs_lazy", "{:.2f}x"),
    ("req/s / lazy", "thr_vs_lazy", "{:.2f}x"),
]


def comparison_rows(results: Sequence[PointResult]) -> list[dict]:
    """One row per result; ratios are this mode's value over lazy's at the same group and load (TTFT > 1:
    lazy answers sooner; req/s < 1: lazy serves more)."""
    lazy = {(r.group, r.load): r.summary for r in results if r.mode == "lazy" and r.summary is not None}
    rows = []
    for r in results:
        s = r.summary
        row: dict[str, Any] = {"group": r.group, "load": r.load, "mode": r.mode}
        if s is None:
            rows.append({**row, "done": f"error: {r.error}"})
            continue
        base = lazy.get((r.group, r.load))
        row.update(
            done=f"{s.completed}/{s.total}" + (" (timed out)" if r.timed_out else ""),
            ttft_mean=s.ttft.mean,
            ttft_p50=s.ttft.median,
            ttft_p99=s.ttft.p99,
            tpot_mean=s.tpot.mean,
            itl_mean=s.itl.mean,
            e2el_mean=s.e2el.mean,
            req_s=s.request_throughput,
            tok_s=s.output_throughput,
            hit_pct=100 * s.doc_hit_ratio,
            prefill_tokens=s.prefill_tokens,
            peak_kv_gb=s.peak_kv_gb,
            ttft_vs_lazy=_ratio(s.ttft.mean, base.ttft.mean if base else None),
            thr_vs_lazy=_ratio(s.request_throughput, base.request_throughput if base else None),
        )
        rows.append(row)
    return rows


def _ratio(a: float, b: float | None) -> float | None:
    if b is None or not b or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def _cell(row: dict, key: str, fmt: str) -> str:
    v = row.get(key)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return fmt.format(v)


def text_table(rows: list[dict], columns: list[tuple[str, str, str]] = COLUMNS) -> str:
    cols = [c for c in columns if any(c[1] in r for r in rows)]
    cells = [[h for h, _, _ in cols]] + [[_cell(r, k, f) for _, k, f in cols] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    out = ["  ".join(c.rjust(w) if i > 2 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in cells]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def markdown_table(rows: list[dict], columns: list[tuple[str, str, str]] = COLUMNS) -> str:
    cols = [c for c in columns if any(c[1] in r for r in rows)]
    lines = ["| " + " | ".join(h for h, _, _ in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r, k, f) for _, k, f in cols) + " |" for r in rows]
    return "\n".join(lines)


# -- files --------------------------------------------------------------------------------------------------


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None  # strict JSON has no NaN/Infinity
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def write_json(path: str | Path, data: dict) -> None:
    """Atomically (a reader, or a run killed mid-write, never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_jsonable(data), indent=1))
    os.replace(tmp, path)
