"""Small random Hugging Face checkpoints written with transformers' save_pretrained, one per supported
flavour, plus the transformers model itself as ground truth. Tests only."""

from __future__ import annotations

from pathlib import Path

import torch

SMALL = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    # Wider than the usual 0.02 so attention patterns and the MLP are far from linear.
    initializer_range=0.08,
)
LLAMA31_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}

# name -> (config class name, overrides, save_pretrained max_shard_size)
CASES: dict[str, tuple[str, dict, str | None]] = {
    "llama": ("LlamaConfig", {}, None),
    # Sharded on purpose: exercises model.safetensors.index.json.
    "llama31": ("LlamaConfig", {"rope_theta": 500000.0, "rope_scaling": LLAMA31_ROPE}, "60KB"),
    "llama_bias": ("LlamaConfig", {"attention_bias": True, "mlp_bias": True}, None),
    "mistral": ("MistralConfig", {"sliding_window": None, "rope_theta": 1e6}, None),
    "qwen2": ("Qwen2Config", {"rope_theta": 1e6}, None),
    # Explicit head_dim: 4 heads x 32 != hidden 64.
    "qwen3": ("Qwen3Config", {"head_dim": 32}, None),
    "tied": ("LlamaConfig", {"tie_word_embeddings": True, "eos_token_id": [2, 3]}, None),
}


def hf_model(name: str, seed: int = 0) -> torch.nn.Module:
    """A random fp32 transformers model of flavour `name`, eager attention, non-trivial norms and biases."""
    import transformers

    cls_name, overrides, _ = CASES[name]
    config = getattr(transformers, cls_name)(**{**SMALL, **overrides})
    torch.manual_seed(seed)
    auto = transformers.AutoModelForCausalLM
    model = auto.from_config(config, attn_implementation="eager", dtype=torch.float32)
    # Default init sets norm weights to 1 and biases to 0, which would hide swapped or dropped tensors.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif pname.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return model.eval()


def write_checkpoint(name: str, directory: Path, seed: int = 0) -> torch.nn.Module:
    """Save flavour `name` to `directory` (safetensors; sharded where CASES says) and return the model."""
    model = hf_model(name, seed)
    shard = CASES[name][2]
    model.save_pretrained(directory, **({"max_shard_size": shard} if shard else {}))
    return model


@torch.inference_mode()
def hf_logits(
    model: torch.nn.Module,
    tokens: list[int],
    positions: list[int] | None = None,
    visible: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """transformers' logits [T, vocab] over `tokens`, optionally at `positions` with a boolean mask [T, T]
    (True = may attend), passed as a 4-D additive float mask, which transformers uses as is; `bias` [T, T] is added
    to the visible scores (after the 1/sqrt(d) scaling, as an additive mask is)."""
    kwargs: dict = {"use_cache": False}
    if positions is not None:
        kwargs["position_ids"] = torch.tensor([positions])
    if visible is not None:
        additive = torch.zeros(visible.shape) if bias is None else bias.clone().float()
        additive = additive.masked_fill(~visible, float("-inf"))
        kwargs["attention_mask"] = additive[None, None]
    return model(input_ids=torch.tensor([tokens]), **kwargs).logits[0].float()
