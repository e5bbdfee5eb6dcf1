"""The skinny decode product (kernels/gemv.py) against F.linear in float64, and its dispatch rule.

On the CPU the kernel runs under TRITON_INTERPRET=1 at small ragged shapes; the `gpu` tests run 8B shapes on the
device, and the engine with the kernel forced on against F.linear.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

from lazyattn.kernels import gemv as gemv_module
from lazyattn.kernels.gemv import FUSED_SLOWDOWN, GemvConfig, gemv, linear, pick, table_entry
from lazyattn.kernels.launch import interpreting
from lazyattn.model.layers import Linear

# Ragged on purpose: N and K are no multiples of the tiles, and K splits unevenly.
SMALL = [GemvConfig(32, 32, 1), GemvConfig(32, 32, 3), GemvConfig(16, 64, 2, num_warps=2)]


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.double(), w.double(), None if b is None else b.double())


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("config", SMALL, ids=lambda c: f"bn{c.block_n}-bk{c.block_k}-s{c.split_k}")
@pytest.mark.parametrize("m", [1, 3, 16])
def test_fp32_matches_float64(config, m):
    g = torch.Generator().manual_seed(m)
    x, w, b = torch.randn(m, 100, generator=g), torch.randn(70, 100, generator=g), torch.randn(70, generator=g)
    out = gemv(x, w, b, config)
    assert out.shape == (m, 70) and out.dtype == torch.float32
    assert rel_err(out, reference(x, w, b)) < 1e-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 3, 16, 40])
def test_16_bit_rounds_like_f_linear(dtype, m):
    """fp32 sums rounded once: within one unit in the last place of the exactly rounded result, nearly always equal."""
    g = torch.Generator().manual_seed(10 + m)
    x, w = torch.randn(m, 150, generator=g).to(dtype), (torch.randn(90, 150, generator=g) * 0.1).to(dtype)
    b = torch.randn(90, generator=g).to(dtype)
    out = gemv(x, w, b, GemvConfig(32, 64, 2))
    exact = reference(x, w, b)
    rounded = exact.to(dtype)
    ulp = (rounded.double().abs() * (2.0**-7 if dtype == torch.bfloat16 else 2.0**-10)).clamp_min(1e-30)
    assert out.dtype == dtype
    assert ((out.double() - exact).abs() <= ulp).all()
    # The interpreter converts fp32 to bf16 by truncation (numpy has no bf16), the GPU rounds to nearest.
    if dtype == torch.float16 or not interpreting():
        assert (out == rounded).float().mean() > 0.95


def test_rows_beyond_one_block_and_leading_dims():
    """M = 70 takes two M blocks of 64; a [2, 35, K] input keeps its leading dims."""
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(2, 35, 48, generator=g), torch.randn(40, 48, generator=g)
    out = gemv(x, w, config=GemvConfig(16, 16, 2))
    assert out.shape == (2, 35, 40)
    assert rel_err(out, reference(x, w, None)) < 1e-6


def test_empty_batch_and_non_contiguous_input():
    w = torch.randn(24, 32)
    assert gemv(torch.empty(0, 32), w).shape == (0, 24)
    wide = torch.randn(3, 64)
    x = wide[:, ::2]  # stride 2 along K: copied to unit stride
    assert rel_err(gemv(x, w, config=GemvConfig(16, 16, 1)), reference(x, w, None)) < 1e-6


def test_same_bits_every_run():
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(4, 256, generator=g).bfloat16(), torch.randn(48, 256, generator=g).bfloat16()
    cfg = GemvConfig(16, 32, 4)
    first = gemv(x, w, config=cfg)
    assert all(torch.equal(first, gemv(x, w, config=cfg)) for _ in range(2))


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="unit stride"):
        gemv(torch.randn(1, 8), torch.randn(8, 16).t())
    with pytest.raises(ValueError, match="columns"):
        gemv(torch.randn(1, 9), torch.randn(4, 8))
    with pytest.raises(ValueError, match="one dtype"):
        gemv(torch.randn(1, 8).half(), torch.randn(4, 8))


def test_dispatch_keeps_f_linear_on_the_cpu(kernel_settings):
    kernel_settings(LAZYATTN_GEMV="force")
    x, w = torch.randn(1, 8), torch.randn(4, 8)
    assert pick(x, w) is None
    layer = Linear(8, 4, bias=True)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


class FakeCuda:
    """Rows [m, 64] that pick() takes for CUDA bf16 rows (no GPU needed)."""

    is_cuda = True
    dtype = torch.bfloat16
    device = torch.device("cuda", 0)

    def __init__(self, m: int) -> None:
        self.shape = (m, 64)

    def numel(self) -> int:
        return self.shape[0] * 64


def test_table_lookup_takes_the_next_measured_batch(tmp_path, monkeypatch, kernel_settings):
    """pick() on a CUDA tensor, faked: the decision of the smallest measured M >= m, None past the table."""
    cfg = GemvConfig(64, 128, 4)
    entries = [
        table_entry("GPU X", torch.bfloat16, 96, 64, 1, cfg),
        table_entry("GPU X", torch.bfloat16, 96, 64, 4, None),
        table_entry("GPU X", torch.bfloat16, 96, 64, 8, cfg),
    ]
    path = tmp_path / "table.json"
    kernel_settings(LAZYATTN_GEMV_TABLE=str(path))
    monkeypatch.setattr(gemv_module, "_device_name", lambda index: "GPU X")

    entries.append(table_entry("GPU X", torch.bfloat16, 96, 64, 16, cfg))
    path.write_text(json.dumps({"entries": entries}))
    w = torch.empty(96, 64, dtype=torch.bfloat16)
    assert [pick(FakeCuda(m), w) for m in (1, 2, 4, 5, 8, 9, 16, 17)] == [cfg, None, None, cfg, cfg, cfg, cfg, None]
    kernel_settings(LAZYATTN_GEMV_TABLE=str(path), LAZYATTN_GEMV_MAX_M="8")  # a lower cap than the default 64 rows
    assert [pick(FakeCuda(m), w) for m in (8, 9, 16, 17)] == [cfg, None, None, None]
    assert pick(FakeCuda(1), torch.empty(97, 64, dtype=torch.bfloat16)) is None  # shape not measured
    kernel_settings(LAZYATTN_GEMV_TABLE=str(path), LAZYATTN_GEMV="0")
    assert pick(FakeCuda(1), w) is None
    assert linear(torch.ones(1, 64), torch.ones(3, 64)).tolist() == [[64.0] * 3]


def test_fused_path_takes_configs_a_little_slower_than_linear(tmp_path, monkeypatch, kernel_settings):
    """The table keeps the tuned config where F.linear won: plain products keep F.linear there, the fused decode
    path takes the kernel up to FUSED_SLOWDOWN; entries of the older format (config only where it won) still load."""
    cfg, slow = GemvConfig(64, 128, 1), GemvConfig(64, 128, 2)
    entries = [
        table_entry("GPU X", torch.bfloat16, 96, 64, 1, cfg, 0.9),
        table_entry("GPU X", torch.bfloat16, 96, 64, 2, slow, FUSED_SLOWDOWN - 0.01, dispatch=False),
        table_entry("GPU X", torch.bfloat16, 96, 64, 4, slow, FUSED_SLOWDOWN + 0.01, dispatch=False),
        table_entry("GPU X", torch.bfloat16, 96, 64, 8, None),
    ]
    entries.append({"device": "GPU X", "dtype": "bfloat16", "n": 96, "k": 64, "m": 16, "config": asdict(cfg)})
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"entries": entries}))
    kernel_settings(LAZYATTN_GEMV_TABLE=str(path))
    monkeypatch.setattr(gemv_module, "_device_name", lambda index: "GPU X")
    w = torch.empty(96, 64, dtype=torch.bfloat16)
    rows = [1, 2, 4, 8, 16]
    assert [pick(FakeCuda(m), w) for m in rows] == [cfg, None, None, None, cfg]
    assert [pick(FakeCuda(m), w, fused=True) for m in rows] == [cfg, slow, None, None, cfg]


# ---------------------------------------------------------------------------------------------------
# GPU


EIGHT_B = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", EIGHT_B)
@pytest.mark.parametrize("m", [1, 5, 16, 64])
def test_gpu_8b_shapes_match_f_linear(n, k, m):
    g = torch.Generator(device="cuda").manual_seed(n + m)
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
    b = torch.randn(n, device="cuda", generator=g).bfloat16()
    exact = reference(x, w, b)
    for cfg in (None, GemvConfig(64, 128, 1), GemvConfig(128, 128, 4, num_warps=8)):
        out = gemv(x, w, b, cfg)
        assert rel_err(out, exact) <= 1.5 * rel_err(F.linear(x, w, b), exact) + 1e-4
        assert torch.equal(out, gemv(x, w, b, cfg))


@pytest.mark.gpu
def test_gpu_graph_replay_equals_eager():
    x = torch.randn(3, 4096, device="cuda").bfloat16()
    w = (torch.randn(4096, 4096, device="cuda") * 0.02).bfloat16()
    cfg = GemvConfig(64, 128, 8)
    eager = gemv(x, w, config=cfg)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        gemv(x, w, config=cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemv(x, w, config=cfg)
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
