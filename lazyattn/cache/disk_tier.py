"""The disk tier: documents' position-free KV in files, below the host tier (docs/design.md, "The disk tier").

Inclusive and written through: when a document is encoded (`encoded`, from DocumentCache.mark_ready) its pages are
gathered on the compute stream, copied to host memory on a side stream and written by a background thread, one file
per document (cache/disk_format.py). So an acknowledged document survives a crash or restart, and a GPU eviction
costs nothing here. A GPU and host miss whose file exists is read back in the background: `claim` decides whether
the read pays (the guard below), `fill` queues the read and check of the file into pinned staging memory on the
reader thread, and `finished` (the scheduler's poll) copies each read that landed into the segment's GPU pages on
the compute stream; the requests that need the document wait for it as for an encode, the others keep running. A
file that fails the check is removed and its segment comes back `failed`: the waiting requests start over and the
document is encoded again.

The guard: a read is taken only where it is expected to be no slower than encoding the document. The tier keeps
running estimates of its read bandwidth (bytes/s of its completed reads; seeded by `read_gbps`, else by the first
read), one for files read from the device and one for files found in the page cache (disk_format.resident: a file
another engine just wrote, or read before a restart, reads at memory speed, several times the disk's), and is told
the engine's encode throughput (`observe_encode`: prefill tokens/s of its steps); a lookup whose expected read time
(the reads queued before it, plus its own bytes, each at its class's estimate) exceeds the expected encode time is a
miss, counted in `skipped_slow`. So on a disk slower than encoding the page cache's files are still read. Until a
page-cache read has been measured, such files count at the device's estimate. With `always_read` every file is read
(a restart where compute is the bottleneck).

The directory is the index: a file's name is a hash of (layout, segment key), its mtime its last use (a hit touches
it). After each write the writer scans the directory and removes the least recently used files beyond the budget.
Several engines on one host or on a shared filesystem may share a directory: files appear by atomic rename, a
reader holds an open file even when another engine removes it, and every step tolerates a file that vanished.

Writing is cache/disk_writer.py's: best effort, within a bound on the host memory of pending writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from lazyattn.cache.disk_format import (
    FORMAT_VERSION,
    HEADER_BYTES,
    SUFFIX,
    RefusedFile,
    kv_names,
    read_verified,
    resident,
    unlink,
)
from lazyattn.cache.disk_writer import DiskWriter, as_bytes, dtype_name, page_index
from lazyattn.cache.page_pool import GiB, copyable
from lazyattn.errors import CacheInvariantError, InvalidRequestError

if TYPE_CHECKING:
    from collections.abc import Callable

    from lazyattn.cache.segment import Segment

logger = logging.getLogger("lazyattn.cache")

DEFAULT_PENDING_BYTES = 4 * GiB  # host memory of writes waiting for the disk: ~16 documents of 2048 tokens at 8B
# Pinned staging memory of reads queued, in flight or landed but not yet copied to the GPU: ~4 documents of 2048
# tokens at 8B. A read beyond it is a miss (skipped_slow), except when no other read is queued.
DEFAULT_STAGING_BYTES = 1 * GiB
# One read at a time: each read already spreads its chunks over several threads (disk_format.read_verified), so one
# read keeps the disk busy, and a read's own bytes/s then measures the disk, which is what the guard needs.
READS_IN_FLIGHT = 1
ESTIMATE_WEIGHT = 0.3  # weight of the newest measurement in the running estimates (read bandwidth, encode rate)


@dataclass(frozen=True)
class DiskTierStats:
    budget_bytes: int
    bytes_used: int  # files in the directory at the last scan (every engine's), plus this engine's writes since
    hits: int  # GPU and host misses served from a file
    refused: int  # files found truncated, corrupt or foreign: removed, the document encoded again
    writes: int  # documents written
    write_skipped: int  # encodes not written: too many writes pending, or larger than the budget
    evictions: int  # files this engine removed for the budget
    bytes_read: int
    bytes_written: int
    read_seconds: float  # reading and checking files (hits and refusals), on the reader thread
    write_seconds: float  # writer thread: checksum, write, fsync, rename
    skipped_slow: int = 0  # files not read: expected slower than encoding (the guard), or staging memory full
    read_bps: float = 0.0  # the guard's estimate of read bandwidth from the device, bytes/s (0: none yet)
    encode_tps: float = 0.0  # the guard's estimate of encode throughput, tokens/s (0: none yet)
    staging_bytes: int = 0  # pinned memory held by reads not yet copied to the GPU
    resident_bps: float = 0.0  # the guard's estimate for files found in the page cache, bytes/s (0: none yet)
    resident_hits: int = 0  # hits whose file was found in the page cache

    @property
    def read_gbps(self) -> float:
        return self.bytes_read / self.read_seconds / 1e9 if self.read_seconds else 0.0


def layout_id(model_fingerprint: str, device_kv: torch.Tensor, v_transposed: bool = False) -> str:
    """What a file's bytes mean: the model, the dtype and the page shape, in the payload's page-major order, and
    whether V's pages are stored transposed (a page's slots contiguous for each kv head and channel, as the engine
    stores FP8 pages' V: kernels/paged.py), so that files of either order never meet."""
    layers, two, _, page_size, heads, head_dim = device_kv.shape
    v_order = " v=[kv_heads,head_dim,tokens]" if v_transposed else ""
    return (
        f"model={model_fingerprint} dtype={dtype_name(device_kv.dtype)} "
        f"page=[layers={layers},kv={two},tokens={page_size},kv_heads={heads},head_dim={head_dim}]{v_order}"
    )


