"""Tensor parallelism on two GPUs (NCCL) at Llama-3.1-8B shapes, random weights: two ranks give the one-rank
engine's tokens and logits in fp32, and lazy ≡ block in bf16. Run on the device: `pytest -m gpu -s tests/parallel`."""

from __future__ import annotations

import pytest
import torch

from lazyattn import LLM, SamplingParams
from lazyattn.engine.prompt import RenderedPrompt
from lazyattn.errors import InvalidRequestError
from tests.engine.test_engine_gpu import CONFIG_8B, capture_logits, config_dir, random_docs, rel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]


def rag_prompts(n: int) -> list[RenderedPrompt]:
    docs = random_docs(4, 600, seed=11)
    docs[2] = docs[2][:333]  # a partial last page
    return [
        RenderedPrompt(
            segments=[[128000] + docs[(i + 3) % 4], docs[i % 4], docs[(i + 1) % 4]],
            final=random_docs(1, 24, seed=20 + i)[0],
        )
        for i in range(n)
    ]


def generate(llm: LLM, prompts: list[RenderedPrompt], max_tokens: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Each prompt alone (batch 1, so each logits row is one request's), greedy: tokens and logits rows."""
    seen = capture_logits(llm)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    tokens = []
    try:
        for i, prompt in enumerate(prompts):
            llm.engine.add_request(f"r{i}", prompt, params)
            while llm.engine.has_unfinished():
                for out in llm.engine.step():
                    if out.finished:
                        tokens.append(out.token_ids)
    finally:
        llm.shutdown()
    return tokens, [row for rows in seen for row in rows]


def test_symmetric_memory_all_reduce_matches_nccl(tmp_path_factory, monkeypatch):
    """The same fp32 model summed through torch's symmetric memory (forced) and through NCCL alone: same tokens,
    logits equal to fp32 rounding (two ranks: a + b either way), graphs and eager prefill steps included. First in
    this file: some torch versions set symmetric memory up once per process (parallel/all_reduce.py), so later
    engines here may fall back to NCCL."""
    directory = config_dir(tmp_path_factory, 4)
    prompts = rag_prompts(2)
    runs = {}
    for path in ("nccl", "symm_mem"):
        monkeypatch.setenv("LAZYATTN_TP_ALLREDUCE", path)  # the workers inherit it when spawned
        llm = LLM(
            model=str(directory),
            device="cuda",
            dtype="float32",
            random_weights=True,
            kv_cache_gb=4,
            max_num_seqs=4,
            warm_up=False,
            progress=False,
            tensor_parallel_size=2,
        )
        assert llm.engine.executor.tp.all_reduce_path == path
        runs[path] = generate(llm, prompts, max_tokens=6)
    (tokens_nccl, logits_nccl), (tokens_symm, logits_symm) = runs["nccl"], runs["symm_mem"]
    worst = max(rel(b, a) for a, b in zip(logits_nccl, logits_symm))
    print(
        f"\n8B shapes, fp32, TP=2, symmetric memory vs NCCL: tokens {tokens_symm == tokens_nccl}, "
        f"worst |Δ|/|logits| {worst:.2e} over {len(logits_nccl)} rows"
    )
    assert tokens_symm == tokens_nccl
    assert worst < 1e-5


def test_fp32_two_ranks_match_one_at_8b_shapes(tmp_path_factory):
    """4 layers of the 8B shapes in fp32, lazy mode, prefill + CUDA-graph decode steps (the all-reduces and the
    logits gather captured in the graphs)."""
    directory = config_dir(tmp_path_factory, 4)
    prompts = rag_prompts(2)
    runs = {}
    for size in (1, 2):
        llm = LLM(
            model=str(directory),
            device="cuda",
            dtype="float32",
            random_weights=True,
            kv_cache_gb=4,
            max_num_seqs=4,
            warm_up=False,
            progress=False,
            tensor_parallel_size=size,
        )
        runs[size] = generate(llm, prompts, max_tokens=6)
    (tokens1, logits1), (tokens2, logits2) = runs[1], runs[2]
    worst = max(rel(b, a) for a, b in zip(logits1, logits2))
    diff = max((a - b).abs().max().item() for a, b in zip(logits1, logits2))
    print(
        f"\n8B shapes, fp32, 4 layers, TP=2 vs TP=1: tokens {tokens2 == tokens1}, max |Δlogit| {diff:.2e}, "
        f"worst |Δ|/|logits| {worst:.2e} over {len(logits1)} rows"
    )
    assert tokens2 == tokens1
    assert worst < 1e-5


NEAR_TIE = 0.25  # logits; bf16 rounding moves an 8B-shape logit by a few hundredths (the fp32 test has none)


def test_bf16_two_ranks_lazy_equals_block_at_8b_shapes():
    """The full 8B shapes in bf16 on two GPUs: lazy and block mode give the same greedy tokens. Random bf16
    weights leave near-ties that rounding may flip, so a request may diverge only at a step whose two best
    logits are within NEAR_TIE, and the logits of every step before it agree to bf16 rounding."""
    prompts, steps = rag_prompts(3), 8
    runs = {}
    for mode in ("lazy", "block"):
        llm = LLM(
            model=str(CONFIG_8B),
            mode=mode,
            device="cuda",
            random_weights=True,
            kv_cache_gb=8,
            max_num_seqs=4,
            warm_up=False,
            progress=False,
            tensor_parallel_size=2,
        )
        runs[mode] = generate(llm, prompts, max_tokens=steps)
    (tokens_lazy, logits_lazy), (tokens_block, logits_block) = runs["lazy"], runs["block"]
    compared = []
    for r, (lazy, block) in enumerate(zip(tokens_lazy, tokens_block)):
        for j, (a, b) in enumerate(zip(lazy, block)):
            row = r * steps + j  # same context in both modes up to here
            compared.append(rel(logits_lazy[row], logits_block[row]))
            if a != b:
                top2 = logits_lazy[row].topk(2).values
                print(f"request {r} diverges at step {j}: top-2 margin {(top2[0] - top2[1]).item():.3f}")
                assert (top2[0] - top2[1]).item() < NEAR_TIE, "lazy and block differ where there is no near-tie"
                break
    print(
        f"\n8B shapes, bf16, TP=2: lazy {tokens_lazy}\nblock {tokens_block}\n"
        f"worst |lazy-block|/|block| over {len(compared)} steps {max(compared):.2e}"
    )
    assert max(compared) < 3e-2


def test_overlapped_scheduling_on_two_ranks_matches_synchronous(tmp_path_factory):
    """Overlapped scheduling under TP = 2 (the fed-back ids broadcast from the driver's GPU,
    engine/executor/fed_back.py) gives the synchronous engine's tokens: three requests decoding together in graphs,
    one ending early (max_tokens) so the steps after it feed back a subset of rows."""
    directory = config_dir(tmp_path_factory, 4)
    prompts = rag_prompts(3)
    runs = {}
    for overlap in (False, True):
        llm = LLM(
            model=str(directory),
            device="cuda",
            dtype="float32",
            random_weights=True,
            kv_cache_gb=4,
            max_num_seqs=4,
            progress=False,
            tensor_parallel_size=2,
            async_scheduling=overlap,
        )
        try:
            for i, (prompt, n) in enumerate(zip(prompts, (12, 5, 12))):
                llm.engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
            tokens = {}
            while llm.engine.has_unfinished():
                tokens.update((o.request_id, o.token_ids) for o in llm.engine.step() if o.finished)
            runs[overlap] = ([tokens[f"r{i}"] for i in range(3)], llm.engine.pipeline.overlapped_steps)
        finally:
            llm.shutdown()
    print(f"\nTP=2 overlap on: {runs[True][1]} overlapped steps; tokens equal {runs[True][0] == runs[False][0]}")
    assert runs[False][1] == 0 and runs[True][1] > 0
    assert runs[True][0] == runs[False][0]


def test_more_ranks_than_gpus_are_refused():
    with pytest.raises(InvalidRequestError, match=f"needs 4 GPUs; {torch.cuda.device_count()} visible"):
        LLM(model=str(CONFIG_8B), device="cuda", random_weights=True, tensor_parallel_size=4)
