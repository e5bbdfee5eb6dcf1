"""The built-in evaluation set: deterministic, splits disjoint, answers only in the gold documents."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from lazyattn.eval.metrics import normalize_answer
from lazyattn.qa.dataset import DatasetError, arrange
from lazyattn.qa.synthetic import MAX_DOCS, generate, split_of


def _digest(items) -> str:
    return hashlib.sha256(json.dumps([i.to_dict() for i in items]).encode()).hexdigest()


def test_same_arguments_same_items_in_another_process():
    here = _digest(generate(12, 6, "middle", seed=3))
    code = (
        "import hashlib, json; from lazyattn.qa.synthetic import generate; "
        "print(hashlib.sha256(json.dumps([i.to_dict() for i in generate(12, 6, 'middle', seed=3)])"
        ".encode()).hexdigest())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # str hashing differs between the processes
    there = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert there.stdout.strip() == here


def test_item_depends_on_its_index_not_on_the_count():
    assert generate(3, 5, seed=1) == generate(8, 5, seed=1)[:3]
    assert generate(4, 5, seed=1) != generate(4, 5, seed=2)


def _names(items) -> set[str]:
    return {d["title"] for item in items for d in item.documents}


def test_eval_and_train_never_share_an_entity_document_or_question():
    evals = [item for seed in range(3) for item in generate(40, 10, seed=seed, split="eval")]
    trains = [item for seed in range(3) for item in generate(40, 10, seed=seed, split="train")]
    assert {split_of(n) for n in _names(evals)} == {"eval"}
    assert {split_of(n) for n in _names(trains)} == {"train"}
    assert not _names(evals) & _names(trains)
    texts = lambda items: {d["text"] for item in items for d in item.documents}  # noqa: E731
    assert not texts(evals) & texts(trains)
    assert not {i.question for i in evals} & {i.question for i in trains}
    assert not {i.id for i in evals} & {i.id for i in trains}


@pytest.mark.parametrize("num_docs", [2, 5, 10])
@pytest.mark.parametrize("position", ["first", "middle", "last"])
def test_gold_documents_hold_the_answer_where_asked(num_docs, position):
    items = generate(30, num_docs, position, seed=0)
    assert {i.type for i in items} == {"single-hop", "two-hop"}
    for item in items:
        assert len(item.documents) == num_docs
        k = num_docs - len(item.gold)  # distractors
        start = {"first": 0, "middle": k // 2, "last": k}[position]
        assert item.gold == tuple(range(start, start + len(item.gold)))
        answer = normalize_answer(item.answers[0])
        holders = [i for i, d in enumerate(item.documents) if answer in normalize_answer(d["text"])]
        assert holders == [item.gold[-1]]  # the (last) gold document, and no distractor
        assert len(set(_names([item]))) == num_docs


def test_two_hop_first_gold_document_names_the_second():
    for item in generate(30, 6, seed=4):
        if item.type == "two-hop":
            first, second = (item.documents[g] for g in item.gold)
            assert second["title"] in first["text"]
            assert first["title"] in item.question and second["title"] not in item.question
        else:
            assert len(item.gold) == 1 and item.documents[item.gold[0]]["title"] in item.question


def test_fewer_documents_show_a_prefix_of_the_same_distractors():
    for position in ("first", "middle", "last"):
        assert [arrange(i, 4, position) for i in generate(10, 10, seed=5)] == generate(10, 4, position, seed=5)


def test_documents_stay_short():
    words = [len(d["text"].split()) for item in generate(60, 10, seed=0) for d in item.documents]
    assert max(words) <= 30


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(split="test"), "split must be"),
        (dict(num_docs=1), r"num_docs must be in \[2"),
        (dict(num_docs=MAX_DOCS + 1), "num_docs must be"),
        (dict(hops=(3,)), "hops"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(DatasetError, match=message):
        generate(2, **kwargs)


def test_single_hop_only_allows_one_document():
    items = generate(3, 1, seed=0, hops=(1,))
    assert all(len(i.documents) == 1 and i.gold == (0,) for i in items)
