"""The fused elementwise kernels (kernels/fused.py) against their PyTorch definitions.

The references are checked against hand-written arithmetic first (so the kernels are not held to a wrong
definition), then the kernels against the references on random data: the residual sum exactly (one rounding of
one add), the normalised and gated outputs within one rounding step of the dtype. On the CPU they run under
TRITON_INTERPRET=1 (tests/conftest.py); the gpu-marked test repeats them at Llama-3.1-8B widths.
"""

import math

import pytest
import torch

from lazyattn.kernels.fused import (
    add_rms_norm,
    add_rms_norm_reference,
    rms_norm,
    rms_norm_reference,
    silu_mul,
    silu_mul_reference,
)
from lazyattn.kernels.launch import interpreting

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:  # one rounding step of a 8/11-bit mantissa
        torch.testing.assert_close(got.float(), want.float(), rtol=_rtol(want.dtype), atol=1e-3)


def _rtol(dtype: torch.dtype) -> float:
    # Triton's CPU interpreter casts fp32 to bf16 by truncation, not to nearest (checked against torch with
    # triton 3.x): each of the kernels' two roundings may then be one step off, so two steps are allowed there.
    if dtype == torch.bfloat16 and interpreting():
        return 2**-6
    return 2**-7


def randn(*shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g)).to(dtype).to(DEVICE)


def test_references_by_hand():
    x = torch.tensor([[3.0, -4.0]])
    w = torch.tensor([2.0, 0.5])
    # mean square 12.5; row / sqrt(12.5 + eps) scaled by w
    s = math.sqrt(12.5 + 1e-6)
    torch.testing.assert_close(rms_norm_reference(x, w, 1e-6), torch.tensor([[2 * 3 / s, 0.5 * -4 / s]]))
    out, total = add_rms_norm_reference(x, torch.tensor([[1.0, 4.0]]), w, 0.0)
    torch.testing.assert_close(total, torch.tensor([[4.0, 0.0]]))
    torch.testing.assert_close(out, torch.tensor([[2.0 * 4 / math.sqrt(8.0), 0.0]]))
    gu = torch.tensor([[1.0, -2.0, 3.0, 5.0]])  # gate [1, -2], up [3, 5]
    silu = [1 / (1 + math.exp(-1)), -2 / (1 + math.exp(2))]
    torch.testing.assert_close(silu_mul_reference(gu), torch.tensor([[silu[0] * 3, silu[1] * 5]]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", [(1, 64), (5, 96)])
def test_rms_norm_matches_reference(dtype, rows, n):
    # x a strided view (rows of a wider buffer), like a slice of a fused projection output
    x = randn(rows, n + 32, dtype=dtype, seed=rows + n, scale=3.0)[:, :n]
    w = randn(n, dtype=dtype, seed=7) + 1
    close(rms_norm(x, w, 1e-5), rms_norm_reference(x, w, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", [(1, 64), (6, 80)])
def test_add_rms_norm_matches_reference(dtype, rows, n):
    x = randn(rows, n, dtype=dtype, seed=1)
    residual = randn(rows, n, dtype=dtype, seed=2, scale=10.0)
    w = randn(n, dtype=dtype, seed=3) + 1
    out, total = add_rms_norm(x, residual, w, 1e-5)
    want_out, want_total = add_rms_norm_reference(x, residual, w, 1e-5)
    if dtype == torch.bfloat16 and interpreting():
        close(total, want_total)  # the interpreter's truncating cast (see _rtol)
    else:
        assert torch.equal(total, want_total)
    close(out, want_out)
    assert x.data_ptr() != total.data_ptr() and residual.data_ptr() != total.data_ptr()  # inputs untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,inter", [(1, 40), (3, 1100)])  # 1100: more than one column block, ragged tail
def test_silu_mul_matches_reference(dtype, rows, inter):
    gate_up = randn(rows, 2 * inter, dtype=dtype, seed=inter, scale=4.0)
    close(silu_mul(gate_up), silu_mul_reference(gate_up))
    # Interleaved rows [g0, u0, g1, u1, ...] (the layout CausalLM.fold_norms gives gate_up): the same function.
    interleaved = torch.stack(gate_up.chunk(2, dim=-1), dim=-1).reshape(rows, 2 * inter)
    close(silu_mul(interleaved, interleaved=True), silu_mul_reference(gate_up))
    close(silu_mul_reference(interleaved, interleaved=True), silu_mul_reference(gate_up))


def test_empty_batches_and_bad_shapes():
    w = torch.ones(8, device=DEVICE)
    assert rms_norm(torch.empty(0, 8, device=DEVICE), w, 1e-5).shape == (0, 8)
    assert silu_mul(torch.empty(0, 8, device=DEVICE)).shape == (0, 4)
    with pytest.raises(ValueError, match="unit stride"):
        rms_norm(torch.ones(8, 4, device=DEVICE).t(), w, 1e-5)
    with pytest.raises(ValueError, match=r"\[rows, 8\]"):
        rms_norm(torch.ones(2, 6, device=DEVICE), w, 1e-5)
    with pytest.raises(ValueError, match="does not match"):
        add_rms_norm(torch.ones(2, 8, device=DEVICE), torch.ones(3, 8, device=DEVICE), w, 1e-5)
    with pytest.raises(ValueError, match="gate_up"):
        silu_mul(torch.ones(2, 7, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 37])
def test_fused_kernels_at_8b_widths(dtype, rows):
    hidden, inter = 4096, 14336
    x, residual = randn(rows, hidden, dtype=dtype, seed=11), randn(rows, hidden, dtype=dtype, seed=12, scale=8.0)
    w = randn(hidden, dtype=dtype, seed=13) + 1
    out, total = add_rms_norm(x, residual, w, 1e-5)
    want_out, want_total = add_rms_norm_reference(x, residual, w, 1e-5)
    assert torch.equal(total, want_total)
    close(out, want_out)
    close(rms_norm(x, w, 1e-5), rms_norm_reference(x, w, 1e-5))
    gate_up = randn(rows, 2 * inter, dtype=dtype, seed=14, scale=4.0)
    close(silu_mul(gate_up), silu_mul_reference(gate_up))
