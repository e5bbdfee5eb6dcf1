"""Moving KV pages between the GPU pool and the host tier's memory (cache/host_tier.py).

The GPU pool is `[layers, 2, pages, page_size, kv_heads, head_dim]`: one page is `layers * 2` strided blocks. The
host pool is page-major, `[pages, layers, 2, page_size, kv_heads, head_dim]`, so a run of consecutive host pages
is one contiguous block and a transfer is one gather (or scatter) kernel on the GPU plus one plain DMA per run of
host pages, into or out of a contiguous staging buffer.

Ordering on CUDA, with no host-side wait (docs/design.md, "The host tier"):
- demotions run on their own stream, after everything the compute stream has queued (the pages' last writes);
  the demoted GPU pages go back to the pool at once, and every later writer of GPU pages waits for the demotion
  still reading them: a forward pass that writes one of them (`before_forward`), every promotion (it waits for the
  last demotion: most of the pages it fills were just freed by one);
- promotions run on a second stream (PCIe copies both ways at once), after the compute stream's queued work (it
  may still read pages being reused) and after the last demotion (it may still write the host pages or read the
  GPU pages); the segment becomes ready only once the host has seen the promotion's event complete, so the
  forward passes that read it are queued after the copy.
On the CPU every copy is done when the call returns.
"""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass

import torch

from lazyattn.cache.page_pool import copyable

logger = logging.getLogger("lazyattn.cache")


@dataclass(eq=False)
class Transfer:
    nbytes: int
    start: torch.cuda.Event | None = None
    end: torch.cuda.Event | None = None
    staging: torch.Tensor | None = None  # the GPU staging buffer, kept alive until the copy has landed


def _runs(pages: list[int], chunk: int = 0) -> list[tuple[int, int, int]]:
    """(offset in `pages`, count, first page) of each run of consecutive page ids; with `chunk`, a run also ends
    where a chunk of that many pages does (one copy never spans two separately page-locked ranges)."""
    runs: list[tuple[int, int, int]] = []
    for i, p in enumerate(pages):
        if runs and runs[-1][2] + runs[-1][1] == p and not (chunk and p % chunk == 0):
            off, n, first = runs[-1]
            runs[-1] = (off, n + 1, first)
        else:
            runs.append((i, 1, p))
    return runs


# The host pool is page-locked a chunk at a time, as the tier first needs it (docs/design.md, "The host tier"):
# locking a host pool up front would add tens of seconds to every engine start (docs/benchmarks.md, "Kernel
# constants"). It is done inline: measured on an H100, cudaHostRegister on a second thread holds up the first
# thread's CUDA calls for as long as it runs, so a background locker would hide nothing.
LOCK_CHUNK_BYTES = 1 << 30


def _register(host: torch.Tensor, owner: torch.Tensor) -> bool:
    """Page-lock `host` (a view of `owner`) in place, unlocked when `owner` is freed: the view itself may go at
    once. Registered rather than allocated through torch's pinned allocator, which rounds every block up to a
    power of two. False where this torch cannot register or the driver refuses."""
    cudart = torch.cuda.cudart()
    if not (hasattr(cudart, "cudaHostRegister") and hasattr(cudart, "cudaHostUnregister")):
        return False
    nbytes = host.numel() * host.element_size()
    if cudart.cudaHostRegister(host.data_ptr(), nbytes, 0) != cudart.cudaError.success:
        return False
    weakref.finalize(owner, cudart.cudaHostUnregister, host.data_ptr())
    return True


