"""benchmarks/icl_calibration.py: contextual calibration's choice, by hand-computed cases."""

import math

import pytest
import torch

from benchmarks.icl_calibration import choose, content_free, label_tokens, table


def test_content_free_questions_keep_the_last_line():
    q = "Text: Bonjour tout le monde\nLanguage:"
    assert content_free(q, ["Text: N/A", "Text: "]) == ["Text: N/A\nLanguage:", "Text: \nLanguage:"]


def test_labels_sharing_a_first_token_are_refused():
    encode = {" french": [7, 1], " frisian": [7, 2], " german": [9]}.__getitem__
    assert label_tokens(encode, ["german", "french"]) == [9, 7]
    with pytest.raises(SystemExit, match="share a first token"):
        label_tokens(encode, ["french", "frisian", "german"])


def test_calibration_divides_by_the_content_free_probabilities():
    # Two questions, three labels. The model leans to label 0 whatever the input: after the content-free inputs it
    # gives label 0 probability 0.6, 1 and 2 0.2 each (the mean of two content-free rows).
    log = math.log
    rows = torch.tensor([[log(0.5), log(0.3), log(0.2)], [log(0.7), log(0.1), log(0.2)]])
    cf = torch.tensor([[[log(0.7), log(0.1), log(0.2)]] * 2, [[log(0.5), log(0.3), log(0.2)]] * 2])
    assert choose(rows, cf, calibrated=False) == [0, 0]
    # 0.5 / 0.6, 0.3 / 0.2, 0.2 / 0.2: label 1; 0.7 / 0.6, 0.1 / 0.2, 0.2 / 0.2: label 0 (1.17 > 1.0 > 0.5)
    assert choose(rows, cf, calibrated=True) == [1, 0]
    # Unnormalised rows (a label set's share of the vocabulary) choose alike: each is renormalised over the labels.
    assert choose(rows - 3.0, cf - 1.0, calibrated=True) == [1, 0]


def test_table_rows_per_run_and_cell():
    result = {
        "model": "m",
        "dataset": "d",
        "content_free": ["Text: N/A"],
        "cells": [
            {
                "num_docs": 5,
                "position": "original",
                "questions": 2,
                "runs": {
                    "full": {"plain": 50.0, "calibrated": 100.0, "calibrated_minus_first_plain": "+50.0",
                             "calibrated_minus_first_calibrated": "+0.0"},
                    "lazy": {"plain": 0.0, "calibrated": 50.0, "calibrated_minus_first_plain": "+0.0",
                             "calibrated_minus_first_calibrated": "-50.0"},
                },
            }
        ],
    }  # fmt: skip
    lines = table(result).splitlines()
    assert lines[2].startswith("| demonstrations | run | plain % | calibrated % | calibrated − full plain")
    assert lines[4] == "| 5 | full | 50.0 | 100.0 | +50.0 | +0.0 |"
    assert lines[5] == "| 5 | lazy | 0.0 | 50.0 | +0.0 | -50.0 |"
