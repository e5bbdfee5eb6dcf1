"""Skinny matrix product for decode: y = x · Wᵀ (+ bias) with few rows in x, W [N, K] row-major.

At batch 1 … 64 a decode step's linears read every weight once and do almost no arithmetic per byte, so their time
is the weight bytes over memory bandwidth. cuBLAS picks kernels made for larger products: on an H100 at 8B shapes
they stay below the bandwidth a copy reaches, and for the K-heavy shapes (down, o) it splits K and adds a second
reduce launch (docs/benchmarks.md, "Kernel constants"). This kernel is built for the skinny case only.

Work split. Grid = (N blocks, K splits, M blocks). A program owns BLOCK_N rows of W and one contiguous range of K,
and walks it in [BLOCK_N, BLOCK_K] tiles read once, K-contiguous (W's own layout, 16-byte loads). The product is
a tl.dot of the W tile with the transposed x tile, x padded to BLOCK_M >= 16 rows: the tensor cores do 16x the
needed multiplies at M = 1, which is free next to the bytes, and tl.dot operands let Triton stage the W tiles
through shared memory with asynchronous copies num_stages deep, which is what keeps enough bytes in flight.
Accumulation is fp32; fp32 inputs multiply in full fp32 (input_precision="ieee"), never tf32.

Split K, deterministically. Shapes with few rows of W can be cut along K so that the grid fills the chip (the
table decides per shape: on the H100 a 64-row block with 6 stages beat every split for the 8B shapes, 70B's down
took 2 splits). Each split writes an fp32 partial [BLOCK_M, BLOCK_N]; the last split
of an (M block, N block) to arrive (an arrival counter, as in decode.py) adds the partials in split order 0, 1, …,
adds the bias and rounds once to the output dtype. The order never depends on which split finished first, so
every run gives the same bits, and the step stays one launch (cuBLAS's split-K takes two).

Rounding matches F.linear: fp32 sum of products, plus the bias in fp32, rounded once.

`linear` is what the model calls: it runs this kernel only where a measured table (gemv_table.json, written by
`python -m benchmarks.gemv` on the GPU named there) says it beats F.linear for that (N, K, M) and dtype, and
F.linear everywhere else (the CPU, other GPUs, shapes or batch sizes not measured, M above DISPATCH_MAX_ROWS).
LAZYATTN_GEMV=0 turns it off, LAZYATTN_GEMV=force uses it for every CUDA product of at most 64 rows (for tests),
LAZYATTN_GEMV_TABLE=path reads another table, LAZYATTN_GEMV_MAX_M=m moves the cap (lazyattn/envs.py: the engine
activates them at construction).
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from lazyattn import envs
from lazyattn.kernels.decode import ArrivalCounters
from lazyattn.kernels.fused import silu_times
from lazyattn.kernels.launch import interpreting, pdl_options, sm_count, wait_for_producers
from lazyattn.kernels.paged import cdiv

MAX_ROWS = 64  # the largest M the dispatch considers: beyond it a product has enough rows for cuBLAS's tiles
# The table's decisions are used up to this M (LAZYATTN_GEMV_MAX_M's default). Without PDL and the decode fusion,
# batches of 16 and 64 came out slower with the kernel inside the engine (a cap of 8 suited that). With both (H100,
# `python -m benchmarks.engine`), a cap of 64 is faster than a cap of 8 at batch 16 and 64 and for the cached RAG
# request's first token, and the same at batch 1 (docs/benchmarks.md, "Kernel constants").
DISPATCH_MAX_ROWS = envs.EnvSettings.gemv_max_m  # 64, declared in lazyattn/envs.py
# The fused decode path (DecodePlan) takes the kernel where it is at most this much slower than F.linear alone: there
# its epilogues carry the residual add and the next norm, two launches a layer that the plain path runs on their own.
FUSED_SLOWDOWN = 1.10
TABLE_PATH = Path(__file__).with_name("gemv_table.json")
_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}

# Counters outlive every launch and every captured graph that used them (see ArrivalCounters).
_COUNTERS = ArrivalCounters()


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    split_k: int  # K ranges per row block (1: no partials)
    num_warps: int = 4
    num_stages: int = 4


def default_config(n: int, k: int, device: torch.device) -> GemvConfig:
    """A config for shapes the table does not list: 64-row blocks, K split until the grid has about two programs
    per SM, each split at least 512 columns long (a pipeline of several tiles)."""
    block_n, block_k = 64, 128
    sms = sm_count(device) if device.type == "cuda" else 4
    split = max(1, min(2 * sms // max(1, cdiv(n, block_n)), k // 512))
    return GemvConfig(block_n=block_n, block_k=block_k, split_k=split)


@triton.jit(do_not_specialize=["M"])  # one compile for every batch size of a block (M = 1 included)
def _gemv_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    part_ptr,
    counters_ptr,
    sq_in_ptr,
    sq_out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    k_per_split,
    stride_sq,
    n_sq_in,
    eps,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    IEEE: tl.constexpr,
    NORM: tl.constexpr,
    RESIDUAL: tl.constexpr,
    BLOCK_SQ: tl.constexpr,
    GATED: tl.constexpr,
    USE_PDL: tl.constexpr,
    PREFETCH_LINES: tl.constexpr,
    LINE: tl.constexpr,
):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    pid_m = tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    # Rows past N and M read row 0 / are masked: W loads need no row mask, only the stores do.
    rn_load = tl.where(rn < N, rn, 0)
    m_ok = rm < M
    k_start = split * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    w_ptrs = w_ptr + rn_load[:, None].to(tl.int64) * stride_wn + (k_start + rk)[None, :]
    x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + (k_start + rk)[None, :]
    if USE_PDL and PREFETCH_LINES > 0:
        # The weights are no kernel's output: while the kernel before this one finishes, pull the first lines of
        # this program's rows into L2, so the pipeline's first tiles arrive sooner.
        lines = k_start + tl.arange(0, PREFETCH_LINES) * LINE
        lines = tl.where(lines < k_end, lines, k_start)
        _prefetch_l2(w_ptr + rn_load[:, None].to(tl.int64) * stride_wn + lines[None, :])
    wait_for_producers(USE_PDL)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        if EVEN_K:
            w = tl.load(w_ptrs)
            x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
        else:
            k_ok = (k + rk) < k_end
            w = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0)
            x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(w.to(DOT_DTYPE), tl.trans(x.to(DOT_DTYPE)), acc, input_precision="ieee")
        else:
            acc = tl.dot(w.to(DOT_DTYPE), tl.trans(x.to(DOT_DTYPE)), acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K

    if not SPLIT:
        _finish(
            acc,
            y_ptr,
            b_ptr,
            sq_in_ptr,
            sq_out_ptr,
            rn,
            rm,
            m_ok,
            N,
            K,
            stride_ym,
            stride_sq,
            n_sq_in,
            eps,
            pid_n,
            HAS_BIAS,
            NORM,
            RESIDUAL,
            BLOCK_SQ,
            GATED,
            BLOCK_N,
            BLOCK_M,
        )
    else:
        num_splits = tl.num_programs(1)
        # Partials [splits, M_pad, N] fp32 (M padded to whole blocks, so no mask on M is needed here).
        m_pad = tl.num_programs(2) * BLOCK_M
        part_rows = part_ptr + (rm[None, :].to(tl.int64) * N + rn[:, None])
        tl.store(part_rows + split.to(tl.int64) * m_pad * N, acc, mask=(rn < N)[:, None])
        # The barrier puts every thread's stores before the counter's release; the last split merges in split
        # order (loads bypass L1, .cg: other programs wrote them) and resets the counter for the next launch.
        tl.debug_barrier()
        counter = counters_ptr + pid_m * tl.num_programs(0) + pid_n
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
            total = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for s in range(0, num_splits):
                total += tl.load(part_rows + s * m_pad * N, mask=(rn < N)[:, None], other=0.0, cache_modifier=".cg")
            _finish(
                total,
                y_ptr,
                b_ptr,
                sq_in_ptr,
                sq_out_ptr,
                rn,
                rm,
                m_ok,
                N,
                K,
                stride_ym,
                stride_sq,
                n_sq_in,
                eps,
                pid_n,
                HAS_BIAS,
                NORM,
                RESIDUAL,
                BLOCK_SQ,
                GATED,
                BLOCK_N,
                BLOCK_M,
            )
            tl.store(counter, 0)


@triton.jit
def _finish(
    acc,
    y_ptr,
    b_ptr,
    sq_in_ptr,
    sq_out_ptr,
    rn,
    rm,
    m_ok,
    N,
    K,
    stride_ym,
    stride_sq,
    n_sq_in,
    eps,
    pid_n,
    HAS_BIAS: tl.constexpr,
    NORM: tl.constexpr,
    RESIDUAL: tl.constexpr,
    BLOCK_SQ: tl.constexpr,
    GATED: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """Store acc [BLOCK_N, BLOCK_M] (fp32 sums of products) as rows rm, columns rn of y.

    NORM: x was the un-normalised residual stream and W carries the norm's weight (docs/design.md, "Decode
    fusion"): the row's 1/rms comes from the n_sq_in sums of squares its producer left (fixed order) and scales the
    sums. RESIDUAL: y is the residual stream; the product, rounded, is added to it in place (rounded again, as
    x + residual in the model dtype), and this program leaves the sum of squares of its columns of the new row,
    for the next product's NORM. GATED: W's rows alternate gate and up (CausalLM.fold_norms), so this block's
    columns pair up as (gate_j, up_j): y [M, N/2] gets SiLU(gate) * up, rounded as fused.silu_mul rounds it."""
    if NORM:
        j = tl.arange(0, BLOCK_SQ)
        sq = tl.load(
            sq_in_ptr + rm[None, :].to(tl.int64) * stride_sq + j[:, None],
            mask=(j < n_sq_in)[:, None] & m_ok[None, :],
            other=0.0,
        )
        acc = acc * tl.rsqrt(tl.sum(sq, axis=0) / K + eps)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[:, None]
    out = acc.to(y_ptr.dtype.element_ty)
    if GATED:
        gate, up = tl.split(tl.permute(tl.reshape(out, [BLOCK_N // 2, 2, BLOCK_M]), (0, 2, 1)))
        half = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(
            y_ptr + rm[None, :].to(tl.int64) * stride_ym + half[:, None],
            silu_times(gate, up),
            mask=(half < N // 2)[:, None] & m_ok[None, :],
        )
    else:
        out_mask = (rn < N)[:, None] & m_ok[None, :]
        y_ptrs = y_ptr + rm[None, :].to(tl.int64) * stride_ym + rn[:, None]
        if RESIDUAL:
            res = tl.load(y_ptrs, mask=out_mask, other=0.0)
            out = (out.to(tl.float32) + res.to(tl.float32)).to(y_ptr.dtype.element_ty)
            wide = tl.where(out_mask, out.to(tl.float32), 0.0)
            tl.store(sq_out_ptr + rm.to(tl.int64) * stride_sq + pid_n, tl.sum(wide * wide, axis=0), mask=m_ok)
        tl.store(y_ptrs, out, mask=out_mask)


@triton.jit
def _prefetch_l2(ptrs):
    """Ask L2 for the lines at ptrs (one pointer per 128-byte line); nothing waits for them."""
    tl.inline_asm_elementwise(
        "mov.u32 $0, 0;\n\tprefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


def _prefetch_lines() -> int:
    """LAZYATTN_GEMV_PREFETCH: 128-byte lines of each weight row a program prefetches before it waits under PDL."""
    return envs.active().gemv_prefetch


def gemv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, config: GemvConfig | None = None
) -> torch.Tensor:
    """x [..., K] · weight[N, K]ᵀ (+ bias [N]) -> [..., N] in x's dtype, like F.linear.

    weight must be row-major (unit stride along K); x is made contiguous along K when it is not. Allocates only
    its output and, with split K, an fp32 scratch of splits x M x N: both come from the caching allocator, so the
    launch can be captured in a CUDA graph.
    """
    rows, lead = _rows(x, weight, bias)
    y = torch.empty(rows.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    _launch(rows, weight, bias, y, config)
    return y.reshape(*lead, weight.shape[0])


def gemv_normed(
    stream: torch.Tensor,
    squares: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: GemvConfig | None = None,
    gated: bool = False,
) -> torch.Tensor:
    """RMSNorm(stream) · weightᵀ (+ bias) for rows [M, K] of the residual stream, where `weight` already carries the
    norm's scale (its columns multiplied by it, CausalLM.fold_norms) and `squares` [M, P] fp32 are sums of squares
    of each row's parts (their sum is the row's, as `gemv_into_residual` leaves them): one launch, no norm kernel.

    Rounds differently from norm-then-product (the normalised row is not rounded to the model dtype before the
    product; the weight is rounded once with the scale in it): within the model dtype's rounding of it.

    gated: `weight` is the MLP's gate_up with gate and up rows interleaved ([g0; u0; g1; u1; ...]): the result is
    SiLU(gate) * up [M, N/2], computed in the epilogue (no gate_up output, no SiLU·mul launch)."""
    rows, lead = _rows(stream, weight, bias)
    if squares.dim() != 2 or squares.shape[0] != rows.shape[0] or squares.dtype != torch.float32:
        raise ValueError(f"squares must be fp32 [{rows.shape[0]}, parts], got {squares.dtype} {tuple(squares.shape)}")
    n = weight.shape[0]
    if gated and n % 2:
        raise ValueError(f"gemv_normed(gated=True) needs interleaved gate/up rows, an even count, got {n}")
    if gated and config is not None and config.block_n % 2:
        raise ValueError(f"gemv_normed(gated=True) needs an even block_n, got {config.block_n}")
    y = torch.empty(rows.shape[0], n // 2 if gated else n, dtype=stream.dtype, device=stream.device)
    _launch(rows, weight, bias, y, config, squares_in=squares.contiguous(), eps=eps, gated=gated)
    return y.reshape(*lead, y.shape[1])


def gemv_into_residual(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: GemvConfig | None = None,
) -> torch.Tensor:
    """residual += x · weightᵀ (+ bias), in place, the product rounded to the model dtype before the add and the sum
    rounded again (as F.linear followed by x + residual). Returns the new rows' sums of squares by blocks of
    columns, fp32 [M, N blocks], for the next `gemv_normed`."""
    rows, _ = _rows(x, weight, bias)
    n = weight.shape[0]
    if residual.shape != (rows.shape[0], n) or residual.dtype != x.dtype or residual.stride(1) != 1:
        raise ValueError(
            f"residual must be {x.dtype} [{rows.shape[0]}, {n}] with unit last stride, got "
            f"{residual.dtype} {tuple(residual.shape)} strides {residual.stride()}"
        )
    config = config or default_config(n, weight.shape[1], x.device)
    squares = torch.empty(rows.shape[0], cdiv(n, config.block_n), dtype=torch.float32, device=x.device)
    _launch(rows, weight, bias, residual, config, squares_out=squares)
    return squares


def row_squares(stream: torch.Tensor) -> torch.Tensor:
    """Each row's sum of squares in fp32, [M, 1]: the `squares` of a stream no product has left them for."""
    return stream.float().square().sum(-1, keepdim=True)


