"""GGUF checkpoints (llama.cpp's one-file format): config and weights, read with the `gguf` package.

Weights are dequantised once at load (by `gguf.quants`, never by hand-written block code) and then run like
any other checkpoint, in the runtime dtype. The tokenizer is built from the same file in gguf_tokenizer.py.

Three conventions of llama.cpp's converter are undone here, so the loaded model is exactly the Hugging Face
one it came from:
- names: `blk.N.attn_q.weight` -> `model.layers.N.self_attn.q_proj.weight`, and so on;
- the `llama` architecture stores q and k rows permuted so that each RoPE pair is two adjacent channels
  (GPT-J pairing); they are permuted back to the half-split pairing our layers and Hugging Face use;
- Llama-3-style RoPE scaling travels as a `rope_freqs` tensor of per-frequency divisors instead of config
  fields; the scaling parameters are recovered from it and checked to reproduce it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lazyattn.errors import CheckpointError
from lazyattn.model.config import ModelConfig

# GGUF `general.architecture` -> the Hugging Face architecture it was converted from.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# Tensor types dequantised at load; every one is checked against transformers' own GGUF loader in tests.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")

_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
ROPE_FREQS = "rope_freqs.weight"


def is_gguf(model: str | Path) -> bool:
    return str(model).lower().endswith(".gguf")


def open_gguf(path: str | Path) -> GGUFFile:
    """The parsed file, shared by the config, weights and tokenizer readers of one process.

    Parsing is slow for big vocabularies (the `gguf` reader walks every token string: seconds for 49k tokens),
    so it is done once per file version (path, size, modification time).
    """
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"GGUF file {str(p)!r} does not exist")
    st = p.stat()
    return _open_cached(str(p.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _open_cached(path: str, size: int, mtime_ns: int) -> GGUFFile:
    return GGUFFile(path)


class GGUFFile:
    """An open GGUF file: metadata values by key, tensors by name (memory-mapped, read on demand)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        import gguf

        try:
            self.reader = gguf.GGUFReader(self.path)
        except (ValueError, OSError, IndexError) as e:  # bad magic, truncated file
            raise CheckpointError(f"{self.path} is not a readable GGUF file: {e}") from e
        self.tensors = {t.name: t for t in self.reader.tensors}
        arch = self.get("general.architecture")
        if arch not in ARCHITECTURES:
            raise CheckpointError(
                f"{self.path.name}: GGUF architecture {arch!r} is not supported; supported: {', '.join(ARCHITECTURES)}"
            )
        self.arch: str = arch

    def get(self, key: str, default: Any = None) -> Any:
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def arch_get(self, key: str, default: Any = None) -> Any:
        """A `{architecture}.key` value, e.g. arch_get("block_count")."""
        return self.get(f"{self.arch}.{key}", default)

    def has_tensor(self, suffix: str) -> bool:
        return any(name.endswith(suffix) for name in self.tensors)

    def array(self, name: str) -> np.ndarray:
        """One tensor dequantised to fp32, in PyTorch's [rows, columns] order."""
        from gguf import GGMLQuantizationType, quants

        t = self.tensors[name]
        if t.tensor_type.name not in SUPPORTED_TYPES:
            raise CheckpointError(
                f"{self.path.name}: tensor {name!r} is stored as {t.tensor_type.name}, which "
                f"lazyattn does not dequantise; supported: {', '.join(SUPPORTED_TYPES)}"
            )
        values = quants.dequantize(t.data, GGMLQuantizationType(t.tensor_type))
        # Unquantised tensors come back as views of the read-only file mapping: copy those.
        values = np.array(values, dtype=np.float32, copy=not values.flags.writeable)
        # GGUF lists dimensions innermost first.
        return values.reshape([int(d) for d in reversed(t.shape.tolist())])


def read_config(path: str | Path) -> ModelConfig:
    """The ModelConfig a GGUF file's metadata describes (through the same parser as config.json)."""
    f = open_gguf(path)
    return ModelConfig.from_dict(hf_config(f), source=f.path.name)


