"""The disk tier's background reads and its guard, under the document cache on the CPU: a read held back on the
reader thread leaves the segment pending and the engine thread free; an acquire given up while its read is in
flight leaks no GPU page and no staging memory, whether the file turns out good or corrupt; the guard reads a file
only where the read is expected to be no slower than encoding it, and the staging budget bounds the reads queued."""

from __future__ import annotations

import os
import threading

import pytest
import torch

import lazyattn.cache.disk_tier as disk_tier
from lazyattn.cache.disk_format import HEADER_BYTES
from tests.cache.test_disk_tier import PAGE, PAGE_BYTES, SHAPE, encode, file_of, make

N_PAGES = SHAPE[2]


@pytest.fixture
def gate(monkeypatch):
    """Reads wait on the reader thread until the test opens the gate."""
    opened = threading.Event()
    started = threading.Event()
    real = disk_tier.read_verified

    def held(*args, **kw):
        started.set()
        assert opened.wait(10), "the test never let the read go"
        return real(*args, **kw)

    monkeypatch.setattr(disk_tier, "read_verified", held)
    opened.started = started
    yield opened
    opened.set()


def on_disk(tmp_path, docs, **kw):
    """A cache over a directory that holds `docs` ({key: n_tokens}), written by an earlier cache; their KV."""
    cache, disk, kv = make(tmp_path)
    written = {k: encode(cache, kv, k, n, seed) for seed, (k, n) in enumerate(docs.items())}
    disk.close()
    return (*make(tmp_path, **kw), written)


def pages_of(kv, seg):
    return torch.stack([kv[:, :, p].clone() for p in seg.pages])


def test_a_read_in_flight_keeps_the_segment_pending_without_blocking_the_caller(tmp_path, gate):
    cache, disk, kv, written = on_disk(tmp_path, {"A": 9})
    seg, is_new = cache.acquire("A", 9)  # returns while the read waits on the reader thread
    assert not is_new and not seg.ready and cache.promoting == 1
    assert gate.started.wait(10)
    assert cache.poll() == 0 and not seg.ready  # not landed: still pending
    assert disk.stats().staging_bytes == HEADER_BYTES + 3 * PAGE_BYTES
    gate.set()
    assert cache.poll(wait=True) == 1 and seg.ready
    assert torch.equal(pages_of(kv, seg), written["A"])
    assert disk.stats().staging_bytes == 0 and disk.stats().hits == 1 and cache.promoting == 0


@pytest.mark.parametrize("corrupt", [False, True])
def test_giving_up_a_document_while_it_loads_leaks_nothing(tmp_path, gate, corrupt):
    cache, disk, kv, _ = on_disk(tmp_path, {"A": 9, "B": 5})
    if corrupt:
        with open(file_of(disk, "A"), "r+b") as f:
            f.seek(HEADER_BYTES + 5)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 1]))
    seg, _ = cache.acquire("A", 9)
    cache.release(seg)  # the request was aborted: only the read's own reference is left
    assert cache.pool.num_free == N_PAGES - 3 and not seg.ready  # the read still writes those pages
    gate.set()
    cache.poll(wait=True)
    assert disk.stats().staging_bytes == 0 and cache.promoting == 0
    if corrupt:  # refused: unindexed and freed, and the hit taken back
        assert seg.failed and cache.lookup("A") is None and cache.pool.num_free == N_PAGES
        assert cache.stats().disk_hits == 0 and disk.stats().refused == 1
    else:  # landed: cached, evictable, as after a read whose requester stayed
        assert cache.lookup("A") is seg and seg.ready and seg.refcount == 0
        assert cache.pool.num_free + cache.evictable_pages() == N_PAGES
    again, is_new = cache.acquire("A", 9)
    assert is_new == corrupt  # a refused file is encoded again
    cache.release(again)


def test_the_guard_reads_only_where_reading_is_expected_no_slower_than_encoding(tmp_path):
    nbytes = HEADER_BYTES + 3 * PAGE_BYTES  # "A": 9 tokens, 3 pages
    # encoding 9 tokens at 9 tokens/s takes 1 s; reading `nbytes` takes 1 s at nbytes/s
    slow, s_disk, _, _ = on_disk(tmp_path / "slow", {"A": 9}, read_gbps=0.9 * nbytes / 1e9)
    s_disk.observe_encode(9, 1.0)
    seg, is_new = slow.acquire("A", 9)
    assert is_new and s_disk.stats().skipped_slow == 1 and slow.stats().disk_hits == 0
    assert s_disk.stats().encode_tps == 9.0
    slow.abort(seg)
    slow.release(seg)

    fast, f_disk, kv, written = on_disk(tmp_path / "fast", {"A": 9}, read_gbps=1.1 * nbytes / 1e9)
    f_disk.observe_encode(9, 1.0)
    seg, is_new = fast.acquire("A", 9)
    assert not is_new and f_disk.stats().skipped_slow == 0
    fast.poll(wait=True)
    assert seg.ready and torch.equal(pages_of(kv, seg), written["A"])
    assert f_disk.stats().read_bps > 0  # measured, blended into the seed

    forced, d_disk, _, _ = on_disk(tmp_path / "forced", {"A": 9}, read_gbps=1e-12, always_read=True)
    d_disk.observe_encode(9, 1.0)
    seg, is_new = forced.acquire("A", 9)
    assert not is_new and d_disk.stats().skipped_slow == 0
    forced.poll(wait=True)
    assert seg.ready


