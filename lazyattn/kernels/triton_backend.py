"""The GPU attention backend: the Triton kernels behind the AttentionBackend seam (kernels/backend.py).

Per layer and forward: one `rope_write_kv` launch (rotate q and k, store k and v), then one attention
launch over the layer's views of the pool, decode or prefill by the batch's shape. The per-page deltas
travel in the PagedBatch; the attention kernels apply them on the fly.
"""

from __future__ import annotations

import torch

from lazyattn.kernels.backend import AttentionBackend, ForwardBatch
from lazyattn.kernels.cache_ops import copy_rotate, rope_write_kv
from lazyattn.kernels.decode import decode_attention
from lazyattn.kernels.prefill import prefill_attention


class TritonBackend(AttentionBackend):
    """Triton kernels; runs on CUDA, and on the CPU under TRITON_INTERPRET=1 (tests)."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        k_cache, v_cache = self.kv[layer, 0], self.kv[layer, 1]
        q = rope_write_kv(q, k, v, fb.positions, fb.slot_mapping, k_cache, v_cache, self.tables)
        attention = decode_attention if fb.is_decode else prefill_attention
        return attention(q, k_cache, v_cache, fb.attn, self.tables, self.scale)

    def copy_rotate(self, src: torch.Tensor, dst: torch.Tensor, deltas: torch.Tensor) -> None:
        copy_rotate(self.kv, src, dst, deltas, self.tables)