def _rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Size]:
    """x as [M, K] rows with unit stride along K, and its leading shape; checks the operands."""
    if weight.dim() != 2 or weight.stride(1) != 1:
        raise ValueError(
            f"gemv needs a 2-D weight with unit stride along K, got shape {tuple(weight.shape)} "
            f"strides {weight.stride()}"
        )
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"gemv: x has {x.shape[-1]} columns, weight has {k}")
    if x.dtype != weight.dtype or (bias is not None and bias.shape != (n,)):
        raise ValueError(
            f"gemv: x {x.dtype}, weight {weight.dtype}, bias {None if bias is None else bias.shape}: "
            f"x and weight need one dtype and bias the shape ({n},)"
        )
    rows = x.reshape(-1, k)
    return (rows if rows.stride(-1) == 1 else rows.contiguous()), x.shape[:-1]


def _launch(
    rows: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    y: torch.Tensor,
    config: GemvConfig | None,
    squares_in: torch.Tensor | None = None,
    eps: float = 0.0,
    squares_out: torch.Tensor | None = None,
    gated: bool = False,
) -> None:
    m, k = rows.shape
    n = weight.shape[0]
    if m == 0 or n == 0:
        return
    if k == 0:
        if squares_in is not None or squares_out is not None:
            raise ValueError("gemv: a fused norm or residual needs K > 0")
        y.copy_(bias.expand(m, n) if bias is not None else torch.zeros_like(y))
        return
    config = config or default_config(n, k, rows.device)
    block_m = max(16, triton.next_power_of_2(min(m, MAX_ROWS)))
    m_blocks = cdiv(m, block_m)
    n_blocks = cdiv(n, config.block_n)
    # Whole tiles per split; the split count is what remains once each split has its share.
    k_per_split = cdiv(cdiv(k, config.split_k), config.block_k) * config.block_k
    splits = cdiv(k, k_per_split)
    if splits > 1:
        part = torch.empty(splits, m_blocks * block_m, n, dtype=torch.float32, device=rows.device)
        counters = _COUNTERS.get(rows.device, m_blocks * n_blocks)
    else:
        part = counters = y  # unused pointers
    sq_in = squares_in if squares_in is not None else y  # placeholders where compiled out
    sq_out = squares_out if squares_out is not None else y
    sq_stride = (
        squares_in.stride(0) if squares_in is not None else (squares_out.stride(0) if squares_out is not None else 0)
    )
    n_sq_in = squares_in.shape[1] if squares_in is not None else 1
    # The interpreter multiplies 16-bit dot operands as their raw bits (triton issue #11584): there they are
    # widened to fp32, exactly (a product of two 16-bit floats fits in fp32).
    dot_ty = tl.float32 if interpreting() else _TL_DTYPES[rows.dtype]
    _gemv_kernel[(n_blocks, splits, m_blocks)](
        rows,
        weight,
        bias if bias is not None else y,
        y,
        part,
        counters,
        sq_in,
        sq_out,
        m,
        n,
        k,
        rows.stride(0),
        weight.stride(0),
        y.stride(0),
        k_per_split,
        sq_stride,
        n_sq_in,
        eps,
        HAS_BIAS=bias is not None,
        SPLIT=splits > 1,
        EVEN_K=k % config.block_k == 0,
        BLOCK_M=block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        DOT_DTYPE=dot_ty,
        IEEE=rows.dtype == torch.float32,
        NORM=squares_in is not None,
        RESIDUAL=squares_out is not None,
        GATED=gated,
        BLOCK_SQ=triton.next_power_of_2(n_sq_in),
        PREFETCH_LINES=_prefetch_lines(),
        LINE=128 // weight.element_size(),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **pdl_options(rows.device, "gemv"),
    )


