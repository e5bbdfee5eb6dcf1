"""load_model: a CausalLM from a Hugging Face checkpoint directory, a GGUF file, a named model ("smollm2"), a LoRA
adapter directory (model/adapter.py), or random weights ("tiny", benchmarks)."""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from lazyattn.errors import CheckpointError
from lazyattn.model import adapter as lora
from lazyattn.model import gguf, sharding
from lazyattn.model.config import ModelConfig
from lazyattn.model.hub import model_not_found, resolve_model
from lazyattn.model.llama import CausalLM
from lazyattn.parallel.group import TensorParallelGroup

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
BIAS_STD = 0.02
# Random weights are drawn on the CPU (same values on every device) unless the model is big enough that
# CPU sampling would dominate start-up (an 8B model takes minutes on a few cores); then on the device.
_CPU_INIT_MAX_PARAMS = 256 * 2**20


def load_model(
    model: str | Path,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    seed: int = 0,
    random_init: bool = False,
    tensor_parallel: TensorParallelGroup | None = None,
    decode_fusion: bool = True,
) -> tuple[CausalLM, ModelConfig]:
    """The model and its config. `model`: "tiny", a checkpoint directory, a .gguf file or a named model
    (hub.NAMED_MODELS, fetched on first use); dtype None keeps the checkpoint's.

    With random_init (implied by "tiny"), only config.json is read and weights are drawn from `seed`.
    The returned config carries the runtime dtype and the weights' identity (see ModelConfig.fingerprint).
    With `tensor_parallel`, the model is this rank's shard (model/sharding.py: only its part of each tensor is
    read or kept) and the returned config is still the whole model's. `decode_fusion` (LAZYATTN_DECODE_FUSION, the
    engine's config.env): on CUDA without tensor parallelism, fold the norms so that the fused decode path runs.
    """
    device = torch.device(device)
    model, adapter, is_gguf, cfg = _resolve(model)
    random_init = random_init or model == "tiny"
    tp = tensor_parallel
    if tp is not None and adapter is not None:
        raise CheckpointError(
            "LoRA adapters are not supported with tensor parallelism: merge the adapter into "
            "the weights first (lazyattn finetune --merge)"
        )
    dtype = dtype or cfg.dtype
    files: list[Path] = []
    if random_init:
        init_device = torch.device("cpu") if _num_params(cfg) <= _CPU_INIT_MAX_PARAMS else device
        weights_id = f"random:{seed}" + ("" if init_device.type == "cpu" else f":{init_device.type}")
    else:
        files = [Path(model)] if is_gguf else weight_files(Path(model))
        weights_id = (
            str(Path(model).resolve())
            + "|"
            + ";".join(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
        )
    if adapter is not None:
        weights_id += "|" + adapter.weights_id
    cfg = dataclasses.replace(cfg, dtype=dtype, weights_id=weights_id)

    # Build on the meta device, then allocate uninitialised storage in the target dtype: no throw-away
    # default init, and no fp32 copy of a bf16 model.
    with torch.device("meta"):
        lm = CausalLM(cfg) if tp is None else CausalLM(sharding.shard_config(cfg, tp.size), tp, cfg.vocab_size)
    lm = lm.to(dtype=dtype).to_empty(device=device)
    if random_init:
        random_weights(lm, seed, init_device, full_config=cfg)
    elif tp is None:
        lm.load_weights(gguf.read_weights(model) if is_gguf else _read_tensors(files, device))
    else:
        lm.load_weights(
            sharding.shard_weights(gguf.read_weights(model), cfg, tp)
            if is_gguf
            else sharding.read_shards(files, device, cfg, tp)
        )
    if tp is not None:
        sharding.add_biases_once(lm, tp)
    if adapter is not None:
        lora.apply_adapter(lm, adapter)
    if device.type == "cuda" and tp is None and decode_fusion:
        lm.fold_norms()  # the fused decode path needs them folded (docs/design.md, "Decode fusion")
    lm.eval().requires_grad_(False)
    return lm, cfg


def model_config(model: str | Path) -> ModelConfig:
    """The config of `model` (as load_model reads it), without its weights."""
    return _resolve(model)[3]


def _resolve(model: str | Path) -> tuple[str, lora.LoraAdapter | None, bool, ModelConfig]:
    """(the model's path or name, its adapter, whether it is a GGUF file, its config)."""
    model = resolve_model(str(model))
    # An adapter directory: its base model's weights, with the adapter folded in by load_model.
    adapter = lora.read_adapter(model) if lora.is_adapter_dir(model) else None
    if adapter is not None:
        model = resolve_model(adapter.base)
    if model != "tiny" and not Path(model).exists():
        raise model_not_found(model)
    is_gguf = gguf.is_gguf(model)
    if model == "tiny":
        cfg = ModelConfig.tiny()
    elif is_gguf:
        cfg = gguf.read_config(model)
    else:
        cfg = ModelConfig.from_dir(model)
    return model, adapter, is_gguf, cfg


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint: every shard its index lists, or the single model.safetensors."""
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"cannot read the weight map of {index}: {e!r}") from e
        shards = [path / name for name in sorted(set(weight_map.values()))]
        missing = [s.name for s in shards if not s.is_file()]
        if missing:
            raise CheckpointError(f"{index} lists shard(s) that are missing: {', '.join(missing)}")
        return shards
    if (path / SINGLE_FILE).is_file():
        return [path / SINGLE_FILE]
    others = sorted(path.glob("*.safetensors"))
    if others:
        return others
    legacy = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
    hint = (
        f" (found {', '.join(legacy)}: only safetensors weights are supported; pass a .gguf file itself as the model)"
        if legacy
        else ""
    )
    raise CheckpointError(f"no weight files in {str(path)!r}: expected {SINGLE_FILE} or {INDEX_FILE}{hint}")


def _read_tensors(files: list[Path], device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of every file, one tensor in memory at a time."""
    # Read straight onto a GPU when loading there; the copy into the parameter casts to its dtype.
    where = "cpu"
    if device.type == "cuda":
        where = f"cuda:{torch.cuda.current_device() if device.index is None else device.index}"
    try:
        total = 0
        for f in files:
            with safe_open(str(f), framework="pt", device="cpu") as h:
                total += len(h.keys())
        with tqdm(total=total, desc="loading weights", unit="tensor", disable=None) as bar:
            for f in files:
                bar.set_postfix_str(f.name)
                with safe_open(str(f), framework="pt", device=where) as h:
                    for name in h.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                        yield name, h.get_tensor(name)
                        bar.update()
    except (OSError, RuntimeError, ValueError, SafetensorError) as e:
        raise CheckpointError(f"cannot read weights from {files[0].parent}: {e}") from e


@torch.no_grad()
def random_weights(
    lm: CausalLM, seed: int, init_device: torch.device | str = "cpu", full_config: ModelConfig | None = None
) -> None:
    """Deterministic random weights, scaled so activations stay O(1) at any size.

    Matrices are N(0, 1/fan_in): each projection of a normalised input has unit-scale outputs, so logits
    have a spread of about 1 and greedy decoding does not collapse onto one token (a flat N(0, 0.02)
    does, at tiny sizes). Embeddings are N(0, 1) so the current token stays visible in the residual
    stream (N(0, 1/hidden) when tied, as they then also are the output projection); norm weights 1.
    Each tensor draws from its own generator seeded by (seed, its name), so a tensor's values do not
    depend on the rest of the config (a deeper model shares its first layers with a shallower one).
    A tensor-parallel shard (lm.tp set; `full_config` the whole model's) draws each whole tensor, one at a time,
    and keeps its part: every rank's weights are exactly the one-rank model's, cut.
    """
    init_device = torch.device(init_device)
    full = lm
    if lm.tp is not None:
        with torch.device("meta"):
            full = CausalLM(full_config or lm.config)
    full_params = dict(full.named_parameters())
    for name, param in lm.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
            continue
        shape = full_params[name].shape
        # 32-bit seeds: the CPU generator (mt19937) keeps only the low 32 bits anyway.
        gen = torch.Generator(device=init_device).manual_seed(zlib.crc32(f"{seed}/{name}".encode()))
        values = torch.empty(shape, dtype=torch.float32, device=init_device)
        values.normal_(0.0, _init_std(full, name, shape), generator=gen)
        param.copy_(values if lm.tp is None else sharding.our_part(name, values, full.config, lm.tp))


def _init_std(lm: CausalLM, name: str, shape: torch.Size) -> float:
    if name.endswith(".bias"):
        return BIAS_STD
    if name == "embed_tokens.weight":
        return lm.config.hidden_size**-0.5 if lm.lm_head is None else 1.0
    return shape[1] ** -0.5


def _num_params(cfg: ModelConfig) -> int:
    attn = cfg.hidden_size * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * cfg.hidden_size
    mlp = 3 * cfg.hidden_size * cfg.intermediate_size
    embed = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    return cfg.num_layers * (attn + mlp) + embed
