"""split_mixed_steps (engine/step_launch.py): a step that decodes some sequences and prefills others runs as a
prefill pass and then a decode pass. The parts and the logits' order by hand; in the engine (tiny model, CPU, lazy
mode, requests arriving while others decode), the same greedy tokens and logprobs as one pass, with split steps
taken."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lazyattn import SamplingParams
from lazyattn.engine.batch import Copy, StepPlan, Work
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.graph_inputs import FedBack
from lazyattn.engine.llm_engine import LLMEngine
from lazyattn.engine.prompt import RenderedPrompt
from lazyattn.engine.sequence import Run
from lazyattn.engine.step_launch import split_mixed
from lazyattn.errors import InvalidRequestError
from lazyattn.kernels.paged import EntryPages

PAGE = 16


def work(lo: int, hi: int, samples: bool, job: bool = False) -> Work:
    run = Run(list(range(hi)), 0)
    return Work(run, lo, hi, EntryPages([], [], []), job=object() if job else None, samples=samples)


def test_split_parts_and_logits_order():
    d1, d2 = work(7, 8, True), work(9, 10, True)
    encode, chunk, last = work(0, 16, False, job=True), work(0, 5, False), work(5, 9, True)
    copy = Copy(3, [1], [2], [16])
    plan = StepPlan(works=(d1, d2, encode, chunk, last), copies=(copy,))
    prefill, decode, order = split_mixed(plan)
    assert prefill.works == (encode, chunk, last) and prefill.copies == (copy,)
    assert decode.works == (d1, d2) and decode.is_decode and not decode.copies
    # logits come as [d1, d2, last], the scheduler's order: nothing to reorder
    assert order is None
    # a step in another order: logits [d1, d2, last], plan order of the sampling works last, d1, d2
    assert split_mixed(StepPlan(works=(encode, last, d1, d2)))[2].tolist() == [2, 0, 1]
    assert split_mixed(StepPlan(works=(d1, encode, last, d2)))[2].tolist() == [0, 2, 1]
    assert split_mixed(StepPlan(works=(d1, d2))) is None  # all decode
    assert split_mixed(StepPlan(works=(d1, chunk))) is None  # one decode row: not worth a second pass
    fed = StepPlan(works=(d1, d2, chunk), fed_back=FedBack(torch.zeros(2, dtype=torch.int64), [0, 1]))
    assert split_mixed(fed) is None


DOCS = [[(k * i + k) % 250 + 10 for i in range(n)] for k, n in ((7, 21), (11, 18), (13, 5))]
REQUESTS = [([0, 1], [40, 41]), ([1, 0], [50]), ([0, 2], [60, 61, 62]), ([2, 1], [70, 71]), ([1], [80])]


def staggered(split: bool, **kw) -> tuple[list[list[int]], list[list[float]], int]:
    """Greedy tokens and logprobs of REQUESTS, one request added per step (so that steps mix decode rows with a
    new request's prefill), and the number of split steps."""
    config = EngineConfig(model="tiny", mode="lazy", page_size=PAGE, progress=False, split_mixed_steps=split, **kw)
    engine = LLMEngine(config)
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=1)
    outputs = {}
    pending = list(enumerate(REQUESTS))
    while pending or engine.has_unfinished():
        if pending:
            i, (docs, prompt) = pending.pop(0)
            engine.add_request(str(i), RenderedPrompt(segments=[DOCS[d] for d in docs], final=prompt), params)
        for out in engine.step():
            if out.finished:
                outputs[int(out.request_id)] = out.outputs[0]
    tokens = [outputs[i].token_ids for i in range(len(REQUESTS))]
    logprobs = [[lp[t] for t, lp in zip(o.token_ids, o.logprobs)] for o in (outputs[i] for i in range(len(REQUESTS)))]
    return tokens, logprobs, engine.launcher.split_steps


def test_engine_outputs_equal_with_and_without_split():
    one, one_lp, none = staggered(False)
    two, two_lp, splits = staggered(True)
    assert none == 0 and splits >= 2
    assert two == one
    np.testing.assert_allclose(two_lp, one_lp, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_gpu_engine_outputs_equal_with_and_without_split():
    """The tiny model on the GPU (fp32, CUDA graphs, shared-document decode): split steps' decode parts replay the
    decode graphs; the same greedy tokens as one pass."""
    kw = dict(device="cuda", dtype="float32", kv_cache_gb=0.25, max_num_seqs=16)
    one, one_lp, _ = staggered(False, **kw)
    two, two_lp, splits = staggered(True, **kw)
    assert splits >= 2 and two == one
    np.testing.assert_allclose(two_lp, one_lp, rtol=1e-4, atol=1e-5)


def test_split_steps_default_on_cuda_only_and_explicit_choice_wins():
    assert EngineConfig(device="cuda").split_mixed_steps_on
    assert not EngineConfig(device="cpu").split_mixed_steps_on
    assert EngineConfig(device="cpu", split_mixed_steps=True).split_mixed_steps_on
    assert not EngineConfig(device="cuda", split_mixed_steps=False).split_mixed_steps_on


def test_split_steps_rejects_a_non_boolean():
    with pytest.raises(InvalidRequestError, match="split_mixed_steps"):
        EngineConfig(device="cpu", split_mixed_steps="yes")
