"""The in-context-learning set (lazyattn/eval/icl.py): well-formed and balanced, each question's demonstrations in
its own seeded shuffle, each demonstration its own segment of the prompt, label scoring, and a run through the
CLI on the tiny model."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from lazyattn import SamplingParams
from lazyattn.cli import main
from lazyattn.engine.prompt import PromptLayout, encode_document, render_chat
from lazyattn.eval import icl
from lazyattn.eval.harness import GuidedLabels
from lazyattn.eval.metrics import Scores, first_label, label_accuracy
from lazyattn.model.tokenizer import load_tokenizer
from lazyattn.qa.dataset import DatasetError, QAItem


@pytest.fixture(scope="module")
def shipped():
    if not icl.DATA_PATH.exists():
        pytest.fail(f"{icl.DATA_PATH} is missing: run python -m lazyattn.eval.icl")
    return icl.read()


def test_sizes_labels_and_no_overlap(shipped):
    header, demos, questions = shipped
    labels = tuple(header["labels"])
    assert labels == icl.LABELS and header["questions"] == len(questions) == len(labels) * icl.TESTS_PER_LABEL
    assert Counter(d.label for d in demos.values()) == {label: icl.DEMOS_PER_LABEL for label in labels}
    assert Counter(q.example.label for q in questions) == {label: icl.TESTS_PER_LABEL for label in labels}
    # labels interleaved: the first 5 k questions hold k of each
    assert [q.example.label for q in questions[: len(labels)]] == list(labels)
    texts = [q.example.text for q in questions] + [d.text for d in demos.values()]
    assert len(set(texts)) == len(texts)  # no test input is a demonstration, none repeated
    assert len({q.example.id for q in questions}) == len(questions)
    for example in [q.example for q in questions] + list(demos.values()):
        assert icl.MIN_WORDS <= len(example.text.split()) <= icl.MAX_WORDS
        # the label is the topic of the module the docstring comes from
        module = example.source.split(".")[0]
        assert any(s.split(".")[0] == module for s in header["topics"][example.label]), example


def test_every_question_shuffles_all_demonstrations_in_balanced_rounds(shipped):
    header, demos, questions = shipped
    labels = header["labels"]
    for q in questions:
        assert sorted(q.order) == sorted(demos)
        for r in range(1, icl.DEMOS_PER_LABEL + 1):
            shown = Counter(demos[i].label for i in q.order[: r * len(labels)])
            assert shown == {label: r for label in labels}, (q.example.id, r)
    # per question: hardly two questions share an order, and not even the first round's
    assert len({q.order for q in questions}) == len(questions)
    assert len({q.order[: len(labels)] for q in questions}) > len(questions) // 2


def test_orders_are_reproducible_from_the_seed(shipped):
    _, demos, questions = shipped
    by_label: dict[str, list[icl.Example]] = {}
    for d in demos.values():
        by_label.setdefault(d.label, []).append(d)
    for q in questions[:20]:
        assert icl.shuffled_order(by_label, random.Random(f"{icl.SEED}:{q.example.id}")) == q.order


def test_the_shipped_file_is_what_the_builder_makes_now(shipped):
    header, demos, questions = shipped
    try:
        built_header, built_demos, built = icl.build()
    except DatasetError as e:  # another Python: other docstrings
        pytest.skip(str(e))
    if [d.text for d in built_demos] != [d.text for d in demos.values()]:
        pytest.skip("the installed standard library differs from the one the set was cut from")
    assert built_header == header
    assert built == questions


def test_items_show_the_demonstrations_in_the_question_order(shipped):
    _, demos, questions = shipped
    _, items = icl.load(limit=7)
    assert len(items) == 7
    for item, q in zip(items, questions):
        assert item.gold == () and item.answers == (q.example.label,) and item.labels == list(icl.LABELS)
        assert [d["text"] for d in item.documents] == [icl.demonstration_text(demos[i]) for i in q.order]
        assert q.example.text in item.question and all(label in item.question for label in icl.LABELS)
        assert QAItem.from_dict(item.to_dict()) == item  # a --write-dataset file reads back as the same items


def test_each_demonstration_is_its_own_segment():
    tokenizer = load_tokenizer("tiny")
    layout = PromptLayout(**icl.LAYOUT)
    _, items = icl.load(limit=2)
    first, second = (
        render_chat(tokenizer, [{"role": "user", "content": i.question}], i.documents, layout) for i in items
    )
    for item, rendered in ((items[0], first), (items[1], second)):
        # [system] + one segment per demonstration, then the test input in the final segment
        assert rendered.segments[1:] == [encode_document(tokenizer, d, layout) for d in item.documents]
        assert layout.system_prompt in tokenizer.decode(rendered.segments[0])
        assert item.question.split("\n")[0] in tokenizer.decode(rendered.final)
    # the same demonstrations, so the same segments (one cached copy each), in another order
    assert first.segments[0] == second.segments[0]
    assert sorted(map(tuple, first.segments[1:])) == sorted(map(tuple, second.segments[1:]))
    assert first.segments[1:] != second.segments[1:]


@pytest.mark.parametrize(
    "output, expected",
    [
        ("math", "math"),
        ("Topic: Network.", "network"),
        ("The topic is time, not math", "time"),
        ("files", None),  # whole words only
        ("", None),
    ],
)
def test_first_label(output, expected):
    assert first_label(output, icl.LABELS) == expected


def test_label_scoring_takes_the_first_label_named():
    labels = ["math", "text", "machine learning", "machine"]
    assert first_label("machine learning, surely", labels) == "machine learning"  # the longer of two
    assert label_accuracy("text or math", ["math"], labels) == 0.0  # containment would count it
    assert Scores.of("text or math", ["math"]).accuracy == 1.0
    assert Scores.of("Math.", ["math"], labels) == Scores(1.0, 1.0, 1.0)


def test_labels_field_is_validated():
    line = {"question": "q", "answers": ["a"], "documents": ["d"], "gold": [], "labels": ["a", "b"]}
    assert QAItem.from_dict(line).labels == ["a", "b"]
    with pytest.raises(DatasetError, match="one of the 'labels'"):
        QAItem.from_dict({**line, "answers": ["c"]})
    with pytest.raises(DatasetError, match="'labels' must be"):
        QAItem.from_dict({**line, "labels": "a"})


ARGS = ["eval", "--model", "tiny", "--device", "cpu", "--page-size", "16", "--max-tokens", "3", "--no-progress"]


def test_a_few_shot_run_through_the_cli(tmp_path):
    code = main(
        ARGS
        + ["--dataset", "builtin:icl", "--limit", "3", "--num-docs", "5,10"]
        + ["--modes", "full,lazy,lazy:ape_prefix=true", "--out", str(tmp_path)]
    )
    assert code == 0
    data = json.loads((tmp_path / "eval.json").read_text())
    assert data["dataset"]["builtin"] == "icl"
    assert data["meta"]["layout"]["system_prompt"] == icl.LAYOUT["system_prompt"]
    cells = [(c["run"], c["num_docs"], c["position"]) for c in data["cells"]]
    runs = ("full", "lazy", "lazy:ape_prefix=true")
    assert cells == [(r, n, "original") for r in runs for n in (5, 10)]
    _, items = icl.load(limit=3)
    answers = {i.id: i.answers for i in items}
    for c in data["cells"]:
        assert [r["id"] for r in c["items"]] == [i.id for i in items]
        for r in c["items"]:
            assert r["accuracy"] == label_accuracy(r["output"], answers[r["id"]], icl.LABELS)
    by_run = {(c["run"], c["num_docs"]): c for c in data["cells"]}
    # lazy encodes each demonstration once: the 10-demonstration cell finds the first 5 of each question cached
    assert by_run[("lazy", 10)]["cached_tokens_mean"] > 0 and by_run[("full", 10)]["cached_tokens_mean"] == 0
    assert {d["run"] for d in data["comparisons"]} == {"lazy", "lazy:ape_prefix=true"}
    assert "Accuracy difference from full" in (tmp_path / "eval.md").read_text()


@pytest.mark.parametrize("dataset, plain", [("builtin:icl", False), ("builtin:icl-language", True)])
def test_guided_choice_answers_every_question_with_one_of_its_labels(tmp_path, dataset, plain):
    """`--guided-choice`: every run's output is a label (the random tiny model names none unguided); in the plain
    few-shot layout it follows the prompt's "Language:" after a space, as the demonstrations show it."""
    code = main(
        ARGS[:-3]
        + ["--max-tokens", "12", "--no-progress", "--dataset", dataset, "--limit", "4", "--num-docs", "5"]
        + ["--modes", "full,lazy:ape_prefix=true", "--guided-choice", "--out", str(tmp_path)]
    )
    assert code == 0
    data = json.loads((tmp_path / "eval.json").read_text())
    assert data["meta"]["guided_choice"] is True and data["meta"]["plain_prompt"] is plain
    labels = set(icl.LABELS) if not plain else {"english", "french", "german", "spanish", "italian"}
    for c in data["cells"]:
        for r in c["items"]:
            assert r["output"] in labels and r["finish_reason"] == "stop", r


def test_guided_labels_take_a_leading_space_after_a_plain_prompt_only():
    params = SamplingParams(max_tokens=4, temperature=0.0)

    def item_of(question: str, **fields) -> QAItem:
        return QAItem.from_dict(
            {"id": "q", "question": question, "answers": ["b"], "documents": ["d"], "gold": [], **fields}
        )

    item = item_of("Text: hola\nLanguage:", labels=["a", "b"])
    assert GuidedLabels(params, plain=True)(item).guided_choice == (" a", " b")
    assert GuidedLabels(params, plain=False)(item).guided_choice == ("a", "b")
    spaced = item_of("Language: ", labels=["a", "b"])
    assert GuidedLabels(params, plain=True)(spaced).guided_choice == ("a", "b")
    free = item_of("Who?")
    assert GuidedLabels(params, plain=True)(free) is params


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--gold-position", "first"], "no gold documents"),
        (["--num-docs", "21"], "20 demonstrations"),
        (["--guided-choice", "--fidelity"], "--guided-choice is for accuracy runs, not with --fidelity"),
    ],
)
def test_bad_arguments(capsys, extra, message):
    assert main(ARGS + ["--dataset", "builtin:icl", "--limit", "1"] + extra) == 2
    assert message in capsys.readouterr().err
