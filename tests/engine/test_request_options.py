"""A request's options as one dataclass (engine/request_options.py): resolved against the engine's settings and its
mode in one place, taken by `LLM.generate`/`chat` as `options=` or as the keywords of the same names."""

from __future__ import annotations

import dataclasses

import pytest

from lazyattn import LLM, RequestOptions
from lazyattn.engine.request_options import ENGINE_DEFAULTS, OFF
from lazyattn.errors import InvalidRequestError
from tests.engine.test_engine import DOCS, REQUESTS, greedy, make_llm

ENGINE = RequestOptions(
    relink_tokens=4,
    ape_temperature=0.5,
    ape_scale=2.0,
    ape_prefix=True,
    ape_tilt=1.0,
    relink_last_tokens=3,
    ape_parallel=False,
)


def test_fields_left_none_are_the_engines():
    assert ENGINE_DEFAULTS.resolve(ENGINE, "lazy") == ENGINE
    mine = RequestOptions(relink_tokens=0, ape_scale=1.5)
    assert mine.resolve(ENGINE, "lazy") == RequestOptions(0, 0.5, 1.5, True, 1.0, 3, False)
    assert RequestOptions(0, ape_parallel=True, relink_last_tokens=0).resolve(ENGINE, "lazy").ape_parallel is True
    assert RequestOptions(relink_last_tokens=0).resolve(ENGINE, "lazy").relink == (4, 0)
    assert RequestOptions(ape_tilt=-2).resolve(ENGINE, "lazy").ape_tilt == -2.0
    assert mine.resolve(ENGINE, "lazy").ape == (0.5, 1.5)
    assert isinstance(RequestOptions(ape_temperature=2).resolve(OFF, "lazy").ape_temperature, float)


def test_a_prefill_only_request_relinks_and_weighs_nothing():
    """It computes no final segment; only its documents' encoding (ape_prefix) is its own."""
    asked = RequestOptions(8, 0.5, 3.0, True, 2.0, relink_last_tokens=8, ape_parallel=True)
    assert asked.resolve(OFF, "lazy", prefill_only=True) == RequestOptions(0, 1.0, 1.0, True, 0.0, 0, False)


@pytest.mark.parametrize(
    ("options", "mode", "param", "message"),
    [
        (RequestOptions(relink_tokens=-1), "lazy", "relink_tokens", "relink_tokens must be an integer >= 0, got -1"),
        (RequestOptions(relink_tokens=4), "block", "relink_tokens", "relink_tokens=4 needs mode 'lazy'"),
        (RequestOptions(relink_last_tokens=-2), "lazy", "relink_last_tokens", "relink_last_tokens must be an integer"),
        (RequestOptions(relink_last_tokens=3), "full", "relink_last_tokens", "relink_last_tokens=3 needs mode 'lazy'"),
        (RequestOptions(ape_temperature=1e-4), "lazy", "ape_temperature", "must be at least 0.001"),
        (RequestOptions(ape_scale=0.0), "lazy", "ape_scale", "ape_scale must be a finite number > 0"),
        (RequestOptions(ape_scale=2.0), "full", "ape_scale", "need mode 'lazy' or 'block'"),
        (RequestOptions(ape_prefix=True), "block", "ape_prefix", "ape_prefix needs mode 'lazy'"),
        (RequestOptions(ape_tilt=1.0), "prefix", "ape_tilt", "ape_tilt=1.0 need mode 'lazy' or 'block'"),
        (RequestOptions(ape_tilt=float("nan")), "lazy", "ape_tilt", "ape_tilt must be a number in"),
        (RequestOptions(ape_prefix=1), "lazy", "ape_prefix", "ape_prefix must be true or false"),  # type: ignore[arg-type]
        (RequestOptions(ape_parallel=1), "lazy", "ape_parallel", "ape_parallel must be true or false"),  # type: ignore[arg-type]
        (RequestOptions(ape_parallel=True), "block", "ape_parallel", "ape_parallel needs mode 'lazy'"),
        (RequestOptions(ape_parallel=True), "full", "ape_parallel", "ape_parallel needs mode 'lazy'"),
        (RequestOptions(ape_parallel=True, relink_tokens=2), "lazy", "ape_parallel", "does not combine with relink"),
        (RequestOptions(ape_parallel=True, relink_last_tokens=3), "lazy", "ape_parallel", "does not combine"),
    ],
)
def test_bad_values_name_their_field(options, mode, param, message):
    with pytest.raises(InvalidRequestError, match=message) as e:
        options.resolve(OFF, mode)
    assert e.value.param == param


def test_options_and_keywords_are_one_thing(checkpoint):
    llm: LLM = make_llm(checkpoint, "llama", "lazy")
    kw = dict(
        prompt_token_ids=[p for _, p in REQUESTS],
        document_token_ids=[[DOCS[d] for d in docs] for docs, _ in REQUESTS],
        sampling_params=greedy(logprobs=5),
    )
    by_keywords = llm.generate(**kw, relink_tokens=2, relink_last_tokens=3, ape_temperature=0.7, ape_prefix=True)
    options = RequestOptions(relink_tokens=2, relink_last_tokens=3, ape_temperature=0.7, ape_prefix=True)
    by_options = llm.generate(**kw, options=options)
    for a, b in zip(by_keywords, by_options):
        assert a.token_ids == b.token_ids and a.outputs[0].logprobs == b.outputs[0].logprobs
    with pytest.raises(InvalidRequestError, match="not both") as e:
        llm.generate(**kw, options=options, ape_scale=2.0)
    assert e.value.param == "options"
    with pytest.raises(InvalidRequestError, match="ape_prefix needs mode 'lazy'"):
        make_llm(checkpoint, "llama", "block").generate(
            **kw, options=dataclasses.replace(options, relink_tokens=0, relink_last_tokens=0)
        )
    assert not llm.engine.has_unfinished()
