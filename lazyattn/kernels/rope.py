"""Rotary position embedding: inverse frequencies, fp32 cos/sin tables, and the PyTorch rotation.

Every RoPE variant supported here is a rotation R_p whose angle for frequency pair j is p * inv_freq[j]
(plain, linear-scaled, Llama-3.1-scaled, static NTK, YaRN). That is what makes deferred positional
encoding exact: R_a R_b = R_{a+b}, so a key cached at local position j can be moved to logical position
delta + j by one more rotation of delta (the derivation: kernels/prefill.py, "Deferred RoPE").

Two pairings of head-dim channels into rotation pairs exist:
- half-split (Llama/NeoX, what Hugging Face checkpoints use): pair j = (x[j], x[j + D/2]);
- interleaved (GPT-J): pair j = (x[2j], x[2j + 1]).

Angles are kept in fp32 end to end: a bf16 cos/sin table costs ~2e-3 relative error in the scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

ROPE_TYPES = ("default", "linear", "llama3", "ntk", "yarn")


class RopeConfigError(ValueError):
    """A RoPE configuration lazyattn cannot honour (unknown type, missing field, length-dependent scaling)."""


@dataclass(frozen=True)
class RopeConfig:
    head_dim: int
    base: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    # llama3
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int | None = None
    # yarn
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True
    interleaved: bool = False

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise RopeConfigError(f"unsupported rope_type {self.rope_type!r}; supported: {', '.join(ROPE_TYPES)}")
        if self.head_dim % 2:
            raise RopeConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_type != "default" and self.factor <= 0:
            raise RopeConfigError(f"rope scaling factor must be positive, got {self.factor}")

    @staticmethod
    def from_hf(config: dict, head_dim: int) -> RopeConfig:
        """Read RoPE settings from a Hugging Face config.json dict.

        Handles both layouts: transformers < 5 (`rope_theta` + `rope_scaling`) and transformers >= 5
        (`rope_parameters` holding `rope_theta` and the scaling fields).
        """
        params = dict(config.get("rope_parameters") or {})
        scaling = dict(config.get("rope_scaling") or {})
        params = {**scaling, **params}
        base = params.get("rope_theta", config.get("rope_theta", 10000.0))
        rope_type = params.get("rope_type", params.get("type", "default")) or "default"
        if rope_type == "dynamic":
            raise RopeConfigError(
                "dynamic NTK scaling changes every rotation with the sequence length, so cached document KV "
                "cannot follow it; set rope_type 'ntk' (static NTK) in config.json to use a fixed scaled base"
            )
        if rope_type not in ROPE_TYPES:
            raise RopeConfigError(f"unsupported rope_type {rope_type!r}; supported: {', '.join(ROPE_TYPES)}")
        orig = params.get("original_max_position_embeddings")
        if rope_type == "yarn" and orig is None:
            orig = config.get("max_position_embeddings")
        partial = config.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0))
        if partial not in (None, 1, 1.0):
            raise RopeConfigError(f"partial rotary embeddings (partial_rotary_factor={partial}) are not supported")
        return RopeConfig(
            head_dim=head_dim,
            base=float(base),
            rope_type=rope_type,
            factor=float(params.get("factor", 1.0) or 1.0),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position=None if orig is None else int(orig),
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            mscale=params.get("mscale"),
            mscale_all_dim=params.get("mscale_all_dim"),
            attention_factor=params.get("attention_factor"),
            truncate=bool(params.get("truncate", True)),
        )


def inv_freq(cfg: RopeConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim/2] in fp32, computed as Hugging Face transformers does."""
    dim = cfg.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    if cfg.rope_type == "ntk":
        # Static NTK-aware scaling: stretch the base so the lowest frequency covers `factor` x the context.
        base = cfg.base * cfg.factor ** (dim / (dim - 2))
        return 1.0 / (base**exponents)
    freq = 1.0 / (cfg.base**exponents)
    if cfg.rope_type == "linear":
        return freq / cfg.factor
    if cfg.rope_type == "llama3":
        return _llama3_inv_freq(freq, cfg)
    if cfg.rope_type == "yarn":
        return _yarn_inv_freq(cfg)
    return freq


