"""The skinny product's fused epilogues (kernels/gemv.py, docs/design.md "Decode fusion"): the residual add that
leaves sums of squares, and the RMSNorm folded into the next product, against their PyTorch definitions in float64.
CPU: TRITON_INTERPRET=1 at small ragged shapes; `gpu`: 8B shapes in bf16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lazyattn.kernels.fused import rms_norm_reference, silu_mul_reference
from lazyattn.kernels.gemv import GemvConfig, gemv_into_residual, gemv_normed, row_squares

SMALL = [GemvConfig(32, 32, 1), GemvConfig(32, 32, 3), GemvConfig(16, 64, 2, num_warps=2)]
EPS = 1e-5


def ids(c: GemvConfig) -> str:
    return f"bn{c.block_n}-bk{c.block_k}-s{c.split_k}"


@pytest.mark.parametrize("config", SMALL, ids=ids)
@pytest.mark.parametrize("m", [1, 3])
def test_product_added_into_the_residual_leaves_its_squares(config, m):
    g = torch.Generator().manual_seed(m)
    x, w, b = torch.randn(m, 100, generator=g), torch.randn(70, 100, generator=g), torch.randn(70, generator=g)
    residual = torch.randn(m, 70, generator=g)
    want = F.linear(x.double(), w.double(), b.double()) + residual.double()
    stream = residual.clone()
    squares = gemv_into_residual(x, w, stream, b, config)
    assert ((stream.double() - want).norm() / want.norm()).item() < 1e-6
    # One sum per block of columns; together they are the row's.
    assert squares.shape == (m, -(-70 // config.block_n))
    blocks = F.pad(stream.double().square(), (0, squares.shape[1] * config.block_n - 70))
    assert torch.allclose(squares.double(), blocks.view(m, -1, config.block_n).sum(-1), rtol=1e-6)


def test_residual_add_rounds_like_linear_then_add():
    """bf16: the product rounded, then the sum rounded, as F.linear followed by x + residual (HF's order). The
    interpreter truncates fp32 to bf16, so it is held to one ulp of the rounded reference, not equality."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 128, generator=g).bfloat16()
    w, residual = (torch.randn(64, 128, generator=g) * 0.1).bfloat16(), torch.randn(2, 64, generator=g).bfloat16()
    product = F.linear(x.double(), w.double()).bfloat16().double()
    want = product + residual.double()
    stream = residual.clone()
    gemv_into_residual(x, w, stream, None, GemvConfig(32, 64, 1))
    # Two roundings, each within one ulp (2^-7 relative) of the value it rounds.
    assert ((stream.double() - want).abs() <= (product.abs() + want.abs()) * 2.0**-7).all()


@pytest.mark.parametrize("config", SMALL, ids=ids)
@pytest.mark.parametrize("parts", [1, 4])
def test_normed_product_is_the_norm_then_the_product(config, parts):
    """The norm's scale folded into the weight's columns, 1/rms from the squares of `parts` blocks: the product of
    the normalised row with the unfolded weight (fp32, all within 1e-5)."""
    g = torch.Generator().manual_seed(parts)
    m, k = 3, 96
    stream = torch.randn(m, k, generator=g) * 3
    scale, w, b = torch.rand(k, generator=g) + 0.5, torch.randn(50, k, generator=g), torch.randn(50, generator=g)
    squares = stream.square().view(m, parts, k // parts).sum(-1)
    out = gemv_normed(stream, squares, EPS, w * scale, b, config)
    want = F.linear(rms_norm_reference(stream.double(), scale.double(), EPS), w.double(), b.double())
    assert ((out.double() - want).norm() / want.norm()).item() < 1e-5
    assert torch.allclose(row_squares(stream), stream.square().sum(-1, keepdim=True))


def interleave(w: torch.Tensor) -> torch.Tensor:
    """[gate; up] rows -> [g0; u0; g1; u1; ...], as CausalLM.fold_norms leaves gate_up."""
    return w.view(2, w.shape[0] // 2, -1).transpose(0, 1).reshape(w.shape)


@pytest.mark.parametrize("config", SMALL, ids=ids)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_normed_product_ends_in_silu_mul(config, dtype):
    """gated=True over interleaved gate/up rows (ragged N, split K): SiLU(gate) * up of the normed product, [M, N/2],
    against the norm, the product and silu_mul_reference in float64 over the same rounded weights (fp32 1e-5; bf16:
    gate, up, SiLU and the product are each rounded, which the interpreter does by truncation: 2e-2)."""
    g = torch.Generator().manual_seed(config.split_k)
    m, k, inter = 3, 96, 45
    stream = (torch.randn(m, k, generator=g) * 3).to(dtype)
    scale = torch.rand(k, generator=g) + 0.5
    w, b = torch.randn(2 * inter, k, generator=g) * 0.3, torch.randn(2 * inter, generator=g)
    squares = stream.float().square().view(m, 4, k // 4).sum(-1)
    folded, b = (w * scale).to(dtype), b.to(dtype)
    out = gemv_normed(stream, squares, EPS, interleave(folded), interleave(b), config, gated=True)
    assert out.shape == (m, inter) and out.dtype == dtype
    normed = rms_norm_reference(stream.double(), torch.ones(k, dtype=torch.float64), EPS)
    want = silu_mul_reference(F.linear(normed, folded.double(), b.double()))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert ((out.double() - want).norm() / want.norm()).item() < tol
    with pytest.raises(ValueError, match="even count"):
        gemv_normed(stream, squares, EPS, w[:-1].to(dtype), None, config, gated=True)


def test_bad_squares_and_residuals_are_refused():
    x, w = torch.randn(2, 32), torch.randn(16, 32)
    with pytest.raises(ValueError, match="squares must be fp32"):
        gemv_normed(x, torch.ones(3, 1), EPS, w)
    with pytest.raises(ValueError, match="squares must be fp32"):
        gemv_normed(x, torch.ones(2, 1, dtype=torch.float64), EPS, w)
    with pytest.raises(ValueError, match="residual must be"):
        gemv_into_residual(x, w, torch.zeros(2, 15))
    with pytest.raises(ValueError, match="residual must be"):
        gemv_into_residual(x, w, torch.zeros(16, 2).t())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_8b_layer_chain_matches_the_unfused_ops():
    """bf16, 8B shapes, one row: o_proj into the residual, then gate_up normed, against F.linear + add + RMSNorm +
    F.linear: the residual bit for bit, the normed product within bf16 rounding."""
    from lazyattn.kernels.gemv import pick

    g = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    attn = torch.randn(1, 4096, device="cuda", generator=g, dtype=dt)
    wo = (torch.randn(4096, 4096, device="cuda", generator=g) * 0.02).to(dt)
    wgu = (torch.randn(28672, 4096, device="cuda", generator=g) * 0.02).to(dt)
    scale = (torch.rand(4096, device="cuda", generator=g) + 0.5).to(dt)
    residual = torch.randn(1, 4096, device="cuda", generator=g, dtype=dt)
    want_stream = F.linear(attn, wo) + residual
    want = F.linear(rms_norm_reference(want_stream, scale, EPS), wgu)
    stream = residual.clone()
    squares = gemv_into_residual(attn, wo, stream, None, pick(attn, wo))
    assert torch.equal(stream, want_stream)
    folded = (wgu.float() * scale.float()).to(dt)
    out = gemv_normed(stream, squares, EPS, folded, None, pick(stream, folded))
    assert ((out.float() - want.float()).norm() / want.float().norm()).item() < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("m", [1, 32])
def test_gpu_8b_gated_gate_up_is_the_product_then_silu_mul(m):
    """bf16, 8B's gate_up shape, the engine's fused config: SiLU·mul in gate_up's epilogue gives the same bits as
    the same product stored, then the SiLU·mul kernel over it (one definition of the rounding, fused.silu_times)."""
    from lazyattn.kernels.fused import silu_mul
    from lazyattn.kernels.gemv import pick

    g = torch.Generator(device="cuda").manual_seed(m)
    dt = torch.bfloat16
    stream = torch.randn(m, 4096, device="cuda", generator=g, dtype=dt)
    w = interleave((torch.randn(28672, 4096, device="cuda", generator=g) * 0.02).to(dt))
    squares = stream.float().square().sum(-1, keepdim=True)
    config = pick(stream, w, fused=True) or GemvConfig(64, 128, 1)
    got = gemv_normed(stream, squares, EPS, w, None, config, gated=True)
    want = silu_mul(gemv_normed(stream, squares, EPS, w, None, config), interleaved=True)
    assert torch.equal(got, want)
