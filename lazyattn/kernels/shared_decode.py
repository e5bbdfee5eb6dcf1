"""Shared-document decode: each page run that several entries list is read once per step for all of them.

Contract: kernels/paged.py with one query row per entry, at the entry's last position (every listed key is
visible: decode has no causal cut inside the listed slots). Same result as decode.decode_attention.

Why. Lazy mode keeps one physical copy of each document, and under a skewed document popularity most
entries of a decode step list the same few documents, each at its own delta (the logical start of the
document in that request). The plain decode kernel reads a page once per entry that lists it; here a page run
listed identically by several entries (same page ids, valid counts, first slots, temperatures and scales) is
read once for all of them (cascade-style), which cuts the step's KV traffic by the number of entries sharing.
Prefix mode shares its prefix pages at delta 0 the same way; block mode's private re-rotated copies cannot.

Math. A key of a page with delta Δ is scored against R(-Δ)q (kernels/decode.py, kernels/prefill.py "Deferred
RoPE"). So the queries of the members of a shared run, each de-rotated by its own Δ, are stacked as the rows
of one tile [members x G, D] (G = Hq / Hkv query heads per kv head), and the run's K/V tiles are read once and
multiplied against every row with tl.dot. Each (member, job) pair gives an unnormalised partial (acc, running
max m, running sum l) in fp32; a second launch merges an entry's partials (max-rescale), as split-KV does.

Plan (host, `shared_plan`). Each entry's page list is cut into runs of consecutive pages of equal (delta,
1/T, ln S), in lazy mode [system] [doc 1] ... [doc N] [own pages]. A run's key is its (page, valid, first) tuples
with its 1/T and ln S; the entries whose runs have equal keys share it. Each run is cut into chunks of at most
`chunk_pages` pages from its start (a 2048-token document at pages of 64 is 32 pages: chunks give the grid
enough programs). A JOB is one chunk with up to M = max(1, group_rows // G) members, each with
its delta and the partial slot it writes; a chunk with more members takes several jobs. An entry's slots are
contiguous, `slot_start[e] .. slot_start[e + 1]`. An entry's last run is keyed chunk by chunk instead: in prefix
mode it is the shared prefix followed by the entry's own pages (one delta), and its prefix chunks are shared.

Device form (SharedPlan): `jobs` int32 [J, 4 + 3M]: source entry (whose page-table row the job's pages are
read from), first page, end page, member count, then M member entries, M deltas, M slots; the job count on the
device. The job kernel's programs stride over the jobs, so a CUDA graph captures a fixed grid over a table of
fixed capacity and replays any plan that fits; entries with no slots (graph padding) get zeros.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from lazyattn.kernels.decode import DecodeConfig, decode_config
from lazyattn.kernels.decode_tiles import (
    NEG_BIG,
    TL_DTYPES,
    load_mask,
    masked_tile,
    merge_group,
    pair_layout,
    rotation_rows,
    softmax_tile,
    v_tile,
)
from lazyattn.kernels.kv_dtype import check_dtypes, tile_dtype
from lazyattn.kernels.launch import LOG2E, interpreting
from lazyattn.kernels.paged import EntryPages, PagedBatch, v_transposed
from lazyattn.kernels.rope import RopeTables

# A job row's columns before the member columns: source entry, first page, end page, member count.
_MEMBERS = 4
# The merge loads (query head, slot) partials this many at a time (decode.py's _MERGE_ROWS).
_MERGE_ROWS = 64


def job_width(members: int) -> int:
    """Columns of a job row with room for `members` members."""
    return _MEMBERS + 3 * members


def members_per_job(group: int, group_rows: int) -> int:
    """M: how many entries one job serves (their G query rows each make the job's query tile)."""
    return max(1, group_rows // group)


@dataclass
class HostPlan:
    """One step's plan on the host (numpy), see the module docstring."""

    jobs: np.ndarray  # int32 [J, 4 + 3M]
    slot_start: np.ndarray  # int32 [B + 1]
    members: int  # M
    shared_jobs: int  # jobs with at least two members
    listed_pages: int = 0  # pages the entries list (what the plain decode kernel reads)
    read_pages: int = 0  # pages the jobs read

    @property
    def num_jobs(self) -> int:
        return self.jobs.shape[0]

    @property
    def num_slots(self) -> int:
        return int(self.slot_start[-1])

    def to(self, device: torch.device | str) -> SharedPlan:
        """The plan on the device, by one copy (one host buffer holds the job count, slot_start and the jobs)."""
        b1, width = self.slot_start.shape[0], self.jobs.shape[1]
        flat = np.empty(1 + b1 + self.jobs.size, dtype=np.int32)
        flat[0] = self.num_jobs
        flat[1 : 1 + b1] = self.slot_start
        flat[1 + b1 :] = self.jobs.reshape(-1)
        buf = torch.from_numpy(flat).to(device, non_blocking=True)
        return SharedPlan(
            num_jobs=buf[:1],
            slot_start=buf[1 : 1 + b1],
            jobs=buf[1 + b1 :].view(-1, width),
            members=self.members,
            num_slots=self.num_slots,
            programs=self.num_jobs,
        )


@dataclass
class SharedPlan:
    """A plan on the device. The job kernel's grid is `programs` (x kv heads), striding over the first `num_jobs`
    rows of `jobs`; `num_slots` sizes the partials' scratch, at least slot_start's last value. A CUDA graph passes
    its buffers' capacities for all three and a device job count."""

    num_jobs: torch.Tensor  # int32 [1]
    jobs: torch.Tensor  # int32 [>= num_jobs, 4 + 3M]
    slot_start: torch.Tensor  # int32 [>= B + 1]
    members: int
    num_slots: int
    programs: int


def _runs(e: EntryPages, lo: int, hi: int) -> list[int]:
    """Page indices in [lo, hi) where the entry's runs of equal (delta, 1/T, ln S) start, then hi."""
    deltas = e.deltas
    if e.inv_temps is None:
        cuts = [i for i in range(lo + 1, hi) if deltas[i] != deltas[i - 1]]
    else:
        t, s = e.inv_temps, e.log_scales
        cuts = [i for i in range(lo + 1, hi) if deltas[i] != deltas[i - 1] or t[i] != t[i - 1] or s[i] != s[i - 1]]
    return [lo, *cuts, hi]


class RunKey:
    """A run's key (pages, valid, first slots, 1/T and ln S) with its hash computed once: a kept context's keys
    are looked up every step. Interned (`interned`), equal keys are one object, and a lookup meets by identity."""

    __slots__ = ("key", "hash", "__weakref__")

    def __init__(self, key: tuple) -> None:
        self.key = key
        self.hash = hash(key)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunKey) and self.key == other.key


_INTERNED: weakref.WeakValueDictionary[tuple, RunKey] = weakref.WeakValueDictionary()  # while a context holds one


def interned(key: tuple) -> RunKey:
    run_key = _INTERNED.get(key)
    if run_key is None:
        run_key = _INTERNED[key] = RunKey(key)
    return run_key


RunItem = tuple[RunKey, int, int]  # (run key, delta, first page)


def _run_items(e: EntryPages, lo: int, hi: int, chunk_pages: int, last_by_chunk: bool, key_of=RunKey) -> list[RunItem]:
    """The keyed runs of the entry's pages [lo, hi) (module docstring), the last one keyed per chunk where
    `last_by_chunk`; `key_of` makes each RunKey."""
    pages, valid = e.pages, e.valid
    firsts = e.firsts if e.firsts is not None and any(e.firsts[lo:hi]) else None
    ape = e.inv_temps is not None
    bounds = _runs(e, lo, hi)
    last = len(bounds) - 2
    items = []
    for r in range(last + 1):
        rs, re = bounds[r], bounds[r + 1]
        delta = e.deltas[rs]
        scores = (e.inv_temps[rs], e.log_scales[rs]) if ape else None
        step = chunk_pages if r == last and last_by_chunk else re - rs
        for c in range(rs, re, step):
            c_end = min(c + step, re)
            offsets = None if firsts is None else tuple(firsts[c:c_end])
            # A relinked entry's runs without offsets match other entries' runs (firsts all 0 or None alike).
            key = (tuple(pages[c:c_end]), tuple(valid[c:c_end]), offsets if offsets and any(offsets) else None, scores)
            items.append((key_of(key), delta, c))
    return items


def _entry_items(e: EntryPages, chunk_pages: int) -> list[RunItem]:
    """The entry's keyed runs. An entry made by `then` from a context (EntryPages.base) whose last page ends a run
    reuses the context's runs, derived once and kept with it: only the entry's own pages are keyed each step."""
    n = len(e.pages)
    base = e.base
    nb = 0 if base is None else len(base.pages)
    if 0 < nb < n and (base.inv_temps is None) == (e.inv_temps is None) and _runs(e, nb - 1, nb + 1)[1] == nb:
        memo = base.memo()
        whole = memo.get("shared_runs")
        if whole is None:  # every run of the context is keyed whole: the entry's last run lies in its own pages
            whole = memo["shared_runs"] = _run_items(base, 0, nb, chunk_pages, last_by_chunk=False, key_of=interned)
        return whole + _run_items(e, nb, n, chunk_pages, last_by_chunk=True)
    return _run_items(e, 0, n, chunk_pages, last_by_chunk=True)


def shared_plan(entries: Sequence[EntryPages], group: int, group_rows: int = 16, chunk_pages: int = 8) -> HostPlan:
    """The jobs of one decode step over the entries' pages (module docstring). `group`: query heads per kv head."""
    if chunk_pages < 1:
        raise ValueError("chunk_pages must be >= 1")
    m = members_per_job(group, group_rows)
    # Equal runs are found whole (one key per document an entry lists, not one per chunk: the host's time), except
    # an entry's last run, keyed per chunk: there prefix mode's shared prefix runs on into the entry's own pages.
    runs: dict[RunKey, list[tuple[int, int, int]]] = {}  # key -> [(entry, delta, first page)]
    for b, e in enumerate(entries):
        if not (len(e.pages) == len(e.deltas) == len(e.valid)):
            raise ValueError(f"entry {b}: pages, deltas and valid differ in length")
        for key, delta, lo in _entry_items(e, chunk_pages):
            runs.setdefault(key, []).append((b, delta, lo))
    # Jobs: each run cut into chunks of at most chunk_pages pages, its members into near-equal groups of at most M.
    g_entries: list[int] = []  # the members of every group, group after group
    g_deltas: list[int] = []
    g_k: list[int] = []  # members per group
    g_lo: list[int] = []  # first page of the group's run in its source entry (its first member)
    g_len: list[int] = []  # pages of the run
    for key, members in runs.items():
        n = len(members)
        size = -(-n // -(-n // m))
        for i in range(0, n, size):
            part = members[i : i + size]
            g_entries += [j[0] for j in part]
            g_deltas += [j[1] for j in part]
            g_k.append(len(part))
            g_lo.append(part[0][2])
            g_len.append(len(key.key[0]))
    return _jobs(
        g_entries, g_deltas, g_k, g_lo, g_len, len(entries), m, chunk_pages, sum(len(e.pages) for e in entries)
    )


def _jobs(
    g_entries: list[int],
    g_deltas: list[int],
    g_k: list[int],
    g_lo: list[int],
    g_len: list[int],
    num_entries: int,
    m: int,
    chunk_pages: int,
    listed: int,
) -> HostPlan:
    """The plan's job table from its groups (shared_plan), in numpy: a group's jobs are its run's chunks in order,
    and each entry's partial slots are numbered in job order from its slot_start (so an entry's slots are
    contiguous and its jobs' partials come in the order the merge reads them)."""
    k = np.asarray(g_k, dtype=np.int64)
    lo = np.asarray(g_lo, dtype=np.int64)
    length = np.asarray(g_len, dtype=np.int64)
    mask = np.arange(m)[None, :] < k[:, None]  # [G, M]: the member columns a group fills
    members = np.zeros(mask.shape, dtype=np.int64)
    members[mask] = g_entries  # row-major: group after group, members in order
    deltas = np.zeros(mask.shape, dtype=np.int64)
    deltas[mask] = g_deltas
    chunks = -(-length // chunk_pages)
    group = np.repeat(np.arange(len(k)), chunks)  # each job's group
    chunk = np.arange(group.size) - np.repeat(np.cumsum(chunks) - chunks, chunks)
    start = chunk * chunk_pages
    job_mask = mask[group]
    held = members[group][job_mask]  # every (job, member) in job order: one partial slot each
    counts = np.bincount(held, minlength=num_entries)
    slot_start = np.zeros(num_entries + 1, dtype=np.int32)
    np.cumsum(counts, out=slot_start[1:])
    # Sorted stably by entry, the (job, member) pairs take consecutive slots: entry b's from slot_start[b], in job
    # order.
    slots = np.empty(held.size, dtype=np.int64)
    slots[np.argsort(held, kind="stable")] = np.arange(held.size)
    table = np.zeros((group.size, job_width(m)), dtype=np.int32)
    table[:, 0] = members[group, 0]
    table[:, 1] = lo[group] + start
    table[:, 2] = lo[group] + np.minimum(start + chunk_pages, length[group])
    table[:, 3] = k[group]
    table[:, _MEMBERS : _MEMBERS + m] = members[group]
    table[:, _MEMBERS + m : _MEMBERS + 2 * m] = deltas[group]
    table[:, _MEMBERS + 2 * m :][job_mask] = slots
    shared = int((k[group] > 1).sum())
    return HostPlan(table, slot_start, m, shared, listed, int(length.sum()))


# ---------------------------------------------------------------------------------------------------
# kernels


@triton.jit
def _shared_job_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    acc_ptr,
    m_ptr,
    l_ptr,
    num_jobs_ptr,
    jobs_ptr,
    pages_ptr,
    valid_ptr,
    firsts_ptr,
    ape_ptr,
    cos_ptr,
    sin_ptr,
    stride_qb,
    stride_qh,
    stride_kp,
    stride_kt,
    stride_kh,
    stride_vp,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_job,
    stride_pages,
    stride_valid,
    stride_firsts,
    ape_gap,
    stride_tab,
    num_slots,
    qk_scale,
    MEMBERS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TILES_PER_PAGE: tl.constexpr,
    APPLY_DELTA: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    DOT_TY: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_FIRST: tl.constexpr,
    HAS_APE: tl.constexpr,
    V_T: tl.constexpr,
    TILE_TY: tl.constexpr,
):
    """One job (a chunk of pages and its members) for one kv head: partials (acc, m, l) of every member's G
    query heads, at scratch row head * num_slots + the member's slot."""
    kv_head = tl.program_id(1)
    # Programs stride over the step's jobs: a CUDA graph's fixed grid serves any job count up to its table's.
    num_jobs = tl.load(num_jobs_ptr)
    for job in range(tl.program_id(0), num_jobs, tl.num_programs(0)):
        row = jobs_ptr + job * stride_job
        n_members = tl.load(row + 3)
        src = tl.load(row + 0).to(tl.int64)
        page_lo = tl.load(row + 1)
        page_hi = tl.load(row + 2)
        r = tl.arange(0, BLOCK_R)
        member = r // GROUP
        r_mask = (member < n_members) & (member < MEMBERS)
        entry = tl.load(row + 4 + member, mask=r_mask, other=0).to(tl.int64)
        slot_of = tl.load(row + 4 + 2 * MEMBERS + member, mask=r_mask, other=0)
        heads = kv_head * GROUP + r % GROUP
        d = tl.arange(0, BLOCK_D)
        n = tl.arange(0, BLOCK_N)
        d_mask = d < HEAD_DIM
        q_mask = r_mask[:, None] & d_mask[None, :]
        # Every row is its member's query head, de-rotated by the member's own delta.
        q_rows = q_ptr + entry[:, None] * stride_qb + heads[:, None].to(tl.int64) * stride_qh
        q = tl.load(q_rows + d[None, :], mask=q_mask, other=0.0).to(tl.float32)
        kv_ty = TILE_TY  # q's, or over FP8 pages kv_dtype.fp8_tile_dtype, as decode.py's
        if APPLY_DELTA:
            partner, pair, sign = pair_layout(HEAD_DIM, BLOCK_D, INTERLEAVED)
            delta = tl.load(row + 4 + MEMBERS + member, mask=r_mask, other=0)
            c, s = rotation_rows(cos_ptr, sin_ptr, stride_tab, delta[:, None], pair, sign, d_mask)
            q_partner = tl.load(q_rows + partner[None, :], mask=q_mask, other=0.0).to(tl.float32)
            q = q * c + q_partner * s
        q_dot = q.to(kv_ty).to(DOT_TY)
        k_base = k_ptr + kv_head.to(tl.int64) * stride_kh
        v_base = v_ptr + kv_head.to(tl.int64) * stride_vh

        m_i = tl.full([BLOCK_R], NEG_BIG, tl.float32)
        l_i = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
        t_lo = page_lo * TILES_PER_PAGE
        t_hi = page_hi * TILES_PER_PAGE
        # The next tile's page id is carried one iteration ahead so the K/V loads stay pipelined (decode.py).
        page_next = tl.load(pages_ptr + src * stride_pages + page_lo)
        for t in range(t_lo, t_hi):
            p = t // TILES_PER_PAGE
            page = page_next.to(tl.int64)
            page_next = tl.load(pages_ptr + src * stride_pages + (t + 1) // TILES_PER_PAGE, mask=t + 1 < t_hi, other=0)
            n_keys = tl.load(valid_ptr + src * stride_valid + p)
            slot = (t % TILES_PER_PAGE) * BLOCK_N + n
            if HAS_FIRST:
                first = tl.load(firsts_ptr + src * stride_firsts + p)
                key_mask = (slot >= first) & (slot < first + n_keys)
            else:
                key_mask = slot < n_keys
            tile_mask = load_mask(key_mask, d_mask, HEAD_DIM, BLOCK_D)
            k = masked_tile(k_base, page, stride_kp, slot, stride_kt, d, tile_mask).to(kv_ty)
            v = v_tile(
                v_base, page, stride_vp, slot, stride_vt, d, stride_vd, key_mask, d_mask, kv_ty, V_T, HEAD_DIM, BLOCK_D
            )
            pv, _, alpha, l_i, m_new = softmax_tile(
                q_dot,
                k,
                v,
                key_mask,
                ape_ptr + src * stride_firsts + p,
                ape_gap,
                qk_scale,
                m_i,
                l_i,
                HAS_APE,
                DOT_TY,
                DOT_PRECISION,
            )
            acc = acc * alpha[:, None] + pv
            m_i = m_new

        # Scratch [Hq, num_slots] (+ [D]) fp32: an entry's slots of one head are contiguous, as the merge reads them.
        out_row = heads.to(tl.int64) * num_slots + slot_of
        tl.store(m_ptr + out_row, m_i, mask=r_mask)
        tl.store(l_ptr + out_row, l_i, mask=r_mask)
        tl.store(acc_ptr + out_row[:, None] * HEAD_DIM + d[None, :], acc, mask=q_mask)


@triton.jit
def _shared_merge_kernel(
    acc_ptr,
    m_ptr,
    l_ptr,
    slot_start_ptr,
    out_ptr,
    stride_ob,
    stride_oh,
    num_slots,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """out of one (entry, kv head): its slots' partials merged. An entry without slots gets zeros."""
    entry = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    lo = tl.load(slot_start_ptr + entry)
    hi = tl.load(slot_start_ptr + entry + 1)
    merge_group(
        acc_ptr,
        m_ptr,
        l_ptr,
        (kv_head * GROUP).to(tl.int64) * num_slots + lo,
        num_slots,
        hi - lo,
        out_ptr + entry * stride_ob + (kv_head * GROUP).to(tl.int64) * stride_oh,
        stride_oh,
        GROUP,
        HEAD_DIM,
        BLOCK_H,
        BLOCK_S,
        BLOCK_D,
    )


# ---------------------------------------------------------------------------------------------------
# launcher


def shared_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: PagedBatch,
    plan: SharedPlan,
    tables: RopeTables | None,
    scale: float,
    *,
    config: DecodeConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decode step by the plan: q [B, Hq, D] (rotated at each entry's position) -> out [B, Hq, D] in q's
    dtype, as decode.decode_attention gives on the same step. `batch` is the step's PagedBatch (the jobs read
    their pages, valid counts, firsts and temperatures from its rows); `plan` is shared_plan's over the same
    entries (HostPlan.to). tables=None takes every delta as 0."""
    bsz, hq, head_dim = q.shape
    _, page_size, hkv, _ = k_cache.shape
    if k_cache.shape != v_cache.shape or k_cache.shape[-1] != head_dim or hq % hkv:
        raise ValueError(f"q {tuple(q.shape)} does not fit caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)}")
    check_dtypes(q, k_cache, v_cache)
    if k_cache.stride(-1) != 1 or not (v_cache.stride(-1) == 1 or v_transposed(v_cache)):
        raise ValueError("k_cache needs a contiguous head_dim (stride 1), v_cache that or contiguous slots")
    if plan.slot_start.numel() < bsz + 1:
        raise ValueError(f"the plan's slot_start holds {plan.slot_start.numel()} values, the batch needs {bsz + 1}")
    if plan.jobs.shape[1] != job_width(plan.members) or plan.jobs.stride(1) != 1:
        raise ValueError("the plan's job rows need 4 + 3 * members contiguous columns")
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty_like(q) if out is None else out
    if bsz == 0:
        return out
    group = hq // hkv
    if config is None:  # over FP8 pages with V transposed: three stages, as decode's (measured: docs/benchmarks.md)
        config = decode_config(head_dim, k_cache.dtype, page_size, v_transposed=v_transposed(v_cache))
    if page_size % config.block_n:
        raise ValueError(f"page_size {page_size} is not a multiple of the tile ({config.block_n} slots)")
    slots = max(1, plan.num_slots)
    acc = torch.empty(hq, slots, head_dim, dtype=torch.float32, device=q.device)
    m = torch.empty(hq, slots, dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    apply_delta = tables is not None
    cos = tables.cos if apply_delta else q  # placeholder pointers when the rotation is compiled out
    sin = tables.sin if apply_delta else q
    if apply_delta and (cos.stride(-1) != 1 or sin.stride() != cos.stride()):
        cos, sin = cos.contiguous(), sin.contiguous()
    firsts = batch.valid if batch.firsts is None else batch.firsts  # placeholder pointer without offsets
    ape = batch.valid if batch.inv_temps is None else batch.inv_temps
    if batch.inv_temps is not None and batch.inv_temps.stride(0) != firsts.stride(0):
        raise ValueError("PagedBatch inv_temps need the row stride of firsts (of valid without firsts)")
    block_r = max(16, triton.next_power_of_2(plan.members * group))
    block_d = triton.next_power_of_2(head_dim)
    # The interpreter multiplies 16-bit floats as raw bits (decode.py): widen after rounding there.
    tile_ty = TL_DTYPES[tile_dtype(q.dtype, k_cache.dtype)]
    dot_ty = tl.float32 if interpreting() else tile_ty
    # decode_config's register cap is for 16-row tiles; larger member tiles keep the compiler's choice.
    regs = {"maxnreg": config.maxnreg} if config.maxnreg and block_r <= 16 else {}
    if plan.programs:
        _shared_job_kernel[(plan.programs, hkv)](
            q,
            k_cache,
            v_cache,
            acc,
            m,
            l,
            plan.num_jobs,
            plan.jobs,
            batch.pages,
            batch.valid,
            firsts,
            ape,
            cos,
            sin,
            q.stride(0),
            q.stride(1),
            *k_cache.stride()[:3],
            *v_cache.stride(),
            plan.jobs.stride(0),
            batch.pages.stride(0),
            batch.valid.stride(0),
            firsts.stride(0),
            batch.ape_gap,
            cos.stride(0),
            slots,
            scale * LOG2E,
            MEMBERS=plan.members,
            GROUP=group,
            HEAD_DIM=head_dim,
            BLOCK_R=block_r,
            BLOCK_D=block_d,
            BLOCK_N=config.block_n,
            TILES_PER_PAGE=page_size // config.block_n,
            APPLY_DELTA=apply_delta,
            INTERLEAVED=bool(tables.interleaved) if apply_delta else False,
            DOT_TY=dot_ty,
            DOT_PRECISION="ieee" if dot_ty == tl.float32 else "tf32",
            HAS_FIRST=batch.firsts is not None,
            HAS_APE=batch.inv_temps is not None,
            V_T=v_transposed(v_cache),
            TILE_TY=tile_ty,
            num_warps=8 if block_r >= 64 else config.num_warps,  # 64 rows of fp32 acc: 64 registers a thread at 8
            num_stages=config.num_stages,
            **regs,
        )
    block_h = triton.next_power_of_2(group)
    _shared_merge_kernel[(bsz, hkv)](
        acc,
        m,
        l,
        plan.slot_start,
        out,
        out.stride(0),
        out.stride(1),
        slots,
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_H=block_h,
        BLOCK_S=max(1, _MERGE_ROWS // block_h),
        BLOCK_D=block_d,
        num_warps=4,
    )
    return out


def worth_sharing(plan: HostPlan, min_saving: float = 0.1) -> bool:
    """Whether the plan reads at least `min_saving` of the listed pages fewer than the plain decode kernel would (a
    system prompt's page shared by every entry alone is not worth the second launch). The share is not measured."""
    return plan.shared_jobs > 0 and plan.read_pages <= (1.0 - min_saving) * plan.listed_pages