def _llama3_inv_freq(freq: torch.Tensor, cfg: RopeConfig) -> torch.Tensor:
    if cfg.original_max_position is None:
        raise RopeConfigError("llama3 rope scaling needs original_max_position_embeddings")
    old_len = cfg.original_max_position
    low_wavelen = old_len / cfg.low_freq_factor
    high_wavelen = old_len / cfg.high_freq_factor
    wavelen = 2 * math.pi / freq
    scaled = torch.where(wavelen > low_wavelen, freq / cfg.factor, freq)
    smooth = (old_len / wavelen - cfg.low_freq_factor) / (cfg.high_freq_factor - cfg.low_freq_factor)
    smoothed = (1 - smooth) * scaled / cfg.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_inv_freq(cfg: RopeConfig) -> torch.Tensor:
    dim, base = cfg.head_dim, cfg.base
    orig = cfg.original_max_position
    if orig is None:
        raise RopeConfigError("yarn rope scaling needs original_max_position_embeddings")

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(cfg.beta_fast), correction_dim(cfg.beta_slow)
    if cfg.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (cfg.factor * pos_freqs)
    extrapolation_weight = 1 - ramp
    return interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight


def magnitude_factor(cfg: RopeConfig) -> float:
    """YaRN's uniform factor on q and k (1.0 for every other type). It is not part of the rotation."""
    if cfg.rope_type != "yarn":
        return 1.0
    if cfg.attention_factor is not None:
        return float(cfg.attention_factor)

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if cfg.mscale and cfg.mscale_all_dim:
        return get_mscale(cfg.factor, cfg.mscale) / get_mscale(cfg.factor, cfg.mscale_all_dim)
    return get_mscale(cfg.factor)


@dataclass
class RopeTables:
    """fp32 cos/sin of p * inv_freq for p in [0, max_position): the pure rotation (no magnitude factor).

    The kernels gather rows of these tables at a page's delta to apply R_{-delta} to queries (or R_delta to
    keys); the model applies R_p * mscale to q and k once, at their own positions.
    """

    cos: torch.Tensor  # [max_position, head_dim/2] fp32
    sin: torch.Tensor  # [max_position, head_dim/2] fp32
    mscale: float = 1.0
    interleaved: bool = False
    config: RopeConfig | None = field(default=None, repr=False)

    @property
    def max_position(self) -> int:
        return self.cos.shape[0]

    @staticmethod
    def build(cfg: RopeConfig, max_position: int, device: torch.device | str = "cpu") -> RopeTables:
        # Angles in fp64 from the fp32 inverse frequencies: exact products, then one rounding to fp32.
        freq = inv_freq(cfg).to(torch.float64)
        pos = torch.arange(max_position, dtype=torch.float64)
        angles = torch.outer(pos, freq)
        return RopeTables(
            cos=angles.cos().to(torch.float32).to(device),
            sin=angles.sin().to(torch.float32).to(device),
            mscale=magnitude_factor(cfg),
            interleaved=cfg.interleaved,
            config=cfg,
        )

    def to(self, device: torch.device | str) -> RopeTables:
        return RopeTables(self.cos.to(device), self.sin.to(device), self.mscale, self.interleaved, self.config)


def split_pairs(x: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The two members of each rotation pair along the last dim."""
    if interleaved:
        return x[..., 0::2], x[..., 1::2]
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]


def merge_pairs(a: torch.Tensor, b: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if interleaved:
        return torch.stack((a, b), dim=-1).flatten(-2)
    return torch.cat((a, b), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Apply the rotation with angle tables cos/sin [..., D/2] broadcast over x [..., D], in fp32."""
    a, b = split_pairs(x.float(), interleaved)
    return merge_pairs(a * cos - b * sin, b * cos + a * sin, interleaved)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, tables: RopeTables) -> torch.Tensor:
    """x [T, heads, D] rotated at positions [T] (int) and scaled by the magnitude factor; same dtype as x."""
    if positions.numel() and int(positions.max()) >= tables.max_position:
        raise ValueError(f"position {int(positions.max())} is beyond the RoPE table ({tables.max_position})")
    cos = tables.cos[positions.long()][:, None, :]
    sin = tables.sin[positions.long()][:, None, :]
    out = rotate(x, cos, sin, tables.interleaved)
    if tables.mscale != 1.0:
        out = out * tables.mscale
    return out.to(x.dtype)
