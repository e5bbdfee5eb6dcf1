"""Few-shot distillation prompts (docs/finetune.md, "Few-shot prompts"): labelled texts made into plain-text
few-shot prompts whose demonstrations are documents, as `lazyattn eval --dataset builtin:icl-language` shows them,
for the full-attention teacher to answer.

A prompt draws 2 to 6 of the labels and 1 to 4 demonstrations of each, in rounds: each round holds one demonstration
of every drawn label in random order, so every prefix of a round boundary is balanced. Each demonstration is a
document; the test input, a text of one of the drawn labels that no demonstration shows, is the prompt, completed by
the model:

    [system]  [Text: <demonstration>\\nLanguage: catalan\\n\\n] ... [Text: <test input>\\nLanguage:]

What varies, so that no one wording is learnt: the system line (`SYSTEM_LINES`, one of them empty), the two field
names (`FIELDS`), and the labels: their own names in half the prompts, in the other half a mapping, fresh per
prompt, onto arbitrary words or letters (`ARBITRARY`), which only the demonstrations can teach. No answer is
written: the teacher answers (distill.py), so the student learns to read cached demonstrations as full attention
reads them, not the labels.

Labelled texts: "sphinx-languages" (built in) or a JSONL of `{"text", "label"}`. The built-in set is the messages
of Sphinx's translation catalogues in twelve languages that no evaluation set uses (`LANGUAGES`; the evaluation's
few-shot sets are Django's messages in ten others), frozen in `data/sphinx-languages.jsonl.gz`;
`python -m lazyattn.finetune.few_shot DIR` rebuilds it from an unpacked wheel of the Sphinx version in
`SPHINX_VERSION`:

    pip download sphinx==9.0.4 --no-deps -d wheels && unzip -q wheels/sphinx-9.0.4-py3-none-any.whl -d sphinx-9.0.4
    python -m lazyattn.finetune.few_shot sphinx-9.0.4
"""

from __future__ import annotations

import gzip
import json
import random
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from lazyattn.errors import InvalidRequestError
from lazyattn.finetune.corpus import jsonl_rows
from lazyattn.finetune.prompts import Prompt
from lazyattn.qa import catalogues

SPHINX_LANGUAGES = "sphinx-languages"
SPHINX_VERSION = "9.0.4"
DATA_PATH = Path(__file__).resolve().parent / "data" / f"{SPHINX_LANGUAGES}.jsonl.gz"
# label -> catalogue code: languages of Sphinx's catalogues with enough usable messages, none of them a label of
# builtin:icl-language or builtin:icl-language-more (lazyattn/eval/icl_language.py)
LANGUAGES = {
    "catalan": "ca",
    "galician": "gl",
    "albanian": "sq",
    "indonesian": "id",
    "slovak": "sk",
    "estonian": "et",
    "greek": "el",
    "russian": "ru",
    "korean": "ko",
    "persian": "fa",
    "hindi": "hi",
    "georgian": "ka",
}
LABELS_PER_PROMPT = (2, 6)  # inclusive ranges
DEMOS_PER_LABEL = (1, 4)
ARBITRARY_SHARE = 0.5  # prompts whose labels are shown as arbitrary words or letters
SYSTEM_LINES = (
    "Here are examples of texts and their labels.\n\n",
    "Classify each text as the examples show.\n\n",
    "Examples:\n\n",
    "",
)
FIELDS = (("Text", "Language"), ("Text", "Label"), ("Input", "Output"), ("Sentence", "Class"), ("Message", "Answer"))
# what an arbitrary label is drawn from: words and letters that say nothing of the text
ARBITRARY = (
    ("apple", "river", "stone", "cloud", "tiger", "lamp", "violet", "copper", "maple", "harbor", "falcon", "meadow"),
    tuple("ABCDEFGHIJKL"),
)


def read_examples(source: str) -> dict[str, list[str]]:
    """Label -> its texts, from "sphinx-languages" or a JSONL of {"text", "label"}; labels with fewer than two
    texts are dropped (a test input needs a text that no demonstration shows)."""
    path = DATA_PATH if source == SPHINX_LANGUAGES else Path(source)
    if not path.is_file():
        raise InvalidRequestError(
            f"{source!r}: not {SPHINX_LANGUAGES!r} nor a JSONL file of {{'text', 'label'}}", param="few_shot"
        )
    by_label: dict[str, list[str]] = defaultdict(list)
    for n, row in jsonl_rows(path, "few_shot"):
        text, label = (row.get("text"), row.get("label")) if isinstance(row, dict) else (None, None)
        if not isinstance(text, str) or not text.strip() or not isinstance(label, str) or not label.strip():
            raise InvalidRequestError(f'{path}:{n + 1}: expected {{"text": ..., "label": ...}}', param="few_shot")
        by_label[label.strip()].append(" ".join(text.split()))
    kept = {label: texts for label, texts in by_label.items() if len(texts) >= 2}
    if len(kept) < 2:
        raise InvalidRequestError(f"{path}: few-shot prompts need two labels with two texts each", param="few_shot")
    return kept


def make_prompts(examples: dict[str, list[str]], n: int, seed: int = 0) -> list[Prompt]:
    """`n` plain few-shot prompts over `examples` (label -> texts), as the module docstring describes."""
    rng = random.Random(seed)
    labels = sorted(examples)
    prompts = []
    for _ in range(n):
        drawn = rng.sample(labels, min(rng.randint(*LABELS_PER_PROMPT), len(labels)))
        per = rng.randint(*DEMOS_PER_LABEL)
        texts = {label: rng.sample(examples[label], min(per + 1, len(examples[label]))) for label in drawn}
        per = min(per, *(len(t) - 1 for t in texts.values()))
        field, label_name = rng.choice(FIELDS)
        shown = dict(zip(drawn, drawn))
        if rng.random() < ARBITRARY_SHARE:
            shown = dict(zip(drawn, rng.sample(rng.choice(ARBITRARY), len(drawn))))
        documents = []
        for r in range(per):
            for label in rng.sample(drawn, len(drawn)):
                documents.append(f"{field}: {texts[label][r]}\n{label_name}: {shown[label]}")
        asked = rng.choice(drawn)
        question = f"{field}: {texts[asked][-1]}\n{label_name}:"
        prompts.append(Prompt(question, documents, system=rng.choice(SYSTEM_LINES), plain=True))
    return prompts


def build(root: Path) -> list[dict[str, str]]:
    """The built-in labelled texts from an unpacked Sphinx wheel: per language, its usable messages
    (`catalogues.messages`: sentence-like, 4 to 40 words, differing from the English original, under one label)."""
    found = catalogues.messages(root, LANGUAGES, "sphinx")
    return [{"text": text, "label": label} for label in LANGUAGES for _, text in found[label]]


def write(root: Path, path: Path = DATA_PATH) -> int:
    rows = build(root)
    with gzip.GzipFile(path, "wb", mtime=0) as f:  # no timestamp: the same wheel gives the same bytes
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode())
    return len(rows)


def _main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print(__doc__.split("\n\n")[-1], file=sys.stderr)
        return 2
    n = write(Path(argv[0]))
    print(f"wrote {n} labelled texts to {DATA_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
