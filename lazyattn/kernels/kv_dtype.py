"""The KV cache's dtype: the model's, bfloat16, or FP8 e4m3 (docs/design.md, "FP8 KV cache").

An FP8 pool stores each K/V element as `float8_e4m3fn` with one fixed scale of 1.0 for every (layer, K/V, kv head):
a value is stored as itself, saturated to ±448 and rounded to the nearest e4m3 value (ties to even), and read back
exactly (`x_fp8.float()`). What K and V are there is the engine's business: over an FP8 pool it loads the model
with V divided by a power of two per (layer, kv head), and K where it could otherwise reach 448, folded into the
weights (model/llama.py, CausalLM.fold_v_scales, fold_k_scales).
The scale choice and its measured error are in docs/design.md. Keys are quantized as they
are cached, rotated at their encoding positions (Deferred RoPE): the kernels dequantize a tile in registers and
rotate the query (or the tile) as for any other dtype.

`quantize` is the one rounding rule of the PyTorch side (the reference backend's writes, block mode's copies); the
Triton writes (kernels/cache_ops.py) apply the same rule in fp32 arithmetic, since the Triton interpreter's own
fp32 -> fp8 conversion rounds wrongly (31.2 -> 16). Both give the same bytes, up to the sign of zero.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3fn's largest finite value


def resolve(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The pool's torch dtype for a `kv_cache_dtype` option (engine/config.py, KV_CACHE_DTYPES): 'auto' is the
    model's."""
    if name == "auto":
        return model_dtype
    if name == "bfloat16":
        return torch.bfloat16
    if name == "fp8_e4m3":
        return FP8
    raise ValueError(f"kv_cache_dtype must be auto, bfloat16 or fp8_e4m3, got {name!r}")


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == FP8


def fp8_tile_dtype(q_dtype: torch.dtype) -> torch.dtype:
    """The dtype the decode, shared-document decode and prefill kernels (prefill.py's and the Hopper one) widen FP8
    tiles to, and round q and P to for their dots, under a q of q_dtype: float16 under a 16-bit q. Every e4m3 value
    is a float16 value, so the widening is exact, and float16 keeps 3 more bits of q and P than bfloat16; its range
    (65,504) is past any query a model computes. Widened to bfloat16, decode over FP8 pages took 1.04-1.25x the time
    over bf16 pages on an H200; widened to float16, 0.86-1.0x (docs/benchmarks.md, "Kernel constants"). Under an fp32
    q: fp32."""
    return torch.float32 if q_dtype == torch.float32 else torch.float16


def tile_dtype(q_dtype: torch.dtype, page_dtype: torch.dtype) -> torch.dtype:
    """The dtype of a kernel's K/V tiles once loaded, to which q and P are rounded for the dots: `fp8_tile_dtype` over
    FP8 pages, q's over any other (the pages' own or narrower)."""
    return fp8_tile_dtype(q_dtype) if is_fp8(page_dtype) else q_dtype


def quantize(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x rounded to the cache's dtype; FP8: in fp32, saturated to ±448 (torch's conversion of a larger value is not
    specified to saturate; the GPU's cvt.satfinite does)."""
    if is_fp8(dtype):
        return x.float().clamp(-FP8_MAX, FP8_MAX).to(dtype)
    return x.to(dtype)


def check_dtypes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """What the Triton attention kernels take: q in bf16, fp16 or fp32 over pages of its dtype or of one whose every
    value q's dtype holds, to which the tiles are widened as they load: FP8 e4m3 under any, 16-bit pages under fp32."""
    wide = (torch.bfloat16, torch.float16, torch.float32)
    narrower = is_fp8(k_cache.dtype) or (q.dtype == torch.float32 and k_cache.dtype in wide)
    if q.dtype not in wide or v_cache.dtype != k_cache.dtype or not (k_cache.dtype == q.dtype or narrower):
        raise ValueError(
            f"q of {q.dtype} over K/V pages of {k_cache.dtype}/{v_cache.dtype}: q must be bf16, fp16 or fp32 and the "
            "pages of its dtype, fp8 e4m3, or (under fp32) 16-bit"
        )
