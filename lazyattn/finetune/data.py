"""Training examples: RAG items (the `lazyattn eval` JSONL format) rendered exactly as the engine renders them.

An item `{"question", "answers", "documents": [{"title", "text"}...], "gold"}` becomes the chat request
`[{"role": "user", "content": question}]` with its documents, through `render_chat` and the same PromptLayout
the engine uses, so the trained segmentation is the served one; the target is the first answer followed by
the model's end-of-turn token.

Sources: "builtin" draws from the built-in generated set (lazyattn/qa/synthetic.py) with split="train",
whose entities never appear in split="eval" items, so nothing evaluated is trained on; any other value is the
path of the user's own JSONL file.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from lazyattn.engine.prompt import DEFAULT_LAYOUT, PromptLayout, render_chat
from lazyattn.errors import InvalidRequestError
from lazyattn.finetune.config import BUILTIN
from lazyattn.model.tokenizer import TokenizerBase

# The built-in mixture: every document count the evaluation uses and more, the gold block anywhere.
BUILTIN_NUM_DOCS = (2, 3, 4, 5, 6, 8, 10)
BUILTIN_POSITIONS = ("first", "middle", "last")


@dataclass(frozen=True)
class Example:
    segments: list[list[int]]  # system, then one per document: each attends to itself only (block rows)
    final: list[int]  # end of the system turn, the question, the assistant header
    answer: list[int]  # the target: loss is taken on these tokens only
    distill: bool = False  # True: the loss is the KL to the teacher (distill.py), not cross-entropy on `answer`

    @property
    def tokens(self) -> list[int]:
        return [t for s in self.segments for t in s] + self.final + self.answer

    @property
    def num_tokens(self) -> int:
        return sum(map(len, self.segments)) + len(self.final) + len(self.answer)


def encode_item(tokenizer: TokenizerBase, item, layout: PromptLayout = DEFAULT_LAYOUT) -> Example:
    """`item`: a QAItem (lazyattn.qa.dataset) or a dict of the JSONL format."""
    get = item.get if isinstance(item, dict) else lambda k: getattr(item, k)
    rendered = render_chat(tokenizer, [{"role": "user", "content": get("question")}], list(get("documents")), layout)
    eos = tokenizer.eos_token_ids
    if not eos:
        raise InvalidRequestError("the tokenizer has no end-of-sequence token to end the answer with")
    answer = tokenizer.encode(list(get("answers"))[0], add_special_tokens=False) + [eos[0]]
    return Example(rendered.segments, rendered.final, answer)


def builtin_items(n: int, seed: int = 0) -> list:
    """`n` items of the built-in set's training split, mixed over BUILTIN_NUM_DOCS x BUILTIN_POSITIONS."""
    from lazyattn.qa.synthetic import generate

    combos = [(d, p) for d in BUILTIN_NUM_DOCS for p in BUILTIN_POSITIONS]
    per = -(-n // len(combos))
    items = []
    for k, (num_docs, position) in enumerate(combos):
        items += generate(per, num_docs=num_docs, gold_position=position, seed=seed * 1000 + k, split="train")
    random.Random(seed).shuffle(items)
    return items[:n]


def load_items(source: str, n: int | None, seed: int = 0) -> list:
    """The items of `source` ("builtin" or a JSONL path): `n` of them (builtin needs n; a file gives all if
    None), validated by the eval format's own reader."""
    if source == BUILTIN:
        if n is None or n <= 0:
            raise InvalidRequestError("the built-in training set needs a positive number of examples", param="examples")
        return builtin_items(n, seed)
    from lazyattn.qa.dataset import read_jsonl

    return read_jsonl(source, limit=n)


def encode_items(
    tokenizer: TokenizerBase,
    items: Sequence,
    layouts: Sequence[PromptLayout] = (DEFAULT_LAYOUT,),
    max_tokens: int | None = None,
) -> list[Example]:
    """Encoded examples, item k in layout k mod len(layouts) (the items come shuffled, so every layout meets every
    document count and gold position); those longer than `max_tokens` are dropped (a truncated prompt would teach
    nothing)."""
    examples = [encode_item(tokenizer, item, layouts[k % len(layouts)]) for k, item in enumerate(items)]
    if max_tokens is not None:
        examples = [e for e in examples if e.num_tokens <= max_tokens]
    if not examples:
        raise InvalidRequestError(f"no training example fits in {max_tokens} tokens", param="max_tokens")
    return examples
