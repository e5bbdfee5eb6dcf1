"""Distillation prompts: the user's questions (JSONL) or questions made from the documents themselves.

A made prompt draws k documents (k from `docs_per_prompt`) from the corpus in random order and asks about one of
them, the gold one, first, in the middle or last in equal shares (the cells `lazyattn eval` reports; "middle" is
slot (k - 1) // 2, as there), with one of these questions:

- about:    'What does the document titled "T" say about <phrase>?'  (phrase: a word of the gold document
            rare in the corpus, with the word after it when that is not a stop word)
- continue: 'Continue this sentence from the document titled "T": "<first half of one of its sentences>"'
- quote:    'Quote the sentence of the document titled "T" that mentions <phrase>.'
- summary:  'In one or two sentences, what is the document titled "T" about?'
- cloze:    'Which words fill the blank (___) in this sentence from one of the documents: "<one of the gold
            document's sentences, a phrase rare in the corpus blanked>"?' It names no document: as in extractive
            question answering, the question has to find its passage among the others. Its answer is written:
            the blanked phrase, a span of the gold document.

Untitled documents are named by their first words instead ('the document that begins "…"'). The first four kinds
write no answer: the teacher answers each prompt itself (distill.py), so no labels are needed.

Questions file: one `{"question": ..., "documents": [...], "answers": [...]}` per line; a document is a corpus
id (from --documents), a text, or `{"title", "text"}`; answers are optional (when given, the first is used as
the answer tokens instead of the teacher's own).
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lazyattn.errors import InvalidRequestError
from lazyattn.finetune.config import DEFAULT_KINDS
from lazyattn.finetune.config import QUESTION_KINDS as QUESTION_KINDS
from lazyattn.finetune.corpus import Document

GOLD_POSITIONS = ("first", "middle", "last")
_WORD = re.compile(r"[A-Za-z][A-Za-z_]{3,}")
_SENTENCE = re.compile(r"[^.!?\n]*[A-Za-z][^.!?\n]*[.!?]")
_STOP = frozenset(
    [
        "this",
        "that",
        "these",
        "those",
        "with",
        "from",
        "into",
        "than",
        "then",
        "them",
        "they",
        "their",
        "there",
        "where",
        "which",
        "while",
        "what",
        "when",
        "will",
        "would",
        "should",
        "could",
        "have",
        "been",
        "being",
        "were",
        "does",
        "done",
        "each",
        "such",
        "only",
        "also",
        "more",
        "most",
        "some",
        "same",
        "other",
        "return",
        "returns",
        "given",
        "used",
        "uses",
        "using",
        "value",
        "values",
        "none",
        "true",
        "false",
        "must",
        "like",
        "just",
        "very",
        "over",
        "under",
    ]
)


@dataclass(frozen=True)
class Prompt:
    question: str
    documents: list[dict[str, str] | str]  # in prompt order, as render_chat takes them
    answer: str | None = None  # None: the teacher answers
    gold: int | None = None  # index of the document asked about (made prompts)
    # A plain prompt (`render_completion`: the question is the text the model continues), not a chat request;
    # each document is its text and a blank line, as `lazyattn eval --plain-prompt` shows few-shot demonstrations
    plain: bool = False
    # a plain prompt's first segment, in place of the layout's completion_system_prompt (None: the layout's)
    system: str | None = None


def make_prompts(
    docs: Sequence[Document], n: int, docs_per_prompt: Sequence[int], seed: int = 0, kinds=DEFAULT_KINDS
) -> list[Prompt]:
    if not docs:
        raise InvalidRequestError("no documents to make prompts from", param="documents")
    rng = random.Random(seed)
    rarity = _rarity(docs)
    prompts = []
    for _ in range(n):
        k = min(rng.choice(list(docs_per_prompt)), len(docs))
        chosen = rng.sample(range(len(docs)), k)
        gold = {"first": 0, "middle": (k - 1) // 2, "last": k - 1}[rng.choice(GOLD_POSITIONS)]
        doc = docs[chosen[gold]]
        kind = rng.choice(list(kinds))
        question, answer = _cloze(doc, rng, rarity) if kind == "cloze" else (None, None)
        if question is None:  # no sentence to blank: asked about instead
            question = _question(doc, "about" if kind == "cloze" else kind, rng, rarity)
        prompts.append(Prompt(question, [docs[i].as_prompt_document() for i in chosen], answer, gold))
    return prompts


def _cloze(doc: Document, rng: random.Random, rarity: dict[str, float]) -> tuple[str | None, str | None]:
    """A question that blanks a rare phrase in one of `doc`'s sentences (8 to 40 words), and the phrase; or
    (None, None) where no sentence has one."""
    # Hard-wrapped prose (the Jargon File's) breaks its lines inside sentences: read it unwrapped.
    sentences = [s.strip() for s in _SENTENCE.findall(" ".join(doc.text.split()))]
    sentences = [s for s in sentences if 8 <= len(s.split()) <= 40]
    rng.shuffle(sentences)
    for sentence in sentences:
        phrase = _phrase(sentence, rng, rarity)
        if phrase is None:
            continue
        at = re.search(rf"\b{re.escape(phrase)}\b", sentence)
        if at is None or at.start() == 0:  # a blank that opens the sentence leaves little to find it by
            continue
        blanked = f"{sentence[: at.start()]}___{sentence[at.end() :]}"
        if phrase.lower() in blanked.lower():  # said twice: the blank would give itself away
            continue
        return f'Which words fill the blank (___) in this sentence from one of the documents: "{blanked}"', phrase
    return None, None


def _rarity(docs: Sequence[Document]) -> dict[str, float]:
    """Inverse document frequency of each lower-cased word."""
    df = Counter(w for d in docs for w in {w.lower() for w in _WORD.findall(d.text)})
    return {w: math.log(len(docs) / c) for w, c in df.items()}


def _question(doc: Document, kind: str, rng: random.Random, rarity: dict[str, float]) -> str:
    name = f'the document titled "{doc.title}"' if doc.title else f'the document that begins "{_opening(doc.text)}"'
    if kind == "continue":
        sentences = [s.strip() for s in _SENTENCE.findall(doc.text) if len(s.split()) >= 6]
        if sentences:
            words = rng.choice(sentences).split()
            return f'Continue this sentence from {name}: "{" ".join(words[: len(words) // 2])}"'
        kind = "about"
    if kind == "summary":
        return f"In one or two sentences, what is {name} about?"
    phrase = _phrase(doc.text, rng, rarity)
    if phrase is None:
        return f"In one or two sentences, what is {name} about?"
    if kind == "quote":
        return f"Quote the sentence of {name} that mentions {phrase}."
    return f"What does {name} say about {phrase}?"


def _phrase(text: str, rng: random.Random, rarity: dict[str, float]) -> str | None:
    """One of the document's rarest words (a random one of its top few), with the next word unless a stop word."""
    words = _WORD.findall(text)
    candidates = sorted({w for w in words if w.lower() not in _STOP}, key=lambda w: (-rarity.get(w.lower(), 0), w))
    if not candidates:
        return None
    word = rng.choice(candidates[:5])
    follow = re.search(rf"\b{re.escape(word)}\s+([A-Za-z][A-Za-z_]+)", text)
    if follow and follow.group(1).lower() not in _STOP and len(follow.group(1)) > 3:
        return f"{word} {follow.group(1)}"
    return word


