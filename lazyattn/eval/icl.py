"""`builtin:icl`, `builtin:icl-language`, `builtin:icl-language-more` and the two `builtin:icl-language-heldout` sets:
in-context learning with the demonstrations as cached segments (docs/quality.md, "In-context learning"). The sets share
everything below but their examples (`IclSet`).

`builtin:icl` is a few-shot topic classification of real text: each example is the summary (first paragraph) of a
docstring of the Python standard library, labelled with the topic of the module it documents (`TOPICS`:
`math.acos` is "math", `shutil.copy` is "file", ...). The label is a fact about the text (where it comes from),
not a judgement.

A fixed pool of `DEMOS_PER_LABEL` demonstrations per label ("Text: ...\\nTopic: math") is shared by every
question; each question shows them as separate documents, so lazy mode encodes each demonstration once and
places it anywhere. Each question has its own seeded shuffle of the pool, in rounds: round r holds one
demonstration of every label, in random order, and which one is random too; so the first 5 r demonstrations
(`--num-docs 5r`) hold r of each label, in an order no other question shares. The test input is the question:
the text and the label set, and the answer is one label (`metrics.label_accuracy` scores the first label the
output names).

`builtin:icl-language` is a few-shot language identification of real text in the same shape: each example is
a message of Django's user interface, labelled with the language of the translation catalogue it comes from
(lazyattn/eval/icl_language.py). Its test input reads like a demonstration without the label
("Text: ...\\nLanguage:"), and the prompt is plain text rather than a chat (`IclSet.plain`): SmolLM2-135M answers
a chat prompt with the same language whatever the demonstrations, and learns from them in a plain one.
`builtin:icl-language-more` is the same with five other languages (`icl_language.MORE_LANGUAGES`), a check of a
setting chosen on `icl-language` on labels it was not chosen on. `builtin:icl-language-heldout` is the same over
Trac's messages in five more languages (`icl_language.HELDOUT_LANGUAGES`), and `builtin:icl-language-heldout-wagtail`
over Wagtail's in five others (`icl_language.WAGTAIL_LANGUAGES`), both for final reporting only.

The examples, the pool and every question's order are frozen in `data/<name>.jsonl.gz`;
`python -m lazyattn.eval.icl` rebuilds `icl` from the installed standard library (Python 3.11) and the seed,
`python -m lazyattn.eval.icl icl-language DIR` (or `icl-language-more DIR`) rebuilds that set from an unpacked Django
wheel, `python -m lazyattn.eval.icl icl-language-heldout DIR` from an unpacked Trac wheel and
`icl-language-heldout-wagtail DIR` from an unpacked Wagtail wheel.
"""

from __future__ import annotations

import collections
import gzip
import importlib
import inspect
import json
import random
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lazyattn.eval import icl_language
from lazyattn.qa.dataset import DatasetError, QAItem

NAME = "icl"
DATA_DIR = Path(__file__).parent / "data"
DATA_PATH = DATA_DIR / f"{NAME}.jsonl.gz"
SEED = 3
DEMOS_PER_LABEL = 4  # a pool of 20 demonstrations: cells of 5, 10, 15 or 20
TESTS_PER_LABEL = 50
MIN_WORDS, MAX_WORDS = 6, 60

# label -> the standard-library modules (or "str", the built-in type) whose docstrings carry it
TOPICS: dict[str, tuple[str, ...]] = {
    "math": ("math", "cmath", "statistics", "fractions", "decimal"),
    "text": ("str", "string", "textwrap", "re", "difflib", "unicodedata", "html"),
    "file": ("os.path", "shutil", "pathlib", "glob", "fnmatch", "tempfile", "filecmp"),
    "time": ("time", "datetime", "calendar", "zoneinfo"),
    "network": (
        "socket",
        "ssl",
        "http.client",
        "urllib.parse",
        "urllib.request",
        "smtplib",
        "ftplib",
        "ipaddress",
    ),
}
LABELS = tuple(TOPICS)
# modules whose objects say they are defined elsewhere (os.path is posixpath on Linux)
_DEFINED_IN = {"os.path": ("posixpath", "genericpath"), "decimal": ("_pydecimal",)}
_SIGNATURE = re.compile(r"^[\w.]+\(.*\)\s*(->.*)?$")  # "gmtime([seconds]) -> (tm_year, ...)": not prose

SOURCE = {
    "source": "docstrings of the Python 3.11 standard library, labelled with the topic of their module",
    "license": "Python Software Foundation License Version 2",
    "copyright": "Copyright (c) 2001 Python Software Foundation. All rights reserved.",
}

