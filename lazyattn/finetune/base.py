"""The model to fine-tune, as a transformers model: from a checkpoint directory, a .gguf file (dequantised by
lazyattn's own GGUF reader, so no `gguf` package is needed), a named model, or "tiny" (the engine's random
weights, the same values `load_model("tiny")` draws). The tokenizer is the engine's own (load_tokenizer)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lazyattn.errors import CheckpointError, InvalidRequestError
from lazyattn.finetune.config import ATTENTION
from lazyattn.model import gguf, gguf_tokenizer
from lazyattn.model.config import ModelConfig
from lazyattn.model.hub import resolve_model
from lazyattn.model.loader import load_model
from lazyattn.model.tokenizer import TINY, TokenizerBase, load_tokenizer

# Files a checkpoint directory's tokenizer lives in; copied beside merged weights.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)


@dataclass
class Base:
    name: str  # as given: recorded in the adapter as its base
    model: torch.nn.Module  # transformers CausalLM, fp32; its attention takes the training rows' 4-D masks as is
    tokenizer: TokenizerBase

    def save_tokenizer(self, directory: Path) -> None:
        """Tokenizer files beside merged weights, so lazyattn loads the directory on its own ("tiny" has none:
        its byte tokenizer is built in)."""
        path = resolve_model(self.name)
        if gguf.is_gguf(path):
            gguf_tokenizer.write_tokenizer_files(gguf.open_gguf(path), directory)
        elif Path(path).is_dir():
            for name in TOKENIZER_FILES:
                if (Path(path) / name).is_file():
                    shutil.copy2(Path(path) / name, directory / name)


def load_base(name: str, attention: str = "sdpa") -> Base:
    """The base model in fp32 with transformers' `attention` implementation: "sdpa" (PyTorch's fused attention,
    memory linear in the row length) or "eager" (a rows x heads x length² score tensor per layer). Both read the
    additive 4-D masks of masks.py as given."""
    import transformers

    if attention not in ATTENTION:
        raise InvalidRequestError(f"attention must be one of {', '.join(ATTENTION)}, got {attention!r}", "attention")

    path = resolve_model(name)
    if name == TINY:
        config, weights = _tiny_config(), engine_weights(TINY)
    elif gguf.is_gguf(path):
        config, weights = gguf.hf_config(gguf.open_gguf(path)), dict(gguf.read_weights(path))
    elif Path(path).is_dir():
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation=attention
        )
        return Base(name, model, load_tokenizer(path))
    else:
        raise CheckpointError(f"{name!r}: not 'tiny', a named model, a .gguf file or a checkpoint directory")
    arch = config["architectures"][0]
    config_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"), None)
    if config_cls is None:
        raise CheckpointError(f"{name}: no transformers config class for {arch}")
    hf_config = config_cls(**{k: v for k, v in config.items() if k != "dtype"})
    model = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation=attention, dtype=torch.float32)
    if hf_config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [m for m in missing if not (hf_config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise CheckpointError(f"{name}: weights do not fit {arch} (missing {missing[:3]}, unexpected {unexpected[:3]})")
    if hf_config.tie_word_embeddings:
        model.tie_weights()
    return Base(name, model.eval(), load_tokenizer(path))


def _tiny_config() -> dict[str, Any]:
    cfg = ModelConfig.tiny()
    return {
        "architectures": [cfg.architecture],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position,
        "rope_theta": cfg.rope.base,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": list(cfg.eos_token_ids),
    }


def engine_weights(name: str) -> dict[str, torch.Tensor]:
    """The engine's weights under Hugging Face names (fused projections split back)."""
    lm, _ = load_model(name)
    return {hf: tensor.detach().clone() for hf, tensor in lm.hf_tensors().items()}
