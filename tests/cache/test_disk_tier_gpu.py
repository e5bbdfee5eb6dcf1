"""The disk tier on the GPU: a write gathered on the compute stream sees the encoder's writes and not the later
overwrites of the same pages, a read fills GPU pages bit for bit, and the engine with a host tier and a disk tier
gives the tokens it gives without them after a restart. Run on the device: `pytest -m gpu -s`."""

from __future__ import annotations

import pytest
import torch

from lazyattn.cache.disk_tier import DiskTier, layout_id
from lazyattn.cache.document_cache import DocumentCache
from lazyattn.cache.page_pool import PagePool
from tests.engine.test_disk_tier_engine import engine, run_all

pytestmark = pytest.mark.gpu


def test_write_through_and_read_back_on_cuda(tmp_path):
    kv = torch.zeros(2, 2, 8, 16, 2, 64, device="cuda", dtype=torch.bfloat16)
    disk = DiskTier(str(tmp_path), 1 << 30, kv, layout_id("m", kv))
    cache = DocumentCache(PagePool(8), 16, disk)
    seg, _ = cache.acquire("A", 40)  # 3 pages
    pages = list(seg.pages)
    kv[:, :, pages] = torch.randn(2, 2, 3, 16, 2, 64, device="cuda").to(kv.dtype)  # the encoder, queued
    expected = kv[:, :, pages].clone()
    cache.mark_ready(seg)  # the gather is queued after the encoder's writes ...
    kv[:, :, pages] = 0  # ... and before these
    cache.release(seg)
    disk.flush()
    cache.evict(8)
    cache2 = DocumentCache(PagePool(8), 16, disk)
    seg2, is_new = cache2.acquire("A", 40)
    assert not is_new
    cache2.poll(wait=True)  # the read runs in the background
    torch.cuda.synchronize()
    assert torch.equal(kv[:, :, list(seg2.pages)], expected)
    disk.close()


def test_engine_restart_with_host_and_disk_tiers_on_cuda(tmp_path):
    plain = run_all(engine("lazy", None, "cuda"))
    first = engine("lazy", str(tmp_path), "cuda", host_cache_gb=0.001)
    assert run_all(first) == plain
    first.engine.shutdown()
    second = engine("lazy", str(tmp_path), "cuda", host_cache_gb=0.001)
    assert run_all(second) == plain
    s = second.engine.stats()
    assert s.cache.misses == 0 and s.cache.disk_hits > 0 and s.disk.refused == 0