# ---------------------------------------------------------------------------------------------------
# dispatch


@dataclass(frozen=True)
class Measured:
    """One (shape, M) row of gemv_table.json: the sweep's best config for that block of M (None: none ran), its
    time over F.linear's, and whether a plain product dispatches to it (it beat F.linear by the sweep's margin)."""

    config: GemvConfig | None
    vs_linear: float
    dispatch: bool


@functools.lru_cache(maxsize=4)
def _load_table(path: str) -> dict:
    """{(device name, dtype name, N, K): [(M, Measured), ...] ascending M}, from the sweep's JSON. Entries written
    before the table kept every config hold only the dispatched ones: those count as faster than F.linear."""
    file = Path(path)
    if not file.exists():
        return {}
    table: dict = {}
    for entry in json.loads(file.read_text())["entries"]:
        key = (entry["device"], entry["dtype"], entry["n"], entry["k"])
        config = GemvConfig(**entry["config"]) if entry["config"] is not None else None
        dispatch = entry.get("dispatch", "lazyattn" if config is not None else "F.linear") == "lazyattn"
        vs_linear = entry.get("vs_linear")
        if vs_linear is None:
            vs_linear = 1.0 if config is not None and dispatch else float("inf")
        table.setdefault(key, []).append((entry["m"], Measured(config, vs_linear, dispatch and config is not None)))
    return {key: sorted(rows, key=lambda r: r[0]) for key, rows in table.items()}


