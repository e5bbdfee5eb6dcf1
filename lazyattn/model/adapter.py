"""LoRA adapters (PEFT's on-disk format) folded into a model's weights at load time.

A directory holding `adapter_config.json` is an adapter, not a model: its `base_model_name_or_path` names the
model it was trained on (anything `load_model` takes: "smollm2", "tiny", a directory, a .gguf file). Loading it
loads that base and adds `scaling * B @ A` to every adapted weight, so the engine serves one ordinary set of
weights and needs neither peft nor a second matmul per layer. `lazyattn finetune` writes such directories;
transformers + peft load the same directory (`PeftModel.from_pretrained`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from lazyattn.errors import CheckpointError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / CONFIG_FILE).is_file()


@dataclass(frozen=True)
class LoraAdapter:
    path: Path
    base: str  # the base model, as load_model takes it
    scaling: float
    # Hugging Face weight name ("model.layers.0.self_attn.q_proj.weight") -> (A [r, in], B [out, r])
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]]

    @property
    def weights_id(self) -> str:
        """Part of the model's identity (cache keys): which adapter file, as written."""
        stat = (self.path / WEIGHTS_FILE).stat()
        return f"lora:{self.path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"

    def delta(self, name: str) -> torch.Tensor | None:
        """The fp32 update of weight `name`, or None if the adapter leaves it alone."""
        pair = self.factors.get(name)
        if pair is None:
            return None
        a, b = pair
        return self.scaling * (b.float() @ a.float())


def read_adapter(path: str | Path) -> LoraAdapter:
    path = Path(path)
    try:
        cfg = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path / CONFIG_FILE}: cannot be read as JSON ({e})") from e
    if cfg.get("peft_type", "LORA") != "LORA":
        raise CheckpointError(f"{path}: only LoRA adapters are supported, this one is {cfg.get('peft_type')}")
    # Options that change the update's form: refused by name rather than merged wrongly.
    for key in ("rank_pattern", "alpha_pattern", "modules_to_save", "use_dora", "fan_in_fan_out"):
        if cfg.get(key):
            raise CheckpointError(f"{path}: adapter option {key}={cfg[key]!r} is not supported")
    if cfg.get("bias", "none") != "none":
        raise CheckpointError(f"{path}: adapters that train biases (bias={cfg['bias']!r}) are not supported")
    base = cfg.get("base_model_name_or_path")
    if not base:
        raise CheckpointError(f"{path / CONFIG_FILE}: no base_model_name_or_path (which model was it trained on?)")
    r, alpha = int(cfg["r"]), float(cfg["lora_alpha"])
    scaling = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    try:
        tensors = load_file(str(path / WEIGHTS_FILE))
    except (OSError, SafetensorError) as e:
        raise CheckpointError(f"{path / WEIGHTS_FILE}: cannot be read ({e})") from e
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for key, a in tensors.items():
        if ".lora_A." not in key:
            continue
        b = tensors.get(key.replace(".lora_A.", ".lora_B."))
        if b is None:
            raise CheckpointError(f"{path / WEIGHTS_FILE}: {key} has no lora_B partner")
        module = key.removeprefix(_PEFT_PREFIX).split(".lora_A.")[0]
        factors[f"{module}.weight"] = (a, b)
    if not factors:
        raise CheckpointError(f"{path / WEIGHTS_FILE}: holds no LoRA factors")
    return LoraAdapter(path, str(base), scaling, factors)


@torch.no_grad()
def apply_adapter(lm: torch.nn.Module, adapter: LoraAdapter) -> None:
    """Add the adapter's updates to a loaded CausalLM (fused projections included), in fp32, then round once."""
    wanted = lm.hf_weight_map()
    params = dict(lm.named_parameters())
    for name in adapter.factors:
        if name not in wanted:
            raise CheckpointError(
                f"adapter {adapter.path} adapts {name!r}, which the base model {adapter.base!r} does not have"
            )
        pname, lo, hi = wanted[name]
        dst = params[pname].data.narrow(0, lo, hi - lo)
        delta = adapter.delta(name).to(dst.device)
        if tuple(delta.shape) != tuple(dst.shape):
            raise CheckpointError(
                f"adapter {adapter.path}: {name!r} update has shape {tuple(delta.shape)}, "
                f"the base weight {tuple(dst.shape)}"
            )
        dst.copy_((dst.float() + delta).to(dst.dtype))
