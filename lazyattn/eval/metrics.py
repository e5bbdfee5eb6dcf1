"""Answer scores as the RAG papers compute them, on SQuAD-normalised text.

Normalising: lowercase, drop punctuation, drop the articles a/an/the, collapse whitespace. Then, against a
list of acceptable answers (the best one counts):

- accuracy: a normalised answer occurs inside the normalised output (Block-Attention's and LazyAttention's
  headline number: an instruct model answers in sentences, so containment is what "answered" means);
- exact match: the whole normalised output equals a normalised answer;
- token F1: harmonic mean of token precision and recall between output and answer (multiset overlap).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def accuracy(output: str, answers: Sequence[str]) -> float:
    out = normalize_answer(output)
    # An answer that normalises to nothing ("The") would be "contained" in every output: it never counts.
    return float(any(a and a in out for a in map(normalize_answer, answers)))


def exact_match(output: str, answers: Sequence[str]) -> float:
    out = normalize_answer(output)
    return float(any(out == normalize_answer(a) for a in answers))


def token_f1(output: str, answers: Sequence[str]) -> float:
    return max((_f1(normalize_answer(output).split(), normalize_answer(a).split()) for a in answers), default=0.0)


def _f1(predicted: list[str], truth: list[str]) -> float:
    if not predicted or not truth:
        return float(predicted == truth)  # both empty: a match; one empty: nothing in common
    common = sum((Counter(predicted) & Counter(truth)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(truth)
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class Scores:
    accuracy: float
    exact_match: float
    f1: float

    @staticmethod
    def of(output: str, answers: Sequence[str]) -> Scores:
        return Scores(accuracy(output, answers), exact_match(output, answers), token_f1(output, answers))
