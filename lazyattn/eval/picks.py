"""`lazyattn eval --pick-on N`: a setting picked on labelled questions of your own (docs/quality.md, "In-context
learning"). Every run answers the first N questions; the run closest to the baseline (full attention) in its worst
cell is picked (`report.closest`); the baseline and the pick then answer the others, and what they show is the check.
The same as a run with `--limit N` and one with `--skip N` (tests/eval/test_pick.py). cli.py runs them; this module
checks the arguments, makes the choice and writes down what came of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lazyattn.errors import InvalidRequestError
from lazyattn.eval import report
from lazyattn.eval.harness import CellResult, RunSpec
from lazyattn.qa.dataset import QAItem


def check(n: int, questions: int, runs: Sequence[RunSpec]) -> None:
    """--pick-on needs questions on both sides of N and at least one run besides the baseline to pick."""
    if not 1 <= n < questions:
        raise InvalidRequestError(
            f"--pick-on {n}: it must leave questions on both sides, between 1 and {questions - 1} of the {questions}",
            param="pick_on",
        )
    if len({r.label for r in runs}) < 2:
        raise InvalidRequestError(
            "--pick-on needs a baseline (full, or else the first run) and at least one other run in --modes to pick "
            "from",
            param="pick_on",
        )


def choose(comparisons: Sequence[dict[str, Any]], runs: Sequence[RunSpec]) -> tuple[RunSpec, RunSpec, dict[str, Any]]:
    """(the pick, the baseline, `report.closest`'s record of the pick) from the first N questions' comparisons."""
    best = report.closest(comparisons)
    if best is None:
        raise InvalidRequestError("--pick-on: no run could be compared with the baseline", param="pick_on")
    chosen = next(r for r in runs if r.label == best["run"])
    baseline = next(r for r in runs if r.label == best["baseline"])
    return chosen, baseline, best


def chance(items: Sequence[QAItem]) -> float | None:
    """A guess's accuracy on classification items that share one label set (1 / its size), else None."""
    sets = {tuple(i.labels) if i.labels else None for i in items}
    if len(sets) != 1 or None in sets:
        return None
    return 1 / len(next(iter(sets)))


def at_chance(checked: Sequence[CellResult], baseline: str, guess: float | None) -> list[dict[str, Any]]:
    """The check's cells in which the baseline is not above a guess's accuracy (its 95 % interval reaches down to
    it): there it does not learn the task either, and a difference from it compares two guesses."""
    if guess is None:
        return []
    out = []
    for r in checked:
        s = r.summary()
        if r.run.label == baseline and s["accuracy_ci"] is not None and s["accuracy_ci"][0] <= guess:
            out.append({"num_docs": r.cell.num_docs, "position": r.cell.position, "accuracy": s["accuracy"]})
    return out


def record(
    n: int,
    others: int,
    best: dict[str, Any],
    chosen: RunSpec,
    checked: Sequence[CellResult],
    comparisons: Sequence[dict[str, Any]],
    guess: float | None = None,
) -> dict[str, Any]:
    """eval.json's `pick`: the run picked on the first n questions and how, what serves it, and the check on the
    `others` questions (their cells and comparisons with the baseline; on a classification set, a guess's accuracy
    and the cells in which the baseline does no better)."""
    return {
        "on": n,
        **best,
        "options": {"mode": chosen.mode, **chosen.options},
        "answer": chosen.answer,
        "serve_flags": chosen.serve_flags,
        "check": {
            "questions": others,
            "comparisons": list(comparisons),
            "worst": min(c["accuracy_diff"] for c in comparisons),
            "significant_losses": [c for c in comparisons if c["significant"] and c["accuracy_diff"] < 0],
            "chance": guess,
            "baseline_at_chance": at_chance(checked, best["baseline"], guess),
            "position_means": report.position_means(checked),
            "cells": [r.to_dict() for r in checked],
        },
    }


def _cell_label(c: dict[str, Any]) -> str:
    return f"{'all' if c['num_docs'] is None else c['num_docs']} docs, gold {c['position']}"


def summary(pick: dict[str, Any]) -> str:
    """What --pick-on found, for a person: the pick, how it did on the others, and how to serve it."""
    check = pick["check"]
    losses = check["significant_losses"]
    verdict = (
        f"{len(losses)} cell(s) significantly below {pick['baseline']}: "
        + "; ".join(_cell_label(c) + f" {100 * c['accuracy_diff']:+.1f}" for c in losses)
        if losses
        else f"no cell significantly below {pick['baseline']}"
    )
    guesses = check.get("baseline_at_chance") or []
    caveat = (
        f"\n{pick['baseline']} is not above chance ({100 * check['chance']:.0f} %) in "
        + "; ".join(_cell_label(c) + f" ({100 * c['accuracy']:.1f} %)" for c in guesses)
        + ": it does not learn the task there, and a difference from it compares two guesses."
        if guesses
        else ""
    )
    return (
        f"Picked on the first {pick['on']} questions: {pick['run']} ({100 * pick['worst']:+.1f} points in its worst "
        f"cell there). On the other {check['questions']}: {100 * check['worst']:+.1f} points in its worst cell, "
        f"{verdict}.{caveat}\nServe it: lazyattn serve --model ... {pick['serve_flags']}"
    )
