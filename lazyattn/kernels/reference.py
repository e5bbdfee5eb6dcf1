"""Plain PyTorch implementation of the attention contract (kernels/paged.py).

It is the ground truth of every kernel test and the engine's CPU backend. It takes the materialising
route on purpose: it rotates each gathered key by its page's delta and attends with ordinary positions,
so it shares no shortcut with the kernels, which de-rotate queries instead.

Pages of any KV dtype are read as fp32 (an FP8 page dequantized exactly: kernels/kv_dtype.py, scale 1.0); writes and
block mode's copies round to the pool's dtype through `kv_dtype.quantize`.
"""

from __future__ import annotations

import torch

from lazyattn.kernels.kv_dtype import quantize
from lazyattn.kernels.paged import PagedBatch
from lazyattn.kernels.rope import RopeTables, rotate


def gather_keys(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: PagedBatch,
    entry: int,
    tables: RopeTables | None,
    round_rotated: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Entry's keys moved to their logical positions (fp32), values (fp32), positions [N] (int64), in page order
    (ascending positions). `round_rotated`: a moved key is rounded to the cache's dtype, as block mode's private
    copy is (`copy_rotate`): the deterministic mode's choice (docs/design.md, "Deterministic mode")."""
    n = int(batch.num_pages[entry])
    pages = batch.pages[entry, :n].long()
    valid = batch.valid[entry, :n].long()
    page_size = k_cache.shape[1]
    first = torch.zeros_like(valid) if batch.firsts is None else batch.firsts[entry, :n].long()
    slot = torch.arange(page_size, device=k_cache.device)
    keep = ((slot[None, :] >= first[:, None]) & (slot[None, :] < (first + valid)[:, None])).reshape(-1)
    k = k_cache[pages].float().reshape(n * page_size, *k_cache.shape[2:])[keep]
    v = v_cache[pages].float().reshape(n * page_size, *v_cache.shape[2:])[keep]
    pos = ((batch.starts[entry, :n].long() - first)[:, None] + slot[None, :]).reshape(-1)[keep]
    delta = batch.deltas[entry, :n].long()[:, None].expand(n, page_size).reshape(-1)[keep]
    if tables is not None and bool((delta != 0).any()):
        d = delta.clamp(min=0)
        if bool((delta < 0).any()):
            raise ValueError("negative page deltas are not part of the contract")
        k = rotate(k, tables.cos[d][:, None, :], tables.sin[d][:, None, :], tables.interleaved)
        if round_rotated:
            k = quantize(k, k_cache.dtype).float()
    return k, v, pos


def key_ape(batch: PagedBatch, entry: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The entry's per-key 1/T and ln S (kernels/paged.py), in gather_keys' key order; None without them."""
    if batch.inv_temps is None:
        return None
    n = int(batch.num_pages[entry])
    valid = batch.valid[entry, :n].long()
    inv_temp = batch.inv_temps[entry, :n].float().repeat_interleave(valid)
    log_scale = batch.log_scales[entry, :n].float().repeat_interleave(valid)
    return inv_temp, log_scale


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    ape: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Softmax attention in fp32 with GQA. q [M, Hq, D], k/v [N, Hkv, D], mask [M, N] (True = visible);
    ape: per-key 1/T and ln S [N] (scores become scores / T + ln S)."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.float(), k) * scale
    if ape is not None:
        scores = scores * ape[0] + ape[1]
    scores = scores.masked_fill(~mask[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hmn,nhd->mhd", probs, v)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: PagedBatch,
    tables: RopeTables | None,
    scale: float,
    invariant: bool = False,
) -> torch.Tensor:
    """q [total_q, Hq, D] (packed by batch.cu_seqlens_q) -> out [total_q, Hq, D] in q's dtype.

    Serves prefill (any query runs, incl. chunks) and decode (one row per entry) alike. `tables` may be
    None when every delta is 0.

    `invariant` (the deterministic mode, docs/design.md): each query row attends on its own to exactly the keys
    it sees (a prefix of the entry's keys in page order), so its result is one computation of the same shapes
    whether the row comes in a prefill chunk, a whole prefill or a decode step; moved keys are rounded to the
    cache's dtype as block mode's copies are (gather_keys).
    """
    out = torch.empty_like(q)
    cu = batch.cu_seqlens_q.tolist()
    for b in range(batch.batch_size):
        lo, hi = cu[b], cu[b + 1]
        if hi == lo:
            continue
        k, v, kpos = gather_keys(k_cache, v_cache, batch, b, tables, round_rotated=invariant)
        qpos = int(batch.q_start[b]) + torch.arange(hi - lo, device=q.device)
        ape = key_ape(batch, b)
        if invariant:
            seen = torch.searchsorted(kpos, qpos, right=True).tolist()  # keys at positions <= each query's
            for i, n in enumerate(seen):
                row_ape = None if ape is None else (ape[0][:n], ape[1][:n])
                visible = torch.ones(1, n, dtype=torch.bool, device=q.device)
                out[lo + i : lo + i + 1] = attend(q[lo + i : lo + i + 1], k[:n], v[:n], visible, scale, row_ape).to(
                    q.dtype
                )
            continue
        mask = kpos[None, :] <= qpos[:, None]
        out[lo:hi] = attend(q[lo:hi], k, v, mask, scale, ape).to(q.dtype)
    return out


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
) -> None:
    """Store already-rotated k and v [T, Hkv, D] at slots [T] (page * page_size + offset); -1 skips."""
    page_size = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_cache[slots // page_size, slots % page_size] = quantize(k[keep], k_cache.dtype)
    v_cache[slots // page_size, slots % page_size] = quantize(v[keep], v_cache.dtype)


def copy_rotate(
    kv: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, deltas: torch.Tensor, tables: RopeTables
) -> None:
    """Block-Attention's private copy: for every layer, K[dst] = R_delta K[src] and V[dst] = V[src].

    kv is the whole pool `[layers, 2, num_pages, page_size, Hkv, D]`; src, dst, deltas are [n] per page.
    """
    d = deltas.long()
    cos = tables.cos[d][:, None, None, :]
    sin = tables.sin[d][:, None, None, :]
    for layer in range(kv.shape[0]):
        k = kv[layer, 0, src.long()].float()
        kv[layer, 0, dst.long()] = quantize(rotate(k, cos, sin, tables.interleaved), kv.dtype)
        kv[layer, 1, dst.long()] = kv[layer, 1, src.long()]


def block_mask(segment_lens: list[int], final_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The block semantics' mask over the concatenation (docs/design.md): block-diagonal causal over
    segments, causal final."""
    total = sum(segment_lens) + final_len
    seg_id = torch.empty(total, dtype=torch.long)
    start = 0
    for i, n in enumerate(segment_lens):
        seg_id[start : start + n] = i
        start += n
    seg_id[start:] = len(segment_lens)
    idx = torch.arange(total)
    causal = idx[None, :] <= idx[:, None]
    same = seg_id[None, :] == seg_id[:, None]
    is_final = (seg_id == len(segment_lens))[:, None]
    return (causal & (same | is_final)).to(device)
