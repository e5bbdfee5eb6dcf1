"""The disk tier's file format: one file per document, written atomically, checked whole before it is served.

    [header: HEADER_BYTES]  MAGIC, format version (u32), JSON length (u32), JSON, zero padding
    [payload]               the document's pages, page-major: [pages, layers, 2 (K, V), page_size, kv_heads, head_dim]

The JSON holds the segment key, the layout (model fingerprint, dtype, page shape), the token and page counts, the
payload size and its checksum, and the pages' KV dtype and scale (an FP8 page is stored as its bytes, one per
element, read back with that scale: docs/design.md, "FP8 KV cache"). A reader checks every field against what it
expects, the file size against the payload size and the checksum against the payload, so a truncated, corrupt or
foreign file is refused, never served. The checksum is blake2b over the CRC-32s of CHUNK_BYTES chunks: each chunk is
read and checked on a thread of its own as soon as it lands (zlib and hashlib let go of the GIL on large buffers).
CRC-32 (as in gzip and zip) detects torn writes and flipped bits, which is what a file here can suffer; a
cryptographic digest per chunk (blake2b, several times slower a core) made the check, not the disk, bound reads on
the GPU machine (docs/benchmarks.md, "Disk tier"), and nobody forges these files: a writer is an engine of the same
host or filesystem. The header is a whole 4 KiB block, so the payload is aligned for O_DIRECT readers.

Writers write a hidden temporary file in the same directory, fsync it, rename it over the final name and fsync the
directory: a reader that opens the final name sees a whole file or none, whatever the writers and evictors on the
same host or a shared filesystem do. Two writers of one document write the same bytes; the last rename wins.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

MAGIC = b"LAZYATTN-KV\x00"
FORMAT_VERSION = 3  # 3: the KV dtype and scale in the header (FP8 pages); 2: CRC-32 per chunk; 1: blake2b per chunk
# What the format change of each version was, for the message that refuses an older file.
_OLDER = {2: "written before the header named the KV dtype and scale", 1: "checksummed by blake2b per chunk"}
HEADER_BYTES = 4096
CHUNK_BYTES = 16 << 20
TMP_SUFFIX = ".tmp"
SUFFIX = ".kv"
STALE_TMP_SECONDS = 600  # a temporary file this old was left by a writer that died
RESIDENCY_PROBE_BYTES = 4096

# Reads (on a request's path) and writes (in the background) hash on threads of their own: a read never queues
# behind a write's chunks.
_read_threads = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="lazyattn-disk-read")
_write_threads = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="lazyattn-disk-write")


class RefusedFile(Exception):
    """A file the disk tier will not serve: truncated, corrupt, from another model/dtype/layout, or another version."""


@dataclass(frozen=True)
class Header:
    key: str  # the segment key (cache/keys.py)
    layout: str  # model fingerprint, dtype and page shape: what the bytes mean
    n_tokens: int
    n_pages: int
    page_bytes: int
    checksum: str
    kv_dtype: str  # the pages' element type, as torch names it (float8_e4m3fn: one byte per element)
    kv_scale: float = 1.0  # stored value x scale = the K/V value (1.0: every dtype today, FP8 included)

    @property
    def payload_bytes(self) -> int:
        return self.n_pages * self.page_bytes


def _chunks(n: int) -> list[tuple[int, int]]:
    return [(a, min(a + CHUNK_BYTES, n)) for a in range(0, n, CHUNK_BYTES)] or [(0, 0)]


def _digest(chunk: memoryview) -> bytes:
    return zlib.crc32(chunk).to_bytes(4, "little")


def checksum(payload: memoryview) -> str:
    """The payload's checksum: blake2b over its size and its chunks' CRC-32s (chunks checked in parallel)."""
    digests = _write_threads.map(lambda r: _digest(payload[r[0] : r[1]]), _chunks(len(payload)))
    return _combine(len(payload), list(digests))


def _combine(n: int, digests: list[bytes]) -> str:
    h = hashlib.blake2b(n.to_bytes(8, "little"), digest_size=32)
    for d in digests:
        h.update(d)
    return h.hexdigest()


def encode_header(h: Header) -> bytes:
    body = json.dumps({"version": FORMAT_VERSION, **h.__dict__}, sort_keys=True).encode()
    out = MAGIC + struct.pack("<II", FORMAT_VERSION, len(body)) + body
    if len(out) > HEADER_BYTES:
        raise ValueError(f"a disk-tier header of {len(out)} bytes does not fit {HEADER_BYTES}")
    return out.ljust(HEADER_BYTES, b"\x00")


def decode_header(raw: bytes) -> Header:
    if len(raw) < HEADER_BYTES or not raw.startswith(MAGIC):
        raise RefusedFile("no disk-tier header")
    version, n = struct.unpack_from("<II", raw, len(MAGIC))
    if version != FORMAT_VERSION:
        why = f" ({_OLDER[version]})" if version in _OLDER else ""
        raise RefusedFile(f"format version {version}{why}, this release reads {FORMAT_VERSION} only")
    start = len(MAGIC) + 8
    try:
        d = json.loads(raw[start : start + n])
        return Header(
            d["key"],
            d["layout"],
            d["n_tokens"],
            d["n_pages"],
            d["page_bytes"],
            d["checksum"],
            d["kv_dtype"],
            float(d["kv_scale"]),
        )
    except (ValueError, KeyError, TypeError) as e:
        raise RefusedFile(f"unreadable header ({e})") from None


def write_atomic(path: str, header: Header, payload: memoryview) -> None:
    """Write `path` whole or not at all (tmp + fsync + rename + fsync of the directory)."""
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb", buffering=0) as f:
            f.write(encode_header(header))
            view = payload
            while view:
                view = view[f.write(view) :]
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        unlink(tmp)
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read_verified(
    path: str, key: str, layout: str, n_tokens: int, page_bytes: int, into: memoryview, kv_dtype: str
) -> Header:
    """Read `path` into `into` (the payload's size) and check it against the expected key, layout, KV dtype (scale
    1.0) and sizes and against its checksum. Raises FileNotFoundError if it is gone, RefusedFile if it must not be
    served."""
    with open(path, "rb", buffering=0) as f:
        h = decode_header(f.read(HEADER_BYTES))
        if h.key != key or h.layout != layout:
            raise RefusedFile(f"written for another document or model ({h.layout[:80]})")
        if h.kv_dtype != kv_dtype or h.kv_scale != 1.0:
            raise RefusedFile(f"KV pages of {h.kv_dtype} at scale {h.kv_scale}, this engine reads {kv_dtype} at 1.0")
        if h.n_tokens != n_tokens or h.page_bytes != page_bytes or h.payload_bytes != len(into):
            raise RefusedFile(f"sizes differ: {h.n_tokens} tokens in {h.n_pages} pages of {h.page_bytes} bytes")
        size = os.fstat(f.fileno()).st_size
        if size != HEADER_BYTES + h.payload_bytes:
            raise RefusedFile(f"{size} bytes, {HEADER_BYTES + h.payload_bytes} expected (truncated or torn)")
        fd = f.fileno()

        def read_and_hash(r: tuple[int, int]) -> bytes:
            a, b = r
            view = into[a:b]
            while view:
                got = os.preadv(fd, [view], HEADER_BYTES + b - len(view))
                if got == 0:
                    raise RefusedFile("truncated while read")
                view = view[got:]
            return _digest(into[a:b])

        digests = list(_read_threads.map(read_and_hash, _chunks(len(into))))
    if _combine(len(into), digests) != h.checksum:
        raise RefusedFile("checksum mismatch (corrupt)")
    return h


# -- the directory ---------------------------------------------------------------------------------------------------


def resident(path: str, size: int) -> bool | None:
    """Whether the file's bytes are in the page cache (a read then runs at memory speed, not the disk's): probes at
    the payload's start, middle and end by reads that fail rather than wait for the device (RWF_NOWAIT). None: the
    platform or filesystem cannot tell, or the file is gone."""
    nowait = getattr(os, "RWF_NOWAIT", None)
    if nowait is None or size <= HEADER_BYTES:
        return None
    probe = bytearray(RESIDENCY_PROBE_BYTES)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        last = max(HEADER_BYTES, size - RESIDENCY_PROBE_BYTES)
        for offset in (HEADER_BYTES, (HEADER_BYTES + last) // 2 // 4096 * 4096, last):
            if os.preadv(fd, [probe], offset, nowait) < min(RESIDENCY_PROBE_BYTES, size - offset):
                return False
        return True
    except BlockingIOError:
        return False  # EAGAIN: not in the page cache
    except OSError:
        return None  # EOPNOTSUPP, EINVAL: this filesystem does not do non-blocking buffered reads
    finally:
        os.close(fd)


def kv_names(directory: str) -> list[str]:
    """The finished files of a directory (not the writers' hidden temporary ones)."""
    try:
        return [n for n in os.listdir(directory) if n.endswith(SUFFIX) and not n.startswith(".")]
    except FileNotFoundError:
        return []


def unlink(path: str) -> bool:
    """Remove a file; False if it was gone already (another engine removed it)."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def enforce_budget(directory: str, budget_bytes: int) -> tuple[int, int]:
    """Remove the least recently used (oldest mtime) files until the directory's files fit `budget_bytes`, and
    temporary files left by writers that died. Tolerates files that vanish meanwhile. Returns (bytes left, files
    removed)."""
    files, now = [], time.time()
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        entries = []
    for e in entries:
        try:
            st = e.stat()
        except FileNotFoundError:
            continue  # removed meanwhile by another engine
        if e.name.endswith(SUFFIX) and not e.name.startswith("."):
            files.append((st.st_mtime, st.st_size, e.path))
        elif e.name.endswith(TMP_SUFFIX) and now - st.st_mtime > STALE_TMP_SECONDS:
            unlink(e.path)
    used, removed = sum(size for _, size, _ in files), 0
    for _, size, path in sorted(files):
        if used <= budget_bytes:
            break
        removed += unlink(path)
        used -= size
    return used, removed
