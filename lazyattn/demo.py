"""The quickstart's main job: a real model answering questions over documents, in every mode, side by side.

Each question comes with 3 of 5 short documents in a shuffled order (a retriever's output), so documents recur in
new slots: lazy reuses every document it has seen, in any slot; prefix only exact prefixes; full nothing. Per
mode: a warm-up request first (one-time costs are not a request's), then each question alone with one output
token (its time to first token, no queueing), then all questions together for their answers. lazy and block
must produce the same tokens (same semantics), and so must prefix and full.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections.abc import Callable

from lazyattn.engine.config import MODES
from lazyattn.engine.llm import LLM
from lazyattn.engine.sampling import SamplingParams

DOCS = [
    {
        "title": "Veltria",
        "text": "Veltria is a small island nation in the Northern Sea. The capital of Veltria is "
        "Oskarn, a port city of 80,000 people.",
    },
    {
        "title": "The glass harp",
        "text": "The glass harp was invented in 1761 by Maren Tolle, a clockmaker from "
        "Brisk. She built it from 37 tuned glass bowls.",
    },
    {
        "title": "The Amsel river",
        "text": "The Amsel river is 412 kilometres long. It rises in the Hollow Mountains and flows into Lake Dorn.",
    },
    {
        "title": "Comet Pell",
        "text": "Comet Pell returns every 58 years. It was last seen in 2019 and is named after "
        "the astronomer Ida Pell.",
    },
    {
        "title": "Sorrel bread",
        "text": "Sorrel bread is baked with rye flour, green sorrel leaves and honey. It is "
        "eaten on the first day of spring.",
    },
]
# (question, index of the document that answers it)
QUESTIONS = [
    ("What is the capital of Veltria?", 0),
    ("Who invented the glass harp?", 1),
    ("How long is the Amsel river?", 2),
    ("Who is Comet Pell named after?", 3),
    ("What is sorrel bread baked with?", 4),
]
WARM_UP_DOC = {"title": "Warm-up", "text": "This passage only warms the engine up; no question is about it."}
NAMES = {
    "smollm2": "SmolLM2-135M-Instruct",
    "tiny": "tiny (random weights)",
    "smollm2-block": "SmolLM2-135M-Instruct + its block-attention adapter (lazyattn finetune)",
}
# The checkpoint adapted to block attention that the demo shows beside a model (docs/finetune.md).
ADAPTED = {"smollm2": "smollm2-block"}


def workload(seed: int = 0, docs_per_request: int = 3) -> list[tuple[list[dict[str, str]], list[dict]]]:
    """(messages, documents) per question: its own document plus others, in a shuffled order."""
    rng = random.Random(seed)
    requests = []
    for question, answer_doc in QUESTIONS:
        others = rng.sample([d for i, d in enumerate(DOCS) if i != answer_doc], docs_per_request - 1)
        docs = [DOCS[answer_doc], *others]
        rng.shuffle(docs)
        requests.append(([{"role": "user", "content": question}], docs))
    return requests


def quiet(message: str) -> None:
    pass


def to_stderr(message: str) -> None:
    """A progress line (the report itself goes to stdout, flushed first so that the two stay in order)."""
    sys.stdout.flush()
    print(f"lazyattn demo: {message}", file=sys.stderr, flush=True)


def run_mode(
    model: str, mode: str, device: str, max_tokens: int, say: Callable[[str], None] = quiet, **options
) -> dict:
    start = time.monotonic()
    say(f"{mode} mode: loading {NAMES.get(model, model)}")
    llm = LLM(model=model, mode=mode, device=device, progress=False, **options)
    say(f"{mode} mode: a warm-up request, the {len(QUESTIONS)} questions one at a time, then all together")
    try:
        result = _run_mode(llm, max_tokens)
    finally:
        llm.shutdown()  # a tensor-parallel engine's workers hold GPUs: the next mode needs them
    say(f"{mode} mode: done in {time.monotonic() - start:.0f} s")
    return result


def _run_mode(llm: LLM, max_tokens: int) -> dict:
    requests = workload()
    first_token = SamplingParams(max_tokens=1, temperature=0.0)
    llm.chat([{"role": "user", "content": "Hello?"}], first_token, documents=[[WARM_UP_DOC]], use_tqdm=False)
    before = llm.stats()
    ttfts = []
    for messages, docs in requests:  # one at a time: time to first token without queueing
        out = llm.chat(messages, first_token, documents=[docs], use_tqdm=False)[0]
        ttfts.append(out.metrics.ttft)
    after = llm.stats()
    answers = llm.chat(
        [m for m, _ in requests],
        SamplingParams(max_tokens=max_tokens, temperature=0.0),
        documents=[d for _, d in requests],
        use_tqdm=False,
    )
    return {
        "tokens": [o.token_ids for o in answers],
        "texts": [o.text.strip() for o in answers],
        "hits": after.cache.hits - before.cache.hits,
        "lookups": after.cache.lookups - before.cache.lookups,
        "prefilled": after.prefilled_tokens - before.prefilled_tokens,
        "ttft_ms": 1e3 * statistics.median(ttfts),
    }


def run_demo(
    model: str = "smollm2", device: str = "cpu", max_tokens: int = 32, say: Callable[[str], None] = quiet, **options
) -> dict[str, dict]:
    return {mode: run_mode(model, mode, device, max_tokens, say, **options) for mode in MODES}


def main(model: str = "smollm2", device: str = "cpu", tensor_parallel_size: int = 1) -> int:
    name = NAMES.get(model, model)
    print(
        f"lazyattn demo: {name} on {device}; {len(QUESTIONS)} questions, each over 3 of {len(DOCS)} documents in "
        f"shuffled order, in the four modes\n"
    )
    start = time.monotonic()
    tp = {"tensor_parallel_size": tensor_parallel_size} if tensor_parallel_size > 1 else {}
    results = run_demo(model, device, max_tokens=8 if model == "tiny" else 32, say=to_stderr, **tp)
    for i, (question, _) in enumerate(QUESTIONS):
        print(f"Q: {question}")
        print(f"   lazy/block  (documents encoded alone): {results['lazy']['texts'][i]}")
        print(f"   prefix/full (ordinary causal):         {results['full']['texts'][i]}")
    print(f"\n{'mode':<8}{'cache hits':>12}{'prefilled tokens':>18}{'median TTFT (ms)':>18}")
    for mode, r in results.items():
        print(f"{mode:<8}{r['hits']:>7}/{r['lookups']:<4}{r['prefilled']:>18}{r['ttft_ms']:>18.1f}")
    same_block = results["lazy"]["tokens"] == results["block"]["tokens"]
    same_causal = results["prefix"]["tokens"] == results["full"]["tokens"]
    print(
        f"\nafter a warm-up request, the {len(QUESTIONS)} questions sent one at a time; cache hits count segments "
        "(system prompt, documents) in lazy/block, pages of exact prefixes in prefix"
    )
    print(f"lazy == block (same tokens, one cached copy vs private re-rotated copies): {same_block}")
    print(f"prefix == full (ordinary causal attention): {same_causal}")
    if model == "tiny":
        print("tiny has random weights: its answers are noise (run `lazyattn demo` for SmolLM2)")
    else:
        print(f"{name} was not fine-tuned for block attention, so lazy/block answers may differ from full attention's")
    if model in ADAPTED:
        show_adapted(ADAPTED[model], device, max_tokens=32, say=to_stderr)  # an adapter: one device (no TP)
    print(f"({time.monotonic() - start:.0f} s)")
    return 0 if same_block and same_causal else 1


def show_adapted(model: str, device: str, max_tokens: int, say: Callable[[str], None] = quiet, **options) -> None:
    """The same questions on the model fine-tuned for block attention: lazy mode beside full attention."""
    results = {mode: run_mode(model, mode, device, max_tokens, say, **options) for mode in ("lazy", "full")}
    print(f"\n{NAMES.get(model, model)}, the same questions:")
    for i, (question, _) in enumerate(QUESTIONS):
        print(f"Q: {question}")
        print(f"   lazy (one cached copy per document): {results['lazy']['texts'][i]}")
        print(f"   full (ordinary causal):              {results['full']['texts'][i]}")
    lazy, full = results["lazy"], results["full"]
    print(
        f"median TTFT: lazy {lazy['ttft_ms']:.1f} ms, full {full['ttft_ms']:.1f} ms "
        f"({full['ttft_ms'] / lazy['ttft_ms']:.1f}x); prefilled tokens: lazy {lazy['prefilled']}, "
        f"full {full['prefilled']}"
    )
