"""Smoke tests of the maintained scripts under benchmarks/ on the CPU: each one's argument parsing, and the helpers
that decide what a GPU run measures, against hand-computed values. serving.py and engine.py run end to end in
test_serving_script.py and test_engine_benchmark.py."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from lazyattn.kernels.gemv import GemvConfig

ROOT = Path(__file__).resolve().parents[2]

# Every script with a main(); compile_check swaps Triton's interpreter for the real compiler when imported, so it is
# checked in its own process below.
SCRIPTS = [
    "best_document",
    "disk_tier",
    "document_tokens",
    "engine",
    "gemv",
    "host_tier",
    "host_ttft",
    "kernels",
    "quality_positions",
    "relink",
    "replicas",
    "serving",
    "tp_allreduce",
    "ttft_anatomy",
    "tune_kernels",
]


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_parses(name, monkeypatch, capsys):
    module = importlib.import_module(f"benchmarks.{name}")
    monkeypatch.setattr(sys, "argv", [f"benchmarks/{name}.py", "--help"])
    with pytest.raises(SystemExit) as exit_:
        module.main()
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_compile_check_help_in_its_own_process():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.compile_check", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "--arch" in out.stdout and "--only" in out.stdout


def test_unknown_option_is_refused(monkeypatch, capsys):
    gemv = importlib.import_module("benchmarks.gemv")
    monkeypatch.setattr(sys, "argv", ["benchmarks/gemv.py", "--out", "x", "--no-such-option"])
    with pytest.raises(SystemExit) as exit_:
        gemv.main()
    assert exit_.value.code == 2
    assert "--no-such-option" in capsys.readouterr().err


def test_gemv_shapes_are_llama_8b_linears():
    gemv = importlib.import_module("benchmarks.gemv")
    shapes = {label: (n, k) for model, label, n, k in gemv.SHAPES if model == "8B"}
    # Llama-3.1-8B: hidden 4096, intermediate 14336, 32 q heads and 8 kv heads of 128, vocabulary 128256.
    assert shapes["qkv"] == ((32 + 2 * 8) * 128, 4096)
    assert shapes["o"] == (4096, 4096)
    assert shapes["gate_up"] == (2 * 14336, 4096)
    assert shapes["down"] == (4096, 14336)
    assert shapes["lm_head"] == (128256, 4096)
    assert shapes["qkv/2"] == (3072, 4096) and shapes["down/2"] == (4096, 7168)


def test_gemv_candidates_keep_each_split_two_tiles_long():
    gemv = importlib.import_module("benchmarks.gemv")
    for block in gemv.TILES:
        configs = gemv.candidates(4096, 14336, block, sms=132)
        assert configs, block
        for cfg in configs:
            assert 14336 // cfg.split_k >= 2 * cfg.block_k


def test_gemv_partial_table_replaces_only_the_measured_entries(tmp_path):
    gemv = importlib.import_module("benchmarks.gemv")
    table = tmp_path / "table.json"

    def entry(device, n, m):
        return {"device": device, "dtype": "bfloat16", "n": n, "k": 4096, "m": m, "dispatch": "F.linear"}

    old = [entry("H100", 4096, 1), entry("H100", 6144, 1), entry("H200", 4096, 1)]
    table.write_text(json.dumps({"commands": {"H100": "first"}, "entries": old}))
    gemv.write_table(table, "H100", "second", [entry("H100", 4096, 1) | {"dispatch": "lazyattn"}], partial=True)
    data = json.loads(table.read_text())
    assert data["commands"]["H100"] == "first; then second"
    by_key = {(e["device"], e["n"]): e["dispatch"] for e in data["entries"]}
    assert by_key == {("H100", 4096): "lazyattn", ("H100", 6144): "F.linear", ("H200", 4096): "F.linear"}

    gemv.write_table(table, "H100", "third", [entry("H100", 4096, 1)])  # a full sweep drops the GPU's other entries
    assert {(e["device"], e["n"]) for e in json.loads(table.read_text())["entries"]} == {("H200", 4096), ("H100", 4096)}


def test_gemv_row_entry_records_the_ratio_to_f_linear():
    gemv = importlib.import_module("benchmarks.gemv")
    cfg = GemvConfig(64, 128, 1, 4, 6)
    row = {"n": 4096, "k": 4096, "m": 1, "config": asdict(cfg), "lazyattn_us": 9.0, "F.linear_us": 12.0}
    entry = gemv.row_entry("H100", torch.bfloat16, row | {"dispatch": "lazyattn"})
    assert (entry["device"], entry["dtype"], entry["n"], entry["m"]) == ("H100", "bfloat16", 4096, 1)
    assert entry["config"] == asdict(cfg) and entry["vs_linear"] == pytest.approx(0.75)
    slower = gemv.row_entry("H100", torch.bfloat16, row | {"lazyattn_us": 15.0, "dispatch": "F.linear"})
    assert slower["vs_linear"] == pytest.approx(1.25) and slower["config"] == asdict(cfg)  # kept for the fused path


def test_kernels_input_copies_clear_l2():
    kernels = importlib.import_module("benchmarks.kernels")
    l2 = 50 * 2**20
    assert kernels.copies_for(2 * l2, l2) == 1  # the working set alone flushes L2
    assert kernels.copies_for(l2, l2) == 3  # 3 x L2 over the rotation
    assert kernels.copies_for(10 * 2**20, l2) == 15
    assert kernels.copies_for(1, l2) == 16  # capped
    assert set(kernels.SECTIONS) == {"overhead", "targets", "decode", "prefill", "copy"}


def test_host_tier_plans_cover_the_cpu_smoke_run():
    host_tier = importlib.import_module("benchmarks.host_tier")
    assert {"cpu", "h100"} <= set(host_tier.PLANS)


def test_disk_tier_cpu_plan_runs_end_to_end(tmp_path, monkeypatch):
    """Each state is served from the tier it names (the lookups say so), and the restarted engine reads its first
    request's documents from disk."""
    disk_tier = importlib.import_module("benchmarks.disk_tier")
    monkeypatch.setattr(sys, "argv", ["disk_tier", "--plan", "cpu", "--out", str(tmp_path), "--repeats", "1"])
    assert disk_tier.main() == 0
    result = json.loads((tmp_path / "disk_tier.json").read_text())
    segments = disk_tier.PLANS["cpu"].docs_per_request + 1  # and the first segment (BOS)
    lookups = {state: r["lookups"][0] for state, r in result["ttft"].items()}
    assert lookups["encode"] == {"misses": segments - 1, "gpu": 1, "host": 0, "disk": 0}  # BOS: cached already
    assert lookups["gpu"] == {"misses": 0, "gpu": segments, "host": 0, "disk": 0}
    assert lookups["host"] == {"misses": 0, "gpu": 0, "host": segments, "disk": 0}
    assert lookups["disk"] == lookups["disk_warm"] == {"misses": 0, "gpu": 0, "host": 0, "disk": segments}
    assert result["restart"]["disk_hits"] == segments and result["restart"]["misses"] == 0
    assert result["bandwidth"]["read_only_gbps"] > 0 and "Restart" in (tmp_path / "disk_tier.md").read_text()
    assert not (tmp_path / "kv").exists()  # removed without --keep


