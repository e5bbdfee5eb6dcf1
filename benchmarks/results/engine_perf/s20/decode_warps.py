"""Session 20: batch-1 decode attention with each warp on its own keys (a new tile loop for kernels/decode.py, probed).

decode.py's loop multiplies a [16, 64] score tile (the kv head's 4 query heads padded to 16 rows, one page of keys)
with Triton's layout for it: the 4 warps side by side along the keys. Each tile's row max and row sum then cross warps
(shared memory and a barrier each), and so do P on its way to the P·V operand and q's operand (it is loop-carried in
another layout): several barriers a tile, each a round of shared-memory latency, and at batch 1 one program per SM has
nothing else to run meanwhile. Session 20's clock stamps (decode_timeline.py, call 1) put the tile loop at 1.55-1.85 us
a page, where a launch that only reads the same tiles by the copy engine takes ~1.3 (tma_read.py).

Here a page is 4 sub-tiles of 16 keys, [4, 16, 128], and the products are batched over them (tl.dot of rank 3: Triton
puts the warps along the batch): warp w keeps its own online softmax over sub-tile w of every page, so nothing in the
loop crosses warps. The 4 softmax states merge once, after the loop. Tiles come by 3-D copy-engine loads ([4, 16, 128]
boxes of the pool seen as [pages * 4, 16, heads * 128]) or by per-thread copies.

The probe takes what the target's case needs (token-major pages of 64, deltas, no relinked first slots) and checks
its output against the reference, beside the engine's kernel, in the targets' graph form (graph_us).

    python benchmarks/results/engine_perf/s20/decode_warps.py OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))

from lazyattn.kernels.decode import (  # noqa: E402
    NEG_BIG,
    _default_rule,
    _derotate,
    _entry_splits,
    _merge_group,
    _pair_layout,
)
from lazyattn.kernels.launch import LOG2E, interpreting, pdl_options, wait_for_producers  # noqa: E402

CONTEXT = 10304
ROUNDS = 3
SUB = 4  # sub-tiles a page, one a warp
SUB_N = 16  # keys a sub-tile


@triton.jit
def _warps_kernel(q_ptr, k_ptr, v_ptr, k_desc, v_desc, out_ptr, acc_ptr, m_ptr, l_ptr, counters_ptr,
                  pages_ptr, deltas_ptr, valid_ptr, starts_ptr, num_pages_ptr, q_start_ptr, cos_ptr, sin_ptr,
                  stride_qb, stride_qh, stride_kp, stride_kt, stride_kh, stride_ob, stride_oh,
                  stride_pages, stride_tab, qk_scale, num_splits, min_pages, short_pages, short_cap,
                  HQ: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr,
                  SUB: tl.constexpr, SUB_N: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr,
                  TMA: tl.constexpr, DOT_TY: tl.constexpr, USE_PDL: tl.constexpr):
    split = tl.program_id(0)
    kv_head = tl.program_id(1)
    entry = tl.program_id(2).to(tl.int64)
    n_pages = tl.load(num_pages_ptr + entry)
    splits = _entry_splits(n_pages, num_splits, min_pages, short_pages, short_cap)
    if split < splits:
        _warps_split(q_ptr, k_ptr, v_ptr, k_desc, v_desc, out_ptr, acc_ptr, m_ptr, l_ptr, counters_ptr,
                     pages_ptr, deltas_ptr, valid_ptr, starts_ptr, q_start_ptr, cos_ptr, sin_ptr,
                     stride_qb, stride_qh, stride_kp, stride_kt, stride_kh, stride_ob, stride_oh,
                     stride_pages, stride_tab, qk_scale, num_splits, split, kv_head, entry, n_pages, splits,
                     HQ, GROUP, HEAD_DIM, BLOCK_G, SUB, SUB_N, BLOCK_H, BLOCK_S, TMA, DOT_TY, USE_PDL)


@triton.jit
def _warps_split(q_ptr, k_ptr, v_ptr, k_desc, v_desc, out_ptr, acc_ptr, m_ptr, l_ptr, counters_ptr,
                 pages_ptr, deltas_ptr, valid_ptr, starts_ptr, q_start_ptr, cos_ptr, sin_ptr,
                 stride_qb, stride_qh, stride_kp, stride_kt, stride_kh, stride_ob, stride_oh,
                 stride_pages, stride_tab, qk_scale, num_splits, split, kv_head, entry, n_pages, splits,
                 HQ: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr,
                 SUB: tl.constexpr, SUB_N: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr,
                 TMA: tl.constexpr, DOT_TY: tl.constexpr, USE_PDL: tl.constexpr):
    per_split = tl.cdiv(n_pages, splits)
    page_lo = split * per_split
    page_hi = tl.minimum(page_lo + per_split, n_pages)
    q_pos = tl.load(q_start_ptr + entry)
    row = entry * stride_pages
    page_next = tl.load(pages_ptr + row + page_lo, mask=page_lo < page_hi, other=0)
    k_base = k_ptr + kv_head.to(tl.int64) * stride_kh
    v_base = v_ptr + kv_head.to(tl.int64) * stride_kh
    wait_for_producers(USE_PDL)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + g
    g_mask = g < GROUP
    q_mask = g_mask[:, None]
    q_rows = q_ptr + entry * stride_qb + heads[:, None].to(tl.int64) * stride_qh
    # q and its rotation partners stay 16-bit between documents (exact: that is how they are stored), in fp32 they
    # would take 128 registers a thread
    q = tl.load(q_rows + d[None, :], mask=q_mask, other=0.0)
    partner, pair, sign = _pair_layout(HEAD_DIM, HEAD_DIM, False)
    q_partner = tl.load(q_rows + partner[None, :], mask=q_mask, other=0.0)
    kv_ty = k_ptr.dtype.element_ty
    q_dot = q.to(DOT_TY)
    cur_delta = tl.full([], 0, tl.int32)
    # slot of sub-tile w, key n: w * SUB_N + n
    slot = tl.arange(0, SUB)[:, None] * SUB_N + tl.arange(0, SUB_N)[None, :]
    m_i = tl.full([SUB, BLOCK_G], NEG_BIG, tl.float32)
    l_i = tl.zeros([SUB, BLOCK_G], tl.float32)
    acc = tl.zeros([SUB, BLOCK_G, HEAD_DIM], tl.float32)
    for p in range(page_lo, page_hi):
        page = page_next.to(tl.int64)
        page_next = tl.load(pages_ptr + row + p + 1, mask=p + 1 < page_hi, other=0)
        n_keys = tl.minimum(tl.load(valid_ptr + row + p), q_pos + 1 - tl.load(starts_ptr + row + p))
        delta = tl.load(deltas_ptr + row + p)
        if delta != cur_delta:
            q_dot = _derotate(q.to(tl.float32), q_partner.to(tl.float32), cos_ptr, sin_ptr, stride_tab, delta, pair,
                              sign, d < HEAD_DIM).to(kv_ty).to(DOT_TY)
            cur_delta = delta
        key_mask = slot < n_keys
        if TMA:
            k = k_desc.load([(page * SUB).to(tl.int32), 0, kv_head * HEAD_DIM]).reshape(SUB, SUB_N, HEAD_DIM)
            v = v_desc.load([(page * SUB).to(tl.int32), 0, kv_head * HEAD_DIM]).reshape(SUB, SUB_N, HEAD_DIM)
        else:
            offs = page * stride_kp + slot[:, :, None] * stride_kt + d[None, None, :]
            k = tl.load(k_base + offs, mask=key_mask[:, :, None], other=0.0)
            v = tl.load(v_base + offs, mask=key_mask[:, :, None], other=0.0)
        q3 = tl.broadcast_to(q_dot[None, :, :], (SUB, BLOCK_G, HEAD_DIM))
        s = tl.dot(q3, tl.permute(k.to(DOT_TY), (0, 2, 1))) * qk_scale  # [SUB, BLOCK_G, SUB_N]
        s = tl.where(key_mask[:, None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 2))
        alpha = tl.exp2(m_i - m_new)
        prob = tl.exp2(s - m_new[:, :, None])
        l_i = l_i * alpha + tl.sum(prob, 2)
        p_dot = prob.to(kv_ty).to(DOT_TY)
        pv = tl.dot(p_dot, v.to(DOT_TY))
        if TMA and n_keys < SUB * SUB_N:
            # copy-engine V holds the page padding too (it may be NaN): a page that is not full takes its product
            # again over V read by masked per-thread loads
            offs = page * stride_kp + slot[:, :, None] * stride_kt + d[None, None, :]
            pv = tl.dot(p_dot, tl.load(v_base + offs, mask=key_mask[:, :, None], other=0.0).to(DOT_TY))
        acc = acc * alpha[:, :, None] + pv
        m_i = m_new

    # The warps' states merged: one softmax state per query row.
    m_all = tl.max(m_i, 0)
    w = tl.exp2(m_i - m_all[None, :])
    l_all = tl.sum(l_i * w, 0)
    acc_all = tl.sum(acc * w[:, :, None], 0)
    if splits == 1:
        out = acc_all / tl.where(l_all > 0, l_all, 1.0)[:, None]
        o_rows = out_ptr + entry * stride_ob + heads[:, None].to(tl.int64) * stride_oh
        tl.store(o_rows + d[None, :], out.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        prow = (entry * HQ + heads) * num_splits + split
        tl.store(m_ptr + prow, m_all, mask=g_mask)
        tl.store(l_ptr + prow, l_all, mask=g_mask)
        tl.store(acc_ptr + prow[:, None] * HEAD_DIM + d[None, :], acc_all, mask=q_mask)
        tl.debug_barrier()
        counter = counters_ptr + entry * tl.num_programs(1) + kv_head
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == splits - 1:
            _merge_group(acc_ptr, m_ptr, l_ptr, (entry * HQ + kv_head * GROUP) * num_splits, num_splits, splits,
                         out_ptr + entry * stride_ob + (kv_head * GROUP).to(tl.int64) * stride_oh, stride_oh,
                         GROUP, HEAD_DIM, BLOCK_H, BLOCK_S, HEAD_DIM)
            tl.store(counter, 0)


def descriptors(k_cache: torch.Tensor, v_cache: torch.Tensor):
    """[SUB, SUB_N, head_dim] boxes of the pool seen as [pages * SUB, SUB_N, heads * head_dim] (token-major pages)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    pages, page_size, heads, dim = k_cache.shape
    assert page_size == SUB * SUB_N and k_cache.is_contiguous()

    def one(cache):
        view = cache.view(pages * SUB, SUB_N, heads * dim)
        return TensorDescriptor(view, list(view.shape), list(view.stride()), [SUB, SUB_N, dim])

    return one(k_cache), one(v_cache)


