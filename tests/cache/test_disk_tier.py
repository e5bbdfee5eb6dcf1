"""The disk tier under the document cache, on the CPU with a small KV pool: files round-trip bit for bit, a new
cache over the same directory hits, the budget evicts least recently used files, and a truncated, corrupt, foreign
or other-version file is refused, removed and the document encoded again."""

from __future__ import annotations

import os
import shutil
import time

import pytest
import torch

from lazyattn.cache.disk_format import HEADER_BYTES, MAGIC
from lazyattn.cache.disk_tier import DiskTier, layout_id
from lazyattn.cache.document_cache import DocumentCache
from lazyattn.cache.page_pool import PagePool

PAGE = 4
SHAPE = (2, 2, 16, PAGE, 2, 8)  # layers, K/V, pages, page_size, kv_heads, head_dim
PAGE_BYTES = 2 * 2 * PAGE * 2 * 8 * 4  # float32


def make(directory, budget=1 << 30, dtype=torch.float32, model="m1", **kw):
    kv = torch.zeros(SHAPE, dtype=dtype)
    disk = DiskTier(str(directory), budget, kv, layout_id(model, kv), **kw)
    return DocumentCache(PagePool(SHAPE[2]), PAGE, disk), disk, kv


def encode(cache, kv, key, n_tokens, seed):
    """Acquire key as a miss, write random KV into its pages (the encoder), mark it ready and release it; returns
    the KV written, page by page."""
    seg, is_new = cache.acquire(key, n_tokens)
    assert is_new
    g = torch.Generator().manual_seed(seed)
    for p in seg.pages:
        kv[:, :, p] = torch.randn(kv[:, :, p].shape, generator=g).to(kv.dtype)
    cache.mark_ready(seg)
    cache.release(seg)
    return torch.stack([kv[:, :, p].clone() for p in seg.pages])


def read_back(cache, kv, key, n_tokens):
    """Acquire key expecting a hit from disk; returns its pages' KV once the fill has landed."""
    seg, is_new = cache.acquire(key, n_tokens)
    assert not is_new and not seg.ready
    cache.poll(wait=True)  # the read runs in the background
    assert seg.ready
    out = torch.stack([kv[:, :, p].clone() for p in seg.pages])
    cache.release(seg)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_new_cache_over_the_same_directory_reads_documents_back_bit_exact(tmp_path, dtype):
    cache, disk, kv = make(tmp_path, dtype=dtype)
    written = {k: encode(cache, kv, k, n, seed) for seed, (k, n) in enumerate([("A", 9), ("B", 4), ("C", 1)])}
    disk.flush()
    assert disk.stats().writes == 3 and len(os.listdir(tmp_path)) == 3
    disk.close()
    cache2, disk2, kv2 = make(tmp_path, dtype=dtype)  # a restart: empty GPU pool, same directory
    for k, n in [("C", 1), ("A", 9), ("B", 4)]:
        assert torch.equal(read_back(cache2, kv2, k, n), written[k])
    s = cache2.stats()
    assert s.disk_hits == 3 and s.misses == 0 and s.disk_tokens_reused == 14 and s.gpu_hits == 0
    assert disk2.stats().hits == 3 and disk2.stats().refused == 0


def test_a_document_on_the_gpu_is_a_gpu_hit_and_is_written_once(tmp_path):
    cache, disk, kv = make(tmp_path)
    encode(cache, kv, "A", 8, 0)
    seg, is_new = cache.acquire("A", 8)
    assert not is_new and seg.ready  # still on the GPU
    cache.release(seg)
    disk.flush()
    assert cache.stats().disk_hits == 0 and disk.stats().writes == 1


def file_of(disk, key):
    return disk.path(key)


def refused_and_reencoded(tmp_path, damage):
    cache, disk, kv = make(tmp_path)
    encode(cache, kv, "A", 9, 1)
    disk.flush()
    disk.close()
    damage(file_of(disk, "A"))
    cache2, disk2, kv2 = make(tmp_path)
    seg, is_new = cache2.acquire("A", 9)
    assert not is_new and not seg.ready  # a hit until the background read has checked the file
    assert cache2.poll(wait=True) == 0
    assert seg.failed and not seg.ready and cache2.lookup("A") is None  # refused: never served
    assert disk2.stats().refused == 1 and disk2.stats().hits == 0 and cache2.stats().disk_hits == 0
    assert not os.path.exists(file_of(disk2, "A"))  # removed
    cache2.release(seg)  # the waiter starts over: now a miss, and it encodes the document
    assert cache2.pool.num_free == SHAPE[2] and cache2.stats().lookups == cache2.stats().hits == 0
    again = encode(cache2, kv2, "A", 9, 1)  # encoded again, written again
    disk2.flush()
    cache3, _, kv3 = make(tmp_path)
    assert torch.equal(read_back(cache3, kv3, "A", 9), again)


def test_a_truncated_file_is_refused_and_the_document_encoded_again(tmp_path):
    refused_and_reencoded(tmp_path, lambda p: os.truncate(p, os.path.getsize(p) - 7))


def test_a_file_torn_inside_its_header_is_refused(tmp_path):
    refused_and_reencoded(tmp_path, lambda p: os.truncate(p, 100))


def flip(offset):
    def damage(path):
        with open(path, "r+b") as f:
            f.seek(offset if offset >= 0 else os.path.getsize(path) + offset)
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ 0x01]))

    return damage


def test_a_flipped_payload_bit_is_refused(tmp_path):
    refused_and_reencoded(tmp_path, flip(-3))


