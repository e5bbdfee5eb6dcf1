"""The host tier end to end on the CPU: under eviction pressure (a KV pool of a few requests' pages) and aborts,
every mode that caches gives the same tokens with and without the tier, documents come back from the host instead
of being encoded again, and no page of either pool is leaked."""

from __future__ import annotations

import pytest

from lazyattn import LLM, SamplingParams
from lazyattn.engine.prompt import from_token_ids
from lazyattn.errors import InvalidRequestError

PAGE = 16
DOCS = [[(7 * k * i + 3 * k) % 250 + 10 for i in range(26 + 7 * k)] for k in range(1, 9)]  # 2 to 5 pages each
REQUESTS = [([(j * 3) % 8, (j * 5 + 2) % 8, (j + 6) % 8], [40 + j, 41, 42 + j]) for j in range(14)]
PARAMS = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def engine(mode: str, host_cache_gb: float, device: str = "cpu", dtype: str | None = None) -> LLM:
    llm = LLM(
        model="tiny",
        mode=mode,
        device=device,
        dtype=dtype,
        page_size=PAGE,
        progress=False,
        kv_cache_gb=0.05,
        host_cache_gb=host_cache_gb,
    )
    # A pool of the largest request's pages plus room for about two documents: most documents get evicted.
    e = llm.engine
    need = max(
        e.mode.pages_needed([len(s) for s in prompt(llm, r).segments], 3 + PARAMS.max_tokens, 1, PAGE) for r in REQUESTS
    )
    e.set_kv_budget(need + 8)
    return llm


def prompt(llm: LLM, request):
    docs, final = request
    return from_token_ids(final, [DOCS[d] for d in docs], llm.tokenizer.bos_token_id)


def run_all(llm: LLM, batched: bool) -> list[list[int]]:
    rendered = [prompt(llm, r) for r in REQUESTS]
    if batched:
        outs = llm._run(rendered, PARAMS, None, False)
    else:
        outs = [o for r in rendered for o in llm._run([r], PARAMS, None, False)]
    return [o.outputs[0].token_ids for o in outs]


def assert_no_leak(llm: LLM) -> None:
    e = llm.engine
    s = e.stats()
    assert s.pages_used == s.cache.pages_in_use  # idle: only cached segments hold GPU pages
    assert e.tier.pool.num_used == s.host.pages_used == sum(len(x.pages) for x in e.tier._index.values())
    e.reset_cache()
    assert e.stats().pages_used == 0 and e.tier.pool.num_used == 0


@pytest.mark.parametrize("mode", ["lazy", "block", "prefix"])
def test_same_tokens_with_and_without_the_tier_under_eviction(mode):
    plain, tiered = engine(mode, 0), engine(mode, 0.01)
    assert plain.engine.tier is None and tiered.engine.tier is not None
    for batched in (False, True):
        expected = run_all(plain, batched)
        assert run_all(tiered, batched) == expected
        p, t = plain.engine.stats(), tiered.engine.stats()
        assert p.cache.evictions > 0 and t.host.demotions > 0 and t.cache.host_hits > 0
        if not batched and mode != "prefix":  # one by one: the host served what the GPU-only engine encoded again
            assert t.cache.misses == 9 and t.cache.misses + t.cache.host_hits == p.cache.misses  # 8 documents, BOS
        assert t.prefilled_tokens < p.prefilled_tokens
        assert t.host.promotions == t.cache.host_hits == t.host.hits
        smallest = 1 if mode == "prefix" else 2  # pages of a cached segment: a prefix page, or a document
        assert t.host.bytes_to_device >= smallest * t.cache.host_hits * t.host.page_bytes
        assert_no_leak(tiered)
        plain.engine.reset_cache()


