"""load_model: checkpoint errors, dtype casting, and the random-weight models ("tiny", random_init)."""

import dataclasses
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from lazyattn.errors import CheckpointError
from lazyattn.kernels.rope import RopeConfig
from lazyattn.model import ModelConfig, load_model
from lazyattn.model.llama import CausalLM
from lazyattn.model.loader import random_weights
from tests.model.runner import PagedRunner, Run


@pytest.fixture
def llama_dir(checkpoint, tmp_path):
    """A private copy of the single-file Llama checkpoint, free to break."""
    src, _ = checkpoint("llama")
    return shutil.copytree(src, tmp_path / "ckpt")


def edit_config(path, **fields):
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, **fields}))


def edit_tensors(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors")


def test_missing_directory_and_config(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no config.json"):
        load_model(tmp_path)


def test_no_weight_files(llama_dir):
    (llama_dir / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weight files"):
        load_model(llama_dir)
    (llama_dir / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match="pytorch_model.bin: only safetensors"):
        load_model(llama_dir)


def test_missing_shard(checkpoint, tmp_path):
    src, _ = checkpoint("llama31")
    path = shutil.copytree(src, tmp_path / "sharded")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[3]
    (path / shard).unlink()
    with pytest.raises(CheckpointError, match=f"missing: {shard}"):
        load_model(path)


def test_missing_unexpected_and_misshapen_tensors(llama_dir):
    edit_tensors(llama_dir, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match="missing tensor.*model.layers.1.mlp.up_proj.weight"):
        load_model(llama_dir)
    edit_tensors(
        llama_dir,
        lambda t: t.update(
            {
                "model.layers.1.mlp.up_proj.weight": torch.zeros(160, 64),
                "model.layers.0.self_attn.extra.weight": torch.zeros(2),
            }
        ),
    )
    with pytest.raises(CheckpointError, match="unexpected tensor 'model.layers.0.self_attn.extra.weight'"):
        load_model(llama_dir)
    edit_tensors(llama_dir, lambda t: t.pop("model.layers.0.self_attn.extra.weight"))
    load_model(llama_dir)
    edit_config(llama_dir, intermediate_size=128)
    with pytest.raises(CheckpointError, match=r"'model\.layers\.0\.mlp\.\w+_proj\.weight' has shape"):
        load_model(llama_dir)


def test_corrupt_weight_file(llama_dir):
    (llama_dir / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json")
    with pytest.raises(CheckpointError, match="cannot read weights"):
        load_model(llama_dir)


def test_unsupported_architecture_and_sliding_window(llama_dir):
    edit_config(llama_dir, architectures=["GPT2LMHeadModel"])
    with pytest.raises(CheckpointError, match="unsupported architecture.*LlamaForCausalLM"):
        load_model(llama_dir)
    edit_config(llama_dir, architectures=["MistralForCausalLM"], sliding_window=128)
    with pytest.raises(CheckpointError, match="sliding-window"):
        load_model(llama_dir)


def test_dtype_and_weights_identity(checkpoint):
    path, _ = checkpoint("llama31")
    model, cfg = load_model(path, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16} and cfg.dtype == torch.bfloat16
    assert "model-00001-of-" in cfg.weights_id and model.config == cfg
    assert load_model(path)[1].dtype == torch.float32  # the checkpoint's own dtype
    assert load_model(path, random_init=True)[1].weights_id == "random:0"


def greedy(model, cfg, prompt, n):
    runner = PagedRunner(model, cfg, page_size=16, num_pages=16)
    seg = runner.segment(len(prompt) + n)
    logits = runner.run([Run(prompt, seg)])[0][-1]
    out = []
    for _ in range(n):
        out.append(int(logits.argmax()))
        logits = runner.run([Run(out[-1:], seg)])[0][-1]
    return out


def test_tiny_is_deterministic_and_varied():
    model, cfg = load_model("tiny")
    assert cfg.weights_id == "random:0" and cfg.vocab_size == 320
    again, _ = load_model("tiny", seed=0)
    other, _ = load_model("tiny", seed=1)
    w = dict(model.named_parameters())
    assert all(torch.equal(p, w[n]) for n, p in again.named_parameters())
    assert not torch.equal(other.embed_tokens.weight, model.embed_tokens.weight)
    out = greedy(model, cfg, [256, *b"The quick brown fox"], 32)
    assert len(set(out)) >= 8, out


def test_tiny_bf16_tracks_fp32():
    prompt = [256, *b"Hello, world"]
    got = []
    for dtype in (torch.float32, torch.bfloat16):
        model, cfg = load_model("tiny", dtype=dtype)
        runner = PagedRunner(model, cfg)
        got.append(runner.run([Run(prompt, runner.segment(len(prompt)))])[0])
    assert got[1].dtype == torch.float32
    assert ((got[1] - got[0]).norm() / got[0].norm()).item() < 5e-2


def test_random_init_keeps_activations_sane_at_depth():
    cfg = dataclasses.replace(
        ModelConfig.tiny(),
        hidden_size=256,
        intermediate_size=704,
        num_layers=16,
        num_heads=4,
        head_dim=64,
        rope=RopeConfig(head_dim=64),
        dtype=torch.bfloat16,
    )
    with torch.device("meta"):
        model = CausalLM(cfg)
    model = model.to(dtype=torch.bfloat16).to_empty(device="cpu")
    random_weights(model, seed=0)
    runner = PagedRunner(model, cfg)
    logits = runner.run([Run(list(range(40)), runner.segment(40))])[0]
    assert torch.isfinite(logits).all() and 0.3 < logits.std().item() < 5
