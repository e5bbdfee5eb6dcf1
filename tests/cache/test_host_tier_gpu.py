"""The host tier on the GPU: the page mover's copies and stream ordering, and the engine end to end with pinned
host memory (same tokens with and without the tier, no page leaked). Run on the device: `pytest -m gpu -s`."""

from __future__ import annotations

import pytest
import torch

from lazyattn.cache.kv_transfer import PageMover
from tests.engine.test_host_tier_engine import PARAMS, REQUESTS, engine, prompt

pytestmark = pytest.mark.gpu


def test_mover_round_trip_and_ordering_on_cuda():
    torch.manual_seed(0)
    kv = torch.randn(4, 2, 16, 16, 2, 8, device="cuda", dtype=torch.bfloat16)
    original = kv.clone()
    mover = PageMover(kv, 8)
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


def test_engine_on_cuda_same_tokens_with_and_without_the_tier():
    outputs = {}
    for host in (0, 0.01):
        llm = engine("lazy", host, device="cuda")
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