class PageMover:
    """Copies between the GPU pool and a host pool of `num_host_pages` pages. On CUDA the host pool is allocated
    (not touched) at once and page-locked in chunks of `chunk_pages` as `lock` asks for them; a copy may only
    touch locked pages (the host tier allocates from them alone). On the CPU every page counts as locked."""

    def __init__(self, device_kv: torch.Tensor, num_host_pages: int, chunk_pages: int | None = None) -> None:
        layers, two, _, page_size, heads, head_dim = device_kv.shape
        self.device_kv = copyable(device_kv)  # FP8 pages travel as their bytes
        self.device = device_kv.device
        self.cuda = device_kv.is_cuda
        self.num_pages = num_host_pages
        self.host_kv = torch.empty(
            (num_host_pages, layers, two, page_size, heads, head_dim), dtype=self.device_kv.dtype
        )
        self.page_bytes = self.host_kv[0].numel() * self.host_kv.element_size() if num_host_pages else 0
        if chunk_pages is None:
            chunk_pages = max(1, LOCK_CHUNK_BYTES // self.page_bytes) if self.page_bytes else 1
        if chunk_pages <= 0:
            raise ValueError(f"chunk_pages must be positive, got {chunk_pages}")
        self.chunk_pages = chunk_pages
        self._to_host: torch.cuda.Stream | None = None
        self._to_device: torch.cuda.Stream | None = None
        self._last_demotion: torch.cuda.Event | None = None
        # Demotions not yet seen to land, with the GPU pages they read; kept for their staging buffers too.
        self._demotions: list[tuple[Transfer, frozenset[int]]] = []
        self.pin_seconds = 0.0  # time spent page-locking so far
        self.locked_pages = 0 if self.cuda else num_host_pages
        if self.cuda and num_host_pages:
            self._to_host = torch.cuda.Stream(self.device)
            self._to_device = torch.cuda.Stream(self.device)

    # -- page-locking ------------------------------------------------------------------------------------------

    @property
    def locked_bytes(self) -> int:
        return self.locked_pages * self.page_bytes

    def lock(self, num_pages: int) -> int:
        """Page-lock the host pool's first `num_pages` pages (whole chunks, at most the pool); returns the pages
        locked now, fewer than asked for only if the driver refused."""
        while self.locked_pages < min(num_pages, self.num_pages):
            first = self.locked_pages
            last = min(first + self.chunk_pages, self.num_pages)
            start = time.monotonic()
            if self.cuda and not _register(self.host_kv[first:last], self.host_kv):
                last = self._cannot_register(first)
            self.pin_seconds += time.monotonic() - start
            self.locked_pages = last
        return self.locked_pages

    def _cannot_register(self, first: int) -> int:
        """Where registration fails. On the first chunk (nothing copied yet: the tier uses no page before it is
        locked) the pool is replaced by one from torch's pinned allocator, which rounds up to a power of two;
        later, the pool stops growing at what is locked. Returns the pages locked."""
        if first == 0:
            logger.warning(
                "could not register host memory for the host tier; pinning %.1f GiB through torch",
                self.num_pages * self.page_bytes / 2**30,
            )
            self.host_kv = torch.empty_like(self.host_kv, pin_memory=True)
            return self.num_pages
        logger.warning(
            "could not page-lock more host memory; the host tier stays at %.1f GiB", first * self.page_bytes / 2**30
        )
        self.num_pages = first
        return first

    # -- copies ------------------------------------------------------------------------------------------------

    def to_host(self, device_pages: list[int], host_pages: list[int]) -> Transfer:
        """Copy GPU pages into host pages (same order)."""
        self._check_locked(host_pages)
        t = Transfer(len(device_pages) * self.page_bytes)
        if not self.cuda:
            staged = self.device_kv[:, :, device_pages].permute(2, 0, 1, 3, 4, 5)
            for off, n, first in _runs(host_pages, self.chunk_pages):
                self.host_kv[first : first + n].copy_(staged[off : off + n])
            return t
        stream = self._to_host
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            t.start, t.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t.start.record(stream)
            index = self._index(device_pages)
            t.staging = self.device_kv.index_select(2, index).permute(2, 0, 1, 3, 4, 5).contiguous()
            for off, n, first in _runs(host_pages, self.chunk_pages):
                self.host_kv[first : first + n].copy_(t.staging[off : off + n], non_blocking=True)
            t.end.record(stream)
        self._last_demotion = t.end
        self._demotions = [d for d in self._demotions if not d[0].end.query()] + [(t, frozenset(device_pages))]
        return t

    def to_device(self, host_pages: list[int], device_pages: list[int]) -> Transfer:
        """Copy host pages into GPU pages (same order)."""
        self._check_locked(host_pages)
        t = Transfer(len(device_pages) * self.page_bytes)
        if not self.cuda:
            index = torch.tensor(device_pages, dtype=torch.int64)
            self.device_kv.index_copy_(2, index, self.host_kv[host_pages].permute(1, 2, 0, 3, 4, 5))
            return t
        stream = self._to_device
        stream.wait_stream(torch.cuda.current_stream(self.device))
        if self._last_demotion is not None:
            stream.wait_event(self._last_demotion)
        with torch.cuda.stream(stream):
            t.start, t.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t.start.record(stream)
            index = self._index(device_pages)
            t.staging = torch.empty(
                (len(device_pages), *self.host_kv.shape[1:]), dtype=self.host_kv.dtype, device=self.device
            )
            for off, n, first in _runs(host_pages, self.chunk_pages):
                t.staging[off : off + n].copy_(self.host_kv[first : first + n], non_blocking=True)
            self.device_kv.index_copy_(2, index, t.staging.permute(1, 2, 0, 3, 4, 5))
            t.end.record(stream)
        return t

    def _check_locked(self, host_pages: list[int]) -> None:
        # An asynchronous copy with pageable memory would silently run synchronously (or, queued behind the copy
        # stream, late): the tier hands out locked pages only, so this is a bookkeeping bug.
        if host_pages and max(host_pages) >= self.locked_pages:
            raise ValueError(f"host page {max(host_pages)} is not page-locked yet ({self.locked_pages} are)")

    # -- completion --------------------------------------------------------------------------------------------

    def done(self, t: Transfer) -> bool:
        landed = t.end is None or t.end.query()
        if landed:
            t.staging = None
        return landed

    def wait(self, t: Transfer) -> None:
        if t.end is not None:
            t.end.synchronize()
        t.staging = None

    def seconds(self, t: Transfer) -> float:
        """Copy-stream time of a landed transfer (0 on the CPU)."""
        return t.start.elapsed_time(t.end) / 1e3 if t.start is not None else 0.0

    def before_forward(self, written: set[int]) -> None:
        """Queue the compute stream after the demotions still reading GPU pages the next forward pass writes
        (`written`); the others go on beside it. Demotions land in order, so waiting for the newest such one is
        enough."""
        self._demotions = [d for d in self._demotions if not d[0].end.query()]
        clashing = [t for t, pages in self._demotions if not pages.isdisjoint(written)]
        if clashing:
            torch.cuda.current_stream(self.device).wait_event(clashing[-1].end)

    def _index(self, pages: list[int]) -> torch.Tensor:
        # Through pinned memory: a copy from pageable memory would block the host until the copy stream's queue
        # (earlier transfers) has drained.
        return torch.tensor(pages, dtype=torch.int64).pin_memory().to(self.device, non_blocking=True)