@pytest.mark.parametrize("mode", ["lazy", "block"])
def test_a_head_major_pool_gives_the_same_tokens(mode, monkeypatch):
    """LAZYATTN_KV_LAYOUT=head (cache/page_pool.py): the same requests under eviction, through the host tier's copies
    both ways, give the default pool's tokens."""
    expected = run_all(engine(mode, 0), batched=True)
    monkeypatch.setenv("LAZYATTN_KV_LAYOUT", "head")
    tiered = engine(mode, 0.01)
    kv = tiered.engine.executor.runner.backend.kv
    assert kv[0, 0, 0, :, 0].is_contiguous() and not kv[0, 0, 0].is_contiguous()  # head-major tiles
    assert run_all(tiered, batched=True) == expected
    assert tiered.engine.stats().cache.host_hits > 0
    assert_no_leak(tiered)


def test_aborts_mid_flight_leak_nothing_and_leave_the_others_unchanged():
    plain, tiered = engine("lazy", 0), engine("lazy", 0.01)
    expected = run_all(plain, batched=True)
    e = tiered.engine
    for j, r in enumerate(REQUESTS):
        e.add_request(f"r{j}", prompt(tiered, r), PARAMS)
    done: dict[str, list[int]] = {}
    aborted = {"r1", "r4", "r5", "r9", "r13"}
    steps = 0
    while e.has_unfinished():
        for out in e.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
        steps += 1
        for rid in [a for a in aborted if a in e.requests and steps >= int(a[1:]) // 2]:
            e.abort(rid)
    for j, tokens in enumerate(expected):
        if f"r{j}" not in aborted:
            assert done[f"r{j}"] == tokens
    assert e.stats().cache.host_hits > 0
    assert_no_leak(tiered)


def test_options_and_the_host_budget():
    with pytest.raises(InvalidRequestError, match="host_cache_gb"):
        LLM(model="tiny", device="cpu", host_cache_gb=-1)
    cpu_default = LLM(model="tiny", device="cpu", progress=False, kv_cache_gb=0.05)
    assert cpu_default.engine.tier is None and cpu_default.engine.stats().host is None  # off on the CPU
    assert (
        LLM(model="tiny", mode="full", device="cpu", progress=False, kv_cache_gb=0.05, host_cache_gb=0.01).engine.tier
        is None
    )  # nothing cached, nothing to demote
    llm = engine("lazy", 0.01)
    pages = llm.engine.tier.num_pages
    assert pages == int(0.01 * 2**30) // llm.engine.executor.page_bytes
    llm.engine.set_host_budget(3)
    assert llm.engine.stats().host.num_pages == 3
    llm.engine.set_host_budget(None)
    assert llm.engine.stats().host.num_pages == pages
    with pytest.raises(InvalidRequestError, match="no host tier"):
        cpu_default.engine.set_host_budget(4)


def test_written_pages_are_the_rows_of_each_work_and_the_copies():
    from lazyattn.engine.batch import Copy, StepPlan, Work
    from lazyattn.engine.sequence import Run
    from lazyattn.kernels.paged import EntryPages

    run = Run(list(range(70)), 0, [7, 3, 9, 12, 5])  # 70 tokens over pages of 16
    other = Run(list(range(20)), 0, [30, 31])
    batch = StepPlan(
        (Work(run, 17, 40, EntryPages([], [], [])), Work(other, 16, 17, EntryPages([], [], []))),
        (Copy(0, [1, 2], [44, 45], [5, 5]),),
    )
    # rows 17..39 sit in pages 1 and 2 of the run (3, 9); row 16 of the other in its page 1 (31)
    assert batch.written_pages(16) == {3, 9, 31, 44, 45}


def test_shutdown_lets_go_of_the_tier(tmp_path):
    """After shutdown nothing the engine object still holds keeps the host or disk tier (and their buffers) alive:
    the object may outlive the shutdown (a `with` block's name, a notebook)."""
    import gc
    import weakref

    llm = LLM(
        model="tiny",
        mode="lazy",
        device="cpu",
        progress=False,
        kv_cache_gb=0.05,
        host_cache_gb=0.01,
        disk_cache_dir=str(tmp_path),
    )
    run_all(llm, batched=True)
    held = [weakref.ref(llm.engine.tier), weakref.ref(llm.engine.disk), weakref.ref(llm.engine.executor.local_kv)]
    llm.engine.shutdown()
    gc.collect()
    assert [t() for t in held] == [None, None, None]  # the tiers, and the KV pool they copy from
