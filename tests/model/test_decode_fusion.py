"""The fused decode path (docs/design.md, "Decode fusion"): norm scales folded into qkv and gate_up, each norm's
1/rms and each residual add in the skinny product's epilogues. Against transformers' own forward, on every supported
flavour (non-trivial norm scales and biases), the kernels under the Triton interpreter."""

import pytest
import torch

from lazyattn.kernels import gemv
from lazyattn.model import load_model
from lazyattn.model.layers import DecodePlan
from tests.model.checkpoints import CASES, hf_logits, hf_model
from tests.model.runner import PagedRunner, Run
from tests.model.test_parity import TOL, random_tokens, rel_err


def cpu_plan(model) -> DecodePlan:
    """The kernel's default configs for a layer's four linears (the CPU has no measured table)."""
    layer = model.layers[0]
    linears = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
    return DecodePlan(*(gemv.default_config(*lin.weight.shape, torch.device("cpu")) for lin in linears))


@pytest.mark.parametrize("name", list(CASES))
def test_fused_decode_matches_transformers(name, checkpoint, monkeypatch):
    path, hf = checkpoint(name)
    model, cfg = load_model(path, dtype=torch.float32)
    scales = model.layers[0].input_layernorm.weight.clone()
    model.fold_norms()
    assert torch.equal(model.layers[0].input_layernorm.weight, torch.ones_like(scales))
    assert not torch.equal(scales, torch.ones_like(scales))  # the checkpoint's scales are not trivially 1
    runner = PagedRunner(model, cfg)
    tokens = [1] + random_tokens(20, seed=0)
    seg = runner.segment(32)
    prefill = runner.run([Run(tokens, seg)])[0]  # the plain path, with the folded weights
    assert rel_err(prefill, hf_logits(hf, tokens)) < TOL
    # Handed back in Hugging Face's layout (gate/up un-interleaved), the folded weights are the same model.
    exported = hf_model(name)
    assert not exported.load_state_dict(model.hf_tensors(), strict=False).unexpected_keys
    assert rel_err(hf_logits(exported, tokens), hf_logits(hf, tokens)) < TOL

    plan, calls = cpu_plan(model), []
    monkeypatch.setattr(model, "decode_plan", lambda x: plan)
    into_residual = gemv.gemv_into_residual
    monkeypatch.setattr(gemv, "gemv_into_residual", lambda *a, **k: calls.append(1) or into_residual(*a, **k))
    nxt = int(prefill[-1].argmax())
    got = runner.run([Run([nxt], seg)])[0]
    assert len(calls) == 2 * cfg.num_layers  # the fused path ran: o_proj and down of every layer
    assert rel_err(got[0], hf_logits(hf, tokens + [nxt])[-1]) < TOL


def test_no_plan_without_folded_norms_or_off_the_table():
    model, _ = load_model("tiny")
    x = torch.zeros(1, model.config.hidden_size)
    assert model.decode_plan(x) is None  # norms not folded (a CPU load never folds them)
    model.fold_norms()
    assert model.decode_plan(x) is None  # the CPU: gemv.pick keeps F.linear
