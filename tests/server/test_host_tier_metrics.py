"""The per-tier Prometheus series (docs/design.md, "The host tier") against the engine's own stats, after a run
that demoted and promoted documents."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from lazyattn.server.metrics import ServerMetrics
from tests.engine.test_host_tier_engine import engine, run_all


def samples(metrics: ServerMetrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name")))] = s.value
    return out


def test_tier_series_match_the_engine_stats():
    llm = engine("lazy", 0.01)
    run_all(llm, batched=False)
    s = llm.engine.stats()
    got = samples(ServerMetrics("tiny", llm.engine.stats, lambda: 0))
    assert s.cache.host_hits > 0 and s.host.demotions > 0
    device, host = (("tier", "device"),), (("tier", "host"),)
    assert got[("lazyattn:document_cache_tier_hits_total", device)] == s.cache.hits - s.cache.host_hits
    assert got[("lazyattn:document_cache_tier_hits_total", host)] == s.cache.host_hits
    assert got[("lazyattn:document_cache_tier_pages_used", host)] == s.host.pages_used
    assert got[("lazyattn:document_cache_tier_pages_total", device)] == s.num_pages
    assert got[("lazyattn:document_cache_tier_pages_total", host)] == s.host.num_pages
    assert got[("lazyattn:host_cache_promotions_total", ())] == s.host.promotions
    assert got[("lazyattn:host_cache_demotions_total", ())] == s.host.demotions
    assert got[("lazyattn:host_cache_bytes_total", (("direction", "to_device"),))] == s.host.bytes_to_device
    assert got[("lazyattn:host_cache_bytes_total", (("direction", "to_host"),))] == s.host.bytes_to_host
    # A CPU engine: its pool is the device tier, not a "gpu" one.
    assert llm.engine.device.type == "cpu" and not any(labels == (("tier", "gpu"),) for _, labels in got)
    locked = got[("lazyattn:host_cache_locked_bytes", ())]
    assert locked == s.host.locked_pages * s.host.page_bytes and 0 < locked <= s.host.num_pages * s.host.page_bytes


def test_no_host_series_without_a_tier():
    llm = engine("lazy", 0)
    got = samples(ServerMetrics("tiny", llm.engine.stats, lambda: 0))
    assert ("lazyattn:document_cache_tier_pages_total", (("tier", "device"),)) in got
    assert not any(labels == (("tier", "host"),) or name.startswith("lazyattn:host_cache") for name, labels in got)
