"""CausalLM: one decoder for the Llama family, Mistral, Qwen2 and Qwen3 (they differ only by config flags)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from lazyattn.errors import CheckpointError
from lazyattn.kernels import gemv, invariant
from lazyattn.kernels.backend import AttentionBackend, ForwardBatch
from lazyattn.model.config import ModelConfig
from lazyattn.model.layers import DecodePlan, DecoderLayer, RMSNorm

if TYPE_CHECKING:
    from lazyattn.parallel.group import TensorParallelGroup

# Hugging Face keeps q/k/v and gate/up as separate matrices; we stack them by rows into one matmul each.
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
# Buffers some checkpoints carry that we recompute (RoPE lives in the attention backend).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CausalLM(nn.Module):
    def __init__(
        self, config: ModelConfig, tp: TensorParallelGroup | None = None, full_vocab_size: int | None = None
    ) -> None:
        """Under tensor parallelism, `config` is the rank's shard (model/sharding.py, shard_config): the embedding
        and the LM head hold rows [rank * vocab_size, (rank + 1) * vocab_size) of the `full_vocab_size` ones."""
        super().__init__()
        self.config = config
        self.tp = tp
        self.full_vocab_size = full_vocab_size or config.vocab_size
        self.vocab_start = 0 if tp is None else tp.rank * config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i, tp) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # Tied checkpoints reuse the embedding matrix as the output projection.
        self.lm_head = (
            None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        self.norms_folded = False
        self.deterministic = False
        self.v_scales: list[torch.Tensor] | None = None  # fold_v_scales' scales, where they were folded
        self.k_scales: list[torch.Tensor] | None = None  # fold_k_scales'

    def set_deterministic(self, on: bool) -> None:
        """Batch-invariant numerics (docs/design.md, "Deterministic mode"): every linear through
        kernels/invariant.py, the norms and SiLU row by row off CUDA, no fused decode path."""
        self.deterministic = on
        for module in self.modules():
            if hasattr(type(module), "deterministic") and module is not self:
                module.deterministic = on

    def forward(self, input_ids: torch.Tensor, fb: ForwardBatch, backend: AttentionBackend) -> torch.Tensor:
        """input_ids [T] (packed entries, as fb describes them) -> final hidden states [T, hidden]."""
        x = self.embed_tokens(input_ids) if self.tp is None else self._embed_shard(input_ids)
        plan = self.decode_plan(x)
        if plan is not None:
            squares = gemv.row_squares(x)
            for layer in self.layers:
                squares = layer.decode_forward(x, squares, fb, backend, plan)
            return self.norm(x)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            x, residual = layer(x, residual, fb, backend)
        assert residual is not None, "a model has at least one layer"
        return self.norm.add_forward(x, residual)[0]

    def decode_plan(self, x: torch.Tensor) -> DecodePlan | None:
        """The fused decode path's configs for these rows, or None where it does not apply: norms not folded, tensor
        parallelism, the deterministic mode, or a linear the skinny kernel does not take at this batch size
        (kernels/gemv.py, `pick`)."""
        if not self.norms_folded or self.tp is not None or self.deterministic:
            return None
        layer = self.layers[0]
        linears = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
        configs = [gemv.pick(x, linear.weight, fused=True) for linear in linears]
        return None if None in configs else DecodePlan(*configs)

    @torch.no_grad()
    def fold_norms(self) -> None:
        """Fold each decoder layer's two RMSNorm scales into the columns of the product that follows (qkv_proj,
        gate_up_proj) and set the scales to 1: RMSNorm(x)·Wᵀ = (x·rstd)·(W·diag(scale))ᵀ. The product is rounded
        once to the weights' dtype. gate_up's rows are interleaved too (gate_j next to up_j, MLP.interleaved), so
        the fused path's gate_up product can end in SiLU·mul. Every path then computes the same function, the fused
        decode path (`decode_plan`) and the plain one alike (docs/design.md, "Decode fusion")."""
        if self.norms_folded:
            return
        for layer in self.layers:
            for norm, linear in (
                (layer.input_layernorm, layer.self_attn.qkv_proj),
                (layer.post_attention_layernorm, layer.mlp.gate_up_proj),
            ):
                linear.weight.copy_(linear.weight.float() * norm.weight.float()[None, :])
                norm.weight.fill_(1.0)
            gate_up = layer.mlp.gate_up_proj
            for tensor in (gate_up.weight, gate_up.bias):
                if tensor is not None:  # [gate; up] rows -> [g0; u0; g1; u1; ...]
                    tensor.copy_(tensor.view(2, tensor.shape[0] // 2, -1).transpose(0, 1).reshape(tensor.shape))
            layer.mlp.interleaved = True
        self.norms_folded = True

    @torch.no_grad()
    def fold_v_scales(self) -> list[torch.Tensor]:
        """Scale each layer's V, per kv head, by a power of two folded into the weights: V's rows of qkv_proj (and
        its bias) divided by s, the o_proj columns of the query heads that read that kv head multiplied by s, so the
        model computes the same function and the cache holds V / s (docs/design.md, "FP8 KV cache": an FP8 cache
        then stores small values V in e4m3's normal range). s is the power of two nearest the RMS of V's rows of
        qkv_proj, each scaled by the input norm's weights (the RMS a unit-RMS normed input gives V), so that V / s has
        an RMS near 1, or the smallest one that keeps V / s within FP8_BOUND for any input (`_row_bound`) where that
        is larger. A head whose weights the scaling would not keep exactly (a subnormal or an overflow in the
        weights' dtype) keeps s = 1. Returns s per layer, float32 [kv_heads] (this rank's heads under tensor
        parallelism), before any page holds V. Once: a second call returns the first one's scales."""
        if self.v_scales is not None:
            return self.v_scales
        scales = []
        for layer in self.layers:
            attn = layer.self_attn
            qkv, out = attn.qkv_proj, attn.o_proj
            d, group = attn.head_dim, attn.num_heads // attn.num_kv_heads
            gamma = layer.input_layernorm.weight.double()
            s_layer = torch.ones(attn.num_kv_heads)
            for h in range(attn.num_kv_heads):
                rows = slice(attn.q_size + attn.kv_size + h * d, attn.q_size + attn.kv_size + (h + 1) * d)
                cols = slice(h * group * d, (h + 1) * group * d)
                weight = qkv.weight[rows].double() * gamma[None, :]
                rms = weight.square().sum(1).mean().sqrt().item()
                if not rms > 0:
                    continue
                s = max(2.0 ** round(math.log2(rms)), _bound_scale(_row_bound(weight, qkv.bias, rows)))
                parts = [(qkv.weight, rows, 1 / s), (out.weight[:, cols], slice(None), s)]
                parts += [] if qkv.bias is None else [(qkv.bias, rows, 1 / s)]
                if _scale_exactly(parts):
                    s_layer[h] = s
            scales.append(s_layer)
        self.v_scales = scales
        return scales

    @torch.no_grad()
    def fold_k_scales(self) -> list[torch.Tensor]:
        """Scale each layer's K down by a power of two where an FP8 page could otherwise saturate, folded into the
        weights so that every score is the same (docs/design.md, "FP8 KV cache"). s is the smallest power of two of
        at least 1 that keeps K / s within FP8_BOUND for any input: from the input norm's bound on what a row of
        qkv_proj can give (`_row_bound`), per kv head; under Qwen3's norm on each head of q and k, |k| is at most
        sqrt(head_dim) times k_norm's largest weight, per layer (the norms' weights are shared by the heads). K's rows
        of qkv_proj and its bias (or k_norm's weights) are divided by s, the rows of the query heads that read it (or
        q_norm's weights) multiplied by s: q·k, and RoPE's rotation, which is linear, are the same to the bit. Most
        models keep 1 everywhere (SmolLM2-135M's largest bound is 118); a model whose keys carry large biases (Qwen2)
        gets the scale that keeps its keys from saturating. A head whose weights the scaling would not keep exactly
        keeps 1. Returns s per layer, float32 [kv_heads] (this rank's heads), before any page holds K. Once."""
        if self.k_scales is not None:
            return self.k_scales
        scales = []
        for layer in self.layers:
            attn = layer.self_attn
            qkv, d, group = attn.qkv_proj, attn.head_dim, attn.num_heads // attn.num_kv_heads
            s_layer = torch.ones(attn.num_kv_heads)
            if attn.q_norm is not None and attn.k_norm is not None:
                s = max(1.0, _bound_scale(math.sqrt(d) * attn.k_norm.weight.double().abs().max().item()))
                norms = [(attn.k_norm.weight, slice(None), 1 / s), (attn.q_norm.weight, slice(None), s)]
                if s > 1 and _scale_exactly(norms):
                    s_layer.fill_(s)
                scales.append(s_layer)
                continue
            gamma = layer.input_layernorm.weight.double()
            for h in range(attn.num_kv_heads):
                rows = slice(attn.q_size + h * d, attn.q_size + (h + 1) * d)
                s = max(1.0, _bound_scale(_row_bound(qkv.weight[rows].double() * gamma[None, :], qkv.bias, rows)))
                if s == 1:
                    continue
                queries = slice(h * group * d, (h + 1) * group * d)
                parts = [(qkv.weight, rows, 1 / s), (qkv.weight, queries, s)]
                parts += [] if qkv.bias is None else [(qkv.bias, rows, 1 / s), (qkv.bias, queries, s)]
                if _scale_exactly(parts):
                    s_layer[h] = s
            scales.append(s_layer)
        self.k_scales = scales
        return scales

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, hidden] (only the rows that need logits) -> fp32 logits [n, vocab].

        The matmul runs in the model dtype, like Hugging Face; only the result is widened for sampling.
        """
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = invariant.linear(hidden, weight) if self.deterministic else gemv.linear(hidden, weight)
        if self.tp is not None:
            logits = self.tp.gather_vocab(logits, self.full_vocab_size)
        return logits.float()

    def _embed_shard(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Each rank looks up the ids of its vocabulary block (zero rows for the others); the sum is the embedding."""
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.config.vocab_size)
        x = F.embedding(local.masked_fill(outside, 0), self.embed_tokens.weight)
        return self.tp.all_reduce(x.masked_fill(outside[:, None], 0))

    # --- weights -------------------------------------------------------------------------------------

    def hf_tensors(self) -> dict[str, torch.Tensor]:
        """Every Hugging Face tensor of this model, in Hugging Face's layout (fused projections split back, gate and
        up rows un-interleaved after fold_norms; folded norm scales stay folded: the same function)."""
        params = dict(self.named_parameters())
        out = {}
        for hf, (name, lo, hi) in self.hf_weight_map().items():
            param = params[name]
            if self.norms_folded and ".gate_up_proj." in name:  # [g0; u0; g1; u1; ...] -> [gate; up]
                param = param.view(param.shape[0] // 2, 2, -1).transpose(0, 1).reshape(param.shape)
            out[hf] = param[lo:hi]
        return out

    def hf_weight_map(self) -> dict[str, tuple[str, int, int]]:
        """Every Hugging Face tensor name this model needs -> (our parameter, first row, end row).

        Rows cover the whole parameter unless the tensor is one part of a fused projection.
        """
        cfg = self.config
        splits = {
            "qkv_proj": (0, cfg.q_size, cfg.q_size + cfg.kv_size, cfg.q_size + 2 * cfg.kv_size),
            "gate_up_proj": (0, cfg.intermediate_size, 2 * cfg.intermediate_size),
        }
        out: dict[str, tuple[str, int, int]] = {}
        for name, param in self.named_parameters():
            hf = name if name.startswith("lm_head.") else f"model.{name}"
            fused = next((f for f in _FUSED if f".{f}." in name), None)
            if fused is None:
                out[hf] = (name, 0, param.shape[0])
                continue
            bounds = splits[fused]
            for i, part in enumerate(_FUSED[fused]):
                out[hf.replace(fused, part)] = (name, bounds[i], bounds[i + 1])
        return out

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face (name, tensor) pairs into the model, casting to each parameter's dtype/device.

        Raises CheckpointError on an unknown name, a shape mismatch, or a name missing at the end.
        """
        wanted = self.hf_weight_map()
        params = dict(self.named_parameters())
        seen: set[str] = set()
        for hf_name, tensor in weights:
            if hf_name.endswith(_IGNORED_SUFFIXES):
                continue
            if hf_name == "lm_head.weight" and self.lm_head is None:
                continue  # tied: some tied checkpoints still store a copy of the embedding
            if hf_name not in wanted:
                raise CheckpointError(
                    f"unexpected tensor {hf_name!r} in a {self.config.architecture} "
                    f"checkpoint (does config.json match the weights?)"
                )
            name, lo, hi = wanted[hf_name]
            dst = params[name].data.narrow(0, lo, hi - lo)
            if tuple(tensor.shape) != tuple(dst.shape):
                raise CheckpointError(
                    f"tensor {hf_name!r} has shape {tuple(tensor.shape)}, config.json implies {tuple(dst.shape)}"
                )
            dst.copy_(tensor)
            seen.add(hf_name)
        missing = sorted(set(wanted) - seen)
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            names = ", ".join(map(repr, missing[:5]))
            raise CheckpointError(f"checkpoint is missing tensor(s) {names}{more}")


# The most a page of FP8 e4m3 (largest value 448) is asked to hold of a scaled key or value, for any input
# (fold_k_scales, fold_v_scales): half of 448, a margin for the rounding of the bound's own arithmetic.
FP8_BOUND = 224.0


def _row_bound(weight: torch.Tensor, bias: torch.Tensor | None, rows: slice) -> float:
    """The largest |y_j| of y = RMSNorm(x) W^T + b for any x, over the rows `weight` holds (W_j times the norm's
    weights gamma; `bias`' entries `rows`): the normed input x / rms(x) has a Euclidean norm below sqrt(n) (n inputs),
    so by Cauchy-Schwarz |y_j| <= sqrt(n) ||W_j * gamma|| + |b_j|."""
    bound = weight.norm(dim=1) * math.sqrt(weight.shape[1])
    if bias is not None:
        bound = bound + bias[rows].double().abs()
    return bound.max().item()


def _bound_scale(bound: float) -> float:
    """The smallest power of two s with bound / s <= FP8_BOUND (0 for a bound of 0)."""
    return 2.0 ** math.ceil(math.log2(bound / FP8_BOUND)) if bound > 0 else 0.0


def _scale_exactly(parts: list[tuple[torch.Tensor, slice, float]]) -> bool:
    """Multiply each (tensor, index, factor) in place where that is exact for all of them (no underflow and no
    overflow in the tensor's dtype: a power of two then changes the exponent alone); whether it did."""
    scaled = [(t, i, t[i] * f, f) for t, i, f in parts]
    if not all(torch.equal(new / f, t[i]) for t, i, new, f in scaled):
        return False
    for t, i, new, _ in scaled:
        t[i] = new
    return True
