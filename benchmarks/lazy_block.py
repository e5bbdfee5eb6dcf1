"""Lazy vs block agreement, with and without the deterministic mode (docs/design.md, "Deterministic mode").

Block mode reads a private copy of each document's keys rotated by its delta and rounded to the KV dtype; lazy mode
applies the delta inside the kernels. In the default kernels lazy never rounds the moved key (it de-rotates the
query in fp32); in the deterministic mode it rounds the moved key to the KV dtype as the copy does, and the two
modes read the same bits. This script measures how often they agree, on random documents placed in random orders:

    python -m benchmarks.lazy_block                       # tiny model, bf16, on the CPU (a minute or two)
    python -m benchmarks.lazy_block --device cuda --model benchmarks/models/llama-3.1-8b --random-weights

For each setting (deterministic off, on): the share of requests whose greedy tokens are identical, of generated
positions whose chosen-token logprobs are bit-identical, and the largest logprob difference at the first
generated token (before the two runs' tokens can diverge).
"""

from __future__ import annotations

import argparse
import json
import random

from lazyattn import LLM, SamplingParams


def workload(n_requests: int, n_docs: int, doc_len: int, question: int, vocab: int, seed: int):
    rng = random.Random(seed)
    pool = [[rng.randrange(10, vocab) for _ in range(doc_len + rng.randrange(doc_len // 2))] for _ in range(8)]
    requests = []
    for _ in range(n_requests):
        docs = rng.sample(pool, n_docs)
        requests.append((docs, [rng.randrange(10, vocab) for _ in range(question)]))
    return requests


def run(mode: str, deterministic: bool, requests, args) -> list[tuple[list[int], list[float]]]:
    llm = LLM(
        model=args.model,
        mode=mode,
        device=args.device,
        dtype=args.dtype,
        random_weights=args.random_weights,
        deterministic=deterministic,
        max_model_len=args.max_model_len,
        kv_cache_gb=args.kv_cache_gb,
        progress=False,
    )
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True, logprobs=1)
    outs = llm.generate(
        prompt_token_ids=[q for _, q in requests], document_token_ids=[d for d, _ in requests], sampling_params=params
    )
    result = []
    for out in outs:
        o = out.outputs[0]
        result.append((list(o.token_ids), [lp[t] for lp, t in zip(o.logprobs, o.token_ids)]))
    llm.engine.shutdown()
    return result


def agreement(lazy, block) -> dict:
    same_tokens = sum(a[0] == b[0] for a, b in zip(lazy, block))
    pairs = [(x, y) for a, b in zip(lazy, block) for x, y in zip(a[1], b[1])]
    same_logprobs = sum(x == y for x, y in pairs)
    first = max(abs(a[1][0] - b[1][0]) for a, b in zip(lazy, block))
    return {
        "identical_tokens": f"{same_tokens}/{len(lazy)}",
        "identical_logprobs": f"{same_logprobs}/{len(pairs)}",
        "max_first_logprob_diff": first,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--random-weights", action="store_true", help="read only config.json (8B shapes)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--docs", type=int, default=3, help="documents per request")
    parser.add_argument("--doc-len", type=int, default=96)
    parser.add_argument("--question", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=8, help="greedy tokens per request")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--kv-cache-gb", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=int, default=250, help="token ids are drawn below this")
    args = parser.parse_args(argv)
    requests = workload(args.requests, args.docs, args.doc_len, args.question, args.vocab, args.seed)
    report = {}
    for deterministic in (False, True):
        lazy = run("lazy", deterministic, requests, args)
        block = run("block", deterministic, requests, args)
        report["deterministic" if deterministic else "default"] = agreement(lazy, block)
    print(json.dumps({"model": args.model, "device": args.device, "dtype": args.dtype, **report}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
