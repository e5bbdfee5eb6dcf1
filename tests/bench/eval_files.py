"""`lazyattn eval` outputs made by hand for the tests of the scripts that summarise them."""

from __future__ import annotations

import json
from pathlib import Path


def write_eval(
    folder: Path,
    scores: dict[str, dict[str, list[float]]],
    parallel: dict[str, dict[str, int]] | None = None,
    confidence: dict[str, dict[str, list[float | None]]] | None = None,
    token_logprobs: dict[str, dict[str, list[list[float] | None]]] | None = None,
    reordered: dict[str, dict[str, int]] | None = None,
) -> None:
    """folder/eval.json with 5-document cells: run -> gold position -> each question's accuracy (ids q0, q1, ...);
    `parallel`: run -> gold position -> how many of its first questions were read in parallel; `confidence`: run ->
    gold position -> each answer's confidence (`lazyattn eval --confidence`; None where not given);
    `token_logprobs`: run -> gold position -> each answer's token log-probabilities (their mean its confidence where
    `confidence` gives none); `reordered`: as `parallel`, how many were read in another order (`document_order`)."""
    parallel, reordered = parallel or {}, reordered or {}
    confidence = dict(confidence or {})
    token_logprobs = token_logprobs or {}
    for run, by_position in token_logprobs.items():
        for position, answers in by_position.items():
            confidence.setdefault(run, {}).setdefault(
                position, [None if t is None else sum(t) / len(t) for t in answers]
            )
    cells = [
        {
            "run": run,
            "num_docs": 5,
            "position": position,
            "items": [
                {
                    "id": f"q{i}",
                    "accuracy": a,
                    "read_in_parallel": i < parallel.get(run, {}).get(position, 0),
                    "document_order": [4, 3, 2, 1, 0] if i < reordered.get(run, {}).get(position, 0) else None,
                    "confidence": confidence[run][position][i] if position in confidence.get(run, {}) else None,
                    "token_logprobs": token_logprobs[run][position][i]
                    if position in token_logprobs.get(run, {})
                    else None,
                }
                for i, a in enumerate(acc)
            ],
        }
        for run, by_position in scores.items()
        for position, acc in by_position.items()
    ]
    folder.mkdir(parents=True)
    (folder / "eval.json").write_text(json.dumps({"runs": [{"label": run} for run in scores], "cells": cells}))
