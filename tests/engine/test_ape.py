"""Attention temperature and scale on documents (docs/design.md, "APE"): lazy and block mode against an independent
transformers reference (one forward over the concatenation, with an attention function registered in transformers
that turns the final segment's scores against document keys into s / T + ln S), plus the option's checks."""

from __future__ import annotations

import math

import pytest
import torch

from lazyattn.engine.config import EngineConfig
from lazyattn.engine.prompt import from_token_ids
from lazyattn.errors import InvalidRequestError
from lazyattn.kernels.reference import block_mask
from tests.engine.test_engine import DOCS, GEN, REQUESTS, generate, greedy, make_llm, token_bos
from tests.model.checkpoints import hf_logits

# What the registered attention function applies to the forward in progress: visibility [T, T] and, per
# (query, key), the multiplier 1/T and the bias ln S of the score.
_LAYOUT: dict[str, torch.Tensor] = {}


def _ape_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention with per-(query, key) temperature and scale; query [B, H, T, D], key/value [B, Hkv, T, D]."""
    group = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    scores = scores * _LAYOUT["inv_temp"] + _LAYOUT["log_scale"]
    scores = scores.masked_fill(~_LAYOUT["visible"], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def _register() -> str:
    from transformers import AttentionInterface

    AttentionInterface.register("ape_reference", _ape_attention)
    return "ape_reference"


def ape_logits(model, segments: list[list[int]], tail: list[int], t: float, s: float) -> torch.Tensor:
    """transformers' logits of the final rows under block attention with (T, S) on the documents after the first."""
    tokens = [x for seg in segments for x in seg] + tail
    n_ctx, first = len(tokens) - len(tail), len(segments[0])
    inv = torch.ones(len(tokens), len(tokens), dtype=torch.float32)
    log = torch.zeros(len(tokens), len(tokens), dtype=torch.float32)
    inv[n_ctx:, first:n_ctx] = 1.0 / t
    log[n_ctx:, first:n_ctx] = math.log(s)
    _LAYOUT.update(inv_temp=inv, log_scale=log, visible=block_mask([len(x) for x in segments], len(tail)))
    model.set_attn_implementation(_register())
    try:
        return hf_logits(model, tokens, list(range(len(tokens))))
    finally:
        model.set_attn_implementation("eager")
        _LAYOUT.clear()


def hf_ape_rollout(model, segments, prompt, t: float, s: float) -> list[torch.Tensor]:
    tail, out = list(prompt), []
    for _ in range(GEN):
        lp = torch.log_softmax(ape_logits(model, segments, tail, t, s)[-1].double(), -1)
        out.append(lp)
        tail.append(int(lp.argmax()))
    return out


def assert_ape_matches(outs, model, bos, t, s, requests=REQUESTS, atol=2e-4):
    for out, (docs, prompt) in zip(outs, requests):
        rendered = from_token_ids(prompt, [DOCS[d] for d in docs], bos)
        want = hf_ape_rollout(model, rendered.segments, rendered.final, t, s)
        assert out.token_ids == [int(lp.argmax()) for lp in want]
        for got, lp in zip(out.outputs[0].logprobs, want):
            ids = torch.tensor(list(got))
            assert torch.allclose(torch.tensor(list(got.values()), dtype=torch.float64), lp[ids], atol=atol)


@pytest.mark.parametrize("name", ["llama", "llama31", "qwen2", "qwen3"])
@pytest.mark.parametrize("mode", ["lazy", "block"])
def test_ape_matches_transformers(checkpoint, name, mode):
    """Engine default (T, S) in fp32 on the CPU == the transformers reference, greedy tokens and log-probs."""
    t, s = 0.6, 2.5
    llm = make_llm(checkpoint, name, mode, ape_temperature=t, ape_scale=s)
    outs = generate(llm, params=greedy(logprobs=20))
    assert_ape_matches(outs, checkpoint(name)[1], token_bos(llm), t, s)


