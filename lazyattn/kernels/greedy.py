"""Greedy pick: each row's argmax and that token's log-probability, in two small launches.

A greedy row needs only two reductions of its logits: the maximum's index and log Σ exp. PyTorch's sampler path
(log_softmax over the whole row, then argmax, then a gather) is three launches and, at batch 1, each reduction of a
128K vocabulary runs on a handful of blocks, a visible share of a batch-1 decode step (docs/benchmarks.md, "Kernel
constants"). Here the vocabulary is cut into chunks, one program each (max, first index of the max, Σ exp(x − max)
of its chunk), and one program per row merges the chunks in order.

Ties go to the lowest index, as torch.argmax. `greedy_pick_reference` is the PyTorch definition the tests hold the
kernel to; the sampler (engine/sampling.py) takes the kernel for rows that are all greedy, without logprobs and
without suppressed tokens, on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lazyattn.kernels.launch import pdl_options, wait_for_producers
from lazyattn.kernels.paged import cdiv

_CHUNK = 4096  # vocabulary entries a program reduces: 32 programs a row for a 128K vocabulary


def greedy_pick_reference(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, V] -> (argmax [B] int64, log_softmax at the argmax [B] fp32)."""
    logits = logits.float()
    token_ids = logits.argmax(dim=-1)
    return token_ids, torch.log_softmax(logits, dim=-1).gather(1, token_ids[:, None]).squeeze(1)


@triton.jit
def _chunk_kernel(logits_ptr, part_ptr, stride_row, vocab, CHUNK: tl.constexpr, USE_PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    wait_for_producers(USE_PDL)
    x = tl.load(logits_ptr + row * stride_row + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
    x = tl.where(x != x, float("inf"), x)  # NaN counts as the maximum, as in torch.argmax (its logprob is NaN)
    top = tl.max(x, axis=0)
    first = tl.min(tl.where(x == top, cols, vocab), axis=0)  # the lowest index holding the maximum
    # A chunk of -inf alone adds nothing to the row's sum (exp(-inf - -inf) would be NaN): the row's logprob is NaN
    # only when its logits are not a distribution, which the engine reads as a request gone bad.
    total = tl.where(top == float("-inf"), 0.0, tl.sum(tl.exp(x - top), axis=0))
    out = part_ptr + (row * tl.num_programs(1) + chunk) * 3
    tl.store(out, top)
    tl.store(out + 1, first.to(tl.float32))  # exact: vocabularies are far below 2^24
    tl.store(out + 2, total)


@triton.jit
def _merge_kernel(part_ptr, ids_ptr, logprob_ptr, chunks, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    ok = c < chunks
    wait_for_producers(USE_PDL)
    parts = part_ptr + (row * chunks + c) * 3
    top = tl.load(parts, mask=ok, other=float("-inf"))
    first = tl.load(parts + 1, mask=ok, other=0.0)
    total = tl.load(parts + 2, mask=ok, other=0.0)
    best = tl.max(top, axis=0)
    # Chunks ascend in index, and each holds its lowest maximal index: the least over the maximal chunks is the
    # row's first maximum.
    token = tl.min(tl.where(ok & (top == best), first, 3.0e38), axis=0).to(tl.int64)
    lse = best + tl.log(tl.sum(tl.where(ok, total * tl.exp(top - best), 0.0), axis=0))
    tl.store(ids_ptr + row, token)
    tl.store(logprob_ptr + row, best - lse)


def greedy_pick(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """greedy_pick_reference in two launches; logits [B, V] with unit last stride (fp32, or the model dtype)."""
    if logits.dim() != 2 or logits.stride(1) != 1 or logits.shape[1] == 0:
        raise ValueError(
            f"logits must be [rows, vocab > 0] with unit last stride, got shape {tuple(logits.shape)} "
            f"strides {logits.stride()}"
        )
    rows, vocab = logits.shape
    token_ids = torch.empty(rows, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows == 0:
        return token_ids, logprobs
    chunks = cdiv(vocab, _CHUNK)
    parts = torch.empty(rows, chunks, 3, dtype=torch.float32, device=logits.device)
    pdl = pdl_options(logits.device, "sampling")
    _chunk_kernel[(rows, chunks)](logits, parts, logits.stride(0), vocab, CHUNK=_CHUNK, num_warps=8, **pdl)
    _merge_kernel[(rows,)](
        parts, token_ids, logprobs, chunks, BLOCK=max(16, triton.next_power_of_2(chunks)), num_warps=1, **pdl
    )
    return token_ids, logprobs
