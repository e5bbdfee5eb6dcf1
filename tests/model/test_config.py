"""ModelConfig parsing (transformers 4 and 5 layouts, per-architecture flags) and the fingerprint."""

import dataclasses

import pytest
import torch

from lazyattn.errors import CheckpointError
from lazyattn.model import SUPPORTED_ARCHITECTURES, ModelConfig

BASE = {
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}


def parse(arch: str, **fields) -> ModelConfig:
    return ModelConfig.from_dict({"architectures": [arch], **BASE, **fields})


def test_transformers4_layout():
    cfg = parse(
        "LlamaForCausalLM",
        rope_theta=500000.0,
        torch_dtype="bfloat16",
        eos_token_id=5,
        rope_scaling={"type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64},
    )
    assert cfg.rope.base == 500000.0 and cfg.rope.rope_type == "llama3" and cfg.rope.factor == 8.0
    assert cfg.dtype == torch.bfloat16 and cfg.eos_token_ids == (5,)
    assert cfg.head_dim == 16 and cfg.num_kv_heads == 2 and cfg.rope.head_dim == 16


def test_transformers5_layout():
    cfg = parse(
        "LlamaForCausalLM",
        dtype="float16",
        eos_token_id=[7, 8],
        bos_token_id=6,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
    )
    assert (cfg.rope.rope_type, cfg.rope.factor, cfg.rope.base) == ("linear", 2.0, 1e6)
    assert cfg.dtype == torch.float16 and cfg.eos_token_ids == (7, 8) and cfg.bos_token_id == 6


def test_architecture_flags():
    qwen3 = parse("Qwen3ForCausalLM", head_dim=32)
    assert qwen3.head_dim == 32 and qwen3.qk_norm and not qwen3.qkv_bias and qwen3.q_size == 128
    qwen2 = parse("Qwen2ForCausalLM")
    assert qwen2.qkv_bias and not qwen2.o_bias and not qwen2.qk_norm
    llama = parse("LlamaForCausalLM", attention_bias=True, mlp_bias=True)
    assert llama.qkv_bias and llama.o_bias and llama.mlp_bias
    mistral = parse("MistralForCausalLM", attention_bias=True)  # Mistral's modelling ignores it
    assert not mistral.qkv_bias and not mistral.o_bias
    assert parse("LlamaForCausalLM", num_key_value_heads=None).num_kv_heads == 4
    assert ModelConfig.from_dict({"model_type": "qwen2", **BASE}).architecture == "Qwen2ForCausalLM"


def test_unsupported_architecture_names_the_supported_ones():
    with pytest.raises(CheckpointError, match="GPT2LMHeadModel") as e:
        parse("GPT2LMHeadModel")
    assert all(a in str(e.value) for a in SUPPORTED_ARCHITECTURES)


def test_sliding_window():
    assert parse("MistralForCausalLM", sliding_window=None).architecture == "MistralForCausalLM"
    parse("MistralForCausalLM", sliding_window=512)  # covers the whole context: full attention
    with pytest.raises(CheckpointError, match="sliding_window=64"):
        parse("MistralForCausalLM", sliding_window=64)
    parse("Qwen2ForCausalLM", sliding_window=64, use_sliding_window=False)  # written but unused
    with pytest.raises(CheckpointError, match="sliding"):
        parse("Qwen2ForCausalLM", sliding_window=64, use_sliding_window=True)


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"quantization_config": {"quant_method": "awq"}}, "quantized"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "dynamic"),
        ({"num_key_value_heads": 3}, "multiple"),
        ({"dtype": "int8"}, "dtype"),
    ],
)
def test_bad_configs(fields, match):
    with pytest.raises(CheckpointError, match=match):
        parse("LlamaForCausalLM", **fields)
    with pytest.raises(CheckpointError, match="hidden_size"):
        ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "vocab_size": 3})


def test_fingerprint_tracks_what_changes_kv():
    tiny = ModelConfig.tiny()
    fp = tiny.fingerprint()
    assert fp == ModelConfig.tiny().fingerprint() and len(fp) == 16
    for change in (
        {"weights_id": "random:1"},
        {"dtype": torch.bfloat16},
        {"num_kv_heads": 4},
        {"rope": dataclasses.replace(tiny.rope, base=5e5)},
        {"qk_norm": True},
    ):
        assert dataclasses.replace(tiny, **change).fingerprint() != fp, change
    for change in ({"eos_token_ids": (1, 2)}, {"bos_token_id": 0}, {"max_position": 8192}):
        assert dataclasses.replace(tiny, **change).fingerprint() == fp, change


def test_tiny_matches_the_byte_tokenizer():
    tiny = ModelConfig.tiny()
    assert (tiny.vocab_size, tiny.bos_token_id, tiny.eos_token_ids) == (320, 256, (257,))
    assert tiny.num_heads * tiny.head_dim == tiny.hidden_size and tiny.max_position == 4096
