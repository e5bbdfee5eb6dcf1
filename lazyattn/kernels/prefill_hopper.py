"""Short-question prefill attention for Hopper GPUs, written in Gluon (Triton's explicit-layout dialect).

The case: a question of a few dozen tokens over thousands of cached document keys (the cached RAG request's
first token). kernels/prefill.py's FlashAttention-2 tile loop runs it at about a third of the memory bandwidth: each
program's two warpgroups issue the Q·Kᵀ product, wait for it, run the softmax while the tensor cores idle, then
issue P·V, and the same warps compute the addresses of and issue every K/V copy (docs/kernels.md, Sessions 5, 8 and
9). This kernel splits that work across warps (warp specialisation):

- a load warp copies each page's K and V tiles with the copy engine (TMA, one instruction per tile) into a ring of
  STAGES shared-memory slots, each slot guarded by two mbarriers (`ready`: the bytes have landed; `empty`: both
  consumers are done with it);
- two consumer warpgroups each own half of the program's 128 query rows (GQA-packed: row r is query r // GROUP,
  head r % GROUP of the kv head's group) and run the online softmax over every tile. Each waits only for its own
  products, so while one runs its softmax the other's products keep the tensor cores busy, and neither issues a load.

Same semantics and contract as `prefill.prefill_attention` (kernels/paged.py; ground truth `reference.paged_attention`)
for the calls it takes (`supports`): 16-bit q over pages of its dtype or FP8 e4m3, head_dim 128, pages of 64 slots
laid out as the pool lays them out (a page's slots, heads and dims contiguous), 128 query rows per program. Relinked
first-slot offsets (`firsts`, which the engine's CUDA graphs always pass, zeros where nothing is relinked) mask the
skipped slots.

Each consumer runs FlashAttention-3's order: Q·Kᵀ of tile t + 1 and P·V of tile t issued back to back, tile t + 1's
softmax while the tensor cores run P·V t. No instruction may read a product's registers before the wait that retires
it: ptxas then serialises every wgmma of the kernel (its C7514 note), which is what made an earlier version of this
kernel slow.

Deferred RoPE: the program's pages are walked in order; when a page's delta differs from the one the consumer's Q
tile holds, the consumer rotates its rows of q by -delta in fp32 (the same expression as prefill_tiles.derotated_q;
delta 0 rotates by cos 1, sin 0, which leaves q as it is) and stores the result as the Q operand in shared memory. A
document is one run of equal delta, so that happens once per document a program's range touches: no rotated copies
of q are read. Each consumer loads its rows of q from memory once and keeps them in shared memory (`q_raw`); each
element's rotation partner is a register permutation (`_partner`). Reloading q and its partners from L2 at every
document was measured slower on an H100 (docs/benchmarks.md, "Kernel constants").

Pages that are not full: the copy engine loads all 64 slots, and the slots outside a page's keys may hold anything,
NaN included (kernels/paged.py). Their scores are masked to -inf, but a probability of 0 times a NaN in V is NaN, so
for such a page each consumer zeroes those rows of the V tile in place before its product (`_mask_v`). Full pages,
nearly all of a document, skip that.

FP8 pages (kv_cache_dtype=fp8_e4m3, docs/design.md "FP8 KV cache"): wgmma multiplies fp8 only by fp8 (q would lose
all but 3 bits) with B K-major (V's [slots, d] tile is not), so the tiles are widened to float16 in shared memory
before the products, as decode widens them in registers (kv_dtype.fp8_tile_dtype: exact, every e4m3 value is a
float16 value; q, rotated in fp32, and P are rounded to float16 for the dots, 3 bits finer than bfloat16). The load
warp becomes a warpgroup (`_widen_tiles`; the kernel pads the load warp's group to four warps anyway): the copy engine
lands each page's K and V in a ring of fp8 slots, half the bytes of a 16-bit tile from memory, and the warpgroup
widens them into the ring of float16 tiles that the consumers read as they read 16-bit pages' tiles (same barriers,
same `_mask_v`). Widening a tile reads 16 KiB of shared memory and writes 32; the consumers' products read 96. On an
H200, in CUDA graphs, 1.07x bf16 pages' time at RAG batch 1 and 1.02x at batch 8
(benchmarks/results/kernels_fp8_prefill_h200.md).

Splits: a program takes one of `num_splits` balanced ranges of the block's visible pages and always writes a
normalised partial output and its log2-sum-exp, which prefill's `combine_kernel` merges (also for one split).

Programmatic dependent launch (kernels/launch.py): the scans that find a program's entry and pages, the barrier
set-up and the first tile's tables and rotation run before the wait; q and the question's K/V are the previous
kernel's writes, read after it.

Triton 3.6 (the GPU machine's) turns constexprs passed to warp_specialize's partitions into run-time values, and
then fails to lower some branches on them; so the partitions take group, head count and the delta flags as
run-time values and branch on none of them.

Who calls it: the engine's GPU backend (kernels/triton_backend.py) for every short prefill call it `supports`, with
`num_splits` (which the prefill CUDA graphs fix per bucket); `prefill.prefill_attention` itself stays prefill.py's
kernel. LAZYATTN_GLUON_PREFILL=0 switches it off. Measured on an H100, the RAG case per layer: this kernel, even
without the two changes below, is faster than prefill.py's at batch 1 to 8 (most at batch 2 and 4); keeping q in
shared memory with the one-warp merge, and storing the partial through the freed Q buffers rather than through the
compiler's scratch, each made it faster again at batch 1 and 8 (docs/benchmarks.md, "Kernel constants"). Where that
leaves it against the hardware limit and FlashInfer: docs/kernels.md, "The request path's attention targets (H100)".
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from lazyattn import envs
from lazyattn.kernels.kv_dtype import FP8, is_fp8, tile_dtype
from lazyattn.kernels.launch import LOG2E, _capability_of, interpreting, pdl_options, sm_count
from lazyattn.kernels.page_scan import BLOCK_B, find_block
from lazyattn.kernels.paged import HOPPER_MAX_QUESTION, PagedBatch, cdiv, v_transposed
from lazyattn.kernels.prefill import combine_kernel, query_slots
from lazyattn.kernels.rope import RopeTables

ROWS = 128  # query rows per program: two consumer warpgroups of 64
HEAD_DIM = 128
PAGE_SIZE = 64  # one K/V tile is one page
STAGES = 4  # K/V tiles in flight per program (32 KiB each; FP8 pages: 16 KiB landing slots)
# FP8 pages: float16 K/V tiles widened ahead of the consumers (32 KiB each). With two, the widening of tile t + 2
# waits for both consumers to release tile t, which they do only after issuing Q·Kᵀ t + 1: every tile would wait for
# a widening. Three fill the shared memory: 32 + 32 (Q) + 4 x 16 (landing) + 3 x 32 KiB.
WIDE_STAGES = 3
# The longest entry (query positions) of the calls it takes whatever the entry reads, at any total: a batch of
# questions over cached documents. A longer entry only where it too is a question over placed documents
# (EntryPages.reads_documents, PagedBatch.max_prompt_q): there this kernel is faster than prefill.py's, which is faster
# on long causal prompts and their chunks (benchmarks/results/kernels_long_questions_h200.md).
MAX_QUESTION = HOPPER_MAX_QUESTION
MAX_SPLITS = 16
_BLOCK_P = 256  # pages scanned per step when it counts its visible pages
# Registers per thread of the consumer warpgroup that runs as a worker, and of the load warp. The kernel's cap
# (maxnreg) sets the default partition's: 3 warpgroups x 128 threads x 168 fit the SM's 64K registers, and the
# load warp's group gives its share to the consumers. Below 232 the consumers spill (two Q·Kᵀ tiles live at once).
_CONSUMER_REGS = 240
_LOADER_REGS = 24
_MAXNREG = 168
# FP8 pages: the widening warpgroup's registers (it widens 16 rows of a tile at a time), taken from the consumer
# worker's, which keeps 232: ptxas spills nothing at these counts.
_WIDEN_CONSUMER_REGS = 232
_WIDEN_REGS = 32


def enabled() -> bool:
    """The engine's short prefill calls take this kernel where it `supports` them, unless LAZYATTN_GLUON_PREFILL=0
    (the settings the engine activated, lazyattn/envs.py)."""
    return envs.active().gluon_prefill


def shape_supported(
    max_q: int, q_heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, page_size: int, device: torch.device
) -> bool:
    """The part of `supports` a launch's shapes decide (what a CUDA graph's bucket knows before any call, its tokens
    bounding `max_q`): a Hopper GPU, pages (`dtype`, the pool's) of 16 bits or FP8, head_dim 128, pages of 64, no entry
    with more than MAX_QUESTION query positions (`max_q`; the call's total is not bounded), the query heads of a kv head
    filling 128 rows with whole positions; and the kernel switched on."""
    if not enabled() or interpreting() or device.type != "cuda":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _capability_of(index)[0] != 9 or dtype not in _GL_DTYPES or head_dim != HEAD_DIM or page_size != PAGE_SIZE:
        return False
    group = q_heads // kv_heads if kv_heads else 0
    return 0 < max_q <= MAX_QUESTION and q_heads % kv_heads == 0 and 0 < group <= 16 and ROWS % group == 0


def takes_dtypes(q_dtype: torch.dtype, pages: torch.dtype) -> bool:
    """The part of `supports` the dtypes decide (what a CUDA graph's bucket knows from the model and the pool): a
    16-bit q over pages of its own dtype or FP8 ones."""
    return q_dtype in _Q_DTYPES and (pages == q_dtype or is_fp8(pages))


def supports(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch) -> bool:
    """Whether this kernel takes the call (else prefill.py's does): `shape_supported` for its longest entry that is
    not a question over placed documents (`longest_prompt`), `takes_dtypes` with k and v of one dtype, pages stored
    as the pool stores them."""
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.dtype != k_cache.dtype:
        return False
    if not takes_dtypes(q.dtype, k_cache.dtype):
        return False
    pages, longest = k_cache.dtype, longest_prompt(batch)
    if not shape_supported(longest, q.shape[1], k_cache.shape[2], q.shape[2], pages, k_cache.shape[1], q.device):
        return False
    v_ok = takes_layout(v_cache) or (is_fp8(pages) and takes_transposed_layout(v_cache))
    return q.stride(2) == 1 and takes_layout(k_cache) and v_ok


def longest_prompt(batch: PagedBatch) -> int:
    """The entry length `shape_supported` judges a call by: its longest entry (`max_q`), or where the batch counted
    its prompts (`max_prompt_q`) and every entry past MAX_QUESTION is a question over placed documents, at most
    MAX_QUESTION: such an entry runs as one of many short questions does."""
    if batch.max_prompt_q is None:
        return batch.max_q
    return min(batch.max_q, max(batch.max_prompt_q, MAX_QUESTION))


def num_splits(
    total_q: int, q_heads: int, kv_heads: int, device: torch.device, entries: int = 1, max_q: int | None = None
) -> int:
    """Splits of a launch over `total_q` rows in `entries` entries of at most `max_q` positions (default total_q):
    one program per SM (213 KiB of shared memory each) over the query blocks the entries fill, at most MAX_SPLITS.
    Blocks are each entry's own: an entry of 16 positions fills a block of 32 alone (counting cdiv(total_q, 32)
    blocks instead, 4 questions of 16 tokens take 8 splits over 6 query slots, three waves, slower than this count
    on an H100). Measured on an H100: 16 at batch 1 (24 starts a second wave, slower), 4 at batch 4, 2 at batch 8
    (questions of 32 tokens); docs/benchmarks.md, "Kernel constants".

    The prefill CUDA graphs pass neither (engine/prefill_graphs.py): a bucket knows its tokens and entries, not their
    lengths, and the bound for any lengths, cdiv(T, 32) + E - 1 blocks, would halve the splits of the common batch of
    32-token questions (8 entries: 15 blocks, 1 split, where they fill 8 and take 2)."""
    max_q = total_q if max_q is None else max_q
    positions = ROWS // (q_heads // kv_heads)
    blocks = min(cdiv(total_q, positions) + entries - 1, entries * cdiv(max(1, max_q), positions))
    return max(1, min(MAX_SPLITS, sm_count(device) // (blocks * kv_heads)))


def takes_layout(cache: torch.Tensor) -> bool:
    """A page's slots, heads and dims contiguous (the pool's `token` layout, cache/page_pool.py): the copy engine then
    reads a tile as a [64, head_dim] box of the [pages * 64, heads * head_dim] matrix."""
    _, page_size, heads, dim = cache.shape
    return cache.stride() == (page_size * heads * dim, heads * dim, dim, 1) and cache.data_ptr() % 16 == 0


def takes_transposed_layout(v_cache: torch.Tensor) -> bool:
    """V's pages stored transposed, as the pool stores FP8 pages' V (kernels/paged.py, `v_transposed`): a page's slots
    contiguous for each kv head and channel, pages one after another. The copy engine then reads a tile as a
    [head_dim, 64] box of the [pages * heads * head_dim, 64] matrix."""
    _, page_size, heads, dim = v_cache.shape
    return v_cache.stride() == (heads * dim * page_size, 1, dim * page_size, page_size) and v_cache.data_ptr() % 16 == 0


def _descriptor(cache: torch.Tensor) -> TensorDescriptor:
    """The copy engine's view of a cache that `takes_layout` or `takes_transposed_layout`."""
    pages, page_size, heads, dim = cache.shape
    rows, cols, box = pages * page_size, heads * dim, [PAGE_SIZE, HEAD_DIM]
    if v_transposed(cache):
        rows, cols, box = pages * heads * dim, page_size, [HEAD_DIM, PAGE_SIZE]
    flat = cache.as_strided((rows, cols), (cols, 1))
    layout = gl.NVMMASharedLayout.get_default_for(box, _GL_DTYPES[cache.dtype])
    return TensorDescriptor(flat, [rows, cols], [cols, 1], box, layout)


_Q_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}
_GL_DTYPES = {**_Q_DTYPES, FP8: gl.float8e4nv}  # the pages'
# A barrier over the calling warps (a partition's, inside a warp-specialised region): `thread_barrier` in Triton 3.6,
# `barrier` since.
_warps_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
# A copy-engine load of a tile into shared memory: `async_copy_global_to_shared` in 3.6, `async_load` since.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


# A warpgroup's layout of [head_dim, 64] V^T tiles (pages stored transposed): 32 rows of 64 slots a pass.
_VT_LAYOUT = gl.constexpr(
    gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[8, 4], warps_per_cta=[4, 1], order=[1, 0])
)