# `lazyattn eval --prompt-layout icl` (PromptLayout fields): the instruction is the system segment, each
# demonstration a segment of its own, the test input the user turn.
LAYOUT = {
    "system_prompt": "Classify each text by its topic. Here are examples of texts and their topics.",
    "untitled_document_format": "{text}\n\n",
    "question_format": "{question}",
}


@dataclass(frozen=True)
class Example:
    id: str  # "demo-03" or "icl-017"
    text: str
    label: str
    source: str  # the documented object, e.g. "math.acos"


@dataclass(frozen=True)
class Question:
    example: Example
    order: tuple[str, ...]  # demonstration ids, in the order this question shows them


@dataclass(frozen=True)
class IclSet:
    """One built-in few-shot set: where its labelled examples come from and how a prompt reads."""

    name: str  # `--dataset builtin:<name>`, the data file `data/<name>.jsonl.gz`
    label_name: str  # what the label is, as a demonstration names it: "Text: ...\nTopic: math"
    labels: tuple[str, ...]
    seed: int
    source: dict[str, str]  # source, license, copyright
    layout: dict[str, str]  # PromptLayout fields, `--prompt-layout <name>`
    # per label, every usable example (ids unset); the argument is the folder a builder reads, if it needs one
    examples: Callable[[Path | None], dict[str, list[Example]]]
    # the test input asks for one of the labels by name (a chat question), or reads like a demonstration without
    # its label, which the model completes
    ask: bool
    plain: bool  # the prompt is plain text, no chat template (`lazyattn eval --plain-prompt`)
    details: dict[str, Any] = field(default_factory=dict)  # more header fields

    @property
    def data_path(self) -> Path:
        return DATA_DIR / f"{self.name}.jsonl.gz"


def demonstration_text(demo: Example, label_name: str = "Topic") -> str:
    return f"Text: {demo.text}\n{label_name}: {demo.label}"


def question_text(
    example: Example, labels: tuple[str, ...] = LABELS, label_name: str = "Topic", ask: bool = True
) -> str:
    if not ask:
        return f"Text: {example.text}\n{label_name}:"
    what = label_name.lower()
    return f"Text: {example.text}\nWhat is the {what} of this text: {', '.join(labels)}? Answer with the {what} only."


def summary(doc: str) -> str:
    """A docstring's first paragraph of prose, on one line (leading signature lines dropped)."""
    lines = inspect.cleandoc(doc).split("\n")
    while lines and (not lines[0].strip() or _SIGNATURE.match(lines[0].strip())):
        lines.pop(0)
    paragraph: list[str] = []
    for line in lines:
        if not line.strip():
            break
        paragraph.append(line.strip())
    return " ".join(" ".join(paragraph).split())


def _documented(source: str) -> list[tuple[str, Any]]:
    """(name, object) of the public functions and classes `source` defines, and of their public methods."""
    if source == "str":
        namespace: Any = str
        allowed: set[str] = set()
    else:
        namespace = importlib.import_module(source)
        allowed = {source, source.split(".")[-1], *_DEFINED_IN.get(source, ())}
    out: list[tuple[str, Any]] = []
    for name, obj in sorted(vars(namespace).items()):
        if name.startswith("_") or not (inspect.isroutine(obj) or inspect.isclass(obj)):
            continue
        module = getattr(obj, "__module__", None)
        if allowed and module is not None and module.lstrip("_") not in allowed:
            continue  # imported from another module (pathlib's urlquote_from_bytes is urllib's)
        out.append((f"{source}.{name}", obj))
        if inspect.isclass(obj):
            for member, attr in sorted(vars(obj).items()):
                if not member.startswith("_") and (inspect.isroutine(attr) or inspect.isdatadescriptor(attr)):
                    out.append((f"{source}.{name}.{member}", attr))
    return out


def stdlib_examples() -> dict[str, list[Example]]:
    """Per label, every usable docstring summary of its modules: 6..60 words, starting with a capital letter;
    a summary found under two labels is dropped (it tells nothing), a repeated one kept once."""
    found: dict[str, list[tuple[str, str]]] = {}
    for label, sources in TOPICS.items():
        found[label] = []
        for source in sources:
            for name, obj in _documented(source):
                doc = getattr(obj, "__doc__", None)
                if not isinstance(doc, str):
                    continue
                text = summary(doc)
                if MIN_WORDS <= len(text.split()) <= MAX_WORDS and text[0].isupper():
                    found[label].append((name, text))
    labels_of: dict[str, set[str]] = collections.defaultdict(set)
    for label, pairs in found.items():
        for _, text in pairs:
            labels_of[text].add(label)
    out: dict[str, list[Example]] = {}
    for label, pairs in found.items():
        seen: set[str] = set()
        out[label] = []
        for name, text in pairs:
            if len(labels_of[text]) == 1 and text not in seen:
                seen.add(text)
                out[label].append(Example("", text, label, name))
    return out


