"""Which attention backend serves a page pool: the Triton kernels on CUDA, the PyTorch reference elsewhere."""

from __future__ import annotations

import torch

from lazyattn.kernels.backend import AttentionBackend, ReferenceBackend
from lazyattn.kernels.rope import RopeTables


def make_backend(kv: torch.Tensor, tables: RopeTables, scale: float, deterministic: bool = False) -> AttentionBackend:
    """Triton kernels on CUDA, the PyTorch reference elsewhere (Triton is only imported for a CUDA pool);
    `deterministic`: their batch-invariant paths (kernels/invariant.py)."""
    if kv.is_cuda:
        from lazyattn.kernels.triton_backend import TritonBackend

        return TritonBackend(kv, tables, scale, deterministic)
    return ReferenceBackend(kv, tables, scale, deterministic)
