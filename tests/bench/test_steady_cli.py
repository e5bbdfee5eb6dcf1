"""`lazyattn bench --smoke` end to end on the CPU (the tiny model, two modes in their own runs, a small budget),
then `--merge` of the two runs: what the lead's per-GPU commands and merge command do, at tiny shapes."""

from __future__ import annotations

import json

import pytest

from lazyattn.bench.replay import make_engine
from lazyattn.cli import main


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("steady")
    # The process's first engine start takes seconds on a busy CPU: taken here, outside the runs' budgets.
    make_engine(dict(model="tiny", device="cpu", page_size=16), "lazy")
    for mode, budget in (("lazy", "6"), ("block", "5")):
        out = str(root / mode)
        code = main(["bench", "--smoke", "--modes", mode, "--budget-s", budget, "--out", out, "--no-progress"])
        assert code == 0
    code = main(["bench", "--merge", str(root / "lazy"), str(root / "block" / "steady.json"), "--out", str(root / "m")])
    assert code == 0
    return root


def test_each_run_records_its_search_points_and_cold_start(runs):
    for mode in ("lazy", "block"):
        data = json.loads((runs / mode / "steady.json").read_text())
        assert data["workload"]["name"] == "paper" and data["budget_s"] in (6, 5)
        entry = data["modes"][mode]
        assert "error" not in entry
        points = entry["points"]
        assert points and points[0]["rate"] == data["search"]["start"]
        # Rates follow the search: growth from the start, or a descent, or a bisection between measured rates.
        assert all(p["window_requests"] > 0 for p in points[:1])
        assert [r["target_ms"] for r in entry["sustainable"]] == [100.0, 1000.0]
        for row in entry["sustainable"]:
            if row["rate"]:
                assert row["rate"] in [p["rate"] for p in points]
        assert entry["converged"] or entry["stopped"]
        cold = entry["cold_start"]
        assert cold["bins"] and sum(b["requests"] for b in cold["bins"]) > 0
        assert cold["bins"][0]["t_s"] == 0
        # After the cold start and before the first point, the whole pool (it fits the KV) was primed, when the
        # budget left two points' time for it (a busy CPU may not; test_prime.py covers it without a budget).
        primed = entry["primed"]
        if primed is not None:
            assert primed["documents"] == data["workload"]["spec"]["num_docs"] and primed["kv_gib"] > 0
            assert "points start from a primed cache" in (runs / mode / "steady.md").read_text()


def test_merge_puts_the_modes_side_by_side(runs):
    merged = json.loads((runs / "m" / "steady.json").read_text())
    assert list(merged["modes"]) == ["lazy", "block"]
    md = (runs / "m" / "steady.md").read_text()
    assert "| TTFT p99 target | lazy: req/s (goodput) | block: req/s (goodput) | lazy ÷ block |" in md
    assert (runs / "m" / "cold_start_paper.png").exists()
    lazy = {r["target_ms"]: r["rate"] for r in merged["modes"]["lazy"]["sustainable"]}
    block = {r["target_ms"]: r["rate"] for r in merged["modes"]["block"]["sustainable"]}
    row = next(line for line in md.splitlines() if line.startswith("| 100 ms"))
    if lazy[100.0] and block[100.0]:
        assert f"{lazy[100.0] / block[100.0]:.2f}×" in row


