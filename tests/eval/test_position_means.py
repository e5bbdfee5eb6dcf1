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