def hf_config(f: GGUFFile) -> dict[str, Any]:
    """The metadata as a Hugging Face config.json dict."""
    unsupported = sorted({t.tensor_type.name for t in f.tensors.values()} - set(SUPPORTED_TYPES))
    if unsupported:
        raise CheckpointError(
            f"{f.path.name}: quantisation type(s) {', '.join(unsupported)} are not supported; "
            f"supported: {', '.join(SUPPORTED_TYPES)}"
        )
    if f.arch_get("expert_count"):
        raise CheckpointError(
            f"{f.path.name}: mixture-of-experts models (expert_count={f.arch_get('expert_count')}) are not supported"
        )
    if "token_embd.weight" not in f.tensors:
        raise CheckpointError(f"{f.path.name}: no token_embd.weight tensor")
    try:
        num_heads = int(f.arch_get("attention.head_count"))
        hidden = int(f.arch_get("embedding_length"))
        head_dim = int(f.arch_get("attention.key_length") or hidden // num_heads)
        cfg: dict[str, Any] = {
            "architectures": [ARCHITECTURES[f.arch]],
            "vocab_size": int(f.tensors["token_embd.weight"].shape[1]),
            "hidden_size": hidden,
            "intermediate_size": int(f.arch_get("feed_forward_length")),
            "num_hidden_layers": int(f.arch_get("block_count")),
            "num_attention_heads": num_heads,
            "num_key_value_heads": int(f.arch_get("attention.head_count_kv") or num_heads),
            "head_dim": head_dim,
            "max_position_embeddings": int(f.arch_get("context_length", 4096)),
            "rms_norm_eps": float(f.arch_get("attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": float(f.arch_get("rope.freq_base", 10000.0)),
        }
    except TypeError as e:  # a required key is absent (int(None))
        raise CheckpointError(f"{f.path.name}: incomplete {f.arch} metadata ({e})") from e
    rope_dims = f.arch_get("rope.dimension_count")
    if rope_dims is not None and int(rope_dims) != head_dim:
        cfg["partial_rotary_factor"] = int(rope_dims) / head_dim  # refused by the RoPE parser, by name
    if (value_length := f.arch_get("attention.value_length")) is not None and int(value_length) != head_dim:
        raise CheckpointError(f"{f.path.name}: value head size {value_length} != key head size {head_dim}")
    cfg["rope_scaling"] = _rope_scaling(f, cfg["rope_theta"], head_dim)
    cfg["tie_word_embeddings"] = "output.weight" not in f.tensors
    cfg["attention_bias"] = f.has_tensor(".attn_q.bias")
    cfg["mlp_bias"] = f.has_tensor(".ffn_up.bias")
    cfg["bos_token_id"] = f.get("tokenizer.ggml.bos_token_id")
    cfg["eos_token_id"] = eos_token_ids(f)
    cfg["dtype"] = "float32"  # what dequantisation produces; the engine picks the runtime dtype
    return cfg


def eos_token_ids(f: GGUFFile) -> list[int]:
    """Every id that ends a turn: EOS, and llama.cpp's end-of-turn / end-of-message ids where given."""
    ids: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        value = f.get(f"tokenizer.ggml.{key}")
        if value is not None and int(value) not in ids:
            ids.append(int(value))
    return ids


def read_weights(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, fp32 tensor) for every weight, dequantised one tensor at a time."""
    from tqdm import tqdm

    f = open_gguf(path)
    heads = int(f.arch_get("attention.head_count"))
    kv_heads = int(f.arch_get("attention.head_count_kv") or heads)
    names = [n for n in f.tensors if n != ROPE_FREQS]  # rope_freqs became config (see _rope_scaling)
    for name in tqdm(names, desc="dequantising GGUF", unit="tensor", disable=None):
        hf_name = hf_tensor_name(name, f.path.name)
        tensor = torch.from_numpy(f.array(name))
        if f.arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            tensor = unpermute_rope_rows(tensor, heads if ".attn_q." in name else kv_heads)
        yield hf_name, tensor


def hf_tensor_name(name: str, source: str = "GGUF") -> str:
    stem, _, kind = name.rpartition(".")  # kind: weight or bias
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{kind}"
    raise CheckpointError(f"{source}: unexpected tensor {name!r} (not part of a supported architecture)")


def unpermute_rope_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (per head, rows [x0 y0 x1 y1 ...] back to [x0 x1 ... y0 y1 ...]).

    Works on weights [rows, in] and biases [rows] alike: only rows move.
    """
    rows = w.shape[0]
    head_dim = rows // num_heads
    return w.reshape(num_heads, head_dim // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _rope_scaling(f: GGUFFile, base: float, head_dim: int) -> dict[str, Any] | None:
    kind = f.arch_get("rope.scaling.type")
    if ROPE_FREQS in f.tensors:
        if kind not in (None, "none"):
            raise CheckpointError(f"{f.path.name}: both rope_freqs and rope.scaling.type {kind!r}")
        return llama3_scaling(f.array(ROPE_FREQS).reshape(-1), base, head_dim, f.path.name)
    if kind in (None, "none"):
        return None
    factor = f.arch_get("rope.scaling.factor")
    orig = f.arch_get("rope.scaling.original_context_length")
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        scaling: dict[str, Any] = {"rope_type": "yarn", "factor": float(factor)}
        if orig is not None:
            scaling["original_max_position_embeddings"] = int(orig)
        for gguf_key, hf_key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if (value := f.arch_get(f"rope.scaling.{gguf_key}")) is not None:
                scaling[hf_key] = float(value)
        return scaling
    raise CheckpointError(
        f"{f.path.name}: RoPE scaling type {kind!r} is not supported (linear, yarn, or Llama-3 rope_freqs)"
    )


def llama3_scaling(divisors: np.ndarray, base: float, head_dim: int, source: str) -> dict[str, Any] | None:
    """Llama-3 RoPE scaling parameters that reproduce llama.cpp's per-frequency divisors.

    llama.cpp rotates pair j by p * base^(-2j/D) / divisors[j]. Llama-3 scaling divides by `factor` where the
    wavelength exceeds L / low, by nothing below L / high (L the original context), and in between by
    1 / ((1 - s) / factor + s) with s = (L / wavelength - low) / (high - low). Only the slope and intercept of
    s in 1 / wavelength matter, so low = 1 loses nothing: two divisors strictly between 1 and `factor` fix
    the rest. With fewer (small head_dim), Llama 3's own high = 4 is assumed and L placed to fit. Whatever
    the route, the result is checked to reproduce every divisor.
    """
    from lazyattn.kernels.rope import RopeConfig, inv_freq

    divisors = divisors.astype(np.float64)
    if len(divisors) != head_dim // 2:
        raise CheckpointError(
            f"{source}: rope_freqs has {len(divisors)} entries, expected head_dim / 2 = {head_dim // 2}"
        )
    if np.allclose(divisors, 1.0):
        return None
    factor = float(divisors.max())
    freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / freq
    mid = (divisors > 1 + 1e-6) & (divisors < factor * (1 - 1e-6))
    s = (1 / divisors[mid] - 1 / factor) / (1 - 1 / factor)
    if mid.sum() >= 2:
        slope, intercept = np.polyfit(1 / wavelen[mid], s, 1)  # s = slope / wavelength + intercept
        high = 1.0 - 1.0 / intercept
        orig = slope * (high - 1.0)
    elif mid.sum() == 1:
        high = 4.0
        orig = float(wavelen[mid][0] * (1 + s[0] * (high - 1)))
    else:  # a step: any L with every unscaled wavelength below L / 4 and every scaled one above L
        high = 4.0
        below = wavelen[divisors < 1 + 1e-6].max(initial=0.0) * high
        above = wavelen[divisors >= factor * (1 - 1e-6)].min()
        orig = (below + above) / 2
    scaling = {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": float(high),
        "original_max_position_embeddings": int(round(orig)),
    }
    try:
        rope = RopeConfig(
            head_dim=head_dim,
            base=base,
            rope_type="llama3",
            factor=factor,
            low_freq_factor=1.0,
            high_freq_factor=float(high),
            original_max_position=int(round(orig)),
        )
        ok = torch.allclose(inv_freq(rope), torch.from_numpy(freq / divisors).float(), rtol=1e-4, atol=0)
    except (ValueError, ZeroDivisionError):
        ok = False
    if not ok:
        raise CheckpointError(f"{source}: rope_freqs does not describe Llama-3 RoPE scaling; not supported")
    return scaling
