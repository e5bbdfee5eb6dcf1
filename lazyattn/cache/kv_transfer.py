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

logger = logging.getLogger("lazyattn.cache")


@dataclass(eq=False)
class Transfer:
    nbytes: int
    start: torch.cuda.Event | None = None
    end: torch.cuda.Event | None = None
    staging: torch.Tensor | None = None  # the GPU staging buffer, kept alive until the copy has landed


def _runs(pages: list[int]) -> list[tuple[int, int, int]]:
    """(offset in `pages`, count, first page) of each run of consecutive page ids."""
    runs: list[tuple[int, int, int]] = []
    for i, p in enumerate(pages):
        if runs and runs[-1][2] + runs[-1][1] == p:
            off, n, first = runs[-1]
            runs[-1] = (off, n + 1, first)
        else:
            runs.append((i, 1, p))
    return runs


def _pin(host: torch.Tensor) -> torch.Tensor:
    """Page-lock `host` for asynchronous copies. Registered in place rather than through torch's pinned allocator,
    which rounds every block up to a power of two (a 40 GiB tier would pin 64 GiB); that allocator is the fallback
    where this torch does not expose registration."""
    cudart = torch.cuda.cudart()
    nbytes = host.numel() * host.element_size()
    if hasattr(cudart, "cudaHostRegister") and hasattr(cudart, "cudaHostUnregister"):
        if cudart.cudaHostRegister(host.data_ptr(), nbytes, 0) == cudart.cudaError.success:
            weakref.finalize(host, cudart.cudaHostUnregister, host.data_ptr())
            return host
        logger.warning("could not register %.1f GiB of host memory for the host tier; pinning a copy", nbytes / 2**30)
    return torch.empty_like(host, pin_memory=True)


class PageMover:
    def __init__(self, device_kv: torch.Tensor, num_host_pages: int) -> None:
        layers, two, _, page_size, heads, head_dim = device_kv.shape
        self.device_kv = device_kv
        self.device = device_kv.device
        self.cuda = device_kv.is_cuda
        self.host_kv = torch.empty((num_host_pages, layers, two, page_size, heads, head_dim), dtype=device_kv.dtype)
        self.page_bytes = self.host_kv[0].numel() * self.host_kv.element_size() if num_host_pages else 0
        self._to_host: torch.cuda.Stream | None = None
        self._to_device: torch.cuda.Stream | None = None
        self._last_demotion: torch.cuda.Event | None = None
        # Demotions not yet seen to land, with the GPU pages they read; kept for their staging buffers too.
        self._demotions: list[tuple[Transfer, frozenset[int]]] = []
        self.pin_seconds = 0.0  # start-up cost of page-locking the host pool
        if self.cuda and num_host_pages:
            start = time.monotonic()
            self.host_kv = _pin(self.host_kv)
            self.pin_seconds = time.monotonic() - start
            self._to_host = torch.cuda.Stream(self.device)
            self._to_device = torch.cuda.Stream(self.device)

    # -- copies ------------------------------------------------------------------------------------------------

    def to_host(self, device_pages: list[int], host_pages: list[int]) -> Transfer:
        """Copy GPU pages into host pages (same order)."""
        t = Transfer(len(device_pages) * self.page_bytes)
        if not self.cuda:
            staged = self.device_kv[:, :, device_pages].permute(2, 0, 1, 3, 4, 5)
            for off, n, first in _runs(host_pages):
                self.host_kv[first : first + n].copy_(staged[off : off + n])
            return t
        stream = self._to_host
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            t.start, t.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t.start.record(stream)
            index = self._index(device_pages)
            t.staging = self.device_kv.index_select(2, index).permute(2, 0, 1, 3, 4, 5).contiguous()
            for off, n, first in _runs(host_pages):
                self.host_kv[first : first + n].copy_(t.staging[off : off + n], non_blocking=True)
            t.end.record(stream)
        self._last_demotion = t.end
        self._demotions = [d for d in self._demotions if not d[0].end.query()] + [(t, frozenset(device_pages))]
        return t

    def to_device(self, host_pages: list[int], device_pages: list[int]) -> Transfer:
        """Copy host pages into GPU pages (same order)."""
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
            t.staging = torch.empty((len(device_pages), *self.host_kv.shape[1:]), dtype=self.host_kv.dtype,
                                    device=self.device)
            for off, n, first in _runs(host_pages):
                t.staging[off : off + n].copy_(self.host_kv[first : first + n], non_blocking=True)
            self.device_kv.index_copy_(2, index, t.staging.permute(1, 2, 0, 3, 4, 5))
            t.end.record(stream)
        return t

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
