"""Batch-invariant kernels: the deterministic mode's linears and attention (docs/design.md, "Deterministic mode").

A request's numbers must not depend on what shares its batch, on how its prefill is chunked, or on a preemption
that recomputes it. Floating-point sums give different bits in a different order, so every per-row result here is
computed by one fixed sequence of operations that depends only on that row's own inputs:

- `linear`: y = x · Wᵀ (+ bias) by one Triton kernel with one tile config for every number of rows (prefill and
  decode alike; the config depends on the weight's shape only): a program owns a BLOCK_M x BLOCK_N tile of y and
  walks K from 0 in BLOCK_K steps, accumulating in fp32 (a tensor-core MMA sums each row's products in an order
  fixed by the instruction, whatever the other rows hold). No split-K, no per-M table (kernels/gemv.py) and no
  cuBLAS, whose kernel choice follows M. Off CUDA, each row is its own F.linear call of shape [1, K]: the same call
  whatever the batch.
- `paged_attention`: one kernel for prefill and decode. A program owns BLOCK_M query tokens of one entry and one
  kv head (its GQA group of query heads as rows) and walks the entry's pages in order, a page being one tile of
  keys at fixed logical positions, with an online softmax in fp32. A query row's result is then the same whether
  it is computed in a prefill chunk, a whole prefill or a decode step: the tiles it sees are the same pages in the
  same order, and a tile past its position is either skipped or fully masked, which leaves the running max, sum
  and output exactly as they were (a factor exp(0) = 1 and added zeros). No split-KV.
- Deferred RoPE (lazy mode): a page with delta != 0 has its K tile rotated by +delta in fp32 and rounded to the
  KV dtype as it is loaded, the same arithmetic as block mode's private copy (cache_ops.copy_rotate), so lazy and
  block read the same key bits and agree exactly (docs/design.md, "Deterministic mode").

`rowwise` is the CPU's way of running any row-local function batch-invariantly: one call per row.
The PyTorch definitions these kernels are held to are kernels/reference.py's (`paged_attention` with
`invariant=True`) and F.linear.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from lazyattn.kernels.cache_ops import _load_pairs, _rotate, to_cache
from lazyattn.kernels.decode_tiles import v_tile
from lazyattn.kernels.kv_dtype import check_dtypes
from lazyattn.kernels.launch import interpreting
from lazyattn.kernels.paged import PagedBatch, cdiv, v_transposed
from lazyattn.kernels.rope import RopeTables

# The tile config of `linear`, one for every M: 64-row tiles of y, K in steps of 64, 4 warps. The tile width depends on
# the weight's N only (never on M): 64 columns where that still gives >= 128 programs at one row block, else 32, so
# that a decode step's products (N = 4096 at 8B: 64 programs of 64 columns) spread over an H100's 132 SMs.
MATMUL_BLOCK_M, MATMUL_BLOCK_K = 64, 64
_WIDE_N_PROGRAMS = 128
# Query tokens per attention program (every call: a decode step's single row is padded to it).
ATTN_BLOCK_M = 16
_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit
def _dot(a, b, acc, PRECISION: tl.constexpr, INTERPRETED: tl.constexpr):
    # INTERPRETED (TRITON_INTERPRET=1, the CPU tests): the interpreter's tl.dot is np.matmul, i.e. OpenBLAS's sgemm,
    # whose result for a row can depend on the row's place in the tile (its Haswell kernel, also picked on AMD Zen,
    # sums rows 0-5 and 6-11 of every 12 and a 4-row tail in three different orders), so a row's bits would follow
    # its offset in the launch; the interpreter also multiplies bf16 as raw uint16 bits. Here every output element
    # is one fixed sum of its own products instead: exact in fp64 (fp32 and bf16 operands), rounded once to fp32.
    # The GPU runs the MMA below, unchanged.
    if INTERPRETED:
        prod = a.to(tl.float32).to(tl.float64)[:, :, None] * b.to(tl.float32).to(tl.float64)[None, :, :]
        return acc + tl.sum(prod, axis=1).to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PRECISION)


def _precision(dtype: torch.dtype) -> str:
    """tl.dot's input precision: fp32 operands multiply in full fp32 (never tf32); others the default."""
    return "ieee" if dtype == torch.float32 else None


def rowwise(fn: Callable[..., torch.Tensor], *rows: torch.Tensor) -> torch.Tensor:
    """fn applied to each row [1, ...] of the given tensors on its own, the results stacked: the same call for a row
    whatever the number of rows (CPU kernels pick vector widths, blockings and thread splits by size)."""
    n = rows[0].shape[0]
    if n == 0:
        return fn(*rows)
    return torch.cat([fn(*(t[i : i + 1] for t in rows)) for i in range(n)])


