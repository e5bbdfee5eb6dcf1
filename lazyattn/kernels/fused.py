"""Fused elementwise kernels of the decoder: residual add + RMSNorm, and SiLU(gate) · up.

In PyTorch each is a chain of small launches (RMSNorm alone: upcast, square, mean, add eps, rsqrt, multiply,
downcast, scale), each reading and writing the whole activation. At batch 1 that is launch overhead and
nothing else: ~50 launches per decoder layer before fusion. Here each is one launch that reads its inputs once
and writes its outputs once.

Both round exactly where the PyTorch path (model/layers.py, Hugging Face's order) rounds, so outputs agree to
the last bit up to the rsqrt/exp implementations:
- `add_rms_norm`: the sum is rounded to the model dtype (it is the residual stream), the statistics are taken
  in fp32 over the rounded sum, the normalised row is rounded to the model dtype, then scaled by the weight
  and rounded again;
- `silu_mul`: SiLU in fp32 rounded to the model dtype, then the product rounded (`silu_times`, which the skinny
  product's gate_up epilogue uses too, kernels/gemv.py).

`rms_norm_reference`, `add_rms_norm_reference` and `silu_mul_reference` are the PyTorch definitions the tests
hold the kernels to, and what the model runs off CUDA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from lazyattn.kernels.launch import pdl_options, wait_for_producers
from lazyattn.kernels.paged import cdiv

_SILU_BLOCK = 1024


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Statistics in fp32, scale in the model dtype (what the Hugging Face models do)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual), the sum in the model dtype."""
    total = x + residual
    return rms_norm_reference(total, weight, eps), total


def silu_mul_reference(gate_up: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """[T, 2I] ([gate | up], or interleaved [g0, u0, g1, u1, ...]) -> SiLU(gate) * up [T, I]."""
    gate, up = (gate_up[..., 0::2], gate_up[..., 1::2]) if interleaved else gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    s_x,
    s_res,
    s_out,
    s_res_out,
    n,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    wait_for_producers(USE_PDL)
    x = tl.load(x_ptr + row * s_x + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * s_res + cols, mask=ok, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * s_res_out + cols, x, mask=ok)
    xf = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, axis=0) / n + eps)
    y = (xf * inv).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * s_out + cols, (w * y).to(out_ptr.dtype.element_ty), mask=ok)


def _check_rows(name: str, t: torch.Tensor, n: int) -> None:
    if t.dim() != 2 or t.shape[1] != n or t.stride(1) != 1:
        raise ValueError(
            f"{name} must be [rows, {n}] with unit stride along the last dim, got shape "
            f"{tuple(t.shape)} strides {t.stride()}"
        )


def _launch_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    n = weight.shape[0]
    _check_rows("x", x, n)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    res_out = None
    if residual is not None:
        _check_rows("residual", residual, n)
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(
                f"residual {tuple(residual.shape)} {residual.dtype} does not match x {tuple(x.shape)} {x.dtype}"
            )
        res_out = torch.empty_like(out)
    if x.shape[0] == 0:
        return out, res_out
    block = triton.next_power_of_2(n)
    res_in = residual if residual is not None else x
    res_store = res_out if res_out is not None else out
    _rms_norm_kernel[(x.shape[0],)](
        x,
        res_in,
        weight,
        out,
        res_store,
        x.stride(0),
        res_in.stride(0),
        out.stride(0),
        res_store.stride(0),
        n,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        num_warps=8 if block >= 4096 else 4,
        **pdl_options(x.device, "norm"),
    )
    return out, res_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm_reference in one launch; x [rows, n] with unit last stride, weight [n]."""
    return _launch_norm(x, None, weight, eps)[0]


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """add_rms_norm_reference in one launch: (norm(x + residual), x + residual)."""
    out, total = _launch_norm(x, residual, weight, eps)
    assert total is not None
    return out, total


@triton.jit
def _silu_mul_kernel(
    gu_ptr, out_ptr, s_gu, s_out, n, BLOCK: tl.constexpr, INTERLEAVED: tl.constexpr, USE_PDL: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n
    wait_for_producers(USE_PDL)
    gate_cols, up_cols = (2 * cols, 2 * cols + 1) if INTERLEAVED else (cols, n + cols)
    gate = tl.load(gu_ptr + row * s_gu + gate_cols, mask=ok, other=0.0)
    up = tl.load(gu_ptr + row * s_gu + up_cols, mask=ok, other=0.0)
    tl.store(out_ptr + row * s_out + cols, silu_times(gate, up), mask=ok)


@triton.jit
def silu_times(gate, up):
    """SiLU(gate) * up in the operands' dtype: SiLU in fp32 rounded to it, then the product rounded (as
    F.silu(gate) * up)."""
    act = (gate.to(tl.float32) / (1.0 + tl.exp(-gate.to(tl.float32)))).to(gate.dtype).to(tl.float32)
    return (act * up.to(tl.float32)).to(gate.dtype)


def silu_mul(gate_up: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """silu_mul_reference in one launch; gate_up [T, 2I] with unit last stride."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.stride(1) != 1:
        raise ValueError(
            f"gate_up must be [rows, 2 * intermediate] with unit last stride, got shape "
            f"{tuple(gate_up.shape)} strides {gate_up.stride()}"
        )
    rows, n = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, n, dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        _silu_mul_kernel[(rows, cdiv(n, _SILU_BLOCK))](
            gate_up,
            out,
            gate_up.stride(0),
            out.stride(0),
            n,
            BLOCK=_SILU_BLOCK,
            INTERLEAVED=interleaved,
            num_warps=4,
            **pdl_options(gate_up.device, "norm"),
        )
    return out
