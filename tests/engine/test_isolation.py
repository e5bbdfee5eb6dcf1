"""One request's failure ends that request alone: the step is redone part by part (engine/isolation.py)."""

from __future__ import annotations

import pytest

from lazyattn import LLM, SamplingParams
from lazyattn.engine.prompt import RenderedPrompt, from_token_ids

GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
DOCS = {"x": [5] * 20 + [6] * 7, "y": [9] * 33, "z": [11] * 18}
REQUESTS = {"a": (["x", "y"], [1, 2, 3]), "b": (["y", "z"], [1, 2, 4]), "c": (["z"], [7, 8])}


def engine(mode: str = "lazy"):
    return LLM(model="tiny", mode=mode, device="cpu", progress=False, page_size=16).engine


def run(e, names, poison=None):
    for name in names:
        docs, prompt = REQUESTS[name]
        e.add_request(name, from_token_ids(prompt, [DOCS[d] for d in docs]), GREEDY)
    if poison is not None:
        poison(e)
    outs = {}
    for _ in range(100):
        if not e.has_unfinished():
            break
        for o in e.step():
            outs[o.request_id] = o
    return outs


def alone(name, mode="lazy"):
    return run(engine(mode), [name])[name].token_ids


def poison_runner(when):
    def install(e):
        real = e.executor.run

        def run(batch):
            if any(when(w) for w in batch.works):
                raise RuntimeError("poisoned part")
            return real(batch)

        e.executor.run = run

    return install


def assert_clean(e):
    s = e.stats()
    assert s.pages_used == s.cache.pages_in_use and s.running == 0 and s.waiting == 0


def test_a_sampling_failure_ends_only_its_request():
    e = engine()

    def poison(e):
        real = e.sampler.sample

        def sample(logits, params, generators, **constraints):
            if any(p.top_k == 3 for p in params):
                raise RuntimeError("poisoned sampling")
            return real(logits, params, generators, **constraints)

        e.sampler.sample = sample

    e.add_request("bad", from_token_ids([1, 2], [DOCS["x"]]), SamplingParams(max_tokens=5, temperature=1.0, top_k=3))
    outs = run(e, ["a", "c"], poison)
    assert outs["bad"].finish_reason == "abort" and "poisoned sampling" in outs["bad"].error
    assert outs["a"].token_ids == alone("a") and outs["c"].token_ids == alone("c")
    assert outs["a"].error is None
    assert_clean(e)


@pytest.mark.parametrize("mode", ["lazy", "block", "prefix"])
def test_a_forward_failure_of_one_sequence_ends_only_its_request(mode):
    e = engine(mode)
    outs = run(e, ["a", "b", "c"], poison_runner(lambda w: w.seq is not None and w.seq.request_id == "b"))
    assert outs["b"].finish_reason == "abort" and "poisoned part" in outs["b"].error
    assert outs["a"].token_ids == alone("a", mode) and outs["c"].token_ids == alone("c", mode)
    assert_clean(e)


def test_a_failing_document_encode_ends_the_requests_that_wait_on_it():
    e = engine()
    outs = run(e, ["a", "b", "c"], poison_runner(lambda w: w.job is not None and w.run.tokens == DOCS["x"]))
    assert outs["a"].error is not None and outs["a"].token_ids == []  # a waits on x
    assert outs["b"].token_ids == alone("b") and outs["c"].token_ids == alone("c")
    assert e.cache.lookup(e.keyer(DOCS["x"], None, None)) is None  # the failed document is not cached
    assert_clean(e)


def poison_document(e, doc):
    """Overwrite a cached document's KV pages with NaN, as corrupt memory or a bad disk file would leave them."""
    segment = e.cache.lookup(e.keyer(doc, None, None))
    e.executor.local_kv[:, :, list(segment.pages)] = float("nan")


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("when", ["before", "while decoding"])
def test_non_finite_logits_end_only_their_request(async_scheduling, when):
    """a reads document x, whose KV turns to NaN; c, beside it in every step, reads only z and goes on untouched."""
    e = LLM(model="tiny", device="cpu", progress=False, page_size=16, async_scheduling=async_scheduling).engine
    e.add_request("x", RenderedPrompt([DOCS["x"]], []), None)  # prefill-only: x encoded and cached
    while e.has_unfinished():
        e.step()
    if when == "before":
        poison_document(e, DOCS["x"])
        outs = run(e, ["a", "c"])
    else:
        for name in ("a", "c"):
            docs, prompt = REQUESTS[name]
            e.add_request(name, from_token_ids(prompt, [DOCS[d] for d in docs]), GREEDY)
        outs = {}
        while e.has_unfinished():
            for o in e.step():
                outs[o.request_id] = o
            if "a" in outs and len(outs["a"].token_ids) == 2 and not outs["a"].finished:
                poison_document(e, DOCS["x"])
    a = outs["a"]
    assert a.finish_reason == "abort" and "non-finite logits" in a.error
    assert a.token_ids == alone("a")[: len(a.token_ids)]  # the tokens before the KV went bad, nothing after
    assert len(a.token_ids) == (0 if when == "before" else 2 + async_scheduling)  # overlapped: one more was on its way
    assert outs["c"].token_ids == alone("c") and outs["c"].error is None
    assert (e.pipeline.overlapped_steps > 0) == async_scheduling
    assert_clean(e)
