"""The page pool: which KV pages are free, and how many pages the GPU can hold.

The engine allocates the KV tensor `[layers, 2, num_pages, page_size, kv_heads, head_dim]` once (`allocate_kv`);
this module hands out page *ids* into it. Allocation runs every scheduler step, so it is a free-list stack plus a
per-page in-use flag: O(1) per page, no scans.

Layout. Every kernel and copy takes the KV tensor's strides, so its memory order is a choice of its own
(LAZYATTN_KV_LAYOUT): `token` (the default) stores a page slot by slot, each slot holding every kv head, so one
(page, kv head) tile, what an attention program reads, is page_size rows of head_dim values at a stride of
kv_heads * head_dim; `head` stores each such tile as one contiguous block. Both show the same logical shape and
give the same results; head-major pages read no faster on the GPU (within the spread in decode, slower in
prefill: docs/kernels.md, "Tried and dropped"), so `token` stays the default. The Hopper prefill kernel's copy-engine
descriptor is built for `token` pages (kernels/prefill_hopper.py `takes_layout`): with `head` pages the engine's
short prefill calls run prefill.py's kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lazyattn.errors import InvalidRequestError, OutOfPagesError

GiB = 1 << 30
MiB = 1 << 20

# Fewer pages than this cannot hold even a short request with a couple of documents: refuse to start
# rather than fail on the first request.
MIN_PAGES = 16

# Left free besides the KV pool for activations, the sampler and allocator fragmentation. The caller
# passes a profiled figure when it has one.
DEFAULT_RESERVE_BYTES = 1 * GiB


KV_LAYOUTS = ("token", "head")


def allocate_kv(
    num_layers: int,
    num_pages: int,
    page_size: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str,
    layout: str = "token",
) -> torch.Tensor:
    """The engine's KV tensor [num_layers, 2, num_pages, page_size, kv_heads, head_dim], zeroed (never-written page
    tails then hold finite values), stored in `layout` order (the engine passes LAZYATTN_KV_LAYOUT's,
    lazyattn/envs.py). A `head` tensor is a view of [num_layers, 2, num_pages, kv_heads, page_size, head_dim]
    storage: each (page, kv head) tile is contiguous."""
    if layout == "token":
        return torch.zeros(num_layers, 2, num_pages, page_size, kv_heads, head_dim, dtype=dtype, device=device)
    if layout == "head":
        kv = torch.zeros(num_layers, 2, num_pages, kv_heads, page_size, head_dim, dtype=dtype, device=device)
        return kv.transpose(3, 4)
    raise ValueError(f"unknown KV layout {layout!r}: use one of {', '.join(KV_LAYOUTS)}")


def copyable(kv: torch.Tensor) -> torch.Tensor:
    """The pool (or a view of it) as the tiers copy it, byte for byte: a one-byte dtype (FP8 pages, docs/design.md,
    "FP8 KV cache") as uint8 of the same shape and strides, since torch's index_copy_ takes no float8; others as
    they are."""
    return kv.view(torch.uint8) if kv.element_size() == 1 else kv


def bytes_per_page(num_layers: int, kv_heads: int, head_dim: int, page_size: int, dtype: torch.dtype) -> int:
    """Bytes one page id costs across all layers, K and V together."""
    return num_layers * 2 * page_size * kv_heads * head_dim * dtype.itemsize


def pages_for_budget(budget_bytes: int, per_page_bytes: int, min_pages: int = MIN_PAGES) -> int:
    """Pages that fit in a fixed KV budget (the benchmarks' 1 / 10 / 50 GB)."""
    if per_page_bytes <= 0:
        raise ValueError(f"per_page_bytes must be positive, got {per_page_bytes}")
    n = max(budget_bytes, 0) // per_page_bytes
    if n < min_pages:
        raise InvalidRequestError(
            f"a KV budget of {budget_bytes / MiB:.1f} MiB holds {n} pages of {per_page_bytes / MiB:.2f} MiB; "
            f"at least {min_pages} pages ({min_pages * per_page_bytes / MiB:.1f} MiB) are needed. "
            "Raise the budget or use a smaller page size.",
            param="kv_budget",
        )
    return n


def pages_from_free_memory(
    utilization: float,
    device: torch.device | str | int,
    per_page_bytes: int,
    reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    min_pages: int = MIN_PAGES,
) -> int:
    """Pages for the KV pool, vLLM-style: the engine may use `utilization` of the device's *total* memory.

    What is already in use (model weights, other processes) counts against that share, so call this
    after the weights are loaded. `reserve_bytes` stays free for activations.
    """
    if not 0.0 < utilization <= 1.0:
        raise InvalidRequestError(f"utilization must be in (0, 1], got {utilization}", param="utilization")
    if per_page_bytes <= 0:
        raise ValueError(f"per_page_bytes must be positive, got {per_page_bytes}")
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"pages_from_free_memory needs a CUDA device, got {dev}; use pages_for_budget")
    free, total = torch.cuda.mem_get_info(dev)
    used = total - free
    available = int(utilization * total) - used - reserve_bytes
    n = max(available, 0) // per_page_bytes
    if n < min_pages:
        raise InvalidRequestError(
            f"not enough GPU memory for the KV cache on {dev}: {utilization:.0%} of {total / GiB:.2f} GiB "
            f"is {utilization * total / GiB:.2f} GiB, of which {used / GiB:.2f} GiB is already in use and "
            f"{reserve_bytes / GiB:.2f} GiB is reserved, leaving {max(available, 0) / GiB:.2f} GiB "
            f"= {n} pages of {per_page_bytes / MiB:.2f} MiB; at least {min_pages} pages "
            f"({min_pages * per_page_bytes / GiB:.2f} GiB) are needed. Raise utilization, lower the "
            "reserve, free GPU memory, or use a smaller model or page size.",
            param="utilization",
        )
    return n