# The same numbers as constexprs, for the kernels.
_KROWS = gl.constexpr(ROWS)
_KHEAD_DIM = gl.constexpr(HEAD_DIM)
_KPAGE_SIZE = gl.constexpr(PAGE_SIZE)
_KSTAGES = gl.constexpr(STAGES)
_KBLOCK_B = gl.constexpr(BLOCK_B)
_KBLOCK_P = gl.constexpr(_BLOCK_P)
_KCONSUMER_REGS = gl.constexpr(_CONSUMER_REGS)
_KLOADER_REGS = gl.constexpr(_LOADER_REGS)
_KWIDE_STAGES = gl.constexpr(WIDE_STAGES)
_KWIDEN_CONSUMER_REGS = gl.constexpr(_WIDEN_CONSUMER_REGS)
_KWIDEN_REGS = gl.constexpr(_WIDEN_REGS)


# prefill.py's entry lookup, compiled as Gluon: the caller passes its arange, laid out for this kernel.
_find_block = gluon.jit(find_block.fn)


@gluon.jit
def _count_pages(starts_row, n_pages, last_pos, BLOCK_P: gl.constexpr, layout: gl.constexpr):
    """Pages whose first position is <= last_pos (a prefix: starts are increasing)."""
    count = 0
    for lo in range(0, n_pages, BLOCK_P):
        i = lo + gl.arange(0, BLOCK_P, layout=layout)
        inside = i < n_pages
        count += gl.sum(((gl.load(starts_row + i, mask=inside, other=0) <= last_pos) & inside).to(gl.int32), axis=0)
    return count


