"""Token ids against the vocabulary at add_request: documents the cache already holds are not scanned again (their
ids were checked when they were encoded), and a bad id still gets its specific error on every path."""

from __future__ import annotations

import pytest

from lazyattn import LLM, SamplingParams
from lazyattn.engine.prompt import RenderedPrompt
from lazyattn.errors import InvalidRequestError

VOCAB = 320  # the built-in tiny model's
SYSTEM = [256, 5, 6, 7]
DOCS = [list(range(10, 40)), list(range(50, 75))]
PARAMS = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


def make_llm(mode: str) -> LLM:
    return LLM(model="tiny", mode=mode, device="cpu", page_size=16, kv_cache_gb=0.01, max_model_len=512, progress=False)


def run(llm: LLM, prompt: RenderedPrompt, params: SamplingParams | None = PARAMS) -> None:
    llm.engine.add_request(f"r{id(prompt)}", prompt, params)
    while llm.engine.has_unfinished():
        llm.engine.step()


@pytest.fixture(scope="module", params=["lazy", "block", "prefix", "full"])
def warm(request) -> LLM:
    """An engine whose cache holds SYSTEM and DOCS (lazy/block: as documents; prefix: as pages)."""
    llm = make_llm(request.param)
    run(llm, RenderedPrompt([SYSTEM, *DOCS], [80, 81]))
    return llm


def with_bad(ids: list[int], at: int, value) -> list:
    return ids[:at] + [value] + ids[at + 1 :]


BAD_CASES = {
    # name: (prompt, param, message)
    "prompt after cached docs": (
        RenderedPrompt([SYSTEM, *DOCS], [80, VOCAB]),
        "prompt",
        rf"token id {VOCAB} is outside the vocabulary \[0, {VOCAB}\)",
    ),
    "new doc beside cached ones": (
        RenderedPrompt([SYSTEM, DOCS[0], [90, -1, 91]], [80]),
        "documents",
        rf"token id -1 is outside the vocabulary \[0, {VOCAB}\)",
    ),
    "a cached doc with one id changed": (
        RenderedPrompt([SYSTEM, with_bad(DOCS[0], 7, 999), DOCS[1]], [80]),
        "documents",
        "token id 999 is outside",
    ),
    "system segment": (
        RenderedPrompt([with_bad(SYSTEM, 2, VOCAB + 5), *DOCS], [80]),
        "documents",
        f"token id {VOCAB + 5} is outside",
    ),
    "an id past int64": (
        RenderedPrompt([SYSTEM, with_bad(DOCS[1], 0, 2**70)], [80]),
        "documents",
        f"token id {2**70} is outside",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_ids_get_their_error_with_documents_cached(warm, case):
    prompt, param, message = BAD_CASES[case]
    with pytest.raises(InvalidRequestError, match=message) as info:
        warm.engine.add_request("bad", prompt, PARAMS)
    assert info.value.param == param
    assert not warm.engine.has_unfinished()  # nothing queued
    run(warm, RenderedPrompt([SYSTEM, *DOCS], [82]))  # the engine serves the good request as before


def test_prefill_only_and_generate_paths_refuse_bad_ids(warm):
    if warm.engine.mode.caches_documents:
        with pytest.raises(InvalidRequestError, match=f"token id {VOCAB} is outside") as info:
            warm.engine.add_request("reg", RenderedPrompt([SYSTEM, DOCS[0], [1, VOCAB]], []), None)
        assert info.value.param == "documents"
    with pytest.raises(InvalidRequestError, match=f"token id {VOCAB + 1} is outside"):
        warm.generate(
            prompt_token_ids=[[80, 81]], document_token_ids=[[DOCS[0], DOCS[1] + [VOCAB + 1]]], sampling_params=PARAMS
        )
    assert not warm.engine.has_unfinished()


def test_a_non_integer_id_in_a_document_is_refused():
    llm = make_llm("lazy")
    with pytest.raises(InvalidRequestError, match="not an integer token id") as info:
        llm.engine.add_request("x", RenderedPrompt([SYSTEM, [10, 11.5, 12]], [80]), PARAMS)
    assert info.value.param == "documents"


def test_each_document_is_keyed_once_per_request():
    """The keys add_request computes (to skip checking cached documents) are the ones the scheduler acquires."""
    llm = make_llm("lazy")
    engine = llm.engine
    keyed: list[int] = []
    keyer = engine.keyer

    def counting(tokens, salt, parent):
        keyed.append(len(tokens))
        return keyer(tokens, salt, parent)

    engine.keyer = engine.intake.keyer = engine.scheduler.admission.keyer = counting
    run(llm, RenderedPrompt([SYSTEM, *DOCS], [80, 81]))  # encodes all three
    run(llm, RenderedPrompt([SYSTEM, *DOCS], [83]))  # hits all three
    assert keyed == [len(SYSTEM), len(DOCS[0]), len(DOCS[1])] * 2
    stats = engine.stats().cache
    assert stats.hits == 3 and stats.misses == 3
