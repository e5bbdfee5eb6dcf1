"""Building blocks of the decoder. Inputs are packed tokens [T, hidden] (no batch dim): the engine packs
every entry of a step into one run of rows, and the attention backend sorts out which row sees what.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from lazyattn.kernels import fused, gemv, invariant
from lazyattn.kernels.backend import AttentionBackend, ForwardBatch
from lazyattn.model.config import ModelConfig

if TYPE_CHECKING:
    from lazyattn.parallel.group import TensorParallelGroup


@dataclass(frozen=True)
class DecodePlan:
    """The skinny-product configs of one decoder layer's four linears, for the fused decode path (docs/design.md,
    "Decode fusion"): every one of them must run kernels/gemv.py for its epilogues to carry the norms and adds."""

    qkv: gemv.GemvConfig
    o: gemv.GemvConfig
    gate_up: gemv.GemvConfig
    down: gemv.GemvConfig


def _fusable(x: torch.Tensor) -> bool:
    """The fused Triton kernels (kernels/fused.py) take CUDA rows with a unit last stride; anything else (the CPU,
    Qwen3's per-head q/k norm) runs their PyTorch definitions, which they match."""
    return x.is_cuda and x.dim() == 2 and x.stride(1) == 1


class Linear(nn.Linear):
    """nn.Linear whose product takes the skinny decode kernel where it was measured faster (kernels/gemv.py), or,
    in the deterministic mode, the batch-invariant one (kernels/invariant.py)."""

    deterministic = False  # set per model by CausalLM.set_deterministic

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.deterministic:
            return invariant.linear(x, self.weight, self.bias)
        return gemv.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """Per row. On CUDA the fused kernels are row-local already (one program a row, a fixed reduction order); the
    deterministic mode runs the CPU's PyTorch definition row by row (invariant.rowwise)."""

    deterministic = False  # set per model by CausalLM.set_deterministic

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in fp32, scale in the model dtype: what the Hugging Face models do, so bf16 runs
        # round the same way.
        if _fusable(x):
            return fused.rms_norm(x, self.weight, self.eps)
        if self.deterministic:
            return invariant.rowwise(lambda row: fused.rms_norm_reference(row, self.weight, self.eps), x)
        return fused.rms_norm_reference(x, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): the residual add fused into the norm."""
        if _fusable(x) and _fusable(residual) and x.shape == residual.shape:
            return fused.add_rms_norm(x, residual, self.weight, self.eps)
        if self.deterministic:
            total = x + residual  # elementwise: exact whatever the batch
            return self.forward(total), total
        return fused.add_rms_norm_reference(x, residual, self.weight, self.eps)


class MLP(nn.Module):
    """Gated SiLU MLP; gate and up projections fused into one matmul ([gate; up] rows).

    Under tensor parallelism `cfg` is the rank's shard: gate/up hold its rows, down its columns, and the partial
    outputs are summed over the ranks (docs/design.md, "Tensor parallelism")."""

    def __init__(self, cfg: ModelConfig, tp: TensorParallelGroup | None = None) -> None:
        super().__init__()
        self.tp = tp
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        # gate_up's rows: [gate; up] as loaded, or interleaved [g0; u0; g1; u1; ...] once CausalLM.fold_norms has
        # run, so that the fused decode path's gate_up product can apply SiLU·mul in its epilogue.
        self.interleaved = False

    deterministic = False  # set per model by CausalLM.set_deterministic

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if _fusable(gate_up):
            act = fused.silu_mul(gate_up, self.interleaved)
        elif self.deterministic:  # the CPU's SiLU takes another exp where a row ends a vector: one call per row
            act = invariant.rowwise(lambda row: fused.silu_mul_reference(row, self.interleaved), gate_up)
        else:
            act = fused.silu_mul_reference(gate_up, self.interleaved)
        out = self.down_proj(act)
        return out if self.tp is None else self.tp.all_reduce(out)


class Attention(nn.Module):
    """q, k, v from one fused projection ([q; k; v] rows); RoPE, KV cache, attention are the backend's. Under tensor
    parallelism `cfg` is the rank's shard (its q and kv heads) and o_proj's partial outputs are summed."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TensorParallelGroup | None = None) -> None:
        super().__init__()
        self.tp = tp
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.qkv_proj = Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.qkv_bias)
        self.o_proj = Linear(cfg.q_size, cfg.hidden_size, bias=cfg.o_bias)
        # Qwen3 normalises each head of q and k before RoPE (the backend rotates afterwards).
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, fb: ForwardBatch, backend: AttentionBackend) -> torch.Tensor:
        out = self.o_proj(self.attend(self.qkv_proj(x), fb, backend))
        return out if self.tp is None else self.tp.all_reduce(out)

    def attend(self, qkv: torch.Tensor, fb: ForwardBatch, backend: AttentionBackend) -> torch.Tensor:
        """The projected rows [T, q + 2 kv] -> attention output [T, q_size], before o_proj."""
        t = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return backend.attend(self.layer_idx, q, k, v, fb).reshape(t, self.q_size)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TensorParallelGroup | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, tp)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        fb: ForwardBatch,
        backend: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-norm block. The residual stream travels separately so each add fuses into the next norm:
        returns (mlp output, residual stream) with the mlp output not yet added."""
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm.add_forward(x, residual)
        x = self.self_attn(x, fb, backend)
        x, residual = self.post_attention_layernorm.add_forward(x, residual)
        return self.mlp(x), residual

    def decode_forward(
        self, stream: torch.Tensor, squares: torch.Tensor, fb: ForwardBatch, backend: AttentionBackend, plan: DecodePlan
    ) -> torch.Tensor:
        """The fused decode path (docs/design.md, "Decode fusion"): `stream` is the residual stream [T, hidden],
        updated in place; `squares` its rows' sums of squares by parts. The norms' scales are folded into qkv and
        gate_up (CausalLM.fold_norms): each norm is the 1/rms the next product applies to its sums, and each residual
        add is the epilogue of o_proj and down, which leave the squares for the next norm. Returns the new squares.
        SiLU·mul is gate_up's epilogue. Four products, RoPE + KV write and attention: six launches a layer instead
        of nine."""
        attn, mlp = self.self_attn, self.mlp
        eps = self.input_layernorm.eps
        qkv = gemv.gemv_normed(stream, squares, eps, attn.qkv_proj.weight, attn.qkv_proj.bias, plan.qkv)
        out = attn.attend(qkv, fb, backend)
        squares = gemv.gemv_into_residual(out, attn.o_proj.weight, stream, attn.o_proj.bias, plan.o)
        act = gemv.gemv_normed(
            stream,
            squares,
            self.post_attention_layernorm.eps,
            mlp.gate_up_proj.weight,
            mlp.gate_up_proj.bias,
            plan.gate_up,
            gated=True,
        )
        return gemv.gemv_into_residual(act, mlp.down_proj.weight, stream, mlp.down_proj.bias, plan.down)
