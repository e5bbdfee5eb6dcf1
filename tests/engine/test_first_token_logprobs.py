"""SamplingParams.first_token_logprobs: the whole log-softmax row of the first generated token, against
transformers (lazyattn eval --fidelity compares these rows)."""

from __future__ import annotations

import pytest
import torch

from lazyattn import LLM, SamplingParams
from lazyattn.engine.prompt import from_token_ids
from lazyattn.errors import InvalidRequestError
from lazyattn.kernels.reference import block_mask
from tests.model.checkpoints import hf_logits

DOCS = [[(7 * i + 3) % 250 + 10 for i in range(37)], [(11 * i + 5) % 250 + 10 for i in range(20)]]
PROMPT = [40, 41, 42, 43, 44, 45]


@pytest.mark.parametrize("mode", ["lazy", "full"])
def test_first_token_logprobs_are_the_log_softmax_of_transformers_logits(checkpoint, mode):
    directory, model = checkpoint("llama")
    llm = LLM(model=str(directory), mode=mode, device="cpu", page_size=16, progress=False)
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, first_token_logprobs=True)
    out = llm.generate(prompt_token_ids=[PROMPT], document_token_ids=[DOCS], sampling_params=params)[0]
    row = out.outputs[0].first_token_logprobs
    bos = llm.tokenizer.bos_token_id if llm.tokenizer.add_bos_token else None
    rendered = from_token_ids(PROMPT, DOCS, bos)
    tokens = [t for s in rendered.segments for t in s] + list(rendered.final)
    visible = block_mask([len(s) for s in rendered.segments], len(rendered.final)) if mode == "lazy" else None
    want = torch.log_softmax(hf_logits(model, tokens, list(range(len(tokens))), visible)[-1].double(), -1)
    assert row.dtype == torch.float32 and row.shape == want.shape
    assert torch.allclose(row.double(), want, atol=2e-4)
    assert out.token_ids[0] == int(want.argmax())
    # only the first token's row, and only when asked
    plain = llm.generate(prompt_token_ids=[PROMPT], document_token_ids=[DOCS], sampling_params=SamplingParams(3))
    assert plain[0].outputs[0].first_token_logprobs is None


def test_first_token_logprobs_must_be_a_bool():
    with pytest.raises(InvalidRequestError, match="first_token_logprobs"):
        SamplingParams(first_token_logprobs=1).validate(100)


def test_sampler_returns_the_rows_only_when_a_row_asks():
    from lazyattn.engine.sampling import Sampler

    logits = torch.randn(3, 50)
    asked = [SamplingParams(temperature=0.0, first_token_logprobs=True), SamplingParams(temperature=0.0)]
    result = Sampler().sample(logits[:2], asked, [None, None])
    assert torch.allclose(result.full_logprobs, torch.log_softmax(logits[:2].double(), -1).float(), atol=1e-6)
    assert result.ids == logits[:2].argmax(-1).tolist()
    plain = Sampler().sample(logits, [SamplingParams(temperature=0.0)] * 3, [None] * 3)
    assert plain.full_logprobs is None
