"""RAG question-answering items: the JSONL format, and which documents a run shows in which order.

One item per line, the shape of the 2WikiMultiHopQA / HotpotQA / NQ sets Block-Attention and LazyAttention
evaluate on, so users can convert and run their own copies:

    {"question": "...", "answers": ["...", ...], "documents": [{"title": "...", "text": "..."}, ...],
     "gold": [indices of the documents holding the answer], "id": "...", ...}

`id` is optional (the line number otherwise); other fields are kept and carried into the results (the
built-in set adds `type`, e.g. "single-hop", and `relation`). A line with `labels` (a list holding every answer)
is a classification item: its output is scored by the first label it names (metrics.label_accuracy); `gold` may
then be empty, as in the in-context-learning set, where the documents are demonstrations.

Block attention changes what a document can see (only itself), so the answer's position among the documents
matters more than under full attention; `arrange` puts the gold documents first, in the middle or last.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lazyattn.errors import LazyAttnError

# Where `arrange` puts the gold documents; "original" keeps the item's own order.
POSITIONS = ("first", "middle", "last", "original")


class DatasetError(LazyAttnError, ValueError):
    """An evaluation item or file that cannot be used (missing field, gold index out of range, ...)."""

    status_code = 400
    error_type = "invalid_request_error"


@dataclass(frozen=True)
class QAItem:
    question: str
    answers: tuple[str, ...]
    documents: tuple[dict[str, str], ...]  # {"title", "text"}; title may be ""
    gold: tuple[int, ...]  # indices into documents, in the order the reasoning uses them
    id: str
    extra: dict[str, Any] = field(default_factory=dict)  # any other fields of the JSONL line

    @property
    def type(self) -> str:
        return str(self.extra.get("type", "all"))

    @property
    def labels(self) -> list[str] | None:
        """A classification item's label set (the `labels` field), or None: then answers are scored by
        containment (metrics.py)."""
        return self.extra.get("labels")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "question": self.question,
            "answers": list(self.answers),
            "documents": [dict(d) for d in self.documents],
            "gold": list(self.gold),
            **self.extra,
        }

    @staticmethod
    def from_dict(d: Any, where: str = "item") -> QAItem:
        """Validated: every problem is reported with `where` (e.g. "data.jsonl line 7")."""
        if not isinstance(d, Mapping):
            raise DatasetError(f"{where}: expected a JSON object, got {type(d).__name__}")
        for key in ("question", "answers", "documents", "gold"):
            if key not in d:
                raise DatasetError(f"{where}: missing field {key!r}")
        question, answers, documents, gold = d["question"], d["answers"], d["documents"], d["gold"]
        if not isinstance(question, str) or not question.strip():
            raise DatasetError(f"{where}: 'question' must be a non-empty string")
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
            raise DatasetError(f"{where}: 'answers' must be a non-empty list of non-empty strings")
        if not isinstance(documents, list) or not documents:
            raise DatasetError(f"{where}: 'documents' must be a non-empty list")
        docs = tuple(_document(doc, f"{where}: documents[{i}]") for i, doc in enumerate(documents))
        if not isinstance(gold, list) or not all(isinstance(g, int) and not isinstance(g, bool) for g in gold):
            raise DatasetError(f"{where}: 'gold' must be a list of document indices")
        if len(set(gold)) != len(gold):
            raise DatasetError(f"{where}: 'gold' repeats an index: {gold}")
        for g in gold:
            if not 0 <= g < len(docs):
                raise DatasetError(f"{where}: gold index {g} is outside the {len(docs)} documents")
        labels = d.get("labels")
        if labels is not None and (
            not isinstance(labels, list) or not all(isinstance(x, str) and x.strip() for x in labels)
        ):
            raise DatasetError(f"{where}: 'labels' must be a list of non-empty strings")
        if labels is not None and not all(a in labels for a in answers):
            raise DatasetError(f"{where}: every answer must be one of the 'labels'")
        extra = {k: v for k, v in d.items() if k not in ("id", "question", "answers", "documents", "gold")}
        return QAItem(question, tuple(answers), docs, tuple(gold), str(d.get("id", where)), extra)


def _document(doc: Any, where: str) -> dict[str, str]:
    if isinstance(doc, str):
        doc = {"title": "", "text": doc}
    if not isinstance(doc, Mapping) or not isinstance(doc.get("text"), str) or not doc["text"].strip():
        raise DatasetError(f"{where}: expected {{'title', 'text'}} with a non-empty text (or a plain string)")
    title = doc.get("title") or ""
    if not isinstance(title, str):
        raise DatasetError(f"{where}: 'title' must be a string")
    return {"title": title, "text": doc["text"]}


def write_jsonl(path: str | Path, items: Iterable[QAItem]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(item.to_dict(), ensure_ascii=False) + "\n")


def read_jsonl(path: str | Path, limit: int | None = None) -> list[QAItem]:
    """The first `limit` items (all if None); blank lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"dataset file {str(path)!r} does not exist")
    items: list[QAItem] = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if limit is not None and len(items) >= limit:
                break
            if not line.strip():
                continue
            where = f"{path.name} line {number}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{where}: not valid JSON ({e.msg})") from e
            if isinstance(data, dict) and "id" not in data:
                data = {**data, "id": f"{path.stem}-{number}"}
            items.append(QAItem.from_dict(data, where))
    if not items:
        raise DatasetError(f"dataset file {str(path)!r} holds no items")
    return items


def gold_start(num_distractors: int, position: str) -> int:
    """Index of the first gold document when the gold block goes `position` among `num_distractors` others.
    "middle" leaves num_distractors // 2 before it (with one distractor that is the first slot)."""
    if position == "first":
        return 0
    if position == "middle":
        return num_distractors // 2
    if position == "last":
        return num_distractors
    raise DatasetError(f"gold position must be one of {', '.join(POSITIONS)}, got {position!r}")


def arrange(item: QAItem, num_docs: int | None, position: str = "original") -> QAItem:
    """The item as a run shows it: all gold documents plus the first distractors, `num_docs` in all (fewer if
    the item has fewer; None keeps all), gold documents kept together in their own order at `position`.

    Distractors keep their relative order, so a smaller `num_docs` shows a prefix of a larger one's
    distractors and the positions differ only in where the gold block sits."""
    if num_docs is not None and num_docs < len(item.gold):
        raise DatasetError(f"item {item.id}: {num_docs} documents cannot hold its {len(item.gold)} gold documents")
    gold_docs = [item.documents[g] for g in item.gold]
    if position == "original":
        keep = len(item.documents) if num_docs is None else num_docs - len(item.gold)
        kept = [i for i in range(len(item.documents)) if i not in item.gold][:keep]
        order = sorted(kept + list(item.gold))
        index = {old: new for new, old in enumerate(order)}
        return replace(item, documents=tuple(item.documents[i] for i in order), gold=tuple(index[g] for g in item.gold))
    distractors = [d for i, d in enumerate(item.documents) if i not in item.gold]
    if num_docs is not None:
        distractors = distractors[: num_docs - len(item.gold)]
    start = gold_start(len(distractors), position)
    docs = distractors[:start] + gold_docs + distractors[start:]
    return replace(item, documents=tuple(docs), gold=tuple(range(start, start + len(gold_docs))))
