"""The engine end to end against transformers: every mode, several architectures, cache behaviour,
memory accounting, preemption and bad input."""

from __future__ import annotations

import pytest
import torch

from lazyattn import LLM, SamplingParams
from lazyattn.engine.prompt import RenderedPrompt, from_token_ids
from lazyattn.errors import CheckpointError, ContextTooLongError, InvalidRequestError
from lazyattn.kernels.reference import block_mask
from tests.model.checkpoints import hf_logits

GEN = 5
DOCS = {  # lengths chosen to leave partial last pages (page size 16) and one exact page
    "a": [(7 * i + 3) % 250 + 10 for i in range(37)],
    "b": [(11 * i + 5) % 250 + 10 for i in range(20)],
    "c": [(13 * i + 1) % 250 + 10 for i in range(16)],
    "d": [(17 * i + 2) % 250 + 10 for i in range(45)],
    "e": [(19 * i + 7) % 250 + 10 for i in range(30)],
    **{name: [(k * i + k) % 250 + 10 for i in range(40)] for name, k in (("f", 23), ("g", 29), ("h", 31))},
}
REQUESTS = [  # (document order, final-segment prompt)
    (["a", "b"], [40, 41, 42, 43, 44, 45, 46, 47, 48]),
    (["b", "a", "c"], [50, 51, 52, 53, 54]),
    (["c"], [60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71]),
]


def greedy(**kw) -> SamplingParams:
    return SamplingParams(max_tokens=GEN, temperature=0.0, ignore_eos=True, **kw)


def make_llm(checkpoint, name: str, mode: str, **kw) -> LLM:
    directory, _ = checkpoint(name)
    return LLM(model=str(directory), mode=mode, device="cpu", page_size=16, progress=False, **kw)


def token_bos(llm: LLM) -> int | None:
    """The BOS token-level input gets: the tokenizer's, when it adds one to text (README, token-level input)."""
    return llm.tokenizer.bos_token_id if llm.tokenizer.add_bos_token else None


def generate(llm: LLM, requests=REQUESTS, params=None):
    return llm.generate(
        prompt_token_ids=[p for _, p in requests],
        document_token_ids=[[DOCS[d] for d in docs] for docs, _ in requests],
        sampling_params=params or greedy(logprobs=20),
    )


def hf_rollout(model, segments: list[list[int]], prompt: list[int], block: bool) -> list[torch.Tensor]:
    """transformers' greedy continuation: log-probs of each generated position (docs/design.md, Semantics semantics)."""
    tokens = [t for s in segments for t in s] + list(prompt)
    out = []
    for step in range(GEN):
        visible = block_mask([len(s) for s in segments], len(prompt) + step) if block else None
        logits = hf_logits(model, tokens, list(range(len(tokens))), visible)[-1]
        lp = torch.log_softmax(logits.double(), -1)
        out.append(lp)
        tokens.append(int(lp.argmax()))
    return out


def assert_matches(outs, model, requests, bos, block: bool):
    for out, (docs, prompt) in zip(outs, requests):
        rendered = from_token_ids(prompt, [DOCS[d] for d in docs], bos)
        want = hf_rollout(model, rendered.segments, rendered.final, block)
        assert out.token_ids == [int(lp.argmax()) for lp in want]
        for got, lp in zip(out.outputs[0].logprobs, want):
            ids = torch.tensor(list(got))
            assert torch.allclose(torch.tensor(list(got.values()), dtype=torch.float64), lp[ids], atol=2e-4)


@pytest.mark.parametrize("name", ["llama", "llama31", "qwen2", "qwen3", "mistral", "tied"])
@pytest.mark.parametrize("mode", ["lazy", "block", "prefix", "full"])
def test_modes_match_transformers(checkpoint, name, mode):
    """lazy/block == transformers with logical positions and the block mask; prefix/full == plain causal."""
    llm = make_llm(checkpoint, name, mode)
    outs = generate(llm)
    assert_matches(outs, checkpoint(name)[1], REQUESTS, token_bos(llm), block=mode in ("lazy", "block"))