def decode_warps(q, k_cache, v_cache, batch, tables, scale, counters, tma: bool, num_stages: int = 3,
                 num_warps: int = SUB, maxnreg: int | None = None, out=None):
    bsz, hq, head_dim = q.shape
    hkv = k_cache.shape[2]
    rule = _default_rule(q, hkv)
    num_splits = rule.unrounded(max(1, batch.max_pages))
    out = torch.empty_like(q) if out is None else out
    m = torch.empty(bsz, hq, num_splits, dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    acc = torch.empty(bsz, hq, num_splits, head_dim, dtype=torch.float32, device=q.device)
    arrivals = counters.get(q.device, bsz * hkv)
    k_desc, v_desc = descriptors(k_cache, v_cache) if tma else (k_cache, v_cache)
    group = hq // hkv
    block_h = triton.next_power_of_2(group)
    _warps_kernel[(num_splits, hkv, bsz)](
        q, k_cache, v_cache, k_desc, v_desc, out, acc, m, l, arrivals,
        batch.pages, batch.deltas, batch.valid, batch.starts, batch.num_pages, batch.q_start, tables.cos, tables.sin,
        q.stride(0), q.stride(1), *k_cache.stride()[:3], out.stride(0), out.stride(1), batch.pages.stride(0),
        tables.cos.stride(0), scale * LOG2E, num_splits, rule.min_pages, rule.short_pages, rule.short_cap,
        HQ=hq, GROUP=group, HEAD_DIM=head_dim, BLOCK_G=max(16, triton.next_power_of_2(group)), SUB=SUB, SUB_N=SUB_N,
        BLOCK_H=block_h, BLOCK_S=min(max(1, 64 // block_h), triton.next_power_of_2(num_splits)), TMA=tma,
        DOT_TY=tl.float32 if interpreting() else tl.bfloat16, num_warps=num_warps, num_stages=num_stages,
        **({"maxnreg": maxnreg} if maxnreg else {}), **pdl_options(q.device, "attention"))
    return out


def main() -> None:
    from kernels import attention, decode_inputs, graph_rounds, rag_sweep_bench

    from lazyattn.kernels.decode import ArrivalCounters
    from lazyattn.kernels.reference import paged_attention

    out_path = sys.argv[1]
    b, copy_gbps, _, _ = rag_sweep_bench()
    inputs, nbytes = decode_inputs(b, 1, CONTEXT, 2)
    counters = ArrivalCounters()
    forms = {"warps, tma, 3 stages": dict(tma=True), "warps, tma, 4 stages": dict(tma=True, num_stages=4),
             "warps, copies, 3 stages": dict(tma=False), "warps, copies, 4 stages": dict(tma=False, num_stages=4)}
    q, k, v, pb = inputs[0]
    ref = paged_attention(q.float(), k.float(), v.float(), pb, b.tables, b.scale)
    fn = attention(True)
    row = {"copy_gbps": copy_gbps, "bytes": nbytes,
           "engine max_abs_vs_ref": (fn(q, k, v, pb, b.tables, b.scale).float() - ref).abs().max().item()}
    calls = {"decode (engine)": [lambda i=i: fn(*i, b.tables, b.scale) for i in inputs]}
    for name, kw in forms.items():
        try:
            got = decode_warps(q, k, v, pb, b.tables, b.scale, counters, **kw)
            row[f"{name} max_abs_vs_ref"] = (got.float() - ref).abs().max().item()
        except Exception as e:  # noqa: BLE001 - recorded, the probe goes on
            row[f"{name} error"] = f"{type(e).__name__}: {str(e)[:400]}"
            continue
        calls[name] = [lambda i=i, kw=kw: decode_warps(*i, b.tables, b.scale, counters, **kw) for i in inputs]
    row.update(graph_rounds(b, calls, ROUNDS, nbytes, copy_gbps))
    print(json.dumps(row, indent=1), flush=True)
    Path(out_path).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