def shuffled_order(demos_by_label: dict[str, list[Example]], rng: random.Random) -> tuple[str, ...]:
    """Rounds of one demonstration per label, the labels in random order within each round and each label's
    demonstrations in random order across rounds: every prefix of 5 r holds r of each label."""
    queues = {label: rng.sample(demos, len(demos)) for label, demos in demos_by_label.items()}
    order: list[str] = []
    for r in range(min(len(q) for q in queues.values())):
        for label in rng.sample(list(queues), len(queues)):
            order.append(queues[label][r].id)
    return tuple(order)


def _language_examples(
    languages: dict[str, str], source: icl_language.Catalogues
) -> Callable[[Path | None], dict[str, list[Example]]]:
    """The examples of a language set: per label, the messages of `source`'s catalogues in that language."""

    def examples(root: Path | None) -> dict[str, list[Example]]:
        if root is None:
            raise DatasetError(f"a language set is built from an unpacked {source.package} wheel: give its folder")
        return {
            label: [Example("", text, label, original) for original, text in pairs]
            for label, pairs in icl_language.messages(root, languages, source).items()
        }

    return examples


def _language_set(
    name: str, languages: dict[str, str], seed: int, source: icl_language.Catalogues = icl_language.DJANGO
) -> IclSet:
    """A few-shot language identification set over a package's messages: plain text, the test input completed."""
    return IclSet(
        name=name,
        label_name="Language",
        labels=tuple(languages),
        seed=seed,
        source=source.source,
        layout={
            "system_prompt": "Here are examples of texts and their languages.",
            "completion_system_prompt": "Here are examples of texts and their languages.\n\n",
            "untitled_document_format": "{text}\n\n",
            "question_format": "{question}",
        },
        examples=_language_examples(languages, source),
        ask=False,
        plain=True,
        details={"languages": languages, source.package: source.version},
    )


TOPIC = IclSet(
    name=NAME,
    label_name="Topic",
    labels=LABELS,
    seed=SEED,
    source=SOURCE,
    layout=LAYOUT,
    examples=lambda root: stdlib_examples(),
    ask=True,
    plain=False,
    details={"topics": {label: list(sources) for label, sources in TOPICS.items()}},
)
LANGUAGE = _language_set("icl-language", icl_language.LANGUAGES, seed=5)
MORE_LANGUAGES = _language_set("icl-language-more", icl_language.MORE_LANGUAGES, seed=6)
HELDOUT_LANGUAGES = _language_set(
    "icl-language-heldout", icl_language.HELDOUT_LANGUAGES, seed=7, source=icl_language.TRAC
)
WAGTAIL_LANGUAGES = _language_set(
    "icl-language-heldout-wagtail", icl_language.WAGTAIL_LANGUAGES, seed=8, source=icl_language.WAGTAIL
)
SETS = {s.name: s for s in (TOPIC, LANGUAGE, MORE_LANGUAGES, HELDOUT_LANGUAGES, WAGTAIL_LANGUAGES)}


