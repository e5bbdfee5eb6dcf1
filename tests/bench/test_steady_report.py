"""steady.md (bench/steady_report.py) from hand-built result documents: an unreachable target shows its evidence, and a
run without steady-state points (a cold start alone) has no empty point table or sustainable-rate section."""

from __future__ import annotations

from lazyattn.bench.steady import PhaseConfig, PointResult
from lazyattn.bench.steady_report import summary_markdown, sustainable_table

SPEC = {"num_docs": 20, "doc_len": 64, "docs_per_request": 5, "zipf_alpha": 2.1, "question_len": 32, "output_len": 16}


def document(modes: dict, search: dict | None) -> dict:
    return {
        "meta": {"command": "lazyattn bench", "model": "tiny"},
        "workload": {"name": "paper", "spec": SPEC, "kv_cache_gb": None, "host_cache_gb": None},
        "phases": PhaseConfig().__dict__,
        "search": search,
        "budget_s": None,
        "modes": modes,
    }


def row(target: float, **kw) -> dict:
    base = dict(target_ms=target, rate=0.0, first_failing_rate=None, goodput=0.0, converged=True, unreachable=False)
    return {**base, **kw}


def test_an_unreachable_target_shows_its_idle_evidence():
    evidence = dict(idle_requests=58, idle_missed=57, idle_ttft_p50_ms=249.4)
    fresh = row(100.0, first_failing_rate=1.0, unreachable=True, **evidence)
    older = row(100.0, first_failing_rate=2.0, unreachable=True)  # a result written before the evidence was kept
    data = document(
        {
            "prefix": {"sustainable": [fresh, row(1000.0, rate=0.9, first_failing_rate=1.0, goodput=0.85)]},
            "full": {"sustainable": [older]},
        },
        {"keep_up": 0.95},
    )
    table = sustainable_table(data)
    line = next(x for x in table.splitlines() if x.startswith("| 100 ms"))
    assert "| 0 (unreachable: 57 of 58 idle requests missed, median 249 ms) | 0 (unreachable) |" in line
    assert "| 1000 ms | 0.9 (0.85) | - |" in table


def test_a_cold_start_alone_writes_no_empty_sections():
    bins = [{"t_s": 0.0, "requests": 2, "ttft_p50_ms": 9.0, "ttft_p99_ms": 18.0, "hit_ratio": 0.4}]
    modes = {m: {"points": [], "sustainable": [], "cold_start": {"bins": bins}} for m in ("lazy", "block")}
    md = summary_markdown(document(modes, None))
    assert "## Cold start" in md and "| lazy | 0 | 2 | 9.0 | 18.0 | 40.0 |" in md
    assert "## Every point" not in md and "## Sustainable rate" not in md and "no rate search" not in md
    assert "|  |" not in md and "\n|\n" not in md
    # With a point, its table (and the line saying no search ran) comes back.
    p = PointResult("lazy", 2.0, window_s=10.0, window_requests=20, ttft_ms={"p50": 5.0, "p90": 6.0, "p99": 7.0})
    p.idle_ttfts_ms = [4.0, 5.0, 6.0]
    modes["lazy"]["points"] = [p.to_dict()]
    md = summary_markdown(document(modes, None))
    assert "## Every point" in md and "no rate search" in md and "## Sustainable rate" not in md
    header = next(x for x in md.splitlines() if x.startswith("| mode | offered"))
    point = next(x for x in md.splitlines() if x.startswith("| lazy | 2 |"))
    cells = dict(zip(header.split(" | "), point.split(" | ")))
    assert cells["idle req"] == "3" and cells["idle TTFT p50"] == "5.0"
