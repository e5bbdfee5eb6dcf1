"""steady.md: the Markdown of a steady-state result document (bench/headline.py writes it, --merge rebuilds it): the
sustainable rate at each TTFT target, every measured point, the cold-start curve, and the run's header lines.
"""

from __future__ import annotations

import math

from lazyattn.bench import report
from lazyattn.bench.metrics import percentile
from lazyattn.bench.search import ALLOWED_MISS, FLOOR_ALPHA, MIN_IDLE_REQUESTS
from lazyattn.bench.steady import PointResult


def _fmt(v, f: str = "{:.1f}") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "∞"
    return f.format(v)


def sustainable_table(data: dict) -> str:
    """Markdown: per TTFT target, each mode's sustainable rate (goodput there), and lazy's ratios."""
    modes = list(data["modes"])
    targets = sorted({row["target_ms"] for m in modes for row in data["modes"][m].get("sustainable", [])})
    if not targets:
        return "(no rate search in these results)"
    ratios = [(other, f"lazy ÷ {other}") for other in ("block", "prefix") if other in modes and "lazy" in modes]
    head = ["TTFT p99 target"] + [f"{m}: req/s (goodput)" for m in modes] + [label for _, label in ratios]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in targets:
        rates = {}
        cells = [f"{t:g} ms"]
        for m in modes:
            row = next((r for r in data["modes"][m].get("sustainable", []) if r["target_ms"] == t), None)
            if row is None:
                cells.append("-")
                continue
            rates[m] = row["rate"]
            if row.get("unreachable"):
                cells.append(_unreachable_cell(row))
                continue
            star = "" if row["converged"] else " *"
            failed = row["first_failing_rate"]
            if not row["rate"]:  # nothing passed: say below what, or that nothing was measured
                cells.append("not measured" if failed is None else f"< {failed:.3g}{star}")
                continue
            at_least = "≥ " if failed is None else ""
            cells.append(f"{at_least}{row['rate']:.3g} ({row['goodput']:.3g}){star}")
        for other, _ in ratios:
            a, b = rates.get("lazy"), rates.get(other)
            cells.append(_fmt(a / b, "{:.2f}×") if a and b else ("∞" if a and b == 0 else "-"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _unreachable_cell(row: dict) -> str:
    """The evidence behind an unreachable target (search.IdleEvidence); results without it say only the verdict."""
    if not row.get("idle_requests"):
        return "0 (unreachable)"
    p50 = _fmt(row.get("idle_ttft_p50_ms"), "{:.0f}")
    return f"0 (unreachable: {row['idle_missed']} of {row['idle_requests']} idle requests missed, median {p50} ms)"


# offered: the Poisson rate asked for; arrived: the window's arrivals over its length (Poisson noise around it);
# achieved: completions over the window's length (any request: the queue does not grow when achieved ~ arrived).
POINT_COLUMNS = [
    ("mode", "mode", "{}"),
    ("offered req/s", "rate", "{:.3g}"),
    ("window s", "window_s", "{:.1f}"),
    ("window req", "window_requests", "{}"),
    ("warm-up s", "warmup", "{}"),
    ("hit %", "hit", "{:.1f}"),
    ("TTFT p50", "ttft_p50", "{:.1f}"),
    ("p90", "ttft_p90", "{:.1f}"),
    ("p99", "ttft_p99", "{:.1f}"),
    ("TPOT p50", "tpot_p50", "{:.2f}"),
    ("p99", "tpot_p99", "{:.2f}"),
    ("E2EL p50", "e2el_p50", "{:.1f}"),
    ("p99", "e2el_p99", "{:.1f}"),
    ("arrived req/s", "arrived", "{:.3g}"),
    ("achieved req/s", "achieved", "{:.3g}"),
    ("keep-up %", "keep_up", "{:.1f}"),
    ("idle req", "idle", "{}"),
    ("idle TTFT p50", "idle_p50", "{:.1f}"),
    ("out tok/s", "tok_s", "{:.1f}"),
    ("peak KV GiB", "peak_kv_gb", "{:.3g}"),
]


def point_rows(data: dict) -> list[dict]:
    rows = []
    for mode, entry in data["modes"].items():
        for d in sorted(entry.get("points", []), key=lambda d: d["rate"]):
            p = PointResult.from_dict(d)
            rows.append(
                {
                    "mode": mode,
                    "rate": p.rate,
                    "window_s": p.window_s,
                    "window_requests": f"{p.window_requests}{' (short)' if p.shortened else ''}",
                    "warmup": f"{p.warmup_s:.1f}{'' if p.warmup_steady else ' (cap)'}",
                    "hit": 100 * p.hit_ratio,
                    **{f"ttft_{q}": p.ttft_ms.get(q) for q in ("p50", "p90", "p99")},
                    **{f"tpot_{q}": p.tpot_ms.get(q) for q in ("p50", "p99")},
                    **{f"e2el_{q}": p.e2el_ms.get(q) for q in ("p50", "p99")},
                    "arrived": p.offered_rate,
                    "achieved": p.achieved_rate,
                    "keep_up": 100 * p.keep_up,
                    "idle": len(p.idle_ttfts_ms) if "idle_ttfts_ms" in d else None,  # older results: not recorded
                    "idle_p50": percentile(p.idle_ttfts_ms, 50),
                    "tok_s": p.output_throughput,
                    "peak_kv_gb": p.peak_kv_gb,
                }
            )
    return rows


def cold_start_table(data: dict) -> str | None:
    rows = []
    for mode, entry in data["modes"].items():
        cold = entry.get("cold_start")
        for b in (cold or {}).get("bins", []):
            rows.append({"mode": mode, **b, "hit_pct": None if b["hit_ratio"] is None else 100 * b["hit_ratio"]})
    if not rows:
        return None
    cols = [
        ("mode", "mode", "{}"),
        ("t s", "t_s", "{:g}"),
        ("requests", "requests", "{}"),
        ("TTFT p50 ms", "ttft_p50_ms", "{:.1f}"),
        ("TTFT p99 ms", "ttft_p99_ms", "{:.1f}"),
        ("hit %", "hit_pct", "{:.1f}"),
    ]
    return report.markdown_table(rows, cols)


def summary_markdown(data: dict) -> str:
    """steady.md; a section with nothing to show (no points: a cold start alone) is left out."""
    w = data["workload"]
    meta = data.get("meta", {})
    points = point_rows(data)
    parts = [
        f"# Steady state: {w['name']}",
        "",
        f"Command: `{meta.get('command', '')}`  ",
        f"Device: {meta.get('gpu') or meta.get('engine_options', {}).get('device', '?')}, "
        f"model {meta.get('model', '?')}, KV {_fmt(w.get('kv_cache_gb'), '{:.3g}')} GiB, "
        f"host tier {_fmt(w.get('host_cache_gb'), '{:g}')} GiB  ",
        f"Workload: {w['spec']['num_docs']} docs x {w['spec']['doc_len']} tokens, {w['spec']['docs_per_request']} "
        f"per request, {_popularity(w['spec']['zipf_alpha'])}, question {w['spec']['question_len']}, "
        f"output {w['spec']['output_len']}  ",
    ]
    if points:
        parts += [
            "Phases: " + ", ".join(f"{k} {v}" for k, v in data["phases"].items()) + "  ",
            _primed_line(data) + "  ",
        ]
    if data.get("budget_s") is not None:
        parts.append(f"Budget: {data['budget_s']:g} s per run (windows shortened to fit are marked short)  ")
    stops = {m: e.get("stopped") or ("converged" if e.get("converged") else "") for m, e in data["modes"].items()}
    errors = {m: e["error"] for m, e in data["modes"].items() if e.get("error")}
    sustainable = any(e.get("sustainable") for e in data["modes"].values())
    if data.get("search") and sustainable:
        parts += [
            "",
            "## Sustainable rate at each TTFT target",
            "",
            "A rate passes when the window's p99 TTFT is within the target and completions keep up with arrivals "
            f"(≥ {100 * data['search']['keep_up']:g} %); goodput: window requests answered within the target per "
            "second. ≥: the highest rate tried passed; < r: nothing passed, r the lowest failing rate; *: the search "
            "did not converge; unreachable: the window requests that had the server to themselves (idle req: nothing "
            "else in flight from arrival to first token, a floor under every rate's TTFT) missed the target clearly "
            f"more often than {100 * ALLOWED_MISS:g} % (at least {MIN_IDLE_REQUESTS} idle requests, and under a "
            f"{100 * FLOOR_ALPHA:g} % chance of that many misses at that share), so no rate meets it.",
            "",
            sustainable_table(data),
        ]
    if data.get("search"):
        parts += [
            "",
            "Search: " + ", ".join(f"{m} {s or '-'}" for m, s in stops.items()) + "  ",
            "Time: "
            + ", ".join(
                f"{m} {_fmt(e.get('startup_s'), '{:.0f}')} s start-up (model load, warm-up), "
                f"{_fmt(e.get('elapsed_s'), '{:.0f}')} s in all"
                for m, e in data["modes"].items()
            ),
        ]
    elif points:
        parts += ["", "(no rate search in these results: the points at the listed rates follow)"]
    if errors:
        parts += ["", "Errors: " + "; ".join(f"{m}: {e}" for m, e in errors.items())]
    if points:
        parts += ["", "## Every point (ms unless said)", "", report.markdown_table(points, POINT_COLUMNS)]
    cold = cold_start_table(data)
    if cold:
        parts += ["", "## Cold start (empty cache, the first seconds of traffic)", "", cold]
    return "\n".join(parts) + "\n"


def _primed_line(data: dict) -> str:
    primed = {m: e["primed"] for m, e in data["modes"].items() if e.get("primed")}
    if not primed:
        return (
            "Cache: not primed (--no-prime, or too little budget): the first point starts from an empty cache (or the "
            "cold start's)"
        )
    return (
        "Cache: points start from a primed cache (the pool's most popular documents that fit, served unmeasured at "
        "saturation before the first point): "
        + ", ".join(
            f"{m} {p['documents']} documents, {p['kv_gib']:.3g} GiB in {p['seconds']:.1f} s"
            + (" (timed out)" if p.get("timed_out") else "")
            for m, p in primed.items()
        )
    )


def _popularity(alpha: float | None) -> str:
    return "uniform" if alpha is None else f"Zipf {alpha:g}"
