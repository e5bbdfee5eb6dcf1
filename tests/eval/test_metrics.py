"""Answer scores on hand-computed cases (SQuAD normalisation: lowercase, no punctuation, no a/an/the)."""

from __future__ import annotations

import math

import pytest

from lazyattn.eval.metrics import (
    Scores,
    accuracy,
    bootstrap_ci,
    exact_match,
    normalize_answer,
    paired_bootstrap_diff,
    token_f1,
)


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


def test_bootstrap_of_all_correct_or_all_wrong_is_a_point():
    assert bootstrap_ci([1.0] * 30) == (1.0, 1.0)
    assert bootstrap_ci([0.0] * 7) == (0.0, 0.0)
    assert bootstrap_ci([]) is None


def test_bootstrap_matches_the_normal_approximation():
    # 200 questions, 60 % correct: the normal interval is p +- 1.96 sqrt(p (1 - p) / n) = 0.6 +- 0.0679
    values = [1.0] * 120 + [0.0] * 80
    lo, hi = bootstrap_ci(values, resamples=4000, seed=1)
    half = 1.96 * math.sqrt(0.6 * 0.4 / 200)
    assert lo == pytest.approx(0.6 - half, abs=0.012) and hi == pytest.approx(0.6 + half, abs=0.012)
    assert bootstrap_ci(values, seed=3) == bootstrap_ci(values, seed=3)  # seeded: reprints the same numbers


def test_bootstrap_interval_narrows_with_more_questions():
    small = bootstrap_ci([1.0, 0.0] * 10)
    large = bootstrap_ci([1.0, 0.0] * 500)
    assert small[1] - small[0] > 3 * (large[1] - large[0])


def test_paired_difference_of_identical_runs_is_zero_and_not_significant():
    a = [1.0, 0.0, 1.0, 1.0, 0.0] * 8
    d = paired_bootstrap_diff(a, a)
    assert (d.mean, d.low, d.high, d.n) == (0.0, 0.0, 0.0, 40)
    assert not d.significant and d.describe().endswith("no significant difference")


def test_paired_difference_hand_cases():
    # b answers every question a answers, plus 30 of 100 more: +30 points, every resample in [+0.2, +0.4]
    a = [1.0] * 50 + [0.0] * 50
    b = [1.0] * 80 + [0.0] * 20
    d = paired_bootstrap_diff(a, b)
    assert d.mean == pytest.approx(0.3) and 0.2 < d.low < 0.3 < d.high < 0.4
    assert d.significant and "no significant" not in d.describe()
    # one question of 100 flips: the interval holds 0, so it is no significant difference, not a gain
    c = [1.0] * 51 + [0.0] * 49
    d = paired_bootstrap_diff(a, c)
    assert d.mean == pytest.approx(0.01) and d.low <= 0 <= d.high and not d.significant
    assert "no significant difference" in d.describe()
    # pairs need both runs' scores of the same questions
    with pytest.raises(ValueError):
        paired_bootstrap_diff([1.0], [1.0, 0.0])
