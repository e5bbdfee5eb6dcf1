"""The markdown summary of a device run (`python -m benchmarks.serving`): goals first, then one table per experiment.

Input is the run's JSON document, so a summary can be rebuilt from a saved serving.json:
`python -c "import json,sys; from lazyattn.bench.summary import summary_markdown; print(summary_markdown(
json.load(open(sys.argv[1]))))" serving.json`.
"""

from __future__ import annotations

import math
from pathlib import Path

from lazyattn.bench.hitratio import HIT_COLUMNS, pivot
from lazyattn.bench.report import PointResult, comparison_rows, markdown_table

RATE_COLUMNS = [
    ("popularity", "group", "{}"),
    ("load", "load", "{}"),
    ("mode", "mode", "{}"),
    ("done", "done", "{}"),
    ("TTFT mean ms", "ttft_mean", "{:.1f}"),
    ("TTFT p99", "ttft_p99", "{:.1f}"),
    ("TPOT ms", "tpot_mean", "{:.2f}"),
    ("E2EL ms", "e2el_mean", "{:.1f}"),
    ("req/s", "req_s", "{:.2f}"),
    ("out tok/s", "tok_s", "{:.1f}"),
    ("doc hit %", "hit_pct", "{:.1f}"),
    ("prefilled", "prefill_tokens", "{}"),
    ("peak KV GiB", "peak_kv_gb", "{:.3g}"),
    ("TTFT / lazy", "ttft_vs_lazy", "{:.2f}x"),
    ("req/s / lazy", "thr_vs_lazy", "{:.2f}x"),
]
SHARED_COLUMNS = [
    ("mode", "mode", "{}"),
    ("concurrent", "concurrency", "{}"),
    ("done", "done", "{}"),
    ("peak KV GiB", "peak_kv_gb", "{:.3g}"),
    ("out tok/s", "tok_s", "{:.1f}"),
    ("req/s", "req_s", "{:.2f}"),
    ("TTFT mean ms", "ttft_mean", "{:.1f}"),
    ("TPOT ms", "tpot_mean", "{:.2f}"),
    ("req/s / lazy", "thr_vs_lazy", "{:.2f}x"),
]


