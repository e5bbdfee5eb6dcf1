"""The mean over gold positions that docs/quality.md's targets use: checked against hand-computed cases."""

from __future__ import annotations

import pytest

from lazyattn.eval.harness import Cell, CellResult, ItemResult, RunSpec
from lazyattn.eval.metrics import Scores
from lazyattn.eval.report import position_means, position_means_markdown


def cell(run: str, docs: int, position: str, correct: list[int]) -> CellResult:
    items = [
        ItemResult(f"q{i}", "single-hop", "", Scores(float(c), 0.0, 0.0), None, 10, 0, "stop")
        for i, c in enumerate(correct)
    ]
    return CellResult(RunSpec.parse(run), Cell(docs, position), items)


def test_the_mean_over_positions_and_its_difference_from_full():
    results = [
        cell("full", 5, "first", [1, 1, 0, 0]),
        cell("full", 5, "last", [1, 1, 1, 0]),
        cell("lazy", 5, "first", [0, 1, 0, 0]),
        cell("lazy", 5, "last", [1, 1, 1, 0]),
        cell("lazy", 10, "first", [1, 1, 1, 1]),  # a count at one position only: no mean reported
    ]
    rows = {(r["run"], r["num_docs"]): r for r in position_means(results)}
    assert set(rows) == {("full", 5), ("lazy", 5)}
    # per question, full: (1, 1, .5, 0) -> 0.625; lazy: (.5, 1, .5, 0) -> 0.5
    assert rows["full", 5]["accuracy"] == pytest.approx(0.625)
    assert rows["lazy", 5]["accuracy"] == pytest.approx(0.5)
    d = rows["lazy", 5]["diff"]
    assert d["mean"] == pytest.approx(-0.125)
    # the paired differences are (-.5, 0, 0, 0): every resample's mean lies in [-0.5, 0]
    assert -0.5 <= d["ci"][0] <= d["mean"] <= d["ci"][1] <= 0
    assert not d["significant"]  # an interval that reaches 0 is no result
    low, high = rows["full", 5]["accuracy_ci"]
    assert 0 <= low <= 0.625 <= high <= 1
    text = position_means_markdown(results)
    assert "| lazy | 50.0 [" in text and "-12.5 [" in text and "no significant difference" in text


def test_identical_runs_differ_by_exactly_zero():
    results = [cell(run, 5, pos, [1, 0, 1]) for run in ("full", "lazy") for pos in ("first", "middle", "last")]
    (lazy,) = [r for r in position_means(results) if r["run"] == "lazy"]
    assert lazy["diff"] == {"mean": 0.0, "ci": [0.0, 0.0], "significant": False}


def test_the_run_closest_in_its_worst_cell():
    """`closest`: the highest smallest difference from the baseline over a run's cells, ties to the higher mean.
    Hand-counted: per cell, lazy:a is 1 question down (-0.25) and then even; lazy:b even, then 2 up (+0.5) where
    full is (1, 1, 0, 0); lazy:c even in both and so tied on the worst cell with lazy:b, whose mean is higher."""
    results = [
        cell("full", 5, "original", [1, 1, 0, 0]),
        cell("full", 10, "original", [1, 1, 0, 0]),
        cell("lazy:a=1", 5, "original", [1, 0, 0, 0]),
        cell("lazy:a=1", 10, "original", [1, 1, 0, 0]),
        cell("lazy:b=1", 5, "original", [1, 1, 0, 0]),
        cell("lazy:b=1", 10, "original", [1, 1, 1, 1]),
        cell("lazy:c=1", 5, "original", [1, 1, 0, 0]),
        cell("lazy:c=1", 10, "original", [1, 1, 0, 0]),
    ]
    from lazyattn.eval.report import closest, comparisons, pivots

    best = closest(comparisons(results))
    assert best == {"run": "lazy:b=1", "baseline": "full", "worst": 0.0, "mean": 0.25}
    assert "Closest to full in its worst cell: lazy:b=1 (+0.0 points there, +25.0 on average" in pivots(results)
    assert closest([]) is None
