"""benchmarks/engine.py (the device run) end to end on the CPU with --quick: every section produces its numbers,
the byte limits are the ones the model's shapes imply, and the JSON and markdown are written."""

from __future__ import annotations

import json

import pytest

from benchmarks import engine as engine_script
from lazyattn.model.config import ModelConfig


@pytest.fixture(scope="module")
def engine_bench():
    return engine_script


def test_quick_run_writes_every_section(engine_bench, tmp_path):
    out = tmp_path / "engine_quick"
    assert engine_bench.main(["--quick", "--device", "cpu", "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    results = data["results"]
    assert "--quick" in data["meta"]["command"]

    # Bytes per step, from the tiny config by hand: every weight (fp32 on the CPU) but an untied embedding table.
    cfg = ModelConfig.tiny()
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    per_layer = h * (cfg.num_heads + 2 * cfg.num_kv_heads) * d + cfg.num_heads * d * h + h * 2 * i + i * h + 2 * h
    weights = cfg.num_layers * per_layer + h + cfg.vocab_size * h
    assert results["weight_bytes"] == 4 * weights
    assert results["kv_bytes_per_token"] == cfg.num_layers * 2 * cfg.num_kv_heads * d * 4

    quick = engine_bench.QUICK
    bw = results["bandwidth_gbs"] * 1e9
    for name in ["decode_short", "decode_rag"] + [f"decode_batch{b}" for b in quick.batches]:
        r = results[name]
        assert r["steps"] >= 1 and r["step_ms"] > 0, name
        expected_limit = (results["weight_bytes"] + r["batch"] * r["context"] * results["kv_bytes_per_token"]) / bw
        # context is rounded to whole tokens in the record: the limit is within one token's KV of it
        assert abs(r["limit_ms"] / 1e3 - expected_limit) <= r["batch"] * results["kv_bytes_per_token"] / bw
        assert r["of_limit"] == pytest.approx(r["limit_ms"] / r["step_ms"])
    assert results["decode_rag"]["context"] > quick.n_docs * quick.doc_len > results["decode_short"]["context"]
    ttft = results["ttft_rag"]
    assert ttft["context"] == quick.system_len + quick.n_docs * quick.doc_len + quick.question
    assert ttft["of_decode_step"] == pytest.approx(ttft["ttft_ms"] / results["decode_rag"]["step_ms"])
    # On the CPU no kernel is launched; the profiler still sees the step's operators.
    for step in ("prefill", "decode"):
        assert results["launches"][step]["kernels"] == 0
        assert results["launches"][step]["aten_ops"] > cfg.num_layers
    table = out.with_suffix(".md").read_text()
    assert "decode TPOT, batch 1, short" in table and "| prefill |" in table
    assert results["async_scheduling"] is False and "Overlapped scheduling off" in table  # the CPU default


def test_deterministic_switch_runs_the_engine_in_that_mode(engine_bench, tmp_path, monkeypatch):
    """`--deterministic` (the mode's cost, read against a run without it): the engine it builds has the option on."""
    built = []
    real = engine_bench.LLM

    def spy(*args, **kw):
        built.append(kw.get("deterministic"))
        return real(*args, **kw)

    monkeypatch.setattr(engine_bench, "LLM", spy)
    out = tmp_path / "engine_det"
    args = ["--quick", "--device", "cpu", "--deterministic", "--sections", "decode_short", "--out", str(out)]
    assert engine_bench.main(args) == 0
    assert built == [True]
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["meta"]["shapes"]["deterministic"] is True
    assert data["results"]["decode_short"]["step_ms"] > 0
