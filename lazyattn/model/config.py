"""ModelConfig: the few numbers of a Llama-family decoder, read from a Hugging Face config.json.

One decoder covers Llama (2/3/3.1/3.2), Mistral, Qwen2 and Qwen3; they differ only by the flags below.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lazyattn.errors import CheckpointError
from lazyattn.kernels.rope import RopeConfig, RopeConfigError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
# Older or hand-written config.json files may only carry model_type.
_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
}


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position: int
    rope: RopeConfig
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 always; Llama/Qwen3 with attention_bias
    o_bias: bool = False  # Llama/Qwen3 attention_bias also puts a bias on o_proj (Qwen2 does not)
    mlp_bias: bool = False  # Llama mlp_bias
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k before RoPE
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    dtype: torch.dtype = torch.float32  # the checkpoint's dtype; load_model replaces it with the runtime one
    # Identity of the weights, set by the loader: file names/sizes/mtimes of a checkpoint, or
    # "random:<seed>" for random init. Part of the fingerprint, so two models never share cached KV.
    weights_id: str = ""

    def __post_init__(self) -> None:
        if self.rope.head_dim != self.head_dim:
            raise ValueError(f"rope.head_dim {self.rope.head_dim} != head_dim {self.head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    @property
    def attn_scale(self) -> float:
        return self.head_dim**-0.5

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def fingerprint(self) -> str:
        """Short hex hash of everything that changes the KV a token produces (model half of a cache key).

        Token ids of BOS/EOS and the context length do not change KV and are left out, so that editing
        generation settings does not invalidate cached documents.
        """
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in ("bos_token_id", "eos_token_ids", "max_position"):
            fields.pop(name)
        fields["rope"] = dataclasses.asdict(self.rope)
        fields["dtype"] = str(self.dtype)
        blob = json.dumps(fields, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @staticmethod
    def tiny() -> ModelConfig:
        """The built-in small random Llama, with the byte tokenizer's vocabulary (256 bytes + 64 specials)."""
        head_dim = 32
        return ModelConfig(
            architecture="LlamaForCausalLM",
            vocab_size=320,
            hidden_size=128,
            intermediate_size=352,
            num_layers=4,
            num_heads=4,
            num_kv_heads=2,
            head_dim=head_dim,
            rms_norm_eps=1e-5,
            max_position=4096,
            rope=RopeConfig(head_dim=head_dim, base=10000.0),
            bos_token_id=256,
            eos_token_ids=(257,),
            dtype=torch.float32,
        )

    @staticmethod
    def from_dir(path: str | Path) -> ModelConfig:
        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(f"model directory {str(path)!r} does not exist (or is not a directory)")
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise CheckpointError(f"{str(path)!r} has no config.json; expected a Hugging Face checkpoint")
        try:
            cfg = json.loads(cfg_file.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointError(f"cannot read {cfg_file}: {e}") from e
        return ModelConfig.from_dict(cfg, source=str(cfg_file))

    @staticmethod
    def from_dict(cfg: dict[str, Any], source: str = "config.json") -> ModelConfig:
        """Parse a config.json dict (transformers 4 or 5 layout)."""
        arch = _architecture(cfg, source)
        if cfg.get("quantization_config"):
            raise CheckpointError(f"{source}: quantized checkpoints are not supported; use bf16/fp16/fp32")
        act = cfg.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise CheckpointError(f"{source}: hidden_act {act!r} is not supported (gated SiLU only)")
        try:
            hidden = int(cfg["hidden_size"])
            num_heads = int(cfg["num_attention_heads"])
            num_kv_heads = int(cfg.get("num_key_value_heads") or num_heads)
            # An explicit head_dim wins (Qwen3 and some Mistral/Llama have head_dim != hidden / heads).
            head_dim = int(cfg.get("head_dim") or hidden // num_heads)
            max_position = int(cfg.get("max_position_embeddings", 4096))
            rope = RopeConfig.from_hf(cfg, head_dim)
            parsed = dict(
                vocab_size=int(cfg["vocab_size"]),
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            )
        except KeyError as e:
            raise CheckpointError(f"{source}: missing field {e.args[0]!r}") from e
        except (RopeConfigError, TypeError, ValueError) as e:
            raise CheckpointError(f"{source}: {e}") from e
        if num_heads % num_kv_heads:
            raise CheckpointError(
                f"{source}: num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv_heads}"
            )
        _check_sliding_window(cfg, arch, max_position, source)
        attention_bias = bool(cfg.get("attention_bias", False))
        eos = cfg.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(t) for t in (eos if isinstance(eos, list) else [eos]))
        dtype_name = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
        if dtype_name not in _DTYPES:
            raise CheckpointError(f"{source}: unsupported dtype {dtype_name!r}")
        return ModelConfig(
            architecture=arch,
            hidden_size=hidden,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            max_position=max_position,
            rope=rope,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=arch == "Qwen2ForCausalLM" or (attention_bias and arch != "MistralForCausalLM"),
            o_bias=attention_bias and arch in ("LlamaForCausalLM", "Qwen3ForCausalLM"),
            mlp_bias=bool(cfg.get("mlp_bias", False)) and arch == "LlamaForCausalLM",
            qk_norm=arch == "Qwen3ForCausalLM",
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            dtype=_DTYPES[dtype_name],
            **parsed,
        )


def _architecture(cfg: dict[str, Any], source: str) -> str:
    archs = cfg.get("architectures") or []
    if not archs and cfg.get("model_type") in _MODEL_TYPES:
        archs = [_MODEL_TYPES[cfg["model_type"]]]
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            return arch
    found = ", ".join(archs) or f"model_type {cfg.get('model_type')!r}"
    raise CheckpointError(
        f"{source}: unsupported architecture ({found}); supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def _check_sliding_window(cfg: dict[str, Any], arch: str, max_position: int, source: str) -> None:
    """Reject configs whose attention is windowed within the context.

    A window makes a token's KV depend on where the window cuts its context, and the block semantics of
    docs/design.md (a segment attends to all of itself, the final segment to everything) would no longer match
    the model. A window at least as long as the context is plain full attention.
    """
    window = cfg.get("sliding_window")
    # Qwen2/Qwen3 write a window into config.json but only use it when use_sliding_window is set.
    if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and not cfg.get("use_sliding_window", False):
        window = None
    layer_types = cfg.get("layer_types") or []
    if layer_types and "sliding_attention" not in layer_types and arch != "MistralForCausalLM":
        window = None
    if window is not None and int(window) < max_position:
        raise CheckpointError(
            f"{source}: sliding-window attention (sliding_window={window} < max_position_embeddings="
            f"{max_position}) is not supported: cached segments assume full attention. Set sliding_window "
            f"to null (or >= max_position_embeddings) in config.json to run it with full attention"
        )
