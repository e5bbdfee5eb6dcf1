"""benchmarks/serving.py (the device run) end to end with micro shapes on the CPU: every experiment produces its
JSON, markdown and plots; a run out of time skips points but still writes everything."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from benchmarks import serving as serving_script
from lazyattn.bench.workload import WorkloadSpec


@pytest.fixture(scope="module")
def serving():
    return serving_script


@pytest.fixture(scope="module")
def micro(serving):
    return replace(
        serving.SMOKE,
        kv_cache_gb=0.05,
        spec=WorkloadSpec(
            num_docs=8, doc_len=32, docs_per_request=3, zipf_alpha=2.1, question_len=4, output_len=3, num_requests=4
        ),
        rate_points=(("zipf 2.1", math.inf, 4), ("zipf 2.1", 50.0, 4), ("uniform", math.inf, 4)),
        shared_doc_len=64,
        shared_concurrency=(1, 3),
        shared_concurrency_full=(1,),
        hit_budgets_gb=(0.0005, 0.005),
        hit_alphas=(1.1, 2.1),
        hit_sim_requests=30,
        hit_engine_requests=6,
        warmup_requests=1,
        page_size=16,
    )


def test_all_three_experiments(serving, micro, tmp_path):
    data = serving.run_plan(micro, tmp_path, budget_s=200)
    assert data["errors"] == [] and data["skipped"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "hit_ratio.png",
        "rate_sweep.png",
        "serving.json",
        "serving.md",
        "shared_document.png",
    ]
    assert json.loads((tmp_path / "serving.json").read_text())["wall_s"] > 0
    rate = data["rate_sweep"]
    assert len(rate) == 4 * 3 and all(p["summary"]["completed"] == 4 for p in rate)
    shared = data["shared_document"]
    assert [(p["mode"], p["concurrency"]) for p in shared] == [
        (m, c) for m in ("lazy", "block", "prefix") for c in (1, 3)
    ] + [("full", 1)]
    engine = data["hit_ratio"]["engine"]
    assert [r["mode"] for r in engine] == ["lazy", "block", "prefix"]
    assert all(r["doc_hit_ratio"] == r["sim_same_requests_hit_ratio"] for r in engine)
    assert len(data["hit_ratio"]["sim"]["rows"]) == 2 * 2 * 2 * 3  # policies x alphas x budgets x modes
    md = (tmp_path / "serving.md").read_text()
    for heading in ("## Goals", "## 1.", "## 2.", "## 3."):
        assert heading in md
    assert "lazy vs block TTFT" in md and "| prefix |" in md


def test_out_of_time_skips_but_writes_everything(serving, micro, tmp_path):
    data = serving.run_plan(replace(micro, modes=("lazy", "prefix"), mode_weights=(1.0, 1.0)), tmp_path, budget_s=3.0)
    assert [s["what"] for s in data["skipped"]] == ["lazy: every point", "prefix: every point"]
    assert data["skipped"] and not data["errors"]
    assert (tmp_path / "serving.md").exists() and (tmp_path / "serving.json").exists()