@gluon.jit
def _rotation(Cos, Sin, delta, max_position, interleaved, layout: gl.constexpr):
    """The cos and signed sin of R_{-delta} per dim of a Q row, [head_dim] in SliceLayout(0, layout): the table rows
    depend on the delta alone (neither on q nor on the kernels before this one), so they load ahead of their use."""
    HALF: gl.constexpr = _KHEAD_DIM // 2
    dims = gl.arange(0, _KHEAD_DIM, layout=gl.SliceLayout(0, layout))
    pair = gl.where(interleaved, dims // 2, dims % HALF)
    leading = gl.where(interleaved, (dims % 2) == 0, dims < HALF)
    # A delta beyond the table is a caller bug (wrong result); clamping keeps the read in bounds.
    table_row = gl.minimum(delta, max_position - 1).to(gl.int64) * HALF
    cos = gl.load(Cos + table_row + pair)
    sin = gl.load(Sin + table_row + pair)
    # R_{-delta}: a' = a c + b s (leading member), b' = b c - a s (trailing member).
    return cos, gl.where(leading, sin, -sin)


@gluon.jit
def _partner(q, interleaved):
    """Each element's rotation partner, [rows, head_dim] like q: element 2j <-> 2j + 1 (interleaved pairs) or j <->
    j + head_dim / 2 (half-split pairs). In the consumers' load layout both members of a pair sit in one thread (8
    consecutive dims a thread, the two halves in its two column steps), so the swap is a register permutation."""
    M: gl.constexpr = q.shape[0]
    D: gl.constexpr = q.shape[1]
    a, b = gl.split(gl.reshape(q, [M, D // 2, 2]))
    swapped_pairs = gl.reshape(gl.join(b, a), [M, D])
    lo, hi = gl.split(gl.permute(gl.reshape(q, [M, 2, D // 2]), [0, 2, 1]))
    swapped_halves = gl.reshape(gl.permute(gl.join(hi, lo), [0, 2, 1]), [M, D])
    layout: gl.constexpr = q.type.layout
    return gl.where(interleaved, gl.convert_layout(swapped_pairs, layout), gl.convert_layout(swapped_halves, layout))


@gluon.jit
def _store_q(q_smem, q, cos, sin, interleaved):
    """Write q [rows, head_dim] (this warpgroup's rows as the RoPE launch left them), rotated by `_rotation`'s cos and
    sin (fp32 math, rounded once to the operand's dtype: q's, float16 over FP8 pages; delta 0 then leaves it as it
    is, cos 1, sin 0), as the Q·Kᵀ operand."""
    rotated = q.to(gl.float32) * cos[None, :] + _partner(q, interleaved).to(gl.float32) * sin[None, :]
    q_smem.store(rotated.to(q_smem.dtype))
    # The tensor cores read the tile through the async proxy, after every warp of the group has written its part.
    fence_async_shared()
    _warps_barrier()


@gluon.jit
def _mask_v(v_tile, first, n_keys, layout: gl.constexpr):
    """Set the slots of the V tile outside [first, first + n_keys) to 0, in place, before it is the P·V operand of a
    page that is not full. Those slots may hold anything, NaN included (kernels/paged.py), and a product carries a
    NaN through a probability of 0; the copy engine cannot skip them. Both consumers mask the tile they share, each
    before its own product: they write the same values, so neither can see the other's half-done writes as wrong."""
    if v_tile.type.shape[0] != _KPAGE_SIZE:  # V^T, [head_dim, 64]: the slots are its columns
        slots = gl.arange(0, _KPAGE_SIZE, layout=gl.SliceLayout(0, _VT_LAYOUT))
        keep = (slots >= first) & (slots < first + n_keys)
        v = v_tile.load(_VT_LAYOUT)
        v_tile.store(gl.where(keep[None, :], v, gl.zeros_like(v)))
    else:
        slots = gl.arange(0, _KPAGE_SIZE, layout=gl.SliceLayout(1, layout))
        keep = (slots >= first) & (slots < first + n_keys)
        v = v_tile.load(layout)
        v_tile.store(gl.where(keep[:, None], v, gl.zeros_like(v)))
    fence_async_shared()
    _warps_barrier()


@gluon.jit
def _softmax_tile(
    s, m_i, l_i, n_keys, first, key0, keys, q_pos, q_first, qk_scale, dtype: gl.constexpr, p_layout: gl.constexpr
):
    """One tile's online-softmax step: the probabilities as the P·V operand, the factor that rescales what was
    accumulated, and the new running max and sum. The page's keys are slots [first, first + n_keys), slot t at
    position key0 + t - first; other slots may hold anything; keys past the diagonal are the question's own later
    tokens; a tile of 0 keys leaves m and l as they were (factor 1, probabilities 0)."""
    if (n_keys < _KPAGE_SIZE) | (key0 - first + _KPAGE_SIZE - 1 > q_first):  # first > 0 implies n_keys < 64
        slot = keys[None, :]
        visible = (slot >= first) & (slot < first + n_keys) & (key0 - first + slot <= q_pos[:, None])
        s = gl.where(visible, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    # Rows with nothing visible yet keep m = -inf; subtracting 0 instead avoids inf - inf = NaN.
    m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
    prob = gl.exp2(s * qk_scale - m_ref[:, None])
    alpha = gl.exp2(m_i - m_ref)
    l_new = l_i * alpha + gl.sum(prob, axis=1)
    return gl.convert_layout(prob.to(dtype), p_layout), alpha, m_new, l_new


@gluon.jit
def _consume(
    Q,
    WsO,
    WsLse,
    Cos,
    Sin,
    deltas_row,
    valid_row,
    starts_row,
    firsts_row,
    q_smem,
    q_raw,
    k_bufs,
    v_bufs,
    ready,
    empty,
    row0,
    first_row,
    q_len,
    pos0,
    kv_head,
    split,
    page_lo,
    n_tiles,
    total_q,
    max_position,
    stride_qt,
    stride_qh,
    qk_scale,
    group,
    num_heads,
    apply_delta,
    interleaved,
    has_first,
    half,
):
    """One consumer warpgroup (a partition of the kernel's warp-specialised region): online softmax of its 64 query
    rows, half `half` of the program's 128 (q_smem: its Q operand; q_raw: its rows of q as loaded), over the program's
    tiles, then its partial (split calls) or its output rows."""
    M: gl.constexpr = _KROWS // 2
    STAGE_COUNT: gl.constexpr = k_bufs.type.shape[0]
    V_T: gl.constexpr = v_bufs.type.shape[1] != _KPAGE_SIZE  # V^T tiles, [head_dim, 64]: P·V reads them transposed
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, _KPAGE_SIZE, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, _KHEAD_DIM, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    load_layout: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 8], threads_per_warp=[4, 8], warps_per_cta=[4, 1], order=[1, 0]
    )

    # Row identities in each layout that uses them.
    qi_load, head_load, ok_load = _row_ids(half, M, group, first_row, q_len, kv_head, load_layout)
    token_load = (row0 + qi_load).to(gl.int64)
    r_s = half * M + gl.arange(0, M, layout=gl.SliceLayout(1, s_layout))
    q_pos = pos0 + first_row + r_s // group
    q_first = pos0 + first_row
    keys = gl.arange(0, _KPAGE_SIZE, layout=gl.SliceLayout(0, s_layout))

    m_i = gl.full([M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([M], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([M, _KHEAD_DIM], gl.float32, layout=o_layout)
    s_zero = gl.zeros([M, _KPAGE_SIZE], gl.float32, layout=s_layout)
    # The loop runs FlashAttention-3's order: issue Q·Kᵀ t + 1 and P·V t back to back, wait for the first and run
    # tile t + 1's softmax while the tensor cores run P·V t, then wait for that and rescale the accumulator. Products
    # retire in issue order, so "all but the last one" retires Q·Kᵀ t + 1. No instruction reads a product's registers
    # before the wait that retires it: one such read makes ptxas serialise every wgmma of the kernel (C7514).
    # Prologue: tile 0's Q, product and softmax. A program without tiles issues one product over whatever the slot
    # holds; its keys count 0, so nothing of it is kept. Past the last tile the same holds for the extra product.
    # Before the wait for the kernel before this one (programmatic dependent launch): everything that is not its
    # write, i.e. the host's tables and the first tile's rotation. q is its write, loaded after.
    has_tiles = n_tiles > 0
    held = gl.load(deltas_row + page_lo, mask=has_tiles, other=0) * apply_delta  # the delta the Q tile holds
    cos, sin = _rotation(Cos, Sin, held, max_position, interleaved, load_layout)
    n_keys = gl.load(valid_row + page_lo, mask=has_tiles, other=0)
    first = gl.load(firsts_row + page_lo, mask=has_tiles & (has_first != 0), other=0)
    key0 = gl.load(starts_row + page_lo, mask=has_tiles, other=0)
    # The delta of the tile after the next one: a new document's rotation waits on one round of loads (its table
    # rows), not two. (Loading those rows a tile ahead too was slower: 4 more live vectors, docs/kernels.md.)
    delta_next = gl.load(deltas_row + page_lo + 1, mask=n_tiles > 1, other=0) * apply_delta
    _wait_for_producers()
    # q as the RoPE launch left it, kept in shared memory for the documents after the first: rotating it again reads
    # no global memory (a reload from L2 cost time at every document, docs/benchmarks.md, "Kernel constants").
    q_rows = Q + token_load * stride_qt + head_load * stride_qh
    dims = gl.arange(0, _KHEAD_DIM, layout=gl.SliceLayout(0, load_layout))
    q_in = gl.load(q_rows[:, None] + dims[None, :], mask=ok_load[:, None], other=0.0)
    q_raw.store(q_in)
    _store_q(q_smem, q_in, cos, sin, interleaved)
    mbarrier.wait(ready.index(0), 0, pred=has_tiles)
    s = warpgroup_mma(q_smem, k_bufs.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    p_op, alpha, m_i, l_i = _softmax_tile(
        s, m_i, l_i, n_keys, first, key0, keys, q_pos, q_first, qk_scale, k_bufs.dtype, p_layout
    )
    for t in range(n_tiles):
        stage = t % STAGE_COUNT
        # Tile t's V, masked in place where the page is not full (P·V t - 1 has retired).
        if n_keys < _KPAGE_SIZE:
            _mask_v(v_bufs.index(stage), first, n_keys, load_layout)
        # The next tile: its metadata and Q rotated for its delta (Q·Kᵀ t has retired).
        more = t + 1 < n_tiles
        page = page_lo + t + 1
        delta = gl.where(more, delta_next, held)
        delta_next = gl.load(deltas_row + page + 1, mask=t + 2 < n_tiles, other=0) * apply_delta
        if delta != held:
            cos, sin = _rotation(Cos, Sin, delta, max_position, interleaved, load_layout)
            _store_q(q_smem, q_raw.load(load_layout), cos, sin, interleaved)
            held = delta
        n_keys = gl.load(valid_row + page, mask=more, other=0)
        first = gl.load(firsts_row + page, mask=more & (has_first != 0), other=0)
        key0 = gl.load(starts_row + page, mask=more, other=0)
        next_stage = (t + 1) % STAGE_COUNT
        mbarrier.wait(ready.index(next_stage), ((t + 1) // STAGE_COUNT) & 1, pred=more)
        s = warpgroup_mma(q_smem, k_bufs.index(next_stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if V_T:
            acc = warpgroup_mma(p_op, v_bufs.index(stage).permute((1, 0)), acc, is_async=True)
        else:
            acc = warpgroup_mma(p_op, v_bufs.index(stage), acc, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        p_op, alpha, m_i, l_i = _softmax_tile(
            s, m_i, l_i, n_keys, first, key0, keys, q_pos, q_first, qk_scale, k_bufs.dtype, p_layout
        )
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(stage), count=1)  # tile t's K and V are read
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]

    # The partial: normalised output and log2-sum-exp (-inf when the split saw no key), stored from blocked layouts
    # (Triton 3.6 cannot lower stores from the products' layouts). The output gets there through this consumer's two
    # Q buffers, free once its last product has retired: each takes one half of the dims as fp32, in one round (a
    # plain layout conversion of the 32 KiB went through the compiler's small scratch in a dozen rounds, each behind
    # a barrier, which showed in every layer's time: docs/benchmarks.md, "Kernel constants").
    row_layout: gl.constexpr = gl.SliceLayout(1, load_layout)
    l_rows = gl.convert_layout(l_i, row_layout)
    l_safe = gl.where(l_rows == 0.0, 1.0, l_rows)  # m_i = -inf already marks a row that saw no key
    mine = split.to(gl.int64) * total_q * num_heads + token_load * num_heads + head_load
    gl.store(WsLse + mine, gl.convert_layout(m_i, row_layout) + gl.log2(l_safe), mask=ok_load)
    if n_tiles > 0:  # a split without pages leaves its output unwritten: the merge skips it
        HALF: gl.constexpr = _KHEAD_DIM // 2
        flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
        low, high = gl.split(gl.permute(gl.reshape(acc, [M, 2, HALF]), [0, 2, 1]))
        low_smem = _as_fp32(q_raw, M, HALF, flat)
        high_smem = _as_fp32(q_smem, M, HALF, flat)
        low_smem.store(low)
        high_smem.store(high)
        _warps_barrier()
        half_layout: gl.constexpr = gl.BlockedLayout(
            size_per_thread=[1, 4], threads_per_warp=[2, 16], warps_per_cta=[4, 1], order=[1, 0]
        )
        qi, head, ok = _row_ids(half, M, group, first_row, q_len, kv_head, half_layout)
        rows = split.to(gl.int64) * total_q * num_heads + (row0 + qi).to(gl.int64) * num_heads + head
        l_half = gl.convert_layout(l_safe, gl.SliceLayout(1, half_layout))
        half_dims = gl.arange(0, HALF, layout=gl.SliceLayout(0, half_layout))
        ptrs = WsO + rows[:, None] * _KHEAD_DIM + half_dims[None, :]
        gl.store(ptrs, low_smem.load(half_layout) / l_half[:, None], mask=ok[:, None])
        gl.store(ptrs + HALF, high_smem.load(half_layout) / l_half[:, None], mask=ok[:, None])


@gluon.jit
def _row_ids(half, M: gl.constexpr, group, first_row, q_len, kv_head, layout: gl.constexpr):
    """(token offset, head, in range) of a consumer's M query rows in `layout`'s row slice: row r of half `half` is
    query first_row + r // group, head kv_head * group + r % group of the kv head's group."""
    r = half * M + gl.arange(0, M, layout=gl.SliceLayout(1, layout))
    qi = first_row + r // group
    return qi, kv_head * group + r % group, qi < q_len


if hasattr(gl.shared_memory_descriptor, "reinterpret"):  # Triton after 3.6

    @gluon.jit
    def _as_fp32(buf, rows: gl.constexpr, cols: gl.constexpr, layout: gl.constexpr):
        """`buf`'s bytes seen as an fp32 [rows, cols] buffer of `layout`."""
        return buf.reinterpret(gl.float32, [rows, cols], layout)
else:

    @gluon.jit
    def _as_fp32(buf, rows: gl.constexpr, cols: gl.constexpr, layout: gl.constexpr):
        """`buf`'s bytes seen as an fp32 [rows, cols] buffer of `layout`."""
        return buf._reinterpret(gl.float32, [rows, cols], layout)


@gluon.jit
def _load_tiles(k_desc, v_desc, pages_row, k_bufs, v_bufs, ready, empty, kv_head, page_lo, n_tiles):
    """The load warp: page t's K and V tiles into slot t % _KSTAGES once both consumers have released it. The page
    ids are the host's; the pages themselves wait for the kernel before this one, which writes the question's."""
    STAGE_COUNT: gl.constexpr = k_bufs.type.shape[0]
    column = kv_head * _KHEAD_DIM
    page_next = gl.load(pages_row + page_lo, mask=n_tiles > 0, other=0)
    _wait_for_producers()
    for t in range(n_tiles):
        page = page_next
        page_next = gl.load(pages_row + page_lo + t + 1, mask=t + 1 < n_tiles, other=0)
        stage = t % STAGE_COUNT
        # Slots start free: the first pass waits on the phase before the barrier's first.
        mbarrier.wait(empty.index(stage), ((t // STAGE_COUNT) & 1) ^ 1)
        mbarrier.expect(ready.index(stage), 2 * k_desc.block_type.nbytes)
        _tma_load(k_desc, [page * _KPAGE_SIZE, column], ready.index(stage), k_bufs.index(stage))
        _tma_load(v_desc, [page * _KPAGE_SIZE, column], ready.index(stage), v_bufs.index(stage))


@gluon.jit
def _widen_tiles(
    k_desc, v_desc, pages_row, k_landed, v_landed, landed, k_bufs, v_bufs, ready, empty, kv_head, page_lo, n_tiles
):
    """FP8 pages, the load warpgroup: page t's K and V tiles land in fp8 slot t % LANDING (the copy engine, up to
    LANDING pages ahead), then are widened to float16 into tile slot t % WIDE once both consumers have released it,
    which `ready` announces to them as the load warp's copies do for 16-bit pages. A landing slot is free again as
    soon as it is widened: this warpgroup is its only reader."""
    LANDING: gl.constexpr = k_landed.type.shape[0]
    WIDE: gl.constexpr = k_bufs.type.shape[0]
    V_T: gl.constexpr = v_landed.type.shape[1] != _KPAGE_SIZE  # V's pages stored transposed: [head_dim, 64] tiles
    tile_bytes: gl.constexpr = 2 * k_desc.block_type.nbytes
    column = kv_head * _KHEAD_DIM
    v_head_row = kv_head * _KHEAD_DIM  # V^T: a page's rows for this kv head (the pages' rows: heads * head_dim)
    v_page_rows = gl.num_programs(1) * _KHEAD_DIM
    _wait_for_producers()
    for i in gl.static_range(LANDING):
        has = i < n_tiles
        page = gl.load(pages_row + page_lo + i, mask=has, other=0)
        mbarrier.expect(landed.index(i), tile_bytes, pred=has)
        _tma_load(k_desc, [page * _KPAGE_SIZE, column], landed.index(i), k_landed.index(i), pred=has)
        if V_T:
            _tma_load(v_desc, [page * v_page_rows + v_head_row, 0], landed.index(i), v_landed.index(i), pred=has)
        else:
            _tma_load(v_desc, [page * _KPAGE_SIZE, column], landed.index(i), v_landed.index(i), pred=has)
    for t in range(n_tiles):
        # The page LANDING tiles ahead, which takes this tile's slot once it is widened.
        ahead = t + LANDING < n_tiles
        page = gl.load(pages_row + page_lo + t + LANDING, mask=ahead, other=0)
        slot = t % LANDING
        stage = t % WIDE
        mbarrier.wait(landed.index(slot), (t // LANDING) & 1)
        # Slots start free: the first pass waits on the phase before the barrier's first.
        mbarrier.wait(empty.index(stage), ((t // WIDE) & 1) ^ 1)
        _widen(k_landed.index(slot), v_landed.index(slot), k_bufs.index(stage), v_bufs.index(stage))
        # The tensor cores read the widened tiles and the copy engine rewrites the slot, both through the async
        # proxy, after every warp of the group has done its part.
        fence_async_shared()
        _warps_barrier()
        mbarrier.arrive(ready.index(stage), count=1)
        mbarrier.expect(landed.index(slot), tile_bytes, pred=ahead)
        _tma_load(k_desc, [page * _KPAGE_SIZE, column], landed.index(slot), k_landed.index(slot), pred=ahead)
        if V_T:
            v_row = page * v_page_rows + v_head_row
            _tma_load(v_desc, [v_row, 0], landed.index(slot), v_landed.index(slot), pred=ahead)
        else:
            _tma_load(v_desc, [page * _KPAGE_SIZE, column], landed.index(slot), v_landed.index(slot), pred=ahead)


@gluon.jit
def _widen(k_src, v_src, k_dst, v_dst):
    """k_dst, v_dst = k_src, v_src: fp8 [64, head_dim] tiles widened to float16 (exact), 16 rows at a time (a row is
    8 threads of 16 bytes; a chunk, 16 values a thread, fits the warpgroup's few registers). K's and V's chunks
    alternate: Triton puts a barrier between two stores into slices of one buffer, not between stores into two, so
    a tile pair takes 3 barriers rather than 7."""
    CHUNK: gl.constexpr = 16
    layout: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 16], threads_per_warp=[4, 8], warps_per_cta=[4, 1], order=[1, 0]
    )
    if v_src.type.shape[0] != _KPAGE_SIZE:
        # V^T tiles, [head_dim, 64]: 32 rows a chunk, as many chunks as K's
        V_CHUNK: gl.constexpr = 2 * CHUNK
        for i in gl.static_range(_KPAGE_SIZE // CHUNK):
            k_dst.slice(i * CHUNK, CHUNK).store(k_src.slice(i * CHUNK, CHUNK).load(layout).to(k_dst.dtype))
            v_chunk = v_src.slice(i * V_CHUNK, V_CHUNK).load(_VT_LAYOUT)
            v_dst.slice(i * V_CHUNK, V_CHUNK).store(v_chunk.to(v_dst.dtype))
    else:
        for r in gl.static_range(0, _KPAGE_SIZE, CHUNK):
            k_dst.slice(r, CHUNK).store(k_src.slice(r, CHUNK).load(layout).to(k_dst.dtype))
            v_dst.slice(r, CHUNK).store(v_src.slice(r, CHUNK).load(layout).to(v_dst.dtype))


@gluon.jit
def _wait_for_producers():
    """launch.wait_for_producers in Gluon (which cannot call a triton.jit function): wait until the kernels before
    this one have finished and their writes are visible, then let the next kernel's programs launch. Safe without
    programmatic dependent launch (the kernels before have finished then), so the partitions call it as they are."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    gl.inline_asm_elementwise(
        "griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit(do_not_specialize=["batch_size", "total_q", "max_position"])
def _short_prefill_kernel(
    Q,
    k_desc,
    v_desc,
    WsO,
    WsLse,
    Cos,
    Sin,
    cu_seqlens_q,
    q_start,
    pages,
    deltas,
    valid,
    starts,
    firsts,
    num_pages,
    batch_size,
    total_q,
    max_position,
    stride_qt,
    stride_qh,
    stride_table,
    qk_scale,
    GROUP: gl.constexpr,
    NUM_HEADS: gl.constexpr,
    APPLY_DELTA: gl.constexpr,
    INTERLEAVED: gl.constexpr,
    HAS_FIRST: gl.constexpr,
    TILE: gl.constexpr,
    WIDEN: gl.constexpr,
    USE_PDL: gl.constexpr,
):
    QB: gl.constexpr = _KROWS // GROUP  # query positions per program
    scan_b: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    slot = gl.num_programs(0) - 1 - gl.program_id(0)
    kv_head = gl.program_id(1)
    split = gl.program_id(2)
    entry, first_row = _find_block(
        cu_seqlens_q, batch_size, slot, gl.arange(0, _KBLOCK_B, layout=scan_b), QB, _KBLOCK_B
    )
    row0 = gl.load(cu_seqlens_q + entry)
    q_len = gl.load(cu_seqlens_q + entry + 1) - row0
    if first_row >= q_len:
        # An entry's spare slot, or one of an entry without rows (a CUDA graph's padding): no rows, nothing to
        # write. Returning before the warp-specialised region matters: such a program would otherwise hold an SM
        # through its set-up (at batch 1 the RAG case's spare slots showed in every launch's time, docs/benchmarks.md,
        # "Kernel constants").
        return
    pos0 = gl.load(q_start + entry)
    q_last = pos0 + gl.minimum(first_row + QB, q_len) - 1
    table = entry.to(gl.int64) * stride_table
    n_vis = _count_pages(starts + table, gl.load(num_pages + entry), q_last, _KBLOCK_P, scan_b)
    # This split's balanced range of the visible pages (none for the splits past them).
    per_split = gl.cdiv(n_vis, gl.num_programs(2))
    page_lo = split * per_split
    n_tiles = gl.maximum(gl.minimum(per_split, n_vis - page_lo), 0)

    # TILE: the products' operand dtype, the pages' (WIDEN false) or float16 over FP8 pages (WIDEN true), whose
    # tiles land in fp8 slots and are widened into the consumers' tiles.
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([_KROWS // 2, _KHEAD_DIM], TILE)
    q_smem = gl.allocate_shared_memory(TILE, [2, _KROWS // 2, _KHEAD_DIM], q_layout)
    raw_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    q_raw = gl.allocate_shared_memory(Q.dtype.element_ty, [2, _KROWS // 2, _KHEAD_DIM], raw_layout)
    if WIDEN:
        tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([_KPAGE_SIZE, _KHEAD_DIM], TILE)
        stages: gl.constexpr = _KWIDE_STAGES
        k_bufs = gl.allocate_shared_memory(TILE, [stages, _KPAGE_SIZE, _KHEAD_DIM], tile_layout)
        # V's tiles as its descriptor reads them: [64, head_dim], or [head_dim, 64] from pages stored transposed
        # (takes_transposed_layout), widened as they are and read by P·V through a transposed view.
        v_tile: gl.constexpr = v_desc.block_type.shape
        v_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([v_tile[0], v_tile[1]], TILE)
        v_bufs = gl.allocate_shared_memory(TILE, [stages, v_tile[0], v_tile[1]], v_layout)
        page_dtype: gl.constexpr = k_desc.block_type.element_ty
        k_landed = gl.allocate_shared_memory(page_dtype, [_KSTAGES, _KPAGE_SIZE, _KHEAD_DIM], k_desc.layout)
        v_landed = gl.allocate_shared_memory(page_dtype, [_KSTAGES, v_tile[0], v_tile[1]], v_desc.layout)
        landed = gl.allocate_shared_memory(gl.int64, [_KSTAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(_KSTAGES):
            mbarrier.init(landed.index(i), count=1)
    else:
        stages: gl.constexpr = _KSTAGES
        k_bufs = gl.allocate_shared_memory(TILE, [stages, _KPAGE_SIZE, _KHEAD_DIM], k_desc.layout)
        v_bufs = gl.allocate_shared_memory(TILE, [stages, _KPAGE_SIZE, _KHEAD_DIM], v_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [stages, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [stages, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(stages):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # one arrival per consumer warpgroup
    # Under programmatic dependent launch, everything above (the metadata, which the host wrote before the step, and
    # the set-up) overlaps the kernel before this one. Each partition waits for it where it first reads what it may
    # have written: the consumers before q (their first tile's tables and rotation come before), the load warp before
    # the pages (the question's are that kernel's writes). Without PDL that wait returns at once, so USE_PDL (the
    # launcher's flag, kernels/launch.py) only keys the compile.

    # The two consumer warpgroups run the same function on their own halves (literal tuples: concatenating tuples in a
    # kernel turns their constexprs into plain ints, which a partition's arguments cannot carry).
    deltas_row, valid_row, starts_row, firsts_row = deltas + table, valid + table, starts + table, firsts + table
    low = (
        Q,
        WsO,
        WsLse,
        Cos,
        Sin,
        deltas_row,
        valid_row,
        starts_row,
        firsts_row,
        q_smem.index(0),
        q_raw.index(0),
        k_bufs,
        v_bufs,
        ready,
        empty,
        row0,
        first_row,
        q_len,
        pos0,
        kv_head,
        split,
        page_lo,
        n_tiles,
        total_q,
        max_position,
        stride_qt,
        stride_qh,
        qk_scale,
        GROUP,
        NUM_HEADS,
        APPLY_DELTA.value,
        INTERLEAVED.value,
        HAS_FIRST.value,
        gl.constexpr(0),
    )
    high = (
        Q,
        WsO,
        WsLse,
        Cos,
        Sin,
        deltas_row,
        valid_row,
        starts_row,
        firsts_row,
        q_smem.index(1),
        q_raw.index(1),
        k_bufs,
        v_bufs,
        ready,
        empty,
        row0,
        first_row,
        q_len,
        pos0,
        kv_head,
        split,
        page_lo,
        n_tiles,
        total_q,
        max_position,
        stride_qt,
        stride_qh,
        qk_scale,
        GROUP,
        NUM_HEADS,
        APPLY_DELTA.value,
        INTERLEAVED.value,
        HAS_FIRST.value,
        gl.constexpr(1),
    )
    if WIDEN:
        widens = (
            k_desc,
            v_desc,
            pages + table,
            k_landed,
            v_landed,
            landed,
            k_bufs,
            v_bufs,
            ready,
            empty,
            kv_head,
            page_lo,
            n_tiles,
        )
        gl.warp_specialize(
            [(_consume, low), (_consume, high), (_widen_tiles, widens)], [4, 4], [_KWIDEN_CONSUMER_REGS, _KWIDEN_REGS]
        )
    else:
        loads = (k_desc, v_desc, pages + table, k_bufs, v_bufs, ready, empty, kv_head, page_lo, n_tiles)
        gl.warp_specialize(
            [(_consume, low), (_consume, high), (_load_tiles, loads)], [4, 1], [_KCONSUMER_REGS, _KLOADER_REGS]
        )


def short_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: PagedBatch,
    tables: RopeTables | None,
    scale: float,
    num_splits: int,
    *,
    apply_delta: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """prefill.prefill_attention's result for a call `supports` accepts: partials of `num_splits` balanced page
    ranges, merged by prefill's combine kernel (also for one split)."""
    ws_o, ws_lse = split_partials(q, k_cache, v_cache, batch, tables, scale, num_splits, apply_delta=apply_delta)
    return merge_partials(ws_o, ws_lse, torch.empty_like(q) if out is None else out)


def split_partials(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: PagedBatch,
    tables: RopeTables | None,
    scale: float,
    num_splits: int,
    *,
    apply_delta: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's launch alone: each split's normalised output [splits, rows, heads, head_dim] and log2-sum-exp
    [splits, rows, heads], fp32 (a split without pages leaves its output unwritten and its log2-sum-exp -inf)."""
    total_q, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    group = q_heads // kv_heads
    ws_o = torch.empty(num_splits, total_q, q_heads, head_dim, dtype=torch.float32, device=q.device)
    ws_lse = torch.empty(num_splits, total_q, q_heads, dtype=torch.float32, device=q.device)
    apply = tables is not None and apply_delta
    # Without deltas every Q tile is rotated by 0: a one-row table of cos 1, sin 0 then serves.
    cos, sin = (tables.cos, tables.sin) if tables is not None else _identity_rotation(head_dim, q.device)
    grid = (query_slots(total_q, batch.batch_size, ROWS // group), kv_heads, num_splits)
    _short_prefill_kernel[grid](
        q,
        _descriptor(k_cache),
        _descriptor(v_cache),
        ws_o,
        ws_lse,
        cos,
        sin,
        batch.cu_seqlens_q,
        batch.q_start,
        batch.pages,
        batch.deltas,
        batch.valid,
        batch.starts,
        batch.valid if batch.firsts is None else batch.firsts,
        batch.num_pages,
        batch.batch_size,
        total_q,
        cos.shape[0],
        q.stride(0),
        q.stride(1),
        batch.pages.stride(0),
        scale * LOG2E,
        GROUP=group,
        NUM_HEADS=q_heads,
        APPLY_DELTA=apply,
        INTERLEAVED=apply and tables.interleaved,
        HAS_FIRST=batch.firsts is not None,
        TILE=_GL_DTYPES[tile_dtype(q.dtype, k_cache.dtype)],
        WIDEN=is_fp8(k_cache.dtype),
        num_warps=4,
        maxnreg=_MAXNREG,
        **pdl_options(q.device, "attention"),
    )
    return ws_o, ws_lse


@functools.lru_cache(maxsize=8)
def _identity_rotation(head_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of one position, 0: the rotation that leaves q as it is."""
    return (
        torch.ones(1, head_dim // 2, dtype=torch.float32, device=device),
        torch.zeros(1, head_dim // 2, dtype=torch.float32, device=device),
    )


def merge_partials(ws_o: torch.Tensor, ws_lse: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`split_partials`' partials merged into out [rows, heads, head_dim] by prefill's combine kernel, one warp per
    (row, head). The merge is one round of loads and sums a program, on the layer's critical path: with one warp the
    sums over the splits stay in the warp, with four they cross warps through shared memory (2 KiB, compile_check),
    which is the likely reason four were slower. (The kernel above takes all of an SM's registers, 384 threads at 168,
    so no merge program runs beside it.) On an H100, batch 1 of the RAG case, one warp was faster than four (what
    prefill.py's longer calls keep), and not much slower than no merge at all; one warp merging 8 or 4 splits a step
    gained nothing (docs/benchmarks.md, "Kernel constants")."""
    num_splits, total_q, q_heads, head_dim = ws_o.shape
    combine_kernel[(total_q * q_heads,)](
        ws_o,
        ws_lse,
        out,
        total_q * q_heads,
        num_splits,
        out.stride(0),
        out.stride(1),
        NUM_HEADS=q_heads,
        HEAD_DIM=head_dim,
        BLOCK_S=min(16, triton.next_power_of_2(num_splits)),
        num_warps=1,
        **pdl_options(out.device, "attention"),
    )
    return out
