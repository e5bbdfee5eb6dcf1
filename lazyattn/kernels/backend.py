"""Attention backends: the one seam between the model and the kernels.

The model computes q, k, v for a packed batch of tokens (after any q/k norm, before RoPE). The backend
rotates q and k at `ForwardBatch.positions` (local positions for a document being encoded, logical ones
for a final segment), stores k and v into the page pool at `slot_mapping`, and attends by the paged
contract (kernels/paged.py), applying each page's delta on the fly. The
modes (docs/design.md) never show up here: they only differ in the page tables the engine builds.

Implementations: ReferenceBackend here (CPU), TritonBackend in triton_backend.py (CUDA); selector.py picks
one for the pool's device.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from lazyattn.kernels import reference
from lazyattn.kernels.paged import PagedBatch, layer_caches
from lazyattn.kernels.rope import RopeTables, apply_rope

if TYPE_CHECKING:  # the plan's module imports Triton, which the CPU backend does without
    from lazyattn.kernels.shared_decode import SharedPlan


@dataclass
class ForwardBatch:
    """Everything one model forward needs besides the token ids (packed in entry order)."""

    positions: torch.Tensor  # [T] RoPE position of each token
    slot_mapping: torch.Tensor  # [T] cache slot (page * page_size + offset) for each token's K/V
    attn: PagedBatch  # one entry per run of tokens, same packing as the token ids
    is_decode: bool  # every entry has exactly one query row
    logits_indices: torch.Tensor  # [n] token rows whose logits the caller wants
    # A decode step's shared-document plan (kernels/shared_decode.py): backends with `shared_decode` attend by it
    # where it is set; others ignore it.
    shared: SharedPlan | None = None


class AttentionBackend(ABC):
    """Owns the page pool `kv` [layers, 2, num_pages, page_size, kv_heads, head_dim] and the RoPE tables.

    Invariant: `attend` writes the batch's k/v before attending, so each query sees its own key.
    Slots of -1 are not stored (tokens whose K/V is already cached).
    """

    shared_decode = False  # whether attend takes ForwardBatch.shared plans (the engine builds them only then)

    def __init__(self, kv: torch.Tensor, tables: RopeTables, scale: float, deterministic: bool = False) -> None:
        self.kv = kv
        self.tables = tables
        self.scale = scale
        # Batch-invariant attention (kernels/invariant.py): one path for prefill and decode, fixed key tiles.
        self.deterministic = deterministic

    @property
    def page_size(self) -> int:
        return self.kv.shape[3]

    @abstractmethod
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D], unrotated -> attention output [T, Hq, D] in q's dtype."""

    @abstractmethod
    def copy_rotate(self, src: torch.Tensor, dst: torch.Tensor, deltas: torch.Tensor) -> None:
        """Block mode's private copies: every layer's K[dst] = R_delta K[src], V[dst] = V[src]."""


class ReferenceBackend(AttentionBackend):
    """Plain PyTorch: the CPU backend, and the ground truth."""

    def attend(self, layer, q, k, v, fb):
        k_cache, v_cache = layer_caches(self.kv, layer)
        q = apply_rope(q, fb.positions, self.tables)
        k = apply_rope(k, fb.positions, self.tables)
        reference.write_kv(k, v, fb.slot_mapping, k_cache, v_cache)
        return reference.paged_attention(
            q, k_cache, v_cache, fb.attn, self.tables, self.scale, invariant=self.deterministic
        )

    def copy_rotate(self, src, dst, deltas):
        reference.copy_rotate(self.kv, src, dst, deltas, self.tables)
