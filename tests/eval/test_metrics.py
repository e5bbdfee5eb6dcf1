"""Answer scores on hand-computed cases (SQuAD normalisation: lowercase, no punctuation, no a/an/the)."""

from __future__ import annotations

import pytest

from lazyattn.eval.metrics import Scores, accuracy, exact_match, normalize_answer, token_f1


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The  Quick, brown fox!", "quick brown fox"),
        ("An apple a day", "apple day"),
        ("Theatre of Anna", "theatre of anna"),  # articles only as whole words
        ("  Brostus-Group.\n", "brostusgroup"),  # punctuation is deleted, not turned into a space
        ("", ""),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_accuracy_is_containment_after_normalising():
    assert accuracy("Cobeck was founded in 1131.", ["1131"]) == 1.0
    assert accuracy("It works for the BROSTUS group!", ["Brostus Group"]) == 1.0
    assert accuracy("Cabeck", ["Cobeck"]) == 0.0
    assert accuracy("Paris", ["London", "paris"]) == 1.0  # any acceptable answer
    assert accuracy("", ["x"]) == 0.0


def test_an_answer_that_normalises_to_nothing_never_counts():
    assert accuracy("The answer is anything", ["The", "!"]) == 0.0


def test_exact_match():
    assert exact_match("The Brostus Group.", ["brostus group"]) == 1.0
    assert exact_match("Brostus Group works", ["Brostus Group"]) == 0.0
    assert exact_match("1131", ["1130", "1131"]) == 1.0


def test_token_f1_hand_cases():
    # 2 common of 3 predicted, 2 of 2 true: P 2/3, R 1 -> 2 * (2/3) / (5/3) = 0.8
    assert token_f1("Brostus Group works", ["Brostus Group"]) == pytest.approx(0.8)
    # best answer counts: "paris" gives P 1/2, R 1 -> 2/3
    assert token_f1("paris france", ["london", "paris"]) == pytest.approx(2 / 3)
    # multiset overlap: "x y y" vs "y y z" share two y's: P = R = 2/3
    assert token_f1("x y y", ["y y z"]) == pytest.approx(2 / 3)
    assert token_f1("nothing shared", ["other words"]) == 0.0
    assert token_f1("", ["x"]) == 0.0
    assert token_f1("The", ["a"]) == 1.0  # both normalise to no tokens: SQuAD counts that as a match


def test_scores_bundle():
    assert Scores.of("The Brostus Group.", ["Brostus Group"]) == Scores(1.0, 1.0, 1.0)
    assert Scores.of("Largila works for Brostus Group", ["Brostus Group"]) == Scores(1.0, 0.0, pytest.approx(4 / 7))