# --- linear ----------------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    s_xm,
    s_wn,
    s_ym,
    HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,
    INTERPRETED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # M is not specialised (do_not_specialize): M = 1 and M divisible by 16 compile to the same kernel.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        x = tl.load(x_ptr + rm[:, None] * s_xm + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        w = tl.load(w_ptr + rn[None, :] * s_wn + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < K), other=0.0)
        acc = _dot(x, w, acc, PRECISION, INTERPRETED)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    tl.store(
        y_ptr + rm[:, None] * s_ym + rn[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )


def matmul_block_n(n: int) -> int:
    """The tile width for a weight of N rows (a function of N alone, so never of the batch)."""
    return 64 if cdiv(n, 64) >= _WIDE_N_PROGRAMS else 32


def matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] · weight[N, K]ᵀ (+ bias) in the fixed-tile Triton kernel; fp32 sums, rounded once to x's dtype
    (F.linear's rounding); fp32 inputs multiply in full fp32, never tf32."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    m, k = x2.shape
    n = weight.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_n = matmul_block_n(n)
    if m:
        grid = (cdiv(m, MATMUL_BLOCK_M), cdiv(n, block_n))
        _matmul_kernel[grid](
            x2,
            weight,
            bias if bias is not None else weight,
            y,
            m,
            n,
            k,
            x2.stride(0),
            weight.stride(0),
            y.stride(0),
            HAS_BIAS=bias is not None,
            PRECISION=_precision(x.dtype),
            INTERPRETED=interpreting(),
            BLOCK_M=MATMUL_BLOCK_M,
            BLOCK_N=block_n,
            BLOCK_K=MATMUL_BLOCK_K,
            num_warps=4,
            num_stages=3,
        )
    return y.reshape(*shape[:-1], n)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, batch-invariantly: the fixed-tile kernel on CUDA, one F.linear call per row elsewhere."""
    if x.is_cuda:
        return matmul(x, weight, bias)
    return rowwise(lambda row: F.linear(row, weight, bias), x.reshape(-1, x.shape[-1])).reshape(
        *x.shape[:-1], weight.shape[0]
    )


# --- attention -------------------------------------------------------------------------------------------------


# Arguments that vary with the batch are not specialised (value 1, divisibility by 16): one compiled kernel a shape.
@triton.jit(do_not_specialize=["batch_size", "s_tab_row", "ape_gap"])
def _attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    cu_ptr,
    q_start_ptr,
    pages_ptr,
    deltas_ptr,
    valid_ptr,
    starts_ptr,
    firsts_ptr,
    num_pages_ptr,
    inv_temp_ptr,
    cos_ptr,
    sin_ptr,
    batch_size,
    scale,
    s_qt,
    s_qh,
    s_qd,
    s_ot,
    s_oh,
    s_od,
    s_kp,
    s_ks,
    s_kh,
    s_kd,
    s_vp,
    s_vs,
    s_vh,
    s_vd,
    s_tab_row,
    s_tab,
    ape_gap,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    PAGE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    HAS_APE: tl.constexpr,
    V_T: tl.constexpr,
    PRECISION: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    b = tl.program_id(0)
    blk = tl.program_id(1)
    kvh = tl.program_id(2)
    lo = tl.load(cu_ptr + b)
    n_q = tl.load(cu_ptr + b + 1) - lo
    if blk * BLOCK_M >= n_q:
        return
    q_start = tl.load(q_start_ptr + b)
    # Rows r = token * BLOCK_G + head of the GQA group: BLOCK_M x BLOCK_G rows of one tile.
    r = tl.arange(0, BLOCK_M * BLOCK_G)
    tok = blk * BLOCK_M + r // BLOCK_G
    g = r % BLOCK_G
    row_ok = (tok < n_q) & (g < GROUP)
    qpos = q_start + tok
    last_pos = q_start + tl.minimum(n_q, (blk + 1) * BLOCK_M) - 1
    q_rows = q_ptr + (lo + tok).to(tl.int64)[:, None] * s_qt + (kvh * GROUP + g).to(tl.int64)[:, None] * s_qh
    qa, qb = _load_pairs(q_rows, s_qd, row_ok[:, None], BLOCK_HALF, HALF, INTERLEAVED)
    # Tiles are widened to q's dtype as they load (FP8 pages, docs/design.md "FP8 KV cache"; else the same dtype).
    ty = q_ptr.dtype.element_ty

    m_i = tl.full([BLOCK_M * BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M * BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_M * BLOCK_G, BLOCK_D], tl.float32)
    slot = tl.arange(0, PAGE)
    d = tl.arange(0, BLOCK_D)
    j = tl.arange(0, BLOCK_HALF)
    n_pages = tl.load(num_pages_ptr + b)
    row = b.to(tl.int64) * s_tab_row
    for i in range(0, n_pages):
        start = tl.load(starts_ptr + row + i)
        # A page wholly after the block's last query is masked for every row: skipping it is exact.
        if start <= last_pos:
            page = tl.load(pages_ptr + row + i).to(tl.int64)
            delta = tl.load(deltas_ptr + row + i).to(tl.int64)
            valid = tl.load(valid_ptr + row + i)
            first = tl.load(firsts_ptr + row + i)
            key_ok = (slot >= first) & (slot < first + valid)
            kpos = start + slot - first
            k_rows = k_ptr + page * s_kp + slot.to(tl.int64)[:, None] * s_ks + kvh * s_kh
            ka, kb = _load_pairs(k_rows, s_kd, key_ok[:, None], BLOCK_HALF, HALF, INTERLEAVED)
            if delta != 0:
                # The cached key moved to its logical position and rounded to the KV dtype: block mode's copy.
                cos = tl.load(cos_ptr + delta * s_tab + j, mask=j < HALF, other=1.0)[None, :]
                sin = tl.load(sin_ptr + delta * s_tab + j, mask=j < HALF, other=0.0)[None, :]
                ra, rb = _rotate(ka, kb, cos, sin)
                ka, kb = to_cache(ra, k_ptr.dtype.element_ty), to_cache(rb, k_ptr.dtype.element_ty)
            ka, kb = ka.to(ty), kb.to(ty)
            s = _dot(qa, tl.trans(ka), tl.zeros([BLOCK_M * BLOCK_G, PAGE], tl.float32), PRECISION, INTERPRETED)
            s = _dot(qb, tl.trans(kb), s, PRECISION, INTERPRETED)
            s = s * scale
            if HAS_APE:
                inv_temp = tl.load(inv_temp_ptr + row + i)
                log_scale = tl.load(inv_temp_ptr + ape_gap + row + i)
                s = s * inv_temp + log_scale
            visible = key_ok[None, :] & (kpos[None, :] <= qpos[:, None])
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            # Rows with nothing visible yet keep m = -inf; their factors are taken as 1 and 0.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            # V's pages stored transposed (V_T, kernels/paged.py) load as [channels, slots] rows (decode_tiles.v_tile)
            v = v_tile(
                v_ptr + kvh * s_vh, page, s_vp, slot, s_vs, d, s_vd, key_ok, d < HEAD_DIM, ty, V_T, HEAD_DIM, BLOCK_D
            )
            # p is rounded to the tile's dtype for the product with V (fp32 keeps it whole)
            acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], PRECISION, INTERPRETED)
            m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_rows = out_ptr + (lo + tok).to(tl.int64)[:, None] * s_ot + (kvh * GROUP + g).to(tl.int64)[:, None] * s_oh
    tl.store(
        o_rows + d[None, :] * s_od, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & (d[None, :] < HEAD_DIM)
    )


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: PagedBatch,
    tables: RopeTables | None,
    scale: float,
) -> torch.Tensor:
    """The paged contract (kernels/paged.py) for prefill and decode alike: q [total_q, Hq, D] rotated at the query
    positions -> out [total_q, Hq, D] in q's dtype. Matches reference.paged_attention(..., invariant=True)."""
    total, hq, dim = q.shape
    page_size, hkv = k_cache.shape[1], k_cache.shape[2]
    group = hq // hkv
    check_dtypes(q, k_cache, v_cache)
    out = torch.empty_like(q)
    if total == 0 or batch.batch_size == 0:
        return out
    if tables is None:  # every delta is 0: the kernel never reads the table
        cos = sin = torch.zeros(1, dim // 2, dtype=torch.float32, device=q.device)
        interleaved = False
    else:
        cos, sin, interleaved = tables.cos, tables.sin, tables.interleaved
    if batch.pages.stride(1) != 1:
        raise ValueError("the page tables need a unit last stride")
    # Always read (zeros where the batch has none): eager steps and CUDA graphs, which always carry them, then run
    # the same compiled kernel.
    firsts = batch.firsts
    if firsts is None:  # zeros in the strides of pages: a view of padded rows (engine/graph_inputs.py) is not dense
        firsts = torch.empty_strided(batch.pages.shape, batch.pages.stride(), dtype=batch.pages.dtype, device=q.device)
        firsts.zero_()
    for name, t in (("deltas", batch.deltas), ("valid", batch.valid), ("starts", batch.starts), ("firsts", firsts)):
        if t.stride() != batch.pages.stride():
            raise ValueError(f"{name} needs the strides of pages")
    ape = batch.inv_temps is not None
    grid = (batch.batch_size, cdiv(max(batch.max_q, 1), ATTN_BLOCK_M), hkv)
    _attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        batch.cu_seqlens_q,
        batch.q_start,
        batch.pages,
        batch.deltas,
        batch.valid,
        batch.starts,
        firsts,
        batch.num_pages,
        batch.inv_temps if ape else cos,
        cos,
        sin,
        batch.batch_size,
        scale,
        *q.stride(),
        *out.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        batch.pages.stride(0),
        cos.stride(0),
        batch.ape_gap,
        GROUP=group,
        BLOCK_G=max(triton.next_power_of_2(group), 1),
        BLOCK_M=ATTN_BLOCK_M,
        PAGE=page_size,
        HEAD_DIM=dim,
        HALF=dim // 2,
        BLOCK_HALF=triton.next_power_of_2(dim // 2),
        BLOCK_D=triton.next_power_of_2(dim),
        INTERLEAVED=interleaved,
        HAS_APE=ape,
        V_T=v_transposed(v_cache),
        PRECISION=_precision(q.dtype),
        INTERPRETED=interpreting(),
        num_warps=4,
    )
    return out
