"""`lazyattn eval --fidelity` (lazyattn/eval/fidelity.py): the comparisons' arithmetic, a float32 run against its
reference and a perturbed one, and the report end to end on the tiny model."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from lazyattn import LLM, SamplingParams
from lazyattn.cli import main
from lazyattn.engine.config import EngineConfig
from lazyattn.errors import InvalidRequestError
from lazyattn.eval import fidelity
from lazyattn.eval.fidelity import Answers, Comparison, Engine, Plan, Prompt
from lazyattn.eval.metrics import bootstrap_ci


def test_first_divergence():
    assert fidelity.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert fidelity.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert fidelity.first_divergence([4], [1, 2]) == 0
    assert fidelity.first_divergence([1, 2], [1, 2, 3]) == 2  # one stopped earlier: they differ where it ended


def test_comparison_counts_identical_answers_and_divergences():
    rows = torch.log_softmax(torch.randn(4, 10), -1)
    ref = Answers([[1, 2, 3], [4, 5], [6, 7, 8], [9]], list(rows))
    run = Answers([[1, 2, 3], [4, 0], [0, 7, 8], [9, 9]], list(rows))
    s = Comparison.of("dtype", "run", "ref", run, ref).summary()
    assert s["n"] == 4 and s["identical"] == 0.25 and s["diverging"] == 3
    assert s["divergence_mean"] == statistics.fmean([1, 0, 1]) and s["divergence_median"] == 1
    assert s["identical_ci"] == bootstrap_ci([1.0, 0.0, 0.0, 0.0])
    assert s["kl_mean"] == 0.0 and s["kl_max"] == 0.0  # the same distributions


def test_kl_equals_torch_distributions_and_is_zero_for_equal_rows():
    p = torch.log_softmax(torch.randn(5, 300, dtype=torch.float64), -1)
    q = torch.log_softmax(p + 0.3 * torch.randn_like(p), -1)
    q[0, 7] = float("-inf")  # a token the run gives no mass: the row's KL is inf
    p[1, 3] = float("-inf")  # a token the reference gives no mass: its term is 0
    want = torch.distributions.kl_divergence(
        torch.distributions.Categorical(logits=p), torch.distributions.Categorical(logits=q)
    )
    got = fidelity.kl_divergence(p.float(), q.float())
    assert torch.isinf(got[0]) and torch.isinf(want[0])
    assert torch.allclose(got[1:], want[1:], rtol=1e-5)
    assert torch.equal(fidelity.kl_divergence(p, p), torch.zeros(5, dtype=torch.float64))


def test_batch_sizes():
    assert fidelity.batch_sizes("1,8,all", 40) == [1, 8, 40]
    assert fidelity.batch_sizes("all,64,1", 20) == [1, 20]
    with pytest.raises(ValueError, match="batch-sizes"):
        fidelity.batch_sizes("1,x", 4)


def _prompts(n: int) -> list[Prompt]:
    return [
        Prompt([{"role": "user", "content": f"Question {i}: what is {i}?"}], [f"doc {i} a", "doc b"]) for i in range(n)
    ]


def _run(plan: Plan, n: int = 4) -> dict:
    def make_llm(engine: Engine) -> LLM:
        extra = fidelity.reference_options("cpu") if engine.reference else {"dtype": engine.dtype}
        return LLM("tiny", mode=engine.mode, page_size=16, progress=False, **extra)

    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, first_token_logprobs=True)
    return fidelity.run_plan(plan, _prompts(n), make_llm, params, log=lambda line: None)


def test_float32_against_its_reference_is_identical_and_bfloat16_is_caught():
    plan = Plan(["lazy", "block"], ["float32", "bfloat16"], ["float32"], [1, 4])
    results = _run(plan)
    comps = {(c.kind, c.run): c for c in fidelity.comparisons(plan, results)}
    assert [k for k in comps] == [
        ("dtype", "lazy float32, batch 4"),
        ("dtype", "lazy bfloat16, batch 4"),
        ("dtype", "block float32, batch 4"),
        ("dtype", "block bfloat16, batch 4"),
        ("batch", "lazy float32, batch 4"),
        ("batch", "block float32, batch 4"),
        ("mode", "lazy float32 reference, batch 4"),
        ("mode", "lazy float32, batch 1"),
        ("mode", "lazy float32, batch 4"),
        ("mode", "lazy bfloat16, batch 4"),
    ]
    for mode in ("lazy", "block"):
        exact = comps["dtype", f"{mode} float32, batch 4"].summary()
        assert exact["identical"] == 1.0 and exact["diverging"] == 0 and exact["kl_max"] < 1e-9
        perturbed = comps["dtype", f"{mode} bfloat16, batch 4"]
        assert all(kl > 1e-7 for kl in perturbed.kl)
        ref = results[Engine(mode, "float32", reference=True), 4].first_logprobs
        run = results[Engine(mode, "bfloat16"), 4].first_logprobs
        want = [
            torch.distributions.kl_divergence(
                torch.distributions.Categorical(logits=p.double()), torch.distributions.Categorical(logits=q.double())
            ).item()
            for p, q in zip(ref, run)
        ]
        assert perturbed.kl == pytest.approx(want, rel=1e-6)
    # lazy and block compute the same semantics: in float32 they agree
    assert comps["mode", "lazy float32 reference, batch 4"].summary()["identical"] == 1.0


def test_cli_writes_the_report(tmp_path):
    args = ["eval", "--fidelity", "--model", "tiny", "--device", "cpu", "--page-size", "16", "--limit", "3"]
    args += ["--num-docs", "1", "--max-tokens", "3", "--modes", "prefix,full"]
    args += ["--dtypes", "float32,float16", "--batch-sizes", "1,all", "--no-progress", "--out", str(tmp_path)]
    assert main(args) == 0
    data = json.loads((tmp_path / "fidelity.json").read_text())
    kinds = [c["kind"] for c in data["comparisons"]]
    # 2 modes x 2 dtypes against the reference; 2 modes x batch 3 against 1; prefix vs full: reference,
    # float32 at batch 1 and 3, float16 at 3
    assert kinds == ["dtype"] * 4 + ["batch"] * 2 + ["mode"] * 4
    for c in data["comparisons"]:
        assert c["n"] == 3 and len(c["kl_each"]) == 3 and 0 <= c["identical"] <= 1
    assert data["meta"]["batch_sizes"] == [1, 3] and len(data["answers"]) == 2 * (1 + 2 + 1)
    md = (tmp_path / "fidelity.md").read_text()
    assert "| compared | run | against |" in md and "| dtype | prefix float16, batch 3 |" in md
    assert md.startswith("# Fidelity: tiny") and "Device: CPU" in md
    # by default the realistic set, each question once (gold first)
    assert data["dataset"]["builtin"] == "real" and data["dataset"]["questions"] == 3


def test_the_reference_options_serve_attention_through_the_pytorch_reference(monkeypatch):
    """On CUDA the engine's backend is the Triton kernels; the reference's options (`reference_attention`) put the
    PyTorch reference on the same page pool instead. Here a stand-in for the device's backend, whose answers the
    reference's options must restore to the reference's."""
    from lazyattn.engine import model_runner
    from lazyattn.kernels.backend import ReferenceBackend

    class Skewed(ReferenceBackend):
        def attend(self, layer, q, k, v, fb):
            return 1.5 * super().attend(layer, q, k, v, fb)

    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, first_token_logprobs=True)
    want = fidelity.answer(LLM("tiny", page_size=16, progress=False), _prompts(2), params, 2)
    monkeypatch.setattr(
        model_runner, "make_backend", lambda kv, tables, scale, deterministic=False: Skewed(kv, tables, scale)
    )
    skewed = fidelity.answer(LLM("tiny", page_size=16, progress=False), _prompts(2), params, 2)
    assert any(not torch.equal(a, b) for a, b in zip(skewed.first_logprobs, want.first_logprobs))
    llm = LLM("tiny", page_size=16, progress=False, **fidelity.reference_options("cpu"))
    got = fidelity.answer(llm, _prompts(2), params, 2)
    assert got.token_ids == want.token_ids
    assert all(torch.equal(a, b) for a, b in zip(got.first_logprobs, want.first_logprobs))
    with pytest.raises(InvalidRequestError, match="tensor parallelism"):
        EngineConfig(reference_attention=True, tensor_parallel_size=2)


def test_comparisons_of_a_run_still_going_are_those_with_both_sides():
    plan = Plan(["prefix", "full"], ["float32"], ["float32"], [1, 2])
    results = _run(plan, n=2)
    everything = {(c.kind, c.run, c.against) for c in fidelity.comparisons(plan, results)}
    # the run stopped before full's float32 engine: full's rows and the mode rows need it
    partial = {k: v for k, v in results.items() if not (k[0].mode == "full" and not k[0].reference)}
    some = {(c.kind, c.run, c.against) for c in fidelity.comparisons(plan, partial)}
    assert some == {
        ("dtype", "prefix float32, batch 2", "prefix float32 reference, batch 2"),
        ("batch", "prefix float32, batch 2", "prefix float32, batch 1"),
        ("mode", "prefix float32 reference, batch 2", "full float32 reference, batch 2"),
    }
    assert some < everything


def test_cli_report_survives_a_stop(tmp_path, monkeypatch):
    """--out is rewritten after every pass: a run stopped from outside leaves the comparisons it had finished."""

    class Stopped(Exception):
        pass

    real, calls = fidelity.answer, []

    def answer_then_stop(*a, **kw):
        if len(calls) == 3:  # prefix: reference, float32 at 3 and at 1; then stopped
            raise Stopped
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(fidelity, "answer", answer_then_stop)
    args = ["eval", "--fidelity", "--model", "tiny", "--device", "cpu", "--page-size", "16", "--limit", "3"]
    args += ["--num-docs", "1", "--max-tokens", "3", "--modes", "prefix,full", "--dtypes", "float32"]
    args += ["--batch-sizes", "1,all", "--no-progress", "--out", str(tmp_path)]
    with pytest.raises(Stopped):
        main(args)
    data = json.loads((tmp_path / "fidelity.json").read_text())
    assert data["meta"]["passes"] == [3, 6]
    assert [(c["kind"], c["run"]) for c in data["comparisons"]] == [
        ("dtype", "prefix float32, batch 3"),
        ("batch", "prefix float32, batch 3"),
    ]
    assert "**Partial**: 3 of 6 passes ran." in (tmp_path / "fidelity.md").read_text()