def test_reordered_documents_hit_and_changed_document_misses(checkpoint):
    llm = make_llm(checkpoint, "llama", "lazy")
    generate(llm, [(["a", "b", "c"], [40, 41])])
    before = llm.stats().cache
    generate(llm, [(["c", "a", "b"], [42, 43])])
    after = llm.stats().cache
    n_segments = len(from_token_ids([42], [DOCS["a"], DOCS["b"], DOCS["c"]], token_bos(llm)).segments)
    assert after.hits - before.hits == n_segments and after.misses == before.misses

    DOCS["b2"] = DOCS["b"][:-1] + [DOCS["b"][-1] + 1]
    try:
        generate(llm, [(["a", "b2", "c"], [44])])
    finally:
        del DOCS["b2"]
    final = llm.stats().cache
    assert final.misses - after.misses == 1 and final.hits - after.hits == n_segments - 1


def test_prefix_mode_misses_reordered_documents(checkpoint):
    lazy, prefix = make_llm(checkpoint, "llama", "lazy"), make_llm(checkpoint, "llama", "prefix")
    for llm in (lazy, prefix):
        generate(llm, [(["a", "b", "c"], [40, 41])])
        generate(llm, [(["c", "b", "a"], [40, 41])])
    assert lazy.stats().prefilled_tokens < prefix.stats().prefilled_tokens


@pytest.mark.parametrize("mode", ["lazy", "block", "prefix", "full"])
def test_only_cached_segments_hold_pages_when_idle(checkpoint, mode):
    llm = make_llm(checkpoint, "qwen2", mode)
    generate(llm, params=SamplingParams(max_tokens=4, temperature=0.8, seed=1, n=2))
    engine = llm.engine
    assert engine.pool.num_used == engine.cache.stats().pages_in_use
    engine.cache.clear()
    assert engine.pool.num_used == 0


@pytest.mark.parametrize("mode", ["lazy", "block", "prefix"])
def test_tiny_kv_budget_evicts_and_preempts_but_stays_correct(checkpoint, mode):
    """A 16-page pool (one request's worth) under a workload that needs far more: eviction and preemption,
    and the same tokens as a roomy pool."""
    requests = (REQUESTS + [(["d", "e"], [80, 81, 82]), (["e", "b", "d"], [83])]) * 2
    roomy = generate(make_llm(checkpoint, "llama", mode), requests)
    page_bytes = make_llm(checkpoint, "llama", mode).stats().page_bytes
    tight = make_llm(checkpoint, "llama", mode, kv_cache_gb=16 * page_bytes / 2**30, max_num_batched_tokens=48)
    outs = generate(tight, requests)
    assert [o.token_ids for o in outs] == [o.token_ids for o in roomy]
    stats = tight.stats()
    assert stats.num_pages == 16 and stats.cache.evictions + stats.preemptions > 0
    assert tight.engine.pool.num_used == stats.cache.pages_in_use


@pytest.mark.parametrize("mode", ["lazy", "block", "prefix"])
def test_the_prompt_lists_come_back_unchanged(checkpoint, mode):
    """The engine keeps a request's prompt lists without copying them (LLMEngine.add_request), so it must never
    change them: not through two samples sharing them, eviction, preemption or the outputs."""
    requests = (REQUESTS + [(["d", "e"], [80, 81, 82])]) * 2
    page_bytes = make_llm(checkpoint, "llama", mode).stats().page_bytes
    llm = make_llm(checkpoint, "llama", mode, kv_cache_gb=16 * page_bytes / 2**30, max_num_batched_tokens=48)
    prompts = [RenderedPrompt([list(DOCS[d]) for d in docs], list(final)) for docs, final in requests]
    expected = [([list(s) for s in p.segments], list(p.final)) for p in prompts]
    engine = llm.engine
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=4, temperature=0.8, seed=i, n=2))
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    stats = llm.stats()
    assert stats.cache.evictions + stats.preemptions > 0  # the tight pool did evict or preempt
    assert sum(o.finished for o in outputs) == len(prompts)
    assert [(p.segments, p.final) for p in prompts] == expected


def test_lru_eviction_under_a_small_pool_keeps_outputs(checkpoint):
    """Requests one after another over more distinct documents than the pool holds."""
    sequence = [
        (["a"], [40]),
        (["d"], [41]),
        (["e", "b"], [42]),
        (["f"], [43]),
        (["g", "h"], [44]),
        (["a", "f"], [45]),
        (["c", "d"], [46]),
    ]
    roomy = make_llm(checkpoint, "llama", "lazy")
    page_bytes = roomy.stats().page_bytes
    tight = make_llm(checkpoint, "llama", "lazy", kv_cache_gb=16 * page_bytes / 2**30)
    for request in sequence:
        assert generate(tight, [request])[0].token_ids == generate(roomy, [request])[0].token_ids
    assert tight.stats().cache.evictions > 0 and roomy.stats().cache.evictions == 0


