"""The GPU attention backend: the Triton kernels behind the AttentionBackend seam (kernels/backend.py).

Per layer and forward: one `rope_write_kv` launch (rotate q and k, store k and v), then one attention
launch over the layer's views of the pool, decode or prefill by the batch's shape; a decode step that carries a
shared-document plan (ForwardBatch.shared) takes kernels/shared_decode.py's two launches. The per-page deltas
travel in the PagedBatch; the attention kernels apply them on the fly. Short prefill calls (a question over cached
documents, any number of them in one call) run the warp-specialised kernel on Hopper GPUs (kernels/prefill_hopper.py),
which rotates Q per document itself; elsewhere calls of at most 256 rows take Q rotated per run of equal delta up
front (kernels/prefill.py), copies that the same RoPE launch writes (`rope_write_kv_runs`), not a launch of their
own.

FP8 pages (kv_cache_dtype=fp8_e4m3, docs/design.md "FP8 KV cache"): the RoPE launch rounds k and v to e4m3 as it
stores them, and the decode, shared-decode, prefill and deterministic kernels widen each tile as it loads (decode,
prefill and the Hopper kernel: to float16 under a 16-bit q, `kv_dtype.fp8_tile_dtype`; the others: to q's dtype).
Short prefill calls over FP8 pages take the Hopper kernel as over 16-bit pages (`prefill_hopper.supports`: under a
bf16 or fp16 q).

The backend owns the launch state that outlives a launch: decode's arrival counters (decode.ArrivalCounters),
which CUDA graphs captured through this backend keep pointing at. Split-KV partials are per-launch scratch.
"""

from __future__ import annotations

import torch

from lazyattn.kernels import invariant, prefill_hopper
from lazyattn.kernels.backend import AttentionBackend, ForwardBatch
from lazyattn.kernels.cache_ops import copy_rotate, rope_write_kv, rope_write_kv_runs
from lazyattn.kernels.decode import ArrivalCounters, decode_attention
from lazyattn.kernels.paged import layer_caches
from lazyattn.kernels.prefill import prefill_attention, rotated_runs_for
from lazyattn.kernels.rope import RopeTables
from lazyattn.kernels.shared_decode import shared_decode_attention


class TritonBackend(AttentionBackend):
    """Triton kernels; runs on CUDA, and on the CPU under TRITON_INTERPRET=1 (tests)."""

    shared_decode = True

    def __init__(self, kv: torch.Tensor, tables: RopeTables, scale: float, deterministic: bool = False) -> None:
        super().__init__(kv, tables, scale, deterministic)
        self.counters = ArrivalCounters()

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        k_cache, v_cache = layer_caches(self.kv, layer)
        if self.deterministic:  # one batch-invariant kernel for prefill and decode (kernels/invariant.py)
            q = rope_write_kv(q, k, v, fb.positions, fb.slot_mapping, k_cache, v_cache, self.tables)
            return invariant.paged_attention(q, k_cache, v_cache, fb.attn, self.tables, self.scale)
        runs = 0 if fb.is_decode else rotated_runs_for(q.shape[0])
        # Questions over cached documents, at any total: the Hopper kernel where it takes the call. It has no per-page
        # temperature or scale (kernels/paged.py): such batches take the Triton one.
        hopper = not fb.is_decode and fb.attn.inv_temps is None
        if hopper and prefill_hopper.supports(q, k_cache, v_cache, fb.attn):
            # Hopper: the warp-specialised kernel rotates Q per document itself, so the RoPE launch writes no copies.
            q = rope_write_kv(q, k, v, fb.positions, fb.slot_mapping, k_cache, v_cache, self.tables)
            splits = fb.attn.num_splits or prefill_hopper.num_splits(
                q.shape[0], q.shape[1], k_cache.shape[2], q.device, fb.attn.batch_size, fb.attn.max_q
            )
            return prefill_hopper.short_prefill_attention(q, k_cache, v_cache, fb.attn, self.tables, self.scale, splits)
        if runs:
            q, q_rot = rope_write_kv_runs(
                q, k, v, fb.positions, fb.slot_mapping, k_cache, v_cache, self.tables, fb.attn, runs
            )
            return prefill_attention(q, k_cache, v_cache, fb.attn, self.tables, self.scale, rotated_q=q_rot)
        q = rope_write_kv(q, k, v, fb.positions, fb.slot_mapping, k_cache, v_cache, self.tables)
        if fb.is_decode and fb.shared is not None:  # runs listed by several entries read once for all of them
            return shared_decode_attention(q, k_cache, v_cache, fb.attn, fb.shared, self.tables, self.scale)
        if fb.is_decode:
            return decode_attention(q, k_cache, v_cache, fb.attn, self.tables, self.scale, counters=self.counters)
        return prefill_attention(q, k_cache, v_cache, fb.attn, self.tables, self.scale)

    def copy_rotate(self, src: torch.Tensor, dst: torch.Tensor, deltas: torch.Tensor) -> None:
        copy_rotate(self.kv, src, dst, deltas, self.tables)
