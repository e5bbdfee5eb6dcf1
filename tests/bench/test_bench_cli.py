"""`lazyattn bench` end to end on the tiny model: every mode serves every request of the same trace, and the
modes' cache behaviour is consistent (lazy reuses reordered documents that prefix cannot; lazy and block
encode exactly the same documents)."""

from __future__ import annotations

import json

import pytest

from lazyattn.cli import main

ARGS = [
    "bench",
    "--model",
    "tiny",
    "--device",
    "cpu",
    "--page-size",
    "16",
    "--num-docs",
    "10",
    "--doc-len",
    "48",
    "--docs-per-request",
    "4",
    "--question-len",
    "8",
    "--output-len",
    "4",
    "--num-requests",
    "12",
    "--zipf",
    "1.5",
    "--rate",
    "40,inf",
    "--warmup-requests",
    "2",
    "--no-progress",
]
MODES = ("lazy", "block", "prefix", "full")


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    code = main(
        ARGS
        + ["--out", str(out), "--kv-budgets", "0.0001,0.001,0.01", "--alphas", "1.1,uniform", "--hit-requests", "40"]
    )
    return code, out, json.loads((out / "bench.json").read_text())


def points(data, mode):
    return [p for p in data["points"] if p["mode"] == mode]


def test_every_mode_served_every_request(bench):
    code, out, data = bench
    assert code == 0
    assert [p["mode"] for p in data["points"]] == [m for m in MODES for _ in range(2)]
    for p in data["points"]:
        s = p["summary"]
        assert p["error"] is None and not p["timed_out"]
        assert s["completed"] == s["total"] == 12 and s["output_tokens"] == 12 * 4
        assert p["requests"]["output_tokens"] == [4] * 12
    assert (out / "ttft_vs_rate.png").stat().st_size > 0 and (out / "hit_ratio_vs_budget.png").stat().st_size > 0


def test_lazy_reuses_what_prefix_cannot(bench):
    _, _, data = bench
    for lazy, prefix, full in zip(points(data, "lazy"), points(data, "prefix"), points(data, "full")):
        assert lazy["summary"]["doc_hit_ratio"] > prefix["summary"]["doc_hit_ratio"]
        assert lazy["summary"]["prefill_tokens"] < prefix["summary"]["prefill_tokens"]
        assert full["summary"]["doc_hit_ratio"] == 0
        assert prefix["summary"]["prefill_tokens"] <= full["summary"]["prefill_tokens"]


def test_lazy_and_block_encode_the_same_documents(bench):
    _, _, data = bench
    for lazy, block in zip(points(data, "lazy"), points(data, "block")):
        assert lazy["load"] == block["load"]
        assert lazy["requests"]["doc_hits"] == block["requests"]["doc_hits"]
        assert lazy["requests"]["cached_tokens"] == block["requests"]["cached_tokens"]
        for key in ("doc_tokens_encoded", "prefill_tokens", "doc_hit_ratio"):
            assert lazy["summary"][key] == block["summary"][key]
        # a roomy pool: each distinct document (and the BOS segment) is encoded exactly once
        misses = sum(4 - h for h in lazy["requests"]["doc_hits"])
        assert lazy["summary"]["doc_tokens_encoded"] == misses * 48 + 1
        assert lazy["summary"]["preemptions"] == block["summary"]["preemptions"] == 0


def test_hit_ratio_sweep_in_the_json(bench):
    _, _, data = bench
    rows = data["hit_ratio"]["rows"]
    assert data["hit_ratio"]["simulated"] is True
    assert {(r["policy"], r["mode"]) for r in rows} == {
        (p, m) for p in ("pool", "pool_plus_request") for m in ("lazy", "block", "prefix")
    }
    assert any(r["doc_hit_ratio"] is None for r in rows)  # 0.0001 GB cannot hold one request
    feasible = [r for r in rows if r["doc_hit_ratio"] is not None]
    big = [r for r in feasible if r["budget_gb"] == 0.01 and r["mode"] == "lazy"]
    small = [r for r in feasible if r["budget_gb"] == 0.001 and r["mode"] == "lazy"]
    assert all(
        b["doc_hit_ratio"] >= s["doc_hit_ratio"]
        for b in big
        for s in small
        if b["alpha"] == s["alpha"] and b["policy"] == s["policy"]
    )


def test_one_mode_and_bad_modes(capsys):
    assert main(ARGS + ["--mode", "prefix", "--rate", "inf"]) == 0
    out = capsys.readouterr().out
    modes = [line.split()[1] for line in out.splitlines() if line.startswith("Mode:")]
    assert modes == ["prefix"]
    assert main(ARGS + ["--modes", "lazy,nope"]) == 2


def test_hit_ratio_only_loads_no_model(tmp_path, capsys):
    assert (
        main(
            [
                "bench",
                "--model",
                "tiny",
                "--doc-len",
                "64",
                "--num-docs",
                "10",
                "--kv-budgets",
                "0.001",
                "--alphas",
                "2.1",
                "--hit-requests",
                "20",
                "--hit-ratio-only",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["points"] == [] and len(data["hit_ratio"]["rows"]) == 2 * 3
    assert "Serving Benchmark Result" not in capsys.readouterr().out
