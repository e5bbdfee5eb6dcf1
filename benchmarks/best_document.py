"""What answering from the best single document costs (docs/quality.md, "Answering from the best single document"):
the time to a whole answer and the questions answered per second, `answer="best-document"` and
`answer="each-last"` (the request as given and once with each other document moved last, in one round),
`answer="both-orders"` (the request as given and once with its documents reversed, in one round),
`answer="both-placements"` (the request as given and once with every document read in parallel, in one round),
`answer="confidence-order"` (the same one-document requests, then one over all the documents reordered), with
`-or-joint` and with the one-document answers capped at 4 and 1 tokens (`confidence_tokens`; with each-last,
both-orders and both-placements the same option chooses after the first 4 or 1 tokens and stops the other
candidates), against one request over all the documents (`joint`) in lazy mode with the shared prefix, and full
attention's joint request beside them, at Llama-3.1-8B shapes (random bf16 weights), through the `LLM` API.

    python -m benchmarks.best_document OUT_DIR [--questions 64] [--answers joint,both-placements] [--smoke]

Workload: a pool of 8 documents x 2048 tokens, 5 per question in seeded random order, a 32-token question, 16 output
tokens (EOS ignored), every document encoded before timing (warm cache). Per configuration:

- idle: one question at a time, 5 questions, the mean of the last 4 wall times of `generate` (the whole answer: a
  best-document or each-last answer is known only when its last candidate ends, a confidence-order one when its joint
  request that follows them ends);
- saturation: `--questions` questions at once; questions per second from the median wall time of three such
  batches after two others (those compile the kernels and graphs of batches that large: a kernel variant that the
  first batch did not need can still be compiled in the second).

Lazy mode runs on one engine; full mode on a second one, made after the first is shut down. --smoke: the tiny model
on the CPU (a check that it runs, not a measurement). --answers: the lazy-mode strategies to measure (default: all
of them; `joint` is always measured, first, as the reference). Writes OUT_DIR/best_document.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from benchmarks.relink import random_tokens  # noqa: E402
from lazyattn import LLM, SamplingParams  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def questions(pool: list[list[int]], n: int, per: int, length: int, seed: int, vocab: int):
    """n questions: each its own token ids and `per` documents of the pool in a seeded order."""
    g = torch.Generator().manual_seed(seed)
    docs = [[pool[int(i)] for i in torch.randperm(len(pool), generator=g)[:per]] for _ in range(n)]
    return random_tokens(n, length, seed + 1, vocab), docs


def measure(
    llm: LLM, label: str, answer: tuple[str, int | None], pool, params: SamplingParams, args, vocab: int
) -> dict:
    strategy, confidence_tokens = answer

    def ask(ids, docs) -> float:
        start = time.perf_counter()
        llm.generate(
            prompt_token_ids=ids,
            document_token_ids=docs,
            sampling_params=params,
            answer=strategy,
            confidence_tokens=confidence_tokens,
        )
        return time.perf_counter() - start

    ask(*questions(pool, 2, args.per, args.question_len, 99, vocab))  # every document encoded; shapes compiled
    idle = [ask(*questions(pool, 1, args.per, args.question_len, 7 + i, vocab)) for i in range(5)]
    for seed in (13, 17):  # the saturated batches' shapes: a kernel variant one batch lacks can come in the next
        ask(*questions(pool, args.questions, args.per, args.question_len, seed, vocab))
    walls = [ask(*questions(pool, args.questions, args.per, args.question_len, s, vocab)) for s in (11, 19, 23)]
    row = dict(
        config=label,
        idle_answer_ms=1e3 * sum(idle[1:]) / 4,
        sat_questions_per_s=args.questions / statistics.median(walls),
    )
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--questions", type=int, default=64)
    p.add_argument("--answers", help="comma-separated lazy-mode strategies (default: all)")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    smoke = args.smoke or not torch.cuda.is_available()
    args.doc_len, args.pool, args.per, args.question_len, output = (32, 8, 5, 8, 4) if smoke else (2048, 8, 5, 32, 16)
    if smoke:
        args.questions = min(args.questions, 4)
        engine = dict(model="tiny", device="cpu")
    else:
        model = str(ROOT / "benchmarks/models/llama-3.1-8b")
        engine = dict(model=model, random_weights=True, device="cuda", dtype="bfloat16", kv_cache_gb=40)
    params = SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True)
    rows = []
    ordered = [(a, k) for a in ("confidence-order", "confidence-order-or-joint") for k in (None, 4, 1)]
    chosen = [(a, k) for a in ("each-last", "both-orders", "both-placements") for k in (None, 4, 1)]
    lazy = [("joint", None), ("best-document", None), *chosen, *ordered]
    if args.answers:
        picked = set(args.answers.split(","))
        unknown = picked - {a for a, _ in lazy}
        if unknown:
            p.error(f"--answers: unknown strategies {sorted(unknown)}; known: {sorted({a for a, _ in lazy})}")
        lazy = [(a, k) for a, k in lazy if a == "joint" or a in picked]
    for mode, configs in (("lazy", lazy), ("full", [("joint", None)])):
        with LLM(mode=mode, progress=False, ape_prefix=mode == "lazy", **engine) as llm:
            vocab = llm.engine.model_config.vocab_size
            pool = random_tokens(args.pool, args.doc_len, 0, vocab)
            for answer, k in configs:
                label = f"{mode}{' + prefix' if mode == 'lazy' else ''}, {answer}"
                label += f", confidence_tokens={k}" if k else ""
                rows.append(measure(llm, label, (answer, k), pool, params, args, vocab))
    device = "cpu (smoke)" if smoke else torch.cuda.get_device_name()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "best_document.json").write_text(json.dumps(dict(device=device, rows=rows), indent=2))
    joint = rows[0]
    lines = [
        f"Device: {device}; command: python -m benchmarks.best_document {' '.join(sys.argv[1:])}",
        "",
        "| config | idle: whole answer ms | vs lazy joint | saturation: questions/s | vs lazy joint |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['config']} | {r['idle_answer_ms']:.1f} | {r['idle_answer_ms'] / joint['idle_answer_ms']:.2f}× "
            f"| {r['sat_questions_per_s']:.1f} | {r['sat_questions_per_s'] / joint['sat_questions_per_s']:.2f}× |"
        )
    (args.out / "best_document.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
