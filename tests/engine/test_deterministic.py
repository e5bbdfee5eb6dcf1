"""The deterministic mode end to end (docs/design.md, "Deterministic mode"): a request's token ids and logprobs are
the same bits alone, beside other requests, under chunked prefill and after a preemption, in every mode; lazy and
block agree exactly. CPU: the PyTorch reference's invariant path; `gpu`: the Triton kernels at batches 1..64.
"""

from __future__ import annotations

import pytest
import torch

from lazyattn import LLM, SamplingParams

DOCS = [
    [(7 * i + 3) % 250 + 10 for i in range(37)],
    [(11 * i + 5) % 250 + 10 for i in range(20)],
    [(13 * i + 1) % 250 + 10 for i in range(45)],
]
TARGET = ([DOCS[0], DOCS[1]], [40, 41, 42, 43, 44, 45, 46, 47, 48])
OTHERS = [([DOCS[2]], [50 + i for i in range(3 + 2 * k)]) for k in range(3)] + [([DOCS[1], DOCS[2], DOCS[0]], [60])]
PARAMS = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=3)
SEEDED = SamplingParams(max_tokens=5, temperature=0.9, top_p=0.95, seed=7, ignore_eos=True, logprobs=3)


@pytest.fixture(autouse=True, scope="module")
def one_cpu_thread():
    """The tiny model's row-by-row products are far too small to split across threads (tests/bench/conftest.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make(mode: str, device: str = "cpu", **kw) -> LLM:
    kw = {"page_size": 16, "progress": False, "deterministic": True, **kw}
    return LLM(model="tiny", mode=mode, device=device, **kw)


def first(llm: LLM, requests, params=PARAMS):
    """The first request's (token ids, chosen logprobs, top logprobs) as generated beside the others."""
    outs = llm.generate(
        prompt_token_ids=[p for _, p in requests],
        document_token_ids=[d for d, _ in requests],
        sampling_params=params,
    )
    out = outs[0].outputs[0]
    chosen = [lp[t] for lp, t in zip(out.logprobs, out.token_ids)]
    return out.token_ids, chosen, [sorted(lp.items()) for lp in out.logprobs]


def preempt_after_step(llm: LLM, n: int) -> None:
    """Preempt the oldest running sequence once, right after the engine's n-th step."""
    engine, step, calls = llm.engine, llm.engine.step, [0]

    def stepped():
        outs = step()
        calls[0] += 1
        if calls[0] == n and engine.scheduler.running:
            engine.scheduler._preempt(engine.scheduler.running[0])
        return outs

    engine.step = stepped


@pytest.mark.parametrize("mode", ["lazy", "block", "prefix", "full"])
def test_alone_batched_chunked_and_preempted_give_the_same_bits(mode):
    llm = make(mode)
    alone = first(llm, [TARGET])
    # beside others, its prefill cut into chunks of at most 16 tokens shared with theirs
    assert first(make(mode, max_num_batched_tokens=16), [TARGET] + OTHERS) == alone
    # preempted (recompute) after its second generated token: prompt and output prefilled again
    llm = make(mode)
    preempt_after_step(llm, 3)
    assert first(llm, [TARGET] + OTHERS[:1]) == alone
    assert llm.stats().preemptions == 1


@pytest.mark.parametrize("mode", ["lazy", "block"])
def test_fp8_pages_alone_batched_and_chunked_give_the_same_bits(mode):
    """kv_cache_dtype=fp8_e4m3 (docs/design.md, "FP8 KV cache"): the same invariance over e4m3 pages."""
    alone = first(make(mode, kv_cache_dtype="fp8_e4m3"), [TARGET])
    assert first(make(mode, kv_cache_dtype="fp8_e4m3", max_num_batched_tokens=16), [TARGET] + OTHERS) == alone


def test_lazy_and_block_agree_exactly_over_fp8_pages():
    """Block's copies round the moved keys to e4m3 again; the deterministic lazy path rounds them the same way."""
    requests = [TARGET] + OTHERS[-1:]
    lazy = first(make("lazy", dtype="bfloat16", kv_cache_dtype="fp8_e4m3"), requests)
    assert lazy == first(make("block", dtype="bfloat16", kv_cache_dtype="fp8_e4m3"), requests)


def test_seeded_sampling_draws_the_same_beside_other_requests():
    alone = first(make("lazy"), [TARGET], SEEDED)
    assert first(make("lazy"), [TARGET] + OTHERS, SEEDED) == alone