def test_concurrent_requests_share_one_prefill_of_a_missing_document(checkpoint):
    llm = make_llm(checkpoint, "llama", "lazy")
    outs = generate(llm, [(["a"], [40]), (["a"], [41]), (["a"], [42])], greedy())
    stats = llm.stats()
    bos_segments = len(from_token_ids([40], [DOCS["a"]], token_bos(llm)).segments) - 1
    assert stats.cache.misses == 1 + bos_segments
    # each document token once, plus per request its prompt token and GEN - 1 decode steps
    doc_tokens = len(DOCS["a"]) + bos_segments * 1
    assert stats.prefilled_tokens <= doc_tokens + 3 * GEN + 3
    assert len(outs) == 3


def test_n_samples_share_documents_and_seeds_reproduce(checkpoint):
    llm = make_llm(checkpoint, "llama", "lazy")
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=7, n=3)
    first = generate(llm, REQUESTS[:1], params)
    misses = llm.stats().cache.misses
    assert len(first[0].outputs) == 3
    second = generate(llm, REQUESTS[:1], params)
    assert [c.token_ids for c in first[0].outputs] == [c.token_ids for c in second[0].outputs]
    assert llm.stats().cache.misses == misses  # the second run hit every document


def test_request_output_reads_its_first_sample_as_the_readme_shows(checkpoint):
    """outs[0].text / token_ids / finish_reason / logprobs are the first sample's (README, Using it from Python)."""
    llm = make_llm(checkpoint, "llama", "lazy")
    out = generate(llm, REQUESTS[:1], SamplingParams(max_tokens=4, temperature=1.0, seed=3, n=2, logprobs=2))[0]
    first, second = out.outputs
    assert (out.text, out.token_ids, out.finish_reason, out.logprobs) == (
        first.text,
        first.token_ids,
        first.finish_reason,
        first.logprobs,
    )
    assert len(out.logprobs) == len(out.token_ids) == 4 and all(len(lp) >= 2 for lp in out.logprobs)
    assert [next(iter(lp)) for lp in out.logprobs] == out.token_ids  # the chosen token first
    assert second.logprobs is not first.logprobs


def test_stop_token_and_stop_string(checkpoint):
    llm = make_llm(checkpoint, "llama", "lazy")
    free = generate(llm, REQUESTS[:1], greedy())[0]
    stop_id = free.token_ids[2]
    cut = generate(llm, REQUESTS[:1], greedy(stop_token_ids=[stop_id]))[0]
    first = free.token_ids.index(stop_id)
    assert cut.token_ids == free.token_ids[: first + 1]
    assert cut.finish_reason == "stop" and cut.outputs[0].stop_reason == stop_id
    text = free.text
    if len(text) >= 4:
        stop = text[2:4]
        out = generate(llm, REQUESTS[:1], greedy(stop=[stop]))[0]
        assert out.text == text[: text.index(stop)] and out.finish_reason == "stop"


def test_bad_input_raises_and_engine_keeps_serving(checkpoint, tmp_path):
    llm = make_llm(checkpoint, "llama", "lazy")
    good = generate(llm, REQUESTS[:1])
    bad_calls = [
        (InvalidRequestError, dict(prompt_token_ids=[[]], document_token_ids=[[DOCS["a"]]])),
        (InvalidRequestError, dict(prompt_token_ids=[[40, 10_000]])),
        (InvalidRequestError, dict(prompt_token_ids=[[-1]])),
        (ContextTooLongError, dict(prompt_token_ids=[[40] * 600])),
        (InvalidRequestError, dict(prompt_token_ids=[[40]], sampling_params=SamplingParams(temperature=-1))),
        (InvalidRequestError, dict(prompt_token_ids=[[40]], sampling_params=SamplingParams(top_p=0.0))),
        (InvalidRequestError, dict(prompt_token_ids=[[40]], sampling_params=SamplingParams(max_tokens=0))),
    ]
    for exc, kwargs in bad_calls:
        with pytest.raises(exc):
            llm.generate(**kwargs)
        assert not llm.engine.has_unfinished()
    # a batch with one bad request queues nothing
    with pytest.raises(InvalidRequestError):
        llm.generate(prompt_token_ids=[[40, 41], [40, 99_999]])
    assert not llm.engine.has_unfinished()
    assert [o.token_ids for o in generate(llm, REQUESTS[:1])] == [o.token_ids for o in good]

    with pytest.raises(CheckpointError):
        LLM(model=str(tmp_path / "missing"), device="cpu", progress=False)


