"""The attention contract shared by the PyTorch reference and the Triton kernels.

KV lives in pages: per layer, K and V are `[num_pages, page_size, kv_heads, head_dim]` (views of the page
pool). One attention launch serves a batch of B *entries*. An entry is a run of query rows at contiguous
logical positions, attending to its own list of pages:

- query row i of entry b sits at logical position `q_start[b] + i` and has already been rotated there;
- page i of entry b is physical page `pages[b, i]`; its slots `[f, f + valid[b, i])` hold keys, where
  f = `firsts[b, i]` (0 unless the entry lists only the tail of a page, see below);
- slot t of that page holds the key of logical position `starts[b, i] + t - f`, cached rotated at position
  `starts[b, i] + t - f - deltas[b, i]`. The kernel puts it back at its logical position on the fly (delta);
- `starts` is the exclusive running sum of `valid`: logical positions are contiguous and page padding
  (and slots before `first`) never shows up in positions;
- a query at position m sees exactly the keys whose logical position is <= m (causal).

Every masking pattern of the block semantics (docs/design.md) comes from which pages an entry lists: a
segment being encoded lists only its own pages (delta 0, local positions), the final segment lists every
segment's pages (delta = the segment's start) followed by its own (delta 0). Chunked prefill is an entry
whose q_start is mid-segment. A relinked request (docs/design.md, "Relink") lists a shared document's
pages from the first one holding a row it did not recompute, with `first` = that row's slot: the shared
copy's first k rows are skipped for that entry only. `firsts=None` (every entry's firsts all 0) is the
contract without offsets, and the kernels compile the offset out for it.

Attention temperature and scale (docs/design.md, "APE"): page i of entry b may carry `inv_temps[b, i]` (1/T) and
`log_scales[b, i]` (ln S). A query's score against a key of that page, s = scale * q.k, becomes
s * inv_temps + log_scales: the key's softmax weight is multiplied by S and sharpened by 1/T. The engine sets them on
the document pages of a final segment's entries; 1 and 0 leave a page as it is. `inv_temps=None` (then
`log_scales` is None too) is the contract without them, compiled out by the kernels. Both are float32 [B, P] views
of one buffer with the row stride of `pages`: the kernels take `inv_temps` and find `log_scales` `ape_gap`
elements further.

Invariant the kernels rely on: the keys of the queries themselves are written to the cache before the
attention call, so every query row sees at least one key.

Under programmatic dependent launch (kernels/launch.py) the decode and Hopper prefill kernels read the tables
(pages, deltas, valid, starts, firsts, num_pages, q_start) before waiting for the kernel launched before them: the
tables must be on the device before that kernel (a copy, as `PagedBatch.build` and the engine's graph inputs make
them, or a stream synchronised after the kernel that computed them). q and the cache are read after the wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lazyattn.kernels.kv_dtype import is_fp8

# The longest entry the Hopper short-prefill kernel takes whatever it reads (kernels/prefill_hopper.py, MAX_QUESTION);
# a longer one only where it is a question over placed documents (EntryPages.reads_documents). Here so that the
# engine's host code counts those without importing Triton (engine/graph_inputs.py).
HOPPER_MAX_QUESTION = 256


def cdiv(a: int, b: int) -> int:
    """Ceiling division: how many pages of size `b` hold `a` tokens."""
    return -(-a // b)


def page_fill(n_tokens: int, page_size: int, first: int = 0) -> list[int]:
    """Valid tokens per page of `n_tokens` written from slot `first` of their first page on (a segment that owns
    whole pages: 0; the last page may be partial)."""
    if not first:
        full, rest = divmod(n_tokens, page_size)
        return [page_size] * full + ([rest] if rest else [])
    head = min(page_size - first, n_tokens)
    return [head, *page_fill(n_tokens - head, page_size)]


@dataclass
class EntryPages:
    """One entry's pages, as the engine describes them (host-side lists)."""

    pages: Sequence[int]
    deltas: Sequence[int]
    valid: Sequence[int]
    firsts: Sequence[int] | None = None  # first key slot per page; None: all 0
    inv_temps: Sequence[float] | None = None  # 1/T per page (module docstring); None: all 1
    log_scales: Sequence[float] | None = None  # ln S per page; None: all 0 (given with inv_temps)
    # Not fields (never compared, nor sent to tensor-parallel workers): the entry this one extends (`then`), whose
    # pages are this one's first, and what the host derived from an entry once (kernels/shared_decode.py's runs,
    # engine/graph_inputs.py's tables), valid while its lists stay as they are. Why: a sequence's context is made
    # once (engine/scheduler.py) and extended by its own pages every step; what is derived from it is kept with it.
    base = None
    derived = None

    def then(self, pages: Sequence[int], valid: Sequence[int], first: int = 0) -> EntryPages:
        """These pages followed by `pages` holding `valid` keys each from slot 0 (the first of them from slot
        `first`: a run packed after another one's rows), at delta 0 (a run's own)."""
        n = len(pages)
        firsts = self.firsts
        if first and firsts is None:
            firsts = [0] * len(self.pages)
        if firsts is not None:
            firsts = [*firsts, *([first] if n else []), *[0] * (n - 1)]
        inv_temps = None if self.inv_temps is None else [*self.inv_temps, *[1.0] * n]
        log_scales = None if self.log_scales is None else [*self.log_scales, *[0.0] * n]
        entry = EntryPages(
            [*self.pages, *pages], [*self.deltas, *[0] * n], [*self.valid, *valid], firsts, inv_temps, log_scales
        )
        entry.base = self
        return entry

    def memo(self) -> dict:
        """The entry's store of derived forms (`derived`), made on first use."""
        if self.derived is None:
            self.derived = {}
        return self.derived

    @property
    def has_ape(self) -> bool:
        """Whether any page changes its scores (a temperature or a scale other than 1)."""
        return self.inv_temps is not None and (
            any(t != 1.0 for t in self.inv_temps) or any(s != 0.0 for s in self.log_scales or ())
        )

    def reads_documents(self, rows: int) -> bool:
        """Whether an entry of `rows` query rows over these pages is a question over placed documents: it reads at
        least as many keys at a nonzero delta (segments cached at other positions than the ones it reads them at) as
        it has rows. A prompt, or a chunk of one, reads its own earlier rows at delta 0, and is not."""
        return sum(v for d, v in zip(self.deltas, self.valid) if d) >= rows


