"""The simulated hit ratio is the engine's: same trace and pool, one request at a time, the same hits, cached
tokens and evictions as the real engine (tiny model) in every cached mode."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lazyattn.bench.hitratio import PageAccounting, TraceKeys, pool_pages, simulate, sweep, working_set_pages
from lazyattn.bench.replay import kv_budget, make_engine, replay
from lazyattn.bench.workload import Load, Trace, WorkloadSpec, make_trace, token_space

PAGE = 16
SPEC = WorkloadSpec(
    num_docs=16, doc_len=40, docs_per_request=3, zipf_alpha=1.1, question_len=8, output_len=3, num_requests=30, seed=5
)


@pytest.fixture(scope="module")
def engines():
    return {
        mode: make_engine(dict(model="tiny", device="cpu", page_size=PAGE), mode)
        for mode in ("lazy", "block", "prefix")
    }


@pytest.mark.parametrize("mode", ["lazy", "block", "prefix"])
def test_simulation_matches_the_engine(engines, mode):
    engine = engines[mode]
    trace = make_trace(SPEC, Load(concurrency=1), *token_space(engine.model_config))
    keys = TraceKeys(trace, PAGE)
    smallest = working_set_pages("block", SPEC, trace.system_len, PAGE)
    for extra in (0, 7, 25, 60):  # from evicting for every request to rarely
        pages = smallest + extra
        sim = simulate(trace, mode, pages, PAGE, keys)
        with kv_budget(engine, pages):
            run = replay(engine, trace)
        s = run.summary
        assert s.completed == SPEC.num_requests
        assert [r.cached_tokens for r in run.records] and sum(r.doc_hits for r in run.records) == sim.doc_hits
        assert sum(r.cached_tokens for r in run.records) == sim.cached_tokens
        assert s.evictions == sim.evictions
        assert s.peak_kv_gb * 2**30 <= pages * engine.stats().page_bytes
    assert engine.stats().pages_used == 0 and engine.stats().num_pages == engine.pool.num_pages  # budget undone


@pytest.mark.parametrize("mode", ["lazy", "block", "prefix", "full"])
def test_working_set_is_what_the_engine_reserves(engines, mode):
    """One request alone in a pool of exactly its working set runs without preemption, and its peak page count is
    the working set of the tokens whose K/V it writes."""
    engine = engines.get(mode) or make_engine(dict(model="tiny", device="cpu", page_size=PAGE), mode)
    trace = make_trace(SPEC, Load(concurrency=1), *token_space(engine.model_config))
    one = Trace(trace.spec, trace.load, trace.system, trace.documents, trace.requests[:1])
    pages = working_set_pages(mode, SPEC, trace.system_len, PAGE)
    with kv_budget(engine, pages):
        run = replay(engine, one)
        peak = engine.stats().pages_high_water
        assert run.summary.completed == 1 and engine.stats().preemptions == 0
    # The last sampled token is never fed back: its K/V is never written.
    assert peak == working_set_pages(mode, replace(SPEC, output_len=SPEC.output_len - 1), trace.system_len, PAGE)


def test_pool_policies_and_infeasible_budgets():
    acct = PageAccounting(page_size=64, page_bytes=8 * 2**20)  # Llama-3.1-8B bf16: 128 KiB per token
    spec = WorkloadSpec()
    lazy, block = working_set_pages("lazy", spec, 1, 64), working_set_pages("block", spec, 1, 64)
    assert (lazy, block) == (1 + 5 * 32 + 1, 1 + 5 * 32 + 5 * 32 + 1)
    assert pool_pages(2**30, "pool", spec, 1, acct) == 128
    assert pool_pages(2**30, "pool_plus_request", spec, 1, acct) == 128 + block
    with pytest.raises(ValueError):
        pool_pages(2**30, "retained", spec, 1, acct)
    small = WorkloadSpec(num_docs=12, doc_len=128, docs_per_request=3, question_len=8, output_len=2, num_requests=20)
    rows = sweep(small, [2.1, None], [0.0001, 0.01], PageAccounting(16, 2**14), 250, 256)
    infeasible = [r for r in rows if r["policy"] == "pool" and r["budget_gb"] == 0.0001]
    assert infeasible and all(r["doc_hit_ratio"] is None for r in infeasible)
    for alpha in (2.1, None):  # a pool holding every document: only first references miss
        trace = make_trace(replace(small, zipf_alpha=alpha), Load(concurrency=1), 250, 256)
        refs = [d for r in trace.requests for d in r.doc_ids]
        roomy = [r for r in rows if r["alpha"] == alpha and r["budget_gb"] == 0.01 and r["mode"] != "prefix"]
        assert len(roomy) == 4 and all(r["evictions"] == 0 for r in roomy)
        assert all(r["doc_hit_ratio"] == pytest.approx(1 - len(set(refs)) / len(refs)) for r in roomy)


def test_disk_tier_serves_every_reference_after_the_first_and_leaves_the_gpu_alone():
    """A disk tier holding every document: only a document's first reference is encoded. A fill takes GPU pages as
    an encode does, so the GPU hits are those of the run without the tier; the rest of the reuse comes from disk
    (lazy, block) or not at all (prefix: no disk tier in the engine either). A disk of half the documents serves
    less."""
    small = WorkloadSpec(
        num_docs=12, doc_len=128, docs_per_request=3, zipf_alpha=None, question_len=8, output_len=2, num_requests=40
    )
    trace = make_trace(small, Load(concurrency=1), 250, 256)
    refs = [d for r in trace.requests for d in r.doc_ids]
    keys = TraceKeys(trace, 16)
    pages = working_set_pages("block", small, trace.system_len, 16) + 4  # most documents are evicted
    for mode in ("lazy", "block", "prefix"):
        plain = simulate(trace, mode, pages, 16, keys)
        tiered = simulate(trace, mode, pages, 16, keys, disk_pages=10**6)
        tight = simulate(trace, mode, pages, 16, keys, disk_pages=6 * 8)  # 6 of the 12 documents (8 pages each)
        assert tiered.gpu_hit_ratio == pytest.approx(plain.gpu_hit_ratio) and plain.disk_hit_ratio == 0
        if mode == "prefix":
            assert tiered.disk_hit_ratio == 0 and tiered.doc_hit_ratio == pytest.approx(plain.doc_hit_ratio)
            continue
        assert plain.doc_hit_ratio < tiered.doc_hit_ratio == pytest.approx(1 - len(set(refs)) / len(refs))
        assert 0 < tight.disk_hit_ratio < tiered.disk_hit_ratio
        assert tight.gpu_hit_ratio == pytest.approx(plain.gpu_hit_ratio)
