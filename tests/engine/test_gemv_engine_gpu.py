"""The engine with the skinny decode kernel (kernels/gemv.py) against the same engine on F.linear: Llama-3.1-8B
layer shapes (4 layers, random bf16 weights, CUDA graphs on), greedy tokens of a batch of prompts. Run on the
device: `pytest -m gpu`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lazyattn import LLM, SamplingParams
from lazyattn.engine.prompt import RenderedPrompt

CONFIG_8B = Path(__file__).resolve().parents[2] / "benchmarks" / "models" / "llama-3.1-8b"
pytestmark = pytest.mark.gpu


def generate(directory: Path, prompts: list[RenderedPrompt]) -> tuple[list[list[int]], torch.Tensor]:
    llm = LLM(model=str(directory), mode="lazy", device="cuda", random_weights=True, kv_cache_gb=2, progress=False)
    seen: list[torch.Tensor] = []
    run = llm.engine.runner.run

    def recording(batch):
        logits = run(batch)
        seen.append(logits.detach().to("cpu", torch.float32, copy=True))  # a copy: graph outputs are reused
        return logits

    llm.engine.runner.run = recording
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        llm.engine.add_request(f"r{i}", p, params)
    outs = {}
    while llm.engine.has_unfinished():
        for o in llm.engine.step():
            if o.finished:
                outs[o.request_id] = o.token_ids
    llm.shutdown()
    return [outs[f"r{i}"] for i in range(len(prompts))], seen[-1]


@pytest.mark.parametrize("mode", ["auto", "force"])
def test_greedy_tokens_match_f_linear(tmp_path, monkeypatch, mode):
    cfg = json.loads((CONFIG_8B / "config.json").read_text())
    cfg["num_hidden_layers"] = 4
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    prompts = [RenderedPrompt(segments=[], final=[128000] + torch.randint(1000, 120000, (n,), generator=g).tolist())
               for n in (5, 17, 40)]
    monkeypatch.setenv("LAZYATTN_GEMV", "0")
    expected, expected_logits = generate(tmp_path, prompts)
    monkeypatch.setenv("LAZYATTN_GEMV", mode)
    tokens, logits = generate(tmp_path, prompts)
    rel = ((logits - expected_logits).norm() / expected_logits.norm()).item()
    print(f"\nLAZYATTN_GEMV={mode}: last step logits |ours - F.linear| / |F.linear| = {rel:.2e}")
    assert rel < 2e-2
    assert tokens == expected
