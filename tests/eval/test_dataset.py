"""The JSONL item format and `arrange` (which documents a run shows, gold block where)."""

from __future__ import annotations

import json

import pytest

from lazyattn.qa.dataset import DatasetError, QAItem, arrange, gold_start, read_jsonl, write_jsonl


def _item(num_docs: int, gold: list[int]) -> QAItem:
    docs = [{"title": f"t{i}", "text": f"text {i}"} for i in range(num_docs)]
    return QAItem.from_dict({"id": "q", "question": "?", "answers": ["a"], "documents": docs, "gold": gold})


def _titles(item: QAItem) -> list[str]:
    return [d["title"] for d in item.documents]


@pytest.mark.parametrize(
    "position, expected",
    [
        ("first", ["t0", "t1", "t2", "t3", "t4"]),
        ("middle", ["t1", "t2", "t0", "t3", "t4"]),
        ("last", ["t1", "t2", "t3", "t4", "t0"]),
    ],
)
def test_one_gold_document_placed(position, expected):
    shown = arrange(_item(5, [0]), 5, position)
    assert _titles(shown) == expected
    assert shown.gold == (expected.index("t0"),)


def test_gold_block_keeps_reasoning_order_and_distractors_are_a_prefix():
    # gold [3, 1]: t3 then t1; 4 documents keep the first two distractors t0, t2; middle leaves one before
    shown = arrange(_item(6, [3, 1]), 4, "middle")
    assert _titles(shown) == ["t0", "t3", "t1", "t2"]
    assert shown.gold == (1, 2)
    assert _titles(arrange(_item(6, [3, 1]), 4, "last")) == ["t0", "t2", "t3", "t1"]


def test_original_order_only_drops_trailing_distractors():
    shown = arrange(_item(6, [4]), 3, "original")
    assert _titles(shown) == ["t0", "t1", "t4"]
    assert shown.gold == (2,)
    assert arrange(_item(6, [4]), None, "original") == _item(6, [4])


def test_gold_start_middle_rounds_down():
    assert [gold_start(k, "middle") for k in (0, 1, 4, 8, 9)] == [0, 0, 2, 4, 4]


def test_too_few_documents_for_the_gold_ones():
    with pytest.raises(DatasetError, match="cannot hold its 2 gold"):
        arrange(_item(4, [0, 1]), 1, "first")
    with pytest.raises(DatasetError, match="gold position"):
        arrange(_item(4, [0]), 2, "top")


def test_jsonl_round_trip_keeps_extra_fields(tmp_path):
    items = [
        _item(3, [2]),
        QAItem.from_dict(
            {
                "id": "x",
                "question": "Who?",
                "answers": ["Ann", "Anne"],
                "documents": ["plain text doc", {"title": "T", "text": "x"}],
                "gold": [1],
                "type": "two-hop",
                "source": {"k": 1},
            }
        ),
    ]
    write_jsonl(tmp_path / "d.jsonl", items)
    back = read_jsonl(tmp_path / "d.jsonl")
    assert back == items
    assert back[1].type == "two-hop" and back[1].extra["source"] == {"k": 1}
    assert back[1].documents[0] == {"title": "", "text": "plain text doc"}
    assert read_jsonl(tmp_path / "d.jsonl", limit=1) == items[:1]


def test_missing_ids_come_from_line_numbers(tmp_path):
    line = {"question": "q?", "answers": "a", "documents": ["d"], "gold": [0]}
    (tmp_path / "set.jsonl").write_text(json.dumps(line) + "\n\n" + json.dumps(line) + "\n")
    items = read_jsonl(tmp_path / "set.jsonl")
    assert [i.id for i in items] == ["set-1", "set-3"]
    assert items[0].answers == ("a",)


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"question": "q", "answers": ["a"], "documents": ["d"]}', "line 1: missing field 'gold'"),
        ('{"question": "q", "answers": ["a"], "documents": ["d"], "gold": [1]}', "gold index 1 is outside"),
        ('{"question": "q", "answers": [], "documents": ["d"], "gold": [0]}', "'answers' must be"),
        ('{"question": "q", "answers": ["a"], "documents": [{"title": "t"}], "gold": [0]}', r"documents\[0\]"),
        ('{"question": "q", "answers": ["a"], "documents": ["d", "e"], "gold": [0, 0]}', "repeats"),
        ('{"question": "q", "answers": ["a"], "documents": ["d"], "gold": [true]}', "document indices"),
        ('{"question": "q",', "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_bad_lines_are_reported_with_their_line(tmp_path, line, message):
    (tmp_path / "bad.jsonl").write_text(line + "\n")
    with pytest.raises(DatasetError, match=message):
        read_jsonl(tmp_path / "bad.jsonl")


def test_missing_or_empty_file(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        read_jsonl(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="holds no items"):
        read_jsonl(tmp_path / "empty.jsonl")