def build(s: IclSet = TOPIC, root: Path | None = None) -> tuple[dict[str, Any], list[Example], list[Question]]:
    """(header, demonstrations, questions) of set `s` from its examples and seed."""
    rng = random.Random(s.seed)
    examples = s.examples(root)
    demos: dict[str, list[Example]] = {}
    tests: dict[str, list[Example]] = {}
    taken: set[str] = set()  # the sources of the demonstrations drawn so far
    for label in s.labels:
        # two labels' examples share a source where one text is a translation of another: never in the pool twice
        pool = [e for e in examples[label] if e.source not in taken]
        if len(pool) < DEMOS_PER_LABEL + TESTS_PER_LABEL:
            raise DatasetError(f"{s.name}, label {label!r}: only {len(pool)} usable examples")
        drawn = rng.sample(pool, DEMOS_PER_LABEL + TESTS_PER_LABEL)
        demos[label], tests[label] = drawn[:DEMOS_PER_LABEL], drawn[DEMOS_PER_LABEL:]
        taken.update(d.source for d in demos[label])
    for label in s.labels:
        # nor is a test input a translation of a later label's demonstration: it would give the label away
        kept = [t for t in tests[label] if t.source not in taken]
        if len(kept) < TESTS_PER_LABEL:
            rest = [e for e in examples[label] if e.source not in taken and e not in tests[label]]
            kept += rng.sample(rest, TESTS_PER_LABEL - len(kept))
        tests[label] = kept
    number = iter(range(len(s.labels) * DEMOS_PER_LABEL))
    demos = {
        label: [Example(f"demo-{next(number):02d}", d.text, d.label, d.source) for d in ds]
        for label, ds in demos.items()
    }
    questions: list[Question] = []
    for i in range(TESTS_PER_LABEL):  # labels interleaved, so --limit keeps them balanced
        for label in s.labels:
            t = tests[label][i]
            example = Example(f"{s.name}-{len(questions):03d}", t.text, t.label, t.source)
            questions.append(Question(example, shuffled_order(demos, random.Random(f"{s.seed}:{example.id}"))))
    header = {
        "name": s.name,
        **s.source,
        "labels": list(s.labels),
        **s.details,
        "demonstrations": len(s.labels) * DEMOS_PER_LABEL,
        "questions": len(questions),
        "seed": s.seed,
    }
    return header, [d for ds in demos.values() for d in ds], questions


def write(s: IclSet = TOPIC, root: Path | None = None, path: Path | None = None) -> Path:
    """A header line, one line per demonstration {"demonstration", "text", "label", "source"} and one per
    question {"id", "text", "label", "source", "order"} (demonstration ids)."""
    header, demos, questions = build(s, root)
    path = path or s.data_path
    lines = [json.dumps({"header": header}, ensure_ascii=False)]
    lines += [
        json.dumps({"demonstration": d.id, "text": d.text, "label": d.label, "source": d.source}, ensure_ascii=False)
        for d in demos
    ]
    lines += [
        json.dumps(
            {"id": q.example.id, "text": q.example.text, "label": q.example.label, "source": q.example.source}
            | {"order": list(q.order)},
            ensure_ascii=False,
        )
        for q in questions
    ]
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode("utf-8"), mtime=0))
    return path


def read(s: IclSet = TOPIC, path: Path | None = None) -> tuple[dict[str, Any], dict[str, Example], list[Question]]:
    """(header, demonstrations by id, questions) of the shipped set."""
    demos: dict[str, Example] = {}
    questions: list[Question] = []
    with gzip.open(path or s.data_path, "rt", encoding="utf-8") as f:
        header = json.loads(f.readline())["header"]
        for line in f:
            d = json.loads(line)
            if "demonstration" in d:
                demos[d["demonstration"]] = Example(d["demonstration"], d["text"], d["label"], d["source"])
            else:
                example = Example(d["id"], d["text"], d["label"], d["source"])
                questions.append(Question(example, tuple(d["order"])))
    return header, demos, questions


def to_item(q: Question, demos: dict[str, Example], s: IclSet = TOPIC) -> QAItem:
    """The question as the harness shows it: every demonstration a document, in the question's order, and no gold
    document (cells take the first --num-docs, gold position "original")."""
    docs = tuple({"title": "", "text": demonstration_text(demos[i], s.label_name)} for i in q.order)
    extra = {"labels": list(s.labels), "type": q.example.label, "source": q.example.source}
    question = question_text(q.example, s.labels, s.label_name, s.ask)
    return QAItem(question, (q.example.label,), docs, (), q.example.id, extra)


def load(limit: int | None = None, s: IclSet = TOPIC) -> tuple[dict[str, Any], list[QAItem]]:
    """(header, the first `limit` questions as QA items) of the shipped set."""
    header, demos, questions = read(s)
    return header, [to_item(q, demos, s) for q in questions[:limit]]


if __name__ == "__main__":
    # python -m lazyattn.eval.icl [icl | icl-language DJANGO_DIR | icl-language-more DJANGO_DIR
    #                              | icl-language-heldout TRAC_DIR | icl-language-heldout-wagtail WAGTAIL_DIR]
    name = sys.argv[1] if len(sys.argv) > 1 else NAME
    if name not in SETS:
        sys.exit(f"usage: python -m lazyattn.eval.icl [{' | '.join(SETS)} [DIR]]")
    print(f"wrote {write(SETS[name], Path(sys.argv[2]) if len(sys.argv) > 2 else None)}")
