"""What one training row sees: the served semantics (docs/design.md, Semantics) as a transformers input.

A block row is `[segment]…[segment][final + answer]`: each segment attends causally to itself only, the final
segment and the answer attend to everything before them; positions are the logical ones, contiguous from 0.
RoPE depends only on relative positions, so a segment at its logical position computes exactly what lazy mode
computes when it encodes the document alone and reads it there. A full row is the same tokens, causal.
This is the engine tests' reference construction (`block_mask` + 4-D additive mask + `position_ids`).

With the shared prefix (`ape_prefix`, docs/design.md, "APE"), lazy mode encodes each document after the first
segment S_0: its rows sit at L_0 + j and attend to all of S_0 and causally to themselves; the final segment then
reads its keys moved to the logical positions s_i + j. One forward pass with ordinary RoPE cannot give one key two
positions, so the row gives each document i ≥ 2 its own copy of S_0 instead, just before it, at positions
s_i - L_0 … s_i - 1 (document 1 reads S_0 itself, which already sits there). A copy attends causally to itself, so
its KV is S_0's (relative positions again); the document attends to its copy and to itself at s_i + j, every
query-key distance equal to the engine's (L_0 + j) - p; the final segment attends to S_0 and the documents, never
to a copy. Gradients through the copies add up to the gradient through the one S_0 the engine shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lazyattn.kernels.reference import block_mask


@dataclass(frozen=True)
class Row:
    """One row as transformers reads it: the tokens with their positions and who may attend to whom."""

    tokens: list[int]
    positions: list[int]
    visible: torch.Tensor  # [T, T] bool, True = may attend


def row(segments: Sequence[Sequence[int]], tail: Sequence[int], block: bool, ape_prefix: bool = False) -> Row:
    """The row of `segments` (S_0 first) then `tail` (the final segment and the answer): causal (`block=False`),
    block attention, or block attention with the shared prefix (`ape_prefix`, block rows only)."""
    lens = [len(s) for s in segments]
    if not (block and ape_prefix and len(segments) > 1):
        tokens = [t for s in segments for t in s] + list(tail)
        return Row(tokens, list(range(len(tokens))), visible(lens, len(tail), block))
    first = list(segments[0])
    tokens, positions, spans = list(first), list(range(lens[0])), []  # spans: (prefix start, document start, end)
    logical = lens[0]
    for i, seg in enumerate(segments[1:], 1):
        prefix = 0
        if i >= 2:
            prefix = len(tokens)
            tokens += first
            positions += range(logical - lens[0], logical)
        start = len(tokens)
        tokens += seg
        positions += range(logical, logical + len(seg))
        spans.append((prefix, start, len(tokens)))
        logical += len(seg)
    context = len(tokens)
    tokens += tail
    positions += range(logical, logical + len(tail))
    seen = torch.zeros(len(tokens), len(tokens), dtype=torch.bool)
    causal = torch.ones(len(tokens), len(tokens), dtype=torch.bool).tril()
    seen[: lens[0], : lens[0]] = True
    for prefix, start, end in spans:
        seen[prefix : prefix + lens[0], prefix : prefix + lens[0]] = True  # a copy of S_0 (or S_0): itself
        seen[start:end, prefix : prefix + lens[0]] = True  # the document: its S_0
        seen[start:end, start:end] = True  # and itself
        seen[context:, start:end] = True  # the final segment reads every document
    seen[context:, : lens[0]] = True
    seen[context:, context:] = True
    return Row(tokens, positions, seen & causal)


def row_length(segment_lens: Sequence[int], tail_len: int, block: bool, ape_prefix: bool = False) -> int:
    """len(row(...).tokens) without building the row."""
    copies = len(segment_lens) - 2 if block and ape_prefix and len(segment_lens) > 2 else 0
    return sum(segment_lens) + tail_len + copies * segment_lens[0]


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