def test_a_damaged_header_is_refused(tmp_path):
    refused_and_reencoded(tmp_path, flip(len(MAGIC) + 20))


def test_another_format_version_is_refused(tmp_path):
    refused_and_reencoded(tmp_path, flip(len(MAGIC)))


@pytest.mark.parametrize("other", [{"model": "m2"}, {"dtype": torch.float64}])
def test_a_file_of_another_model_or_dtype_is_refused(tmp_path, other):
    """A file another model (or dtype) wrote, found under the name this one expects, is never served."""
    theirs = tmp_path / "theirs"
    cache, disk, kv = make(theirs, **other)
    encode(cache, kv, "A", 8, 2)
    disk.flush()
    cache2, disk2, kv2 = make(tmp_path / "ours")
    shutil.copy(file_of(disk, "A"), file_of(disk2, "A"))
    assert cache2.contains("A")
    seg, _ = cache2.acquire("A", 8)
    cache2.poll(wait=True)
    assert seg.failed and disk2.stats().refused == 1 and not os.path.exists(file_of(disk2, "A"))
    assert file_of(disk, "A") != file_of(disk2, "A")  # in a shared directory, they would not even meet


def test_lru_budget_evicts_the_least_recently_used_file(tmp_path):
    file_bytes = HEADER_BYTES + 2 * PAGE_BYTES
    cache, disk, kv = make(tmp_path, budget=2 * file_bytes)
    for seed, k in enumerate("AB"):
        encode(cache, kv, k, 8, seed)
    disk.flush()
    old = time.time() - 100
    os.utime(file_of(disk, "A"), (old, old))  # A written first ...
    os.utime(file_of(disk, "B"), (old + 1, old + 1))
    cache2, disk2, kv2 = make(tmp_path, budget=2 * file_bytes)
    read_back(cache2, kv2, "A", 8)  # ... but used last
    encode(cache2, kv2, "C", 8, 5)
    disk2.flush()
    assert {os.path.exists(file_of(disk2, k)) for k in "AC"} == {True}
    assert not os.path.exists(file_of(disk2, "B"))
    s = disk2.stats()
    assert s.evictions == 1 and s.bytes_used == 2 * file_bytes


def test_a_document_larger_than_the_budget_is_not_written(tmp_path):
    cache, disk, kv = make(tmp_path, budget=HEADER_BYTES + PAGE_BYTES)
    encode(cache, kv, "A", 8, 0)
    disk.flush()
    assert disk.stats().write_skipped == 1 and os.listdir(tmp_path) == []


def test_writes_beyond_the_pending_bytes_are_skipped_not_waited_for(tmp_path):
    cache, disk, kv = make(tmp_path, max_pending_bytes=0)
    encode(cache, kv, "A", 8, 0)
    disk.flush()
    assert disk.stats().write_skipped == 1 and disk.stats().writes == 0


def test_two_caches_share_a_directory(tmp_path):
    (c1, d1, kv1), (c2, d2, kv2) = make(tmp_path), make(tmp_path)
    a = encode(c1, kv1, "A", 6, 0)
    b = encode(c2, kv2, "B", 5, 1)
    d1.flush()
    d2.flush()
    assert torch.equal(read_back(c2, kv2, "A", 6), a) and torch.equal(read_back(c1, kv1, "B", 5), b)


def test_a_file_removed_by_another_engine_is_a_plain_miss(tmp_path):
    (c1, d1, kv1), (c2, d2, _) = make(tmp_path), make(tmp_path)
    encode(c1, kv1, "A", 6, 0)
    d1.flush()
    assert c2.contains("A")
    os.unlink(file_of(d1, "A"))  # the other engine's eviction, between contains and acquire
    seg, is_new = c2.acquire("A", 6)
    assert is_new and d2.stats().refused == 0


def test_a_stale_temporary_file_is_never_served_and_is_cleaned_up(tmp_path):
    cache, disk, kv = make(tmp_path)
    stale, fresh = tmp_path / ".x.kv.1.ab.tmp", tmp_path / ".y.kv.2.cd.tmp"
    stale.write_bytes(b"partial")
    fresh.write_bytes(b"being written")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    encode(cache, kv, "A", 4, 0)
    disk.flush()
    assert not stale.exists() and fresh.exists()  # a live writer's file stays


def test_remove_and_clear_delete_files(tmp_path):
    cache, disk, kv = make(tmp_path)
    for seed, k in enumerate("ABC"):
        encode(cache, kv, k, 4, seed)
    disk.flush()
    cache.evict(100)  # only on disk now
    assert cache.remove("A") and not os.path.exists(file_of(disk, "A")) and not cache.contains("A")
    assert not cache.remove("A")
    cache.clear()
    assert os.listdir(tmp_path) == [] and not cache.contains("B")


def test_files_of_another_format_version_are_named_apart(tmp_path, monkeypatch):
    """Two releases sharing a directory: the other version's file of the same document has another name, so this
    engine neither serves nor removes it (it encodes, and the file ages out under the budget)."""
    from lazyattn.cache import disk_format, disk_tier

    cache, disk, kv = make(tmp_path)
    encode(cache, kv, "A", 8, 2)
    disk.flush()
    ours = file_of(disk, "A")
    monkeypatch.setattr(disk_tier, "FORMAT_VERSION", disk_format.FORMAT_VERSION + 1)
    cache2, disk2, _ = make(tmp_path)  # the next release's engine on the same directory
    assert file_of(disk2, "A") != ours and not cache2.contains("A")
    assert os.path.exists(ours) and disk2.stats().refused == 0