@dataclass
class PagedBatch:
    """Device-side metadata of one attention launch (all int32)."""

    cu_seqlens_q: torch.Tensor  # [B + 1] packed query row offsets
    q_start: torch.Tensor  # [B] logical position of each entry's first query row
    pages: torch.Tensor  # [B, P] physical page ids (0 where past num_pages)
    deltas: torch.Tensor  # [B, P] logical position minus cached rotation position
    valid: torch.Tensor  # [B, P] keys held by each page (0 where past num_pages)
    starts: torch.Tensor  # [B, P] logical position of slot 0 of each page
    num_pages: torch.Tensor  # [B]
    max_q: int  # longest query run
    max_kv: int  # most keys of any entry
    firsts: torch.Tensor | None = None  # [B, P] first key slot of each page; None: all 0 (compiled out)
    num_splits: int | None = None  # prefill split-KV count; None: the launcher picks (CUDA graphs fix it)
    # [B, num_splits, PLAN_WIDTH] int32: the host's plan of each entry's pages over the splits
    # (kernels/prefill_plan.py, split_plan); None: the kernel finds each split's pages itself
    plan: torch.Tensor | None = None
    inv_temps: torch.Tensor | None = None  # [B, P] float32, 1/T of each page; None: all 1 (compiled out)
    log_scales: torch.Tensor | None = None  # [B, P] float32, ln S of each page, in inv_temps' buffer
    # The most query rows of an entry that is not a question over placed documents (EntryPages.reads_documents: a
    # prompt or a chunk of one), 0 if none; None: not counted (max_q stands for it). What the Hopper short-prefill
    # kernel's rule reads (kernels/prefill_hopper.py, `supports`); the engine counts it only for the entries longer
    # than that kernel's longest question (engine/graph_inputs.py).
    max_prompt_q: int | None = None

    @property
    def ape_gap(self) -> int:
        """Elements from inv_temps to log_scales in their shared buffer (what the kernels take)."""
        if self.inv_temps is None or self.log_scales is None:
            return 0
        if self.log_scales.stride() != self.inv_temps.stride() or self.inv_temps.stride(0) != self.pages.stride(0):
            raise ValueError("inv_temps and log_scales need the row stride of pages")
        gap, rest = divmod(self.log_scales.data_ptr() - self.inv_temps.data_ptr(), self.inv_temps.element_size())
        if rest or self.inv_temps.untyped_storage().data_ptr() != self.log_scales.untyped_storage().data_ptr():
            raise ValueError("inv_temps and log_scales must be views of one buffer")
        return gap

    @property
    def batch_size(self) -> int:
        return self.q_start.shape[0]

    @property
    def max_pages(self) -> int:
        return self.pages.shape[1]

    @staticmethod
    def build(
        entries: Sequence[EntryPages],
        q_lens: Sequence[int],
        q_starts: Sequence[int],
        device: torch.device | str = "cpu",
    ) -> PagedBatch:
        if not (len(entries) == len(q_lens) == len(q_starts)):
            raise ValueError("entries, q_lens and q_starts must have one element per entry")
        b = len(entries)
        width = max((len(e.pages) for e in entries), default=0) or 1
        pages = torch.zeros(b, width, dtype=torch.int32)
        deltas = torch.zeros(b, width, dtype=torch.int32)
        valid = torch.zeros(b, width, dtype=torch.int32)
        firsts = None
        ape = None  # [2, B, W]: inv_temps, log_scales
        for i, e in enumerate(entries):
            if not (len(e.pages) == len(e.deltas) == len(e.valid)):
                raise ValueError(f"entry {i}: pages, deltas and valid differ in length")
            n = len(e.pages)
            pages[i, :n] = torch.tensor(list(e.pages), dtype=torch.int32)
            deltas[i, :n] = torch.tensor(list(e.deltas), dtype=torch.int32)
            valid[i, :n] = torch.tensor(list(e.valid), dtype=torch.int32)
            if e.firsts is not None and any(e.firsts):
                if len(e.firsts) != n or min(e.firsts) < 0:
                    raise ValueError(f"entry {i}: firsts must be one slot >= 0 per page")
                firsts = torch.zeros(b, width, dtype=torch.int32) if firsts is None else firsts
                firsts[i, :n] = torch.tensor(list(e.firsts), dtype=torch.int32)
            if e.has_ape:
                if len(e.inv_temps) != n or len(e.log_scales) != n:
                    raise ValueError(f"entry {i}: inv_temps and log_scales need one value per page")
                if min(e.inv_temps) <= 0:
                    raise ValueError(f"entry {i}: inv_temps must be > 0")
                if ape is None:
                    ape = torch.zeros(2, b, width, dtype=torch.float32)
                    ape[0] = 1.0
                ape[0, i, :n] = torch.tensor(list(e.inv_temps), dtype=torch.float32)
                ape[1, i, :n] = torch.tensor(list(e.log_scales), dtype=torch.float32)
        starts = torch.cumsum(valid, dim=1, dtype=torch.int32) - valid
        cu = torch.zeros(b + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(torch.tensor(list(q_lens), dtype=torch.int32), 0)
        dev = torch.device(device)
        return PagedBatch(
            cu_seqlens_q=cu.to(dev),
            q_start=torch.tensor(list(q_starts), dtype=torch.int32).to(dev),
            pages=pages.to(dev),
            deltas=deltas.to(dev),
            valid=valid.to(dev),
            starts=starts.to(dev),
            num_pages=torch.tensor([len(e.pages) for e in entries], dtype=torch.int32).to(dev),
            max_q=max(q_lens, default=0),
            max_kv=int(valid.sum(1).max()) if b else 0,
            firsts=None if firsts is None else firsts.to(dev),
            max_prompt_q=max((q for e, q in zip(entries, q_lens) if not e.reads_documents(q)), default=0),
            **({} if ape is None else dict(zip(("inv_temps", "log_scales"), ape.to(dev).unbind(0)))),
        )


def v_transposed(v_cache: torch.Tensor) -> bool:
    """Whether V's pages are stored transposed: a page's slots contiguous for each kv head and channel (stride 1
    along slots, not along head_dim), as the page pool stores FP8 pages' V (docs/design.md, "FP8 KV cache")."""
    return v_cache.stride(1) == 1 and v_cache.stride(-1) != 1


def transposed_copy(v_cache: torch.Tensor) -> torch.Tensor:
    """A copy of V pages [pages, slots, heads, head_dim] stored transposed (`v_transposed`), seen the same way: the
    same values in the order in which a pool that `transposes_v` holds them (`layer_caches`)."""
    return v_cache.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


def transposes_v(dtype: torch.dtype) -> bool:
    """Whether a page pool of `dtype` stores V's pages transposed (`v_transposed`): FP8 pools. Their V tiles then reach
    the P·V products by matrix loads, which transpose 16-bit elements only (docs/design.md, "FP8 KV cache")."""
    return is_fp8(dtype)


def layer_caches(kv: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer `layer`'s K and V caches, [num_pages, page_size, kv_heads, head_dim] each, of the pool
    [layers, 2, num_pages, page_size, kv_heads, head_dim] (cache/page_pool.py, either layout). Over a pool that
    `transposes_v`, V is a view of the same bytes with each page's slots contiguous for each kv head and channel:
    a page holds the same bytes in another order, so whatever copies whole pages (the tiers, block mode's copy) copies
    V as it is."""
    k, v = kv[layer, 0], kv[layer, 1]
    if transposes_v(kv.dtype):
        _, page_size, _, head_dim = v.shape
        v = v.as_strided(v.shape, (kv.stride(2), 1, head_dim * page_size, page_size))
    return k, v
