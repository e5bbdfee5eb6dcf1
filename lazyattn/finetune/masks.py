"""What one training row sees: the served semantics (docs/design.md, Semantics) as a transformers input.

A block row is `[segment]…[segment][final + answer]`: each segment attends causally to itself only, the final
segment and the answer attend to everything before them; positions are the logical ones, contiguous from 0.
RoPE depends only on relative positions, so a segment at its logical position computes exactly what lazy mode
computes when it encodes the document alone and reads it there. A full row is the same tokens, causal.
This is the engine tests' reference construction (`block_mask` + 4-D additive mask + `position_ids`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lazyattn.kernels.reference import block_mask


def visible(segment_lens: Sequence[int], final_len: int, block: bool) -> torch.Tensor:
    """[T, T] bool, True = may attend."""
    if block:
        return block_mask(list(segment_lens), final_len)
    total = sum(segment_lens) + final_len
    return torch.ones(total, total, dtype=torch.bool).tril()


def additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A bool mask [..., T, T] as the additive float mask transformers adds to the scores (used as is when 4-D).

    The most negative finite value rather than -inf: a padding row that sees nothing must give finite
    (ignored) outputs, not NaN that would reach the gradients."""
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)


def padded(masks: Sequence[torch.Tensor], length: int) -> torch.Tensor:
    """Per-row masks [Ti, Ti] -> [B, 1, length, length]; padding keys are hidden, padding rows see themselves."""
    out = torch.eye(length, dtype=torch.bool).repeat(len(masks), 1, 1)
    for i, m in enumerate(masks):
        n = m.shape[0]
        out[i, :n, :n] = m
    return out[:, None]
