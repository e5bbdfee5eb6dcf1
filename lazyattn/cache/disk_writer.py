"""The disk tier's writer (docs/design.md, "The disk tier"): documents' KV queued when they are encoded, written by a
background thread one file per document (cache/disk_format.py), the directory kept within its budget.

Writes are best effort: documents waiting to be written hold their KV in host memory (pinned on CUDA), at most
`max_pending_bytes` of it; an encode beyond that is not written (`skipped`), so a slow disk never stalls serving and
never takes more host memory than that. (On CUDA each also holds a GPU staging copy until its copy to the host has
landed, a few milliseconds.)
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import TYPE_CHECKING

import torch

from lazyattn.cache.disk_format import HEADER_BYTES, Header, checksum, enforce_budget, write_atomic
from lazyattn.cache.page_pool import copyable

if TYPE_CHECKING:
    from lazyattn.cache.segment import Segment

logger = logging.getLogger("lazyattn.cache")


class DiskWriter:
    """Writes documents' pages from `device_kv` into `directory` (files named by the tier), at most
    `budget_bytes` of files there."""

    def __init__(
        self, directory: str, budget_bytes: int, device_kv: torch.Tensor, layout: str, max_pending_bytes: int
    ) -> None:
        self.directory = directory
        self.budget_bytes = budget_bytes
        self.device_kv = copyable(device_kv)  # FP8 pages travel as their bytes
        self.kv_dtype = dtype_name(device_kv.dtype)
        self.layout = layout
        self.max_pending_bytes = max_pending_bytes
        self.page_bytes = device_kv[:, :, 0].numel() * device_kv.element_size()
        self._pending: dict[str, int] = {}  # keys queued for writing: their bytes
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._stream = torch.cuda.Stream(device_kv.device) if device_kv.is_cuda else None
        self.bytes_used = 0
        self.reset_stats()
        self.scan()
        self._thread = threading.Thread(target=self._loop, name="lazyattn-disk-writer", daemon=True)
        self._thread.start()

    def reset_stats(self) -> None:
        self.writes = self.skipped = self.evictions = self.bytes_written = 0
        self.seconds = 0.0

    def write(self, segment: Segment, path: str) -> None:
        """Queue the segment's KV for writing to `path`, unless a file or a write of it exists or too many writes
        wait. The pages are gathered on the current (compute) stream, so later writes of them come after."""
        size = HEADER_BYTES + len(segment.pages) * self.page_bytes
        with self._lock:
            if segment.key in self._pending:
                return
            if sum(self._pending.values()) + size > self.max_pending_bytes or size > self.budget_bytes:
                self.skipped += 1
                return
        if os.path.exists(path):
            return
        index = page_index(list(segment.pages), self.device_kv)
        staged = self.device_kv.index_select(2, index).permute(2, 0, 1, 3, 4, 5).contiguous()  # in stream order
        event = None
        if self._stream is not None:
            host = torch.empty(staged.shape, dtype=staged.dtype, pin_memory=True)
            self._stream.wait_stream(torch.cuda.current_stream(self.device_kv.device))
            with torch.cuda.stream(self._stream):
                host.copy_(staged, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self._stream)
            staged.record_stream(self._stream)
            staged = host
        with self._lock:
            self._pending[segment.key] = size
        self._queue.put((segment.key, segment.n_tokens, path, staged, event))

    def flush(self) -> None:
        """Wait until every queued write is on disk."""
        self._queue.join()

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
        self._thread.join()

    def scan(self) -> None:
        """Remove the least recently used files beyond the budget; count what is left."""
        used, evicted = enforce_budget(self.directory, self.budget_bytes)
        self.bytes_used = used
        self.evictions += evicted

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            key, n_tokens, path, pages, event = item
            try:
                if event is not None:
                    event.synchronize()
                start = time.perf_counter()
                payload = as_bytes(pages)
                header = Header(
                    key, self.layout, n_tokens, pages.shape[0], self.page_bytes, checksum(payload), self.kv_dtype
                )
                write_atomic(path, header, payload)
                self.seconds += time.perf_counter() - start
                self.writes += 1
                self.bytes_written += HEADER_BYTES + len(payload)
                self.bytes_used += HEADER_BYTES + len(payload)
                self.scan()
            except Exception:
                logger.exception("disk tier: could not write %s", path)
            finally:
                with self._lock:
                    self._pending.pop(key, None)
                self._queue.task_done()


def dtype_name(dtype: torch.dtype) -> str:
    """A dtype as files and layouts name it: float8_e4m3fn, bfloat16, float32."""
    return str(dtype).removeprefix("torch.")


def page_index(pages: list[int], device_kv: torch.Tensor) -> torch.Tensor:
    """The page ids as an index tensor on the pool's device."""
    index = torch.tensor(pages, dtype=torch.int64)
    if not device_kv.is_cuda:
        return index
    # Through pinned memory: a copy from pageable memory would block the host until the stream has drained.
    return index.pin_memory().to(device_kv.device, non_blocking=True)


def as_bytes(t: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's bytes, without a copy."""
    return memoryview(t.view(torch.uint8).numpy()).cast("B") if t.numel() else memoryview(b"")