def _opening(text: str, words: int = 6) -> str:
    return " ".join(text.split()[:words])


def write_questions(prompts: Sequence[Prompt], path: str | Path) -> int:
    """The prompts that carry an answer, as a JSONL in the `lazyattn eval` format (question, answers, documents,
    gold), which `lazyattn finetune --data` and `lazyattn eval --dataset` read; returns how many were written."""
    rows = [
        {
            "id": f"made-{i}",
            "question": p.question,
            "answers": [p.answer],
            "documents": [d if isinstance(d, dict) else {"title": "", "text": d} for d in p.documents],
            "gold": [p.gold] if p.gold is not None else [],
        }
        for i, p in enumerate(prompts)
        if p.answer is not None
    ]
    Path(path).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return len(rows)


def read_questions(path: str | Path, corpus: Sequence[Document] = ()) -> list[Prompt]:
    by_id = {d.id: d for d in corpus}
    prompts = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        where = f"{path}:{n + 1}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InvalidRequestError(f"{where}: not JSON ({e})", param="questions") from e
        if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not row.get("documents"):
            raise InvalidRequestError(f'{where}: expected {{"question": ..., "documents": [...]}}', param="questions")
        documents = [_resolve(d, by_id, where) for d in row["documents"]]
        answers = row.get("answers") or []
        prompts.append(Prompt(row["question"], documents, str(answers[0]) if answers else None))
    if not prompts:
        raise InvalidRequestError(f"{path} holds no question", param="questions")
    return prompts


def _resolve(entry, by_id: dict[str, Document], where: str) -> dict[str, str] | str:
    if isinstance(entry, dict) and "id" in entry and "text" not in entry:
        entry = str(entry["id"])
        if entry not in by_id:
            raise InvalidRequestError(f"{where}: no document with id {entry!r} in --documents", param="questions")
    if isinstance(entry, str | int) and str(entry) in by_id:
        return by_id[str(entry)].as_prompt_document()
    if isinstance(entry, str) or (isinstance(entry, dict) and isinstance(entry.get("text"), str)):
        return entry
    raise InvalidRequestError(f"{where}: a document is an id, a text or {{'title', 'text'}}", param="questions")