def _fmt(x: float | None, spec: str = "{:.2f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else spec.format(x)


def goal_rows(rate: list[PointResult], hit: dict) -> list[str]:
    """The serving goals (docs/design.md, Goals) against what was measured."""
    by = {(r.group, r.load, r.mode): r.summary for r in rate if r.summary is not None}
    loads = list(dict.fromkeys(r.load for r in rate if r.group.startswith("zipf")))
    group = next((r.group for r in rate if r.group.startswith("zipf")), "zipf")

    def ratios(other: str, f) -> str:
        cells = []
        for load in loads:
            a, b = by.get((group, load, "lazy")), by.get((group, load, other))
            if a is not None and b is not None:
                cells.append(f"{load}: {_fmt(f(a, b))}x")
        return "; ".join(cells) or "-"

    ttft = lambda lazy, o: o.ttft.mean / lazy.ttft.mean if lazy.ttft.mean else None  # noqa: E731
    thr = lambda lazy, o: lazy.request_throughput / o.request_throughput if o.request_throughput else None  # noqa: E731
    rows = [
        "| goal (docs/design.md, Goals) | measured | target |",
        "|---|---|---|",
        f"| lazy vs block TTFT, {group} (block ÷ lazy) | {ratios('block', ttft)} | ≥ 1.5x (published 1.37x) |",
        f"| lazy vs block throughput, {group} (lazy ÷ block req/s; only saturation is not rate-bound) | "
        f"{ratios('block', thr)} | ≥ 1.5x (published 1.40x) |",
        f"| lazy vs prefix TTFT, {group}, shuffled documents (prefix ÷ lazy) | {ratios('prefix', ttft)} | ≥ 3x |",
    ]
    engine = {r["mode"]: r for r in hit.get("engine", [])}
    sim = {(r["policy"], r["alpha"], r["budget_gb"], r["mode"]): r for r in (hit.get("sim") or {}).get("rows", [])}
    if engine:
        e = next(iter(engine.values()))
        n_sim = (hit.get("sim") or {}).get("requests")
        cells = []
        for mode in ("lazy", "block", "prefix"):
            r = engine.get(mode)
            s = sim.get((e["policy"], e["alpha"], e["budget_gb"], mode))
            if r is not None:
                cells.append(
                    f"{mode} {_fmt(100 * r['doc_hit_ratio'])} % engine ({r['completed']} req; simulated "
                    f"same requests {_fmt(100 * r['sim_same_requests_hit_ratio'])} %)"
                    + (f", simulated {n_sim}-req {_fmt(_pct(s['doc_hit_ratio']))} %" if s else "")
                )
        rows.append(
            f"| hit ratio, {e['budget_gb']:g} GB budget (+ one block request: pool {e['pool_gb']:.3g} GiB), "
            f"Zipf {e['alpha']:g} | {'; '.join(cells)} | ≥ 13.57 % (published lazy; block 7.27 %) |"
        )
    return rows


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


def summary_markdown(d: dict) -> str:
    meta, plan = d["meta"], d["plan"]
    spec = plan["spec"]
    rate = [PointResult.from_dict(p) for p in d.get("rate_sweep", [])]
    shared = [PointResult.from_dict(p) for p in d.get("shared_document", [])]
    hit = d.get("hit_ratio") or {}
    out = [
        f"# RAG serving benchmark: {meta.get('gpu', meta['device'])}",
        "",
        f"`{meta['command']}` at {meta['time']}, commit {meta.get('commit')}, torch {meta.get('torch')}, "
        f"wall {d.get('wall_s', 0):.0f} s.",
        "",
        f"Model: `{Path(plan['model']).name}` (random weights, only speed is measured); every mode gets the "
        f"same KV pool of {plan['kv_cache_gb']:g} GiB, page size {plan['page_size']}. Workload: pool of "
        f"{spec['num_docs']} documents x {spec['doc_len']} tokens, {spec['docs_per_request']} per request in "
        f"random order, {spec['question_len']}-token question, {spec['output_len']} output tokens (EOS ignored); "
        "each point starts from an empty document cache after an identical warm-up.",
        "",
        "## Goals",
        "",
        *goal_rows(rate, hit),
        "",
        "## 1. TTFT and throughput vs request rate",
        "",
        "Poisson arrivals in real time (TTFT includes queueing); saturation: all requests at t=0. "
        "Requests per point: "
        + ", ".join(f"{g} {'sat.' if r is None else f'{r:g}/s'}: {n}" for g, r, n in plan["rate_points"])
        + ". Ratios: mode ÷ lazy.",
        "",
        markdown_table(comparison_rows(rate), RATE_COLUMNS) if rate else "(no points)",
        "",
    ]
    out += ["## 2. Document hit ratio vs KV budget", ""]
    sim_rows = (hit.get("sim") or {}).get("rows", [])
    if sim_rows:
        out += [
            f"**Simulated** ({(hit['sim'] or {}).get('requests')} requests one at a time through the engine's "
            "DocumentCache/PagePool, the model's page size). `pool`: KV pool = budget (a mode whose single "
            "request does not fit: -). `pool_plus_request`: pool = budget + one block request's working set, "
            "the same for every mode.",
            "",
            markdown_table(pivot(sim_rows), HIT_COLUMNS),
            "",
        ]
    if hit.get("engine"):
        out += [
            "**Engine runs** (real model and scheduler, one request at a time, the first requests of the "
            "same trace; `sim` = the simulation of exactly those requests, which should match):",
            "",
            "| mode | budget GB | pool GiB | Zipf | requests | engine hit % | sim hit % | evictions (sim) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        out += [
            f"| {r['mode']} | {r['budget_gb']:g} | {r['pool_gb']:.3g} | {r['alpha']:g} | {r['completed']}/"
            f"{r['requests']} | {_fmt(_pct(r['doc_hit_ratio']))} | {_fmt(_pct(r['sim_same_requests_hit_ratio']))}"
            f" | {r['evictions']} ({r['sim_evictions']}) |"
            for r in hit["engine"]
        ]
        out.append("")
    out += [
        f"## 3. One {plan['shared_doc_len']}-token document shared by concurrent requests",
        "",
        "All requests sent at once; peak KV = most pages in use at once (capped by the pool).",
        "",
    ]
    if shared:
        rows = comparison_rows(
            [
                PointResult("shared", r.mode, r.load, None, r.concurrency, r.summary, r.wall_s, r.timed_out, r.error)
                for r in shared
            ]
        )
        for row, r in zip(rows, shared):
            row["concurrency"] = r.concurrency
        out += [markdown_table(rows, SHARED_COLUMNS), ""]
    else:
        out += ["(no points)", ""]
    if d.get("skipped"):
        out += ["## Skipped (time)", ""] + [f"- {s['what']}: {s['why']}" for s in d["skipped"]] + [""]
    if d.get("errors"):
        out += ["## Errors", ""] + [f"- {e['where']}: `{e['error']}`" for e in d["errors"]] + [""]
    return "\n".join(out)
