"""The disk tier's Prometheus series (docs/design.md, "The disk tier") against the engine's own stats, after a
restarted engine read documents back from disk."""

from __future__ import annotations

from lazyattn.server.metrics import ServerMetrics
from tests.engine.test_disk_tier_engine import SEGMENTS, engine, run_all
from tests.server.test_host_tier_metrics import samples


def test_disk_series_match_the_engine_stats(tmp_path):
    first = engine("lazy", str(tmp_path))
    run_all(first)
    first.engine.shutdown()
    llm = engine("lazy", str(tmp_path))
    run_all(llm)
    s = llm.engine.stats()
    got = samples(ServerMetrics("tiny", llm.engine.stats, lambda: 0))
    assert s.cache.disk_hits == SEGMENTS == got[("lazyattn:disk_cache_hits_total", ())]
    assert got[("lazyattn:document_cache_tier_hits_total", (("tier", "device"),))] == s.cache.hits - SEGMENTS
    assert got[("lazyattn:disk_cache_read_bytes_total", ())] == s.disk.bytes_read > 0
    assert got[("lazyattn:disk_cache_refused_total", ())] == 0 == got[("lazyattn:disk_cache_writes_total", ())]
    assert got[("lazyattn:disk_cache_skipped_slow_total", ())] == 0
    assert got[("lazyattn:disk_cache_page_cache_hits_total", ())] == s.disk.resident_hits <= SEGMENTS
    assert got[("lazyattn:disk_cache_used_bytes", ())] == s.disk.bytes_used > 0
    assert got[("lazyattn:disk_cache_budget_bytes", ())] == 64 * 2**30


def test_the_skipped_slow_series_counts_the_guards_misses(tmp_path):
    first = engine("lazy", str(tmp_path))
    run_all(first)
    first.engine.shutdown()
    llm = engine("lazy", str(tmp_path), disk_read_gbps=1e-6, disk_always_read=False)  # a very slow disk
    llm.engine.disk.observe_encode(1000, 1.0)
    run_all(llm)
    got = samples(ServerMetrics("tiny", llm.engine.stats, lambda: 0))
    assert got[("lazyattn:disk_cache_skipped_slow_total", ())] == SEGMENTS == llm.engine.stats().disk.skipped_slow
    assert got[("lazyattn:disk_cache_hits_total", ())] == 0


def test_no_disk_series_without_a_tier():
    got = samples(ServerMetrics("tiny", engine("lazy").engine.stats, lambda: 0))
    assert not any(name.startswith("lazyattn:disk_cache") for name, _ in got)