def test_without_an_encode_estimate_the_first_read_is_taken_and_measured(tmp_path):
    cache, disk, _, _ = on_disk(tmp_path, {"A": 9})
    assert disk.stats().read_bps == 0 and disk.stats().encode_tps == 0
    seg, is_new = cache.acquire("A", 9)
    cache.poll(wait=True)
    stats = disk.stats()  # measured in its class: a file just written is usually still in the page cache
    assert not is_new and seg.ready and (stats.resident_bps if stats.resident_hits else stats.read_bps) > 0


def test_the_queue_counts_against_a_read_and_the_staging_budget_bounds_it(tmp_path, gate):
    one = HEADER_BYTES + 2 * PAGE_BYTES  # "A" and "B": 2 pages each
    cache, disk, _, _ = on_disk(tmp_path, {"A": 2 * PAGE, "B": 2 * PAGE, "C": PAGE}, staging_bytes=one)
    a, is_new = cache.acquire("A", 2 * PAGE)
    assert not is_new  # alone in the queue, a read is taken whatever the staging budget
    b, is_new = cache.acquire("B", 2 * PAGE)
    assert is_new and disk.stats().skipped_slow == 1  # would exceed the staging budget behind "A"
    cache.abort(b)
    cache.release(b)
    gate.set()
    cache.poll(wait=True)
    assert a.ready
    cache.release(a)
    # Behind a queued read, a read must also beat the encode with the queue's bytes in front of it.
    disk._read_bps = disk._resident_bps = 1.5 * one  # one file in 2/3 s, from the device or the page cache
    disk._encode_tps = PAGE * 2.0  # a 1-page encode in 1/2 s
    disk.max_staging_bytes = 1 << 30
    gate.clear()
    cache.evict(N_PAGES)
    a2, is_new = cache.acquire("A", 2 * PAGE)
    assert not is_new  # 2/3 s read against a 1 s encode
    c, is_new = cache.acquire("C", PAGE)
    assert is_new and disk.stats().skipped_slow == 2  # behind "A": > 2/3 s read against a 1/2 s encode
    gate.set()
    cache.poll(wait=True)
    assert a2.ready and a2 is not a and disk.stats().staging_bytes == 0


def test_a_file_that_vanishes_before_its_read_is_encoded_again(tmp_path, gate):
    cache, disk, _, _ = on_disk(tmp_path, {"A": 9})
    seg, is_new = cache.acquire("A", 9)
    assert not is_new
    os.unlink(file_of(disk, "A"))  # another engine's eviction, before the reader thread opens it
    gate.set()
    assert cache.poll(wait=True) == 0 and seg.failed and disk.stats().refused == 0
    cache.release(seg)
    again, is_new = cache.acquire("A", 9)
    assert is_new and cache.stats().misses == 1 and cache.stats().disk_hits == 0


def test_the_page_cache_s_files_are_read_where_the_device_s_would_not_pay(tmp_path, monkeypatch):
    """Two estimates: a file found in the page cache is judged by the page cache's bandwidth, another by the
    device's; each read updates only its own class's estimate."""
    nbytes = HEADER_BYTES + 3 * PAGE_BYTES  # 9 tokens, 3 pages
    cache, disk, kv, written = on_disk(tmp_path, {"A": 9, "B": 9}, read_gbps=0.5 * nbytes / 1e9)  # device: 2 s
    in_page_cache = {file_of(disk, "A")}
    monkeypatch.setattr(disk_tier, "resident", lambda path, size: path in in_page_cache)
    disk._resident_bps = 4.0 * nbytes  # the page cache: 1/4 s a file
    disk.observe_encode(9, 1.0)  # encoding a file's 9 tokens: 1 s
    b, is_new = cache.acquire("B", 9)
    assert is_new and disk.stats().skipped_slow == 1  # 2 s from the device against a 1 s encode
    cache.abort(b)
    cache.release(b)
    a, is_new = cache.acquire("A", 9)
    assert not is_new  # 1/4 s from the page cache
    cache.poll(wait=True)
    assert a.ready and torch.equal(pages_of(kv, a), written["A"])
    stats = disk.stats()
    assert stats.resident_hits == 1 and stats.read_bps == 0.5 * nbytes  # the device's estimate untouched
    assert stats.resident_bps != 4.0 * nbytes  # the page cache's, blended with this read's bytes/s


def test_residency_is_what_the_page_cache_holds(tmp_path):
    """disk_format.resident against the kernel: a file just written is resident, one dropped from the page cache is
    not (where the platform and filesystem can tell)."""
    from lazyattn.cache.disk_format import resident

    path = tmp_path / "probe.kv"
    size = HEADER_BYTES + (4 << 20)
    with open(path, "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
    warm = resident(str(path), size)
    if warm is None:
        pytest.skip("no RWF_NOWAIT buffered reads on this platform or filesystem")
    assert warm is True
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    cold = resident(str(path), size)
    if cold is True:
        pytest.skip("this filesystem keeps its files in memory (tmpfs): they stay resident")
    assert cold is False
    assert resident(str(tmp_path / "gone.kv"), size) is None