@dataclass(eq=False)
class _Read:
    """One file read back: claimed (bytes reserved), queued by `fill`, done when `future` is."""

    key: str
    n_tokens: int
    n_pages: int
    nbytes: int  # header and payload
    resident: bool | None = None  # in the page cache when claimed (None: could not tell)
    segment: Segment | None = None
    future: Future | None = None  # the pinned staging buffer, or None if the file was gone or refused


def prepare_directory(directory: str) -> None:
    """Create the tier's directory where it is missing and check that files can be written there. Raises
    InvalidRequestError naming disk_cache_dir: a path that is a file, one under a file, one that cannot be created
    (no permission, a read-only filesystem) or a directory that is not writable."""
    try:
        os.makedirs(directory, exist_ok=True)
    except FileExistsError as e:
        raise InvalidRequestError(f"disk_cache_dir {directory}: exists and is not a directory", "disk_cache_dir") from e
    except OSError as e:
        raise InvalidRequestError(
            f"disk_cache_dir {directory}: cannot create the directory: {e.strerror or e}", "disk_cache_dir"
        ) from e
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InvalidRequestError(f"disk_cache_dir {directory}: the directory is not writable", "disk_cache_dir")


class DiskTier:
    """The document cache's lowest tier (cache/tiers.py): files in `directory`, at most `budget_bytes` of them."""

    name = "disk"

    def __init__(
        self,
        directory: str,
        budget_bytes: int,
        device_kv: torch.Tensor,
        layout: str,
        before_write: Callable[[list[int]], None] | None = None,
        max_pending_bytes: int = DEFAULT_PENDING_BYTES,
        read_gbps: float | None = None,
        always_read: bool = False,
        staging_bytes: int = DEFAULT_STAGING_BYTES,
    ) -> None:
        prepare_directory(directory)
        self.directory = directory
        self.budget_bytes = budget_bytes
        self.device_kv = copyable(device_kv)  # FP8 pages travel as their bytes
        self.kv_dtype = dtype_name(device_kv.dtype)
        self.layout = layout
        self.before_write = before_write  # orders a fill after copies still reading its GPU pages (the host tier's)
        self.page_bytes = device_kv[:, :, 0].numel() * device_kv.element_size()
        self.always_read = always_read
        self.max_staging_bytes = staging_bytes
        self._seed_bps = read_gbps * 1e9 if read_gbps else 0.0
        self._reads: list[_Read] = []  # claimed and not handed back by `finished`, oldest first
        self._readers = ThreadPoolExecutor(READS_IN_FLIGHT, thread_name_prefix="lazyattn-disk-reader")
        self.writer = DiskWriter(directory, budget_bytes, device_kv, layout, max_pending_bytes)
        self.reset_stats()

    def reset_stats(self) -> None:
        self.writer.reset_stats()
        self._hits = self._refused = self._skipped_slow = self._resident_hits = 0
        self._bytes_read = 0
        self._read_seconds = 0.0
        self._read_bps = self._seed_bps  # from the device
        self._resident_bps = 0.0  # from the page cache
        self._encode_tps = 0.0

    def stats(self) -> DiskTierStats:
        return DiskTierStats(
            self.budget_bytes,
            self.writer.bytes_used,
            self._hits,
            self._refused,
            self.writer.writes,
            self.writer.skipped,
            self.writer.evictions,
            self._bytes_read,
            self.writer.bytes_written,
            self._read_seconds,
            self.writer.seconds,
            self._skipped_slow,
            self._read_bps,
            self._encode_tps,
            self._staging(),
            self._resident_bps,
            self._resident_hits,
        )

    def path(self, key: str) -> str:
        """The document's file. The format version is part of the name, so engines of two releases sharing a
        directory (a rolling deploy) each find their own files instead of refusing and removing the other's."""
        name = hashlib.sha256(f"{FORMAT_VERSION}\x00{self.layout}\x00{key}".encode()).hexdigest()[:40]
        return os.path.join(self.directory, name + SUFFIX)

    # -- the lower-tier interface (cache/tiers.py) -------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._reads)

    def contains(self, key: str) -> bool:
        return os.path.exists(self.path(key))

    def claim(self, key: str, n_tokens: int) -> _Read | None:
        """A read of key's file (`contains` just saw it), if it pays (the guard) and its staging memory fits; None:
        a miss (the read is expected slower than an encode, or too many reads are queued). A file that vanishes
        before the read gets to it comes back `failed` from `finished`, like a refused one."""
        n_pages = -(-n_tokens // self.device_kv.shape[3])
        nbytes = HEADER_BYTES + n_pages * self.page_bytes
        queued = self._staging()
        if not self.always_read and queued and queued + nbytes > self.max_staging_bytes:
            self._skipped_slow += 1
            return None
        read = _Read(key, n_tokens, n_pages, nbytes, resident(self.path(key), nbytes))
        if not self.always_read and not self._pays([*self._reads, read], n_tokens):
            self._skipped_slow += 1
            return None
        return read

    def _pays(self, reads: list[_Read], n_tokens: int) -> bool:
        """Whether `reads` (the reads queued, then this file's) are expected to take no longer than encoding
        `n_tokens`. Without the estimates it is taken: the read measures the disk."""
        seconds = 0.0
        for r in reads:
            bps = self._bps(r.resident)
            if not bps:
                return True
            seconds += r.nbytes / bps
        return not self._encode_tps or seconds <= n_tokens / self._encode_tps

    def _bps(self, resident: bool | None) -> float:
        """The read bandwidth to expect: the page cache's once measured, else the device's."""
        return (self._resident_bps if resident else 0.0) or self._read_bps

    def observe_encode(self, n_tokens: int, seconds: float) -> None:
        """The engine computed `n_tokens` prefill tokens in `seconds` (one step): the guard's encode throughput."""
        if n_tokens > 0 and seconds > 0:
            self._encode_tps = _blend(self._encode_tps, n_tokens / seconds)

    def fill(self, read: _Read, segment: Segment) -> None:
        """Queue the claimed read for the segment's GPU pages; `finished` copies it in once it has landed."""
        if read.n_pages != len(segment.pages):
            raise ValueError(f"filling {len(segment.pages)} GPU pages from {read.n_pages} pages of a file")
        read.segment = segment
        read.future = self._readers.submit(self._read, read)
        self._reads.append(read)

    def finished(self, wait: bool = False) -> list[Segment]:
        """The segments whose read has landed, oldest first: verified ones copied into their GPU pages on the current
        stream (the forward passes that read them are queued after it), refused ones `failed`. wait: block until
        every read queued has landed."""
        if wait and self._reads:
            futures.wait([r.future for r in self._reads])
        done, pending = [], []
        for r in self._reads:
            (done if r.future.done() else pending).append(r)
        self._reads = pending
        for r in done:
            buf = r.future.result()
            if buf is None:
                r.segment.failed = True  # the cache unindexes it; its waiters start over and encode it
            else:
                self._copy_in(buf, r.segment)
        return [r.segment for r in done]

    def _copy_in(self, buf: torch.Tensor, segment: Segment) -> None:
        pages = list(segment.pages)
        if self.before_write is not None:
            self.before_write(pages)
        index = page_index(pages, self.device_kv)
        src = buf.to(self.device_kv.device, non_blocking=True)  # pinned: torch keeps it until the copy is done
        self.device_kv.index_copy_(2, index, src.permute(1, 2, 0, 3, 4, 5))

    def _staging(self) -> int:
        return sum(r.nbytes for r in self._reads)

    def _read(self, read: _Read) -> torch.Tensor | None:
        """Reader thread: the file read and checked into pinned memory, or None (gone, or refused and removed)."""
        shape = (read.n_pages, *self.device_kv.shape[:2], *self.device_kv.shape[3:])
        buf = torch.empty(shape, dtype=self.device_kv.dtype, pin_memory=self.device_kv.is_cuda)
        path = self.path(read.key)
        start = time.perf_counter()
        try:
            read_verified(path, read.key, self.layout, read.n_tokens, self.page_bytes, as_bytes(buf), self.kv_dtype)
        except FileNotFoundError:
            return None  # removed by another engine's eviction since `claim`
        except (RefusedFile, OSError) as e:
            self._refused += 1
            logger.warning("disk tier: refusing %s (%s); the document is encoded again", path, e)
            with contextlib.suppress(OSError):  # a directory we may not write to: the file stays, never served
                unlink(path)
            return None
        finally:
            self._read_seconds += time.perf_counter() - start
        seconds = time.perf_counter() - start
        if seconds > 0 and read.resident:
            self._resident_bps = _blend(self._resident_bps, read.nbytes / seconds)
        elif seconds > 0:
            self._read_bps = _blend(self._read_bps, read.nbytes / seconds)
        self._hits += 1
        self._resident_hits += bool(read.resident)
        self._bytes_read += read.nbytes
        with contextlib.suppress(OSError):
            os.utime(path)  # its last use, for LRU eviction
        return buf

    def filling(self) -> list[Segment]:
        return [r.segment for r in self._reads]

    def check(self) -> None:
        """Every claimed read targets a segment (the files themselves are checked when read)."""
        if any(r.segment is None or r.future is None for r in self._reads):
            raise CacheInvariantError("disk tier: a read in flight has no segment to fill")

    def encoded(self, segment: Segment) -> None:
        """Queue the segment's KV for writing (cache/disk_writer.py)."""
        self.writer.write(segment, self.path(segment.key))

    def evicted(self, segment: Segment) -> None:
        """Nothing: the file was written when the document was encoded."""

    def discard(self, key: str) -> bool:
        """Remove key's file (the document was deleted), after any write of it still queued."""
        self.flush()
        return unlink(self.path(key))

    def clear(self) -> int:
        """Remove every file of this directory (every engine's that shares it). Returns how many."""
        self.flush()
        n = sum(unlink(os.path.join(self.directory, name)) for name in kv_names(self.directory))
        self.writer.bytes_used = 0
        return n

    def flush(self) -> None:
        """Wait until every queued write is on disk."""
        self.writer.flush()

    def close(self) -> None:
        self._readers.shutdown(wait=True)
        self.writer.close()


def _blend(estimate: float, measured: float) -> float:
    return measured if not estimate else (1 - ESTIMATE_WEIGHT) * estimate + ESTIMATE_WEIGHT * measured


class DiskTierOptions(Protocol):
    """The engine options `make_disk_tier` reads (EngineConfig has them): the cache layer names what it needs
    rather than importing the engine above it."""

    @property
    def mode(self) -> str: ...

    @property
    def disk_cache_dir(self) -> str | None: ...

    @property
    def disk_cache_gb(self) -> float: ...

    @property
    def disk_read_gbps(self) -> float | None: ...

    @property
    def disk_always_read(self) -> bool: ...


def make_disk_tier(
    config: DiskTierOptions,
    device_kv: torch.Tensor,
    model_fingerprint: str,
    before_write: Callable[[list[int]], None] | None = None,
    v_transposed: bool = False,
) -> DiskTier | None:
    """The engine's disk tier (`disk_cache_dir`, `disk_cache_gb`), or None: off, or a mode whose cached KV is not
    position-free (prefix mode's pages hold absolute positions; full mode caches nothing)."""
    if config.disk_cache_dir is None or config.mode not in ("lazy", "block"):
        return None
    budget = int(config.disk_cache_gb * GiB)
    return DiskTier(
        config.disk_cache_dir,
        budget,
        device_kv,
        layout_id(model_fingerprint, device_kv, v_transposed),
        before_write,
        read_gbps=config.disk_read_gbps,
        always_read=config.disk_always_read,
    )
