"""The host tier on the GPU: the page mover's copies and stream ordering, and the engine end to end with pinned
host memory (same tokens with and without the tier, no page leaked). Run on the device: `pytest -m gpu -s`."""

from __future__ import annotations

import gc

import pytest
import torch

from lazyattn.cache.kv_transfer import PageMover
from tests.engine.test_host_tier_engine import PARAMS, REQUESTS, engine, prompt

pytestmark = pytest.mark.gpu


def test_mover_round_trip_and_ordering_on_cuda():
    torch.manual_seed(0)
    kv = torch.randn(4, 2, 16, 16, 2, 8, device="cuda", dtype=torch.bfloat16)
    original = kv.clone()
    mover = PageMover(kv, 8, chunk_pages=4)
    with pytest.raises(ValueError, match="not page-locked"):
        mover.to_host([9], [0])
    assert mover.lock(5) == 8  # two whole chunks
    t = mover.to_host([9, 3, 4, 12], [5, 6, 7, 0])
    # The compute stream overwrites the demoted pages right away; ordered after the copy by before_forward.
    mover.before_forward({3, 40})  # a write to page 3, still being read by the demotion
    kv[:, :, [9, 3, 4, 12]] = 0
    mover.wait(t)
    for device_page, host_page in ((9, 5), (3, 6), (4, 7), (12, 0)):
        assert torch.equal(mover.host_kv[host_page], original[:, :, device_page].cpu())
    u = mover.to_device([0, 5], [1, 2])
    mover.wait(u)
    torch.cuda.synchronize()
    expected = original.clone()
    expected[:, :, [9, 3, 4, 12]] = 0
    expected[:, :, 1] = original[:, :, 12]
    expected[:, :, 2] = original[:, :, 9]
    assert torch.equal(kv, expected)
    assert mover.seconds(u) > 0


def test_the_host_pool_is_locked_a_chunk_at_a_time_on_cuda():
    from lazyattn.cache.document_cache import DocumentCache
    from lazyattn.cache.host_tier import HostTier
    from lazyattn.cache.page_pool import PagePool

    kv = torch.randn(2, 2, 8, 4, 1, 8, device="cuda")
    mover = PageMover(kv, 6, chunk_pages=4)
    tier = HostTier(6, mover.page_bytes, mover)
    cache = DocumentCache(PagePool(4), 4, tier)
    assert mover.locked_pages == 0  # nothing is locked before the first demotion
    for key in "ABC":  # 2 pages each: A fills the GPU's pages 0-1, B 2-3; C evicts A
        seg, _ = cache.acquire(key, 8)
        cache.mark_ready(seg)
        cache.release(seg)
    gc.collect()  # the registration must outlive the slice it was made through
    assert tier.contains("A") and mover.locked_pages == 4 and tier.stats().locked_pages == 4
    assert mover.host_kv[:4].is_pinned()
    for key in "DE":  # evict B, C: the second chunk (2 pages, the rest of the pool) is added
        seg, _ = cache.acquire(key, 8)
        cache.mark_ready(seg)
        cache.release(seg)
    assert mover.locked_pages == 6 and tier.stats().locked_pages == 6 and len(tier) == 3


def test_engine_on_cuda_same_tokens_with_and_without_the_tier():
    # float32: a document promoted from the host is read in a smaller prefill than one encoded again, so in
    # bfloat16 the two runs' logits round differently (another prefill graph bucket, another GEMM tiling) and a
    # near-tie of the random model can flip; in float32 the pages moved must give the tokens exactly.
    outputs = {}
    for host in (0, 0.01):
        llm = engine("lazy", host, device="cuda", dtype="float32")
        rendered = [prompt(llm, r) for r in REQUESTS]
        outs = [o for r in rendered for o in llm._run([r], PARAMS, None, False)]
        outputs[host] = [o.outputs[0].token_ids for o in outs]
        s = llm.engine.stats()
        if host:
            assert s.cache.host_hits > 0 and s.host.promotions == s.cache.host_hits and s.host.promotion_gbps > 0
            assert s.pages_used == s.cache.pages_in_use
            llm.engine.reset_cache()
            assert llm.engine.stats().pages_used == 0 and llm.engine.tier.pool.num_used == 0
        llm.shutdown()
    assert outputs[0] == outputs[0.01]