def test_relink_prompts_are_seeded_and_well_formed():
    relink = importlib.import_module("benchmarks.relink")
    pool = relink.random_tokens(6, 20, seed=1, vocab=5000)
    assert pool == relink.random_tokens(6, 20, seed=1, vocab=5000)
    assert pool != relink.random_tokens(6, 20, seed=2, vocab=5000)
    assert all(len(doc) == 20 and all(1000 <= t < 4999 for t in doc) for doc in pool)
    prompts = relink.prompts(pool, n=4, per_request=3, question_len=5, seed=0, bos=1, vocab=5000)
    assert len(prompts) == 4
    for p in prompts:
        assert p.segments[0] == [1] and len(p.segments) == 4
        docs = [pool.index(s) for s in p.segments[1:]]
        assert len(set(docs)) == 3  # three different documents of the pool
        assert len(p.final) == 5


def test_best_document_cost_runs_end_to_end_on_the_cpu(tmp_path, monkeypatch):
    best = importlib.import_module("benchmarks.best_document")
    monkeypatch.setattr(sys, "argv", ["benchmarks/best_document.py", str(tmp_path), "--smoke"])
    best.main()
    rows = json.loads((tmp_path / "best_document.json").read_text())["rows"]
    ordering = [
        f"lazy + prefix, {answer}{cap}"
        for answer in ("confidence-order", "confidence-order-or-joint")
        for cap in ("", ", confidence_tokens=4", ", confidence_tokens=1")
    ]
    chosen = [
        f"lazy + prefix, {answer}{cap}"
        for answer in ("each-last", "both-orders", "both-placements")
        for cap in ("", ", confidence_tokens=4", ", confidence_tokens=1")
    ]
    assert [r["config"] for r in rows] == [
        "lazy + prefix, joint",
        "lazy + prefix, best-document",
        *chosen,
        *ordering,
        "full, joint",
    ]
    assert all(r["idle_answer_ms"] > 0 and r["sat_questions_per_s"] > 0 for r in rows)
    # --answers measures the strategies named, after the joint reference; an unknown one is refused
    argv = [
        "benchmarks/best_document.py",
        str(tmp_path / "two"),
        "--smoke",
        "--answers",
        "both-placements,both-orders,each-last",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    best.main()
    rows = json.loads((tmp_path / "two" / "best_document.json").read_text())["rows"]
    assert [r["config"] for r in rows] == ["lazy + prefix, joint", *chosen, "full, joint"]
    monkeypatch.setattr(sys, "argv", ["benchmarks/best_document.py", str(tmp_path), "--smoke", "--answers", "eachlast"])
    with pytest.raises(SystemExit):
        best.main()
    # every question draws its documents from the pool, in its own seeded order
    ids, docs = best.questions([[i] for i in range(8)], 3, 5, 4, seed=0, vocab=5000)
    assert len(ids) == 3 and all(len(q) == 4 for q in ids)
    assert all(len(d) == 5 and len({tuple(x) for x in d}) == 5 for d in docs)
    assert (ids, docs) == best.questions([[i] for i in range(8)], 3, 5, 4, seed=0, vocab=5000)


def test_host_ttft_tokens_stay_inside_the_small_vocabulary():
    host_ttft = importlib.import_module("benchmarks.host_ttft")
    tokens = host_ttft.random_tokens(500, seed=3)
    assert tokens == host_ttft.random_tokens(500, seed=3)
    assert min(tokens) >= 1000 and max(tokens) < host_ttft.VOCAB


def test_alternating_readings_take_turns_and_give_each_timers_median():
    """Each round reads every timer once, starting one later each round; each figure is the median of its own
    readings (hand-set readings: a drift that raises every later reading still leaves the medians in order)."""
    kernels = importlib.import_module("benchmarks.kernels")
    order: list[str] = []
    readings = {"a": iter([10.0, 30.0, 20.0, 11.0, 40.0]), "b": iter([5.0, 6.0, 50.0, 7.0, 8.0])}

    def timer(name: str):
        return lambda: order.append(name) or next(readings[name])

    got = kernels.alternating({name: timer(name) for name in "ab"}, rounds=5)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]
    assert got == {"a": 20.0, "b": 7.0}
    three = kernels.alternating({k: (lambda k=k: order.append(k) or 1.0) for k in "xyz"}, rounds=3)
    assert order[10:] == ["x", "y", "z", "y", "z", "x", "z", "x", "y"] and three == dict.fromkeys("xyz", 1.0)


def test_tune_kernels_quick_jobs_are_small_and_numbered():
    tune = importlib.import_module("benchmarks.tune_kernels")
    jobs = tune.all_jobs({"prefill", "overhead", "decode"}, quick=True)
    assert [j["id"] for j in jobs] == list(range(len(jobs)))
    assert {j["case"] for j in jobs} >= {"causal", "rag", "decode"}
    assert max(j.get("n", 0) for j in jobs) == 64 and max(j.get("ctx", 0) for j in jobs) == 96  # CPU-sized
    full = tune.all_jobs({"prefill", "decode"}, quick=False)
    assert min(j["n"] for j in full if "n" in j) == 4096 and max(j.get("ctx", 0) for j in full) == 32768
    assert tune.all_jobs({"decode"}, quick=True) and not tune.all_jobs(set(), quick=True)


@pytest.mark.parametrize("script", ["serving.sh", "tensor_parallel.sh"])
def test_shell_scripts_parse_and_call_existing_modules(script):
    path = ROOT / "benchmarks" / script
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    modules = set(re.findall(r"python3? -m benchmarks\.(\w+)", path.read_text()))
    assert modules, script
    for name in modules:
        assert name in SCRIPTS and (ROOT / "benchmarks" / f"{name}.py").is_file(), name
