"""Answer scores as the RAG papers compute them, on SQuAD-normalised text.

Normalising: lowercase, drop punctuation, drop the articles a/an/the, collapse whitespace. Then, against a
list of acceptable answers (the best one counts):

- accuracy: a normalised answer occurs inside the normalised output (Block-Attention's and LazyAttention's
  headline number: an instruct model answers in sentences, so containment is what "answered" means);
- exact match: the whole normalised output equals a normalised answer;
- token F1: harmonic mean of token precision and recall between output and answer (multiset overlap).

A classification item (one with a fixed label set, e.g. `builtin:icl`) is scored by `label_accuracy` instead of
containment: the first label the output names must be the answer, so an output that lists every label scores 0.
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


def first_label(output: str, labels: Sequence[str]) -> str | None:
    """The label the normalised output names first, as whole words (of two starting at one word, the longer);
    None if it names none."""
    words = normalize_answer(output).split()
    options = sorted(((normalize_answer(label).split(), label) for label in labels), key=lambda t: -len(t[0]))
    for i in range(len(words)):
        for tokens, label in options:
            if tokens and words[i : i + len(tokens)] == tokens:
                return label
    return None


def label_accuracy(output: str, answers: Sequence[str], labels: Sequence[str]) -> float:
    return float(first_label(output, labels) in answers)


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
    def of(output: str, answers: Sequence[str], labels: Sequence[str] | None = None) -> Scores:
        """With `labels`, accuracy is `label_accuracy` (a classification item), else containment."""
        acc = accuracy(output, answers) if labels is None else label_accuracy(output, answers, labels)
        return Scores(acc, exact_match(output, answers), token_f1(output, answers))


# Confidence intervals: percentile bootstrap over questions. Seeded, so a report reprints the same numbers.
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


def bootstrap_ci(
    values: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES, confidence: float = CONFIDENCE, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile-bootstrap interval of the mean of `values` (one score per question): resample the questions
    with replacement `resamples` times and take the (1 - confidence) / 2 and (1 + confidence) / 2 quantiles of
    the resampled means. None for no values."""
    import numpy as np

    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return None
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(lo), float(hi)


@dataclass(frozen=True)
class Difference:
    """Mean of b - a over paired questions, with its paired-bootstrap interval."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def significant(self) -> bool:
        """The interval excludes 0: anything else is "no significant difference", never a gain or a loss."""
        return self.low > 0 or self.high < 0

    def describe(self, scale: float = 100.0) -> str:
        text = f"{scale * self.mean:+.1f} [{scale * self.low:+.1f}, {scale * self.high:+.1f}]"
        return text if self.significant else f"{text} no significant difference"


def paired_bootstrap_diff(
    a: Sequence[float],
    b: Sequence[float],
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> Difference | None:
    """b - a where a[i] and b[i] score the same question under two runs: the questions are resampled together,
    so what varies between questions (some are just hard) cancels. None for no pairs."""
    if len(a) != len(b):
        raise ValueError(f"paired scores need equal lengths, got {len(a)} and {len(b)}")
    if not a:
        return None
    d = [y - x for x, y in zip(a, b)]
    lo, hi = bootstrap_ci(d, resamples, confidence, seed)  # type: ignore[misc]
    return Difference(sum(d) / len(d), lo, hi, len(d))