def test_merge_refuses_runs_of_different_workloads(runs, tmp_path):
    doc = json.loads((runs / "block" / "steady.json").read_text())
    doc["workload"]["name"] = "wide"
    (tmp_path / "steady.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="workload"):
        main(["bench", "--merge", str(runs / "lazy"), str(tmp_path)])


def test_merge_refuses_a_mode_given_twice(runs):
    with pytest.raises(ValueError, match="mode lazy"):
        main(["bench", "--merge", str(runs / "lazy"), str(runs / "lazy" / "steady.json")])


def test_steady_at_listed_rates_without_a_search(tmp_path):
    code = main(
        ["bench", "--smoke", "--steady", "--rate", "4,8", "--modes", "lazy", "--budget-s", "4"]
        + ["--cold-start-s", "0.5", "--out", str(tmp_path), "--no-progress", "--no-prime"]
    )
    assert code == 0
    data = json.loads((tmp_path / "steady.json").read_text())
    assert data["search"] is None
    entry = data["modes"]["lazy"]
    rates = [p["rate"] for p in entry["points"]]
    assert rates == [4.0, 8.0][: len(rates)] and rates  # in the order given, as many as the budget allowed
    assert entry["sustainable"] == [] and entry["primed"] is None
    md = (tmp_path / "steady.md").read_text()
    assert "no rate search" in md and "Cache: not primed" in md


def test_cold_start_alone_writes_no_empty_tables(tmp_path):
    code = main(
        ["bench", "--model", "tiny", "--workload", "paper", "--num-docs", "20", "--doc-len", "64", "--cold-start"]
        + ["--cold-start-s", "1", "--cold-start-rate", "4", "--cold-start-bin-s", "0.5", "--modes", "lazy"]
        + ["--no-progress", "--out", str(tmp_path)]
    )
    assert code == 0
    data = json.loads((tmp_path / "steady.json").read_text())
    entry = data["modes"]["lazy"]
    assert entry["points"] == [] and entry["sustainable"] == [] and entry["cold_start"]["bins"]
    md = (tmp_path / "steady.md").read_text()
    assert "## Cold start" in md and "## Every point" not in md and "## Sustainable rate" not in md
    assert "|  |" not in md and "\n|\n" not in md


def test_serving_steady_script_runs_a_mode_and_merges(tmp_path):
    """benchmarks/serving_steady.sh with the tiny model's shapes given after the mode (they override the script's
    Llama-3.1-8B defaults): the per-GPU command and the merge, as the docs give them."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "BUDGET_S": "4"}
    script = str(root / "benchmarks" / "serving_steady.sh")
    tiny = "--model tiny --device cpu --dtype float32 --kv-cache-gb 0.05 --num-docs 20 --doc-len 64 --question-len 8"
    tiny += " --output-len 4 --page-size 16 --window-s 0.5 --window-requests 5 --warmup-max-s 0.5 --min-point-s 1"
    run = subprocess.run(["bash", script, str(tmp_path), "lazy", *tiny.split()], env=env, capture_output=True)
    assert run.returncode == 0, run.stdout.decode()[-2000:]
    data = json.loads((tmp_path / "lazy" / "steady.json").read_text())
    assert data["search"]["start"] == 16 and data["workload"]["host_cache_gb"] == 0
    assert data["workload"]["kv_cache_gb"] == 0.05 and (tmp_path / "lazy.log").stat().st_size > 0
    run = subprocess.run(["bash", script, str(tmp_path), "--merge"], env=env, capture_output=True)
    assert run.returncode == 0, run.stdout.decode()[-2000:]
    assert list(json.loads((tmp_path / "merged" / "steady.json").read_text())["modes"]) == ["lazy"]


def test_serving_steady_matrix_spreads_runs_over_workers_and_merges(tmp_path):
    """benchmarks/serving_steady_matrix.sh: each line of the list runs once (two workers, two folders), every folder is
    merged; with a deadline no run fits, nothing starts and every line is listed as skipped."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "BUDGET_S": "4", "GPUS": "2"}
    script = str(root / "benchmarks" / "serving_steady_matrix.sh")
    tiny = "--model tiny --device cpu --dtype float32 --kv-cache-gb 0.05 --num-docs 20 --doc-len 64 --question-len 8"
    tiny += " --output-len 4 --page-size 16 --window-s 0.5 --window-requests 5 --warmup-max-s 0.5 --min-point-s 1"
    runs = tmp_path / "runs.list"
    runs.write_text(f"# name mode options\npaper lazy {tiny}\n\nsmall block {tiny} --workload wide\n")
    run = subprocess.run(["bash", script, str(tmp_path / "m"), str(runs)], env=env, capture_output=True)
    assert run.returncode == 0, run.stdout.decode()[-2000:]
    lazy = json.loads((tmp_path / "m" / "paper" / "lazy" / "steady.json").read_text())
    block = json.loads((tmp_path / "m" / "small" / "block" / "steady.json").read_text())
    assert list(lazy["modes"]) == ["lazy"] and lazy["workload"]["name"] == "paper"
    assert list(block["modes"]) == ["block"] and block["workload"]["name"] == "wide"
    for name, mode in (("paper", "lazy"), ("small", "block")):
        assert list(json.loads((tmp_path / "m" / name / "merged" / "steady.json").read_text())["modes"]) == [mode]
    assert not (tmp_path / "m" / "paper" / "block").exists() and not (tmp_path / "m" / "skipped.txt").exists()

    env["END_S"] = "10"  # each run needs BUDGET_S + 40 s
    run = subprocess.run(["bash", script, str(tmp_path / "late"), str(runs)], env=env, capture_output=True)
    assert run.returncode == 0, run.stdout.decode()[-2000:]
    skipped = (tmp_path / "late" / "skipped.txt").read_text().splitlines()
    assert [s.split()[:2] for s in skipped] == [["paper", "lazy"], ["small", "block"]]
    assert not (tmp_path / "late" / "paper").exists()
