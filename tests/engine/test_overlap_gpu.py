"""Overlapped scheduling on the GPU, CUDA graphs on (8B shapes, two layers, random bf16 weights): the same tokens,
logprobs, finish reasons and seeded draws as the synchronous engine. Run on the device: `pytest -m gpu -s`."""

from __future__ import annotations

import pytest
import torch

from lazyattn import LLM, SamplingParams
from lazyattn.engine.prompt import RenderedPrompt
from tests.engine.test_engine_gpu import config_dir, random_docs

pytestmark = pytest.mark.gpu


def run(directory, overlap: bool, prompts: list[RenderedPrompt], params: list[SamplingParams]):
    llm = LLM(
        model=str(directory),
        mode="lazy",
        device="cuda",
        random_weights=True,
        kv_cache_gb=2,
        max_model_len=4096,
        progress=False,
        async_scheduling=overlap,
    )
    assert llm.engine.pipeline.overlap is overlap and llm.engine.executor.runner.graphs is not None
    outs = llm.generate(
        sampling_params=params,
        prompt_token_ids=[p.final for p in prompts],
        document_token_ids=[p.segments for p in prompts],
    )
    engine = llm.engine
    stats = engine.stats()
    assert stats.running == 0 and stats.pages_used == stats.cache.pages_in_use
    result = (
        [[(c.token_ids, c.finish_reason, c.logprobs) for c in o.outputs] for o in outs],
        engine.pipeline.overlapped_steps,
        sorted(engine.executor.runner.graphs.graphs),
    )
    llm.shutdown()
    return result


def test_overlapped_steps_equal_synchronous_ones_with_graphs(tmp_path_factory):
    directory = config_dir(tmp_path_factory, 2)
    docs = random_docs(3, 300, seed=8)
    prompts = [
        RenderedPrompt(segments=[[128000]] + docs[i:] + docs[:i], final=random_docs(1, 8, seed=400 + i)[0])
        for i in range(6)
    ]
    # max_tokens staggered, so that sequences end while others decode (the pipeline drains and refills)
    params = [SamplingParams(max_tokens=5 + 3 * i, temperature=0.0, ignore_eos=True, logprobs=2) for i in range(4)]
    params += [
        SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=21, n=2, ignore_eos=True),
        SamplingParams(max_tokens=9, temperature=1.0, top_k=50, seed=4, ignore_eos=True, logprobs=1),
    ]
    sync, steps_off, _ = run(directory, False, prompts, params)
    over, steps_on, graphs = run(directory, True, prompts, params)
    assert steps_off == 0 and steps_on > 0 and graphs
    for a, b in zip(sync, over):
        for (tokens_a, reason_a, lp_a), (tokens_b, reason_b, lp_b) in zip(a, b):
            assert tokens_a == tokens_b and reason_a == reason_b
            if lp_a is not None:
                assert [list(e) for e in lp_a] == [list(e) for e in lp_b]
                values_a = torch.tensor([v for e in lp_a for v in e.values()])
                values_b = torch.tensor([v for e in lp_b for v in e.values()])
                assert torch.allclose(values_a, values_b, atol=1e-3)