def test_lazy_and_block_agree_exactly_in_bf16():
    """Block mode's private copies round the moved keys to bf16; the deterministic lazy path rounds the same way,
    so the two read the same key bits (off, lazy keeps them in fp32: the logprobs differ in the last bits)."""
    requests = [TARGET] + OTHERS[-1:]
    lazy = first(make("lazy", dtype="bfloat16"), requests)
    block = first(make("block", dtype="bfloat16"), requests)
    assert lazy == block
    plain_lazy = first(make("lazy", dtype="bfloat16", deterministic=False), requests)
    plain_block = first(make("block", dtype="bfloat16", deterministic=False), requests)
    assert plain_lazy[1] != plain_block[1]


def test_deterministic_is_a_cli_option():
    from lazyattn.cli import build_parser

    args = build_parser().parse_args(["generate", "--deterministic", "hello"])
    assert args.deterministic is True


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["lazy", "block", "prefix", "full"])
def test_gpu_batches_1_to_64_and_chunked_prefill(mode):
    """Random weights at a small Llama config in bf16 on CUDA (CUDA graphs on): the target request alone, beside
    1..63 others, and with its prefill cut into 16-token chunks gives the same token ids and logprobs."""
    gen = torch.Generator().manual_seed(0)
    others = [
        (
            [DOCS[i % 3]],
            torch.randint(10, 250, (int(torch.randint(1, 40, (1,), generator=gen)),), generator=gen).tolist(),
        )
        for i in range(63)
    ]
    llm = make(mode, "cuda", dtype="bfloat16", kv_cache_gb=1.0)
    alone = first(llm, [TARGET])
    for n in (1, 2, 7, 16, 31, 63):
        assert first(llm, [TARGET] + others[:n]) == alone, n
    chunked = make(mode, "cuda", dtype="bfloat16", kv_cache_gb=1.0, max_num_batched_tokens=16)
    assert first(chunked, [TARGET] + others[:8]) == alone


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3"])
def test_gpu_lazy_and_block_agree_exactly(kv_cache_dtype):
    """On CUDA, lazy's kernel rounds a moved key as block's copy kernel (cache_ops.copy_rotate) does (to e4m3 over
    FP8 pages)."""
    requests = [TARGET] + OTHERS
    kw = dict(dtype="bfloat16", kv_cache_gb=1.0, kv_cache_dtype=kv_cache_dtype)
    lazy = first(make("lazy", "cuda", **kw), requests)
    block = first(make("block", "cuda", **kw), requests)
    assert lazy == block


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_fp8_batches_1_to_32():
    """FP8 pages on CUDA (CUDA graphs on): the target request alone and beside 1..31 others, the same bits."""
    others = [([DOCS[i % 3]], [50 + (7 * i + j) % 200 for j in range(1 + i % 17)]) for i in range(31)]
    llm = make("lazy", "cuda", dtype="bfloat16", kv_cache_gb=1.0, kv_cache_dtype="fp8_e4m3")
    alone = first(llm, [TARGET])
    for n in (1, 7, 31):
        assert first(llm, [TARGET] + others[:n]) == alone, n


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_deterministic_sampler_gives_greedy_rows_the_log_softmax_logprob():
    """An all-greedy batch without logprobs takes the greedy kernel by default; in the deterministic mode it takes
    log_softmax, the path of every other batch, so a row's logprob does not depend on its neighbours' parameters."""
    from lazyattn.engine.sampling import Sampler

    logits = torch.randn(4, 128256, generator=torch.Generator().manual_seed(0)).cuda()
    params = [SamplingParams(temperature=0.0)] * 4
    got = Sampler(deterministic=True).sample(logits, params, [None] * 4)
    want = torch.log_softmax(logits, -1).gather(1, logits.argmax(-1, keepdim=True)).squeeze(1)
    assert torch.equal(got.token_ids, logits.argmax(-1)) and torch.equal(got.logprobs, want)


@pytest.mark.parametrize("name", ["qwen3", "llama31"])
@pytest.mark.parametrize("mode", ["lazy", "full"])
def test_deterministic_outputs_match_transformers(checkpoint, name, mode):
    """The invariant paths compute the same function: tokens and logprobs of transformers' forward (Qwen3's per-head
    q/k norms run row by row too)."""
    from tests.engine.test_engine import REQUESTS, assert_matches, generate, make_llm, token_bos

    llm = make_llm(checkpoint, name, mode, deterministic=True)
    assert_matches(generate(llm), checkpoint(name)[1], REQUESTS, token_bos(llm), block=mode == "lazy")