def test_min_tokens_holds_back_stop_tokens(checkpoint):
    llm = make_llm(checkpoint, "llama", "lazy")
    free = generate(llm, REQUESTS[:1], greedy())[0]
    first = free.token_ids[0]
    out = generate(llm, REQUESTS[:1], greedy(stop_token_ids=[first], min_tokens=2))[0]
    assert out.token_ids[0] != first and len(out.token_ids) >= 2


def test_documents_encoded_ahead_are_hits_later(checkpoint):
    llm = make_llm(checkpoint, "llama", "lazy")
    bos = token_bos(llm)
    segments = from_token_ids([40], [DOCS["a"], DOCS["d"]], bos).segments
    llm.engine.add_request("encode", RenderedPrompt(segments, []), None)  # prefill-only: documents, nothing sampled
    outs = []
    while llm.engine.has_unfinished():
        outs += llm.engine.step()
    assert [(o.request_id, o.finished, o.token_ids) for o in outs] == [("encode", True, [])]
    assert llm.stats().cache.misses == len(segments)
    assert llm.engine.pool.num_used == llm.stats().cache.pages_in_use
    out = generate(llm, [(["d", "a"], [40, 41])])
    assert llm.stats().cache.misses == len(segments)  # every document hit
    assert out[0].token_ids == generate(make_llm(checkpoint, "llama", "lazy"), [(["d", "a"], [40, 41])])[0].token_ids


def test_warm_up_leaves_no_trace(checkpoint):
    """The start-up warm-up (run on CUDA before serving) touches no cache, page or counter and zeroes the KV."""
    llm = make_llm(checkpoint, "llama", "lazy", max_num_seqs=8, max_num_batched_tokens=256)
    want = generate(make_llm(checkpoint, "llama", "lazy"), REQUESTS)
    llm.engine.executor.runner.warm_up()
    stats = llm.stats()
    assert stats.cache.lookups == 0 and stats.pages_used == 0 and stats.prefilled_tokens == 0
    assert not llm.engine.executor.runner.backend.kv.any()
    assert [o.token_ids for o in generate(llm, REQUESTS)] == [o.token_ids for o in want]


@pytest.mark.parametrize(
    "mode, segments, n, pages_for_tokens",
    [
        # 16-token pages, a 20-page budget, a 10-token final segment; hand-counted pages besides the run's own:
        ("lazy", [50], 1, lambda m: 4 + -(-(10 + m) // 16)),  # the document's 4 pages, shared
        ("lazy", [50], 2, lambda m: 4 + 2 * -(-(10 + m) // 16)),  # each sample has its own run
        ("block", [50, 30], 1, lambda m: 6 + 2 + -(-(10 + m) // 16)),  # + a private copy of the moved document
        ("prefix", [50, 30], 1, lambda m: -(-(90 + m) // 16)),  # one causal sequence
        ("full", [50], 2, lambda m: 2 * -(-(60 + m) // 16)),
    ],
)
def test_max_new_tokens_is_the_most_that_fits(checkpoint, mode, segments, n, pages_for_tokens):
    llm = make_llm(checkpoint, "llama", mode)
    llm.engine.set_kv_budget(20)
    prompt = RenderedPrompt([[7] * k for k in segments], [8] * 10)
    context_room = llm.engine.max_model_len - sum(segments) - 10
    most = max(m for m in range(context_room + 1) if pages_for_tokens(m) <= 20)
    assert most < context_room  # the pool is the bound here
    assert llm.engine.max_new_tokens(prompt, n) == most
    llm.engine.add_request("fits", prompt, SamplingParams(max_tokens=most, n=n))  # accepted, then dropped
    llm.engine.abort("fits")
    with pytest.raises(ContextTooLongError):
        llm.engine.add_request("over", prompt, SamplingParams(max_tokens=most + 1, n=n))
