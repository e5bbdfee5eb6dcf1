"""Each rank's part of the model under tensor parallelism: its shard's config (`shard_config`), and its part of the
weights, cut from a checkpoint's tensors (reading only that part of each safetensors tensor), or drawn as random
weights exactly equal to the matching part of the one-rank model's.

Which part: rows of the column-parallel projections (q/k/v, gate/up, and their biases), columns of the row-parallel
ones (o, down), a block of vocabulary rows of the embedding and the LM head (zero-padded so that every rank holds
cdiv(vocab, size) rows); norms, q/k norms and the biases of o and down are whole on every rank, and those two
biases are zeroed off rank 0 so that the all-reduce adds them once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from lazyattn.errors import CheckpointError, InvalidRequestError
from lazyattn.kernels.paged import cdiv
from lazyattn.model.config import ModelConfig
from lazyattn.parallel.group import TensorParallelGroup

_ROWS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # Hugging Face names, split by output rows
_COLUMNS = ("o_proj.weight", "down_proj.weight")
_VOCAB = ("embed_tokens.weight", "lm_head.weight")
_ONCE = ("o_proj.bias", "down_proj.bias")  # added after the all-reduce: on rank 0 only


def check_divisible(cfg: ModelConfig, size: int) -> None:
    """Heads and MLP rows must split evenly (the vocabulary is padded instead)."""
    for field, n in (
        ("num_attention_heads", cfg.num_heads),
        ("num_key_value_heads", cfg.num_kv_heads),
        ("intermediate_size", cfg.intermediate_size),
    ):
        if n % size:
            raise InvalidRequestError(
                f"tensor_parallel_size {size} does not divide the model's {field} ({n}): each rank must hold the "
                f"same share; pick a size that divides {field}",
                "tensor_parallel_size",
            )


def shard_config(cfg: ModelConfig, size: int) -> ModelConfig:
    """The config of one rank's shard: its heads, MLP rows and (padded) vocabulary block."""
    check_divisible(cfg, size)
    return dataclasses.replace(
        cfg,
        num_heads=cfg.num_heads // size,
        num_kv_heads=cfg.num_kv_heads // size,
        intermediate_size=cfg.intermediate_size // size,
        vocab_size=cdiv(cfg.vocab_size, size),
    )


def _how(name: str) -> str | None:
    """How tensor `name` (ours or Hugging Face's) is split: 'rows', 'columns', 'vocab', or None (whole)."""
    if name.endswith(_VOCAB):
        return "vocab"
    if name.endswith(_COLUMNS):
        return "columns"
    if any(f".{part}." in name for part in _ROWS):
        return "rows"
    return None


def _part(t: torch.Tensor, how: str | None, tp: TensorParallelGroup, vocab_size: int) -> torch.Tensor:
    if how is None:
        return t
    if how == "vocab":
        block = cdiv(vocab_size, tp.size)
        return _pad_rows(t[tp.rank * block : (tp.rank + 1) * block], block)
    dim = 0 if how == "rows" else 1
    if t.shape[dim] % tp.size:
        raise CheckpointError(f"a tensor of shape {tuple(t.shape)} does not split into {tp.size} equal parts")
    return t.chunk(tp.size, dim)[tp.rank]


def _pad_rows(rows: torch.Tensor, block: int) -> torch.Tensor:
    """The last vocabulary block, past the vocabulary: zero rows, which no token id reaches."""
    if rows.shape[0] == block:
        return rows
    return torch.cat([rows, rows.new_zeros(block - rows.shape[0], *rows.shape[1:])])


def shard_weights(
    weights: Iterable[tuple[str, torch.Tensor]], cfg: ModelConfig, tp: TensorParallelGroup
) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, this rank's part) for every whole tensor of `weights` (a GGUF file's, say)."""
    for name, tensor in weights:
        yield name, _part(tensor, _how(name), tp, cfg.vocab_size)


def read_shards(
    files: list[Path], device: torch.device, cfg: ModelConfig, tp: TensorParallelGroup
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, this rank's part) of every safetensors tensor, reading only that part from the file."""
    where = (
        f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
        if device.type == "cuda"
        else "cpu"
    )
    try:
        for f in files:
            with safe_open(str(f), framework="pt", device=where) as h:
                for name in h.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                    how = _how(name)
                    view = h.get_slice(name)
                    shape = view.get_shape()
                    if how == "rows" and shape[0] % tp.size == 0:
                        n = shape[0] // tp.size
                        tensor = view[tp.rank * n : (tp.rank + 1) * n]
                    elif how == "columns" and len(shape) == 2 and shape[1] % tp.size == 0:
                        n = shape[1] // tp.size
                        tensor = view[:, tp.rank * n : (tp.rank + 1) * n]
                    elif how == "vocab":
                        block = cdiv(cfg.vocab_size, tp.size)
                        tensor = _pad_rows(view[tp.rank * block : (tp.rank + 1) * block], block)
                    else:  # whole, or a shape that does not split: _part says so
                        tensor = _part(view[:], how, tp, cfg.vocab_size)
                    yield name, tensor
    except (OSError, RuntimeError, ValueError, SafetensorError) as e:
        raise CheckpointError(f"cannot read weights from {files[0].parent}: {e}") from e


def our_part(name: str, full: torch.Tensor, cfg: ModelConfig, tp: TensorParallelGroup) -> torch.Tensor:
    """This rank's part of our (fused) parameter `name` of the one-rank model, whose value is `full`."""
    if ".qkv_proj." in name or ".gate_up_proj." in name:
        sizes = [cfg.q_size, cfg.kv_size, cfg.kv_size] if ".qkv_proj." in name else [cfg.intermediate_size] * 2
        return torch.cat([_part(p, "rows", tp, cfg.vocab_size) for p in full.split(sizes)])
    return _part(full, _how(name), tp, cfg.vocab_size)


@torch.no_grad()
def add_biases_once(lm: torch.nn.Module, tp: TensorParallelGroup) -> None:
    """Zero the row-parallel biases off rank 0: the all-reduce sums the ranks' partial outputs, bias included."""
    if tp.rank == 0:
        return
    for name, param in lm.named_parameters():
        if name.endswith(_ONCE):
            param.zero_()