def test_per_request_override(checkpoint):
    """A request's own (T, S) over the engine's default, and T = S = 1 on an engine with a default: plain lazy."""
    llm = make_llm(checkpoint, "llama", "lazy", ape_temperature=0.5, ape_scale=3.0)
    kw = dict(
        prompt_token_ids=[p for _, p in REQUESTS],
        document_token_ids=[[DOCS[d] for d in docs] for docs, _ in REQUESTS],
        sampling_params=greedy(logprobs=20),
    )
    outs = llm.generate(**kw, ape_temperature=1.4, ape_scale=0.7)
    assert_ape_matches(outs, checkpoint("llama")[1], token_bos(llm), 1.4, 0.7)
    off = llm.generate(**kw, ape_temperature=1.0, ape_scale=1.0)
    plain = generate(make_llm(checkpoint, "llama", "lazy"), params=greedy(logprobs=20))
    for a, b in zip(off, plain):
        assert a.token_ids == b.token_ids and a.outputs[0].logprobs == b.outputs[0].logprobs


def test_the_reference_is_block_attention_at_one_and_differs_elsewhere(checkpoint):
    model = checkpoint("qwen2")[1]
    docs, prompt = REQUESTS[1]
    segments = from_token_ids(prompt, [DOCS[d] for d in docs], 1).segments
    tokens = [x for seg in segments for x in seg] + prompt
    block = hf_logits(model, tokens, list(range(len(tokens))), block_mask([len(x) for x in segments], len(prompt)))
    assert torch.allclose(ape_logits(model, segments, prompt, 1.0, 1.0), block, atol=1e-5)
    ape = ape_logits(model, segments, prompt, 0.6, 2.5)
    assert (ape[-1] - block[-1]).abs().max() > 1e-3
    # rows of the documents themselves are untouched: only the final segment's scores change
    n_ctx = len(tokens) - len(prompt)
    assert torch.allclose(ape[:n_ctx], block[:n_ctx], atol=1e-5)


def test_documents_stay_shared(checkpoint):
    """APE requests read the one cached copy of each document: a plain request after them hits every document
    and gets plain lazy's answer (the shared pages were not changed)."""
    llm = make_llm(checkpoint, "qwen3", "lazy")
    generate(llm, params=greedy(), requests=REQUESTS)
    before = llm.stats().cache
    kw = dict(
        prompt_token_ids=[p for _, p in REQUESTS],
        document_token_ids=[[DOCS[d] for d in docs] for docs, _ in REQUESTS],
        sampling_params=greedy(logprobs=20),
    )
    llm.generate(**kw, ape_temperature=0.5, ape_scale=2.0)
    after = llm.stats().cache
    assert after.misses == before.misses  # every document of the APE requests was found in the cache
    plain = generate(make_llm(checkpoint, "qwen3", "lazy"), params=greedy(logprobs=20))
    again = llm.generate(**kw)
    for a, b in zip(again, plain):
        assert a.token_ids == b.token_ids and a.outputs[0].logprobs == b.outputs[0].logprobs


@pytest.mark.parametrize("mode", ["prefix", "full"])
def test_causal_modes_reject_it(checkpoint, mode):
    with pytest.raises(InvalidRequestError, match="need mode 'lazy' or 'block'"):
        EngineConfig(mode=mode, ape_temperature=0.5)
    llm = make_llm(checkpoint, "llama", mode)
    with pytest.raises(InvalidRequestError, match="ape_scale=2.0"):
        llm.generate(prompt_token_ids=[[40, 41]], sampling_params=greedy(), ape_scale=2.0)
    assert not llm.engine.has_unfinished()
    # 1.0 is off, accepted everywhere
    llm.generate(prompt_token_ids=[[40, 41]], sampling_params=greedy(), ape_temperature=1.0, ape_scale=1.0)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), True, "2"])
def test_rejects_bad_values(bad):
    with pytest.raises(InvalidRequestError, match="must be a finite number > 0"):
        EngineConfig(ape_temperature=bad)
    with pytest.raises(InvalidRequestError, match="must be a finite number > 0"):
        EngineConfig(ape_scale=bad)