class PagePool:
    """Free/used bookkeeping of `num_pages` page ids.

    Invariants: `num_free + num_used == num_pages`; a page is on the free stack iff its in-use flag is
    clear; every failed call (OutOfPagesError, ValueError) leaves the pool unchanged.
    """

    def __init__(self, num_pages: int) -> None:
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        self._num_pages = num_pages
        # A stack whose top is the lowest id: a fresh pool hands out 0, 1, 2, ... (easy to read in tests),
        # and recently freed pages are reused first (warm in the GPU's L2).
        self._free = list(range(num_pages - 1, -1, -1))
        self._in_use = bytearray(num_pages)
        self._high_water = 0
        self._withheld: list[int] = []  # pages taken out of use by set_budget

    @property
    def num_pages(self) -> int:
        return self._num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self._num_pages - len(self._free)

    @property
    def high_water(self) -> int:
        """Most pages ever in use at once (peak KV memory = high_water * bytes_per_page)."""
        return self._high_water

    def reset_high_water(self) -> None:
        """Start a new peak measurement from the current use (e.g. after a warm-up)."""
        self._high_water = self.num_used

    def allocate(self, n: int) -> list[int]:
        """n page ids, all or nothing."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        if n > len(self._free):
            raise OutOfPagesError(f"need {n} KV pages, {len(self._free)} of {self._num_pages} are free")
        if n == 0:
            return []
        pages = self._free[-n:]
        del self._free[-n:]
        pages.reverse()
        for p in pages:
            self._in_use[p] = 1
        self._high_water = max(self._high_water, self.num_used)
        return pages

    def free(self, pages: Sequence[int]) -> None:
        """Return pages to the pool. Validates every page first: a bad one frees nothing."""
        for p in pages:
            if not 0 <= p < self._num_pages:
                raise ValueError(f"page {p} is outside the pool of {self._num_pages} pages")
            if not self._in_use[p]:
                raise ValueError(f"page {p} is already free (double free)")
        if len(pages) > 1 and len(set(pages)) != len(pages):
            raise ValueError(f"pages freed twice in one call: {sorted(pages)}")
        for p in pages:
            self._in_use[p] = 0
        # Reversed so that a later allocate of the same size gets them back in the same order.
        self._free.extend(reversed(pages))

    def grow(self, n: int) -> None:
        """Add n new page ids after the current ones (the host tier growing into newly page-locked memory). They
        go under the free pages on the stack: the pages already there are handed out first, then the new ones
        lowest id first."""
        if n < 0:
            raise ValueError(f"cannot grow a pool by {n} pages")
        old = self._num_pages
        self._num_pages += n
        self._in_use.extend(bytes(n))
        self._free[:0] = range(self._num_pages - 1, old - 1, -1)

    def set_budget(self, num_pages: int | None) -> None:
        """Use only `num_pages` of the pool's pages (None: all of them), exactly as if it were that small: the
        pages beyond are allocated here and held until the next call (benchmarks' budget sweeps, without
        reallocating memory). The caller checks the budget's range and that nothing else holds pages it cares
        about; a pool that grows later (the host tier's) grows past the cut only by another call."""
        self.free(self._withheld)
        self._withheld = []
        if num_pages is not None and self._num_pages > num_pages:
            self._withheld = self.allocate(self._num_pages - num_pages)

    @property
    def num_withheld(self) -> int:
        """Pages set_budget holds out of use (counted in num_used)."""
        return len(self._withheld)

    def is_used(self, page: int) -> bool:
        return 0 <= page < self._num_pages and bool(self._in_use[page])

    def __repr__(self) -> str:
        return f"PagePool(num_pages={self._num_pages}, used={self.num_used}, high_water={self._high_water})"