@functools.lru_cache(maxsize=16)
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def pick(x: torch.Tensor, weight: torch.Tensor, fused: bool = False) -> GemvConfig | None:
    """The kernel config for this product, or None where F.linear is faster or nothing was measured.

    The table holds the sweep's M values (1, 2, 4, …): a batch of m rows takes the decision measured at the
    smallest listed M >= m, the same block of x rows padded the same way. `fused`: for the fused decode path, which
    takes the kernel up to FUSED_SLOWDOWN times F.linear's time (its epilogues save two launches a layer)."""
    settings = envs.active()
    mode = settings.gemv
    m = x.numel() // max(1, x.shape[-1])
    if mode == "0" or not x.is_cuda or m > MAX_ROWS or weight.dim() != 2 or weight.stride(1) != 1:
        return None
    n, k = weight.shape
    if mode == "force":
        return default_config(n, k, x.device)
    if m > settings.gemv_max_m:
        return None
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    key = (_device_name(index), str(x.dtype).removeprefix("torch."), n, k)
    rows = _load_table(settings.gemv_table or str(TABLE_PATH)).get(key, [])
    for measured_m, measured in rows:
        if measured_m >= m:
            takes = measured.vs_linear <= FUSED_SLOWDOWN if fused else measured.dispatch
            return measured.config if takes else None
    return None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, through the skinny kernel where it was measured to be faster (see `pick`)."""
    config = pick(x, weight)
    if config is None:
        return F.linear(x, weight, bias)
    return gemv(x, weight, bias, config)


def table_entry(
    device: str,
    dtype: torch.dtype,
    n: int,
    k: int,
    m: int,
    config: GemvConfig | None,
    vs_linear: float | None = None,
    dispatch: bool | None = None,
) -> dict:
    """One row of gemv_table.json (`python -m benchmarks.gemv` writes them): the best config, its time over
    F.linear's, and whether plain products take it (by default: when it is faster, or nothing was compared)."""
    if dispatch is None:
        dispatch = vs_linear is None or vs_linear < 1.0
    dispatch = dispatch and config is not None
    return {
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "n": n,
        "k": k,
        "m": m,
        "config": None if config is None else asdict(config),
        "vs_linear": vs_linear,
        "dispatch": "lazyattn" if dispatch else "F.linear",
    }
