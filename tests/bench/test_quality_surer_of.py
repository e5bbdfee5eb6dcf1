"""benchmarks/quality_surer_of.py: per question the surest of several runs' answers against the baseline, checked
against a case worked by hand (ties and answers without a confidence go to the run named first)."""

from __future__ import annotations

import pytest

from benchmarks.quality_surer_of import main, surest

from .eval_files import write_eval


def test_surest_breaks_ties_and_missing_confidences_toward_the_first_run():
    assert surest([{"confidence": -0.5}, {"confidence": -0.2}]) == 1
    assert surest([{"confidence": -0.2}, {"confidence": -0.2}]) == 0
    assert surest([{"confidence": None}, {"confidence": -9.0}]) == 1
    assert surest([{"confidence": None}, {"confidence": None}, {}]) == 0


def test_the_surest_answer_per_question_against_the_baseline(tmp_path):
    write_eval(
        tmp_path / "base-icl",
        {
            "full": {"first": [1, 1, 0, 0] * 10},
            "a": {"first": [1, 0, 1, 0] * 10},
            "b": {"first": [0, 1, 0, 1] * 10},
        },
        confidence={"a": {"first": [-0.1, -0.5, -0.2, -1.0] * 10}, "b": {"first": [-0.3, -0.2, -0.2, None] * 10}},
    )
    text = main([str(tmp_path / "base-icl" / "eval.json"), "--runs", "a,b"])
    row = next(line for line in text.splitlines() if line.startswith("| base-icl | 5 | first |")).split(" | ")
    # kept: a (surer), b (surer), a (tie), a (b has none): 1, 1, 1, 0 against full's 1, 1, 0, 0
    assert row[3] == "50.0"
    assert row[4].startswith("+0.0") and row[4].endswith("n.s.")  # a: 0, -1, +1, 0
    assert row[5].startswith("+0.0") and row[5].endswith("n.s.")  # b: -1, 0, 0, +1
    assert row[6].startswith("+25.0")
    assert row[7] == "30 / 10 |"
    # against a run named as the baseline
    row = next(
        line
        for line in main([str(tmp_path / "base-icl" / "eval.json"), "--runs", "b,full", "--baseline", "a"]).splitlines()
        if line.startswith("| base-icl |")
    )
    assert row.split(" | ")[3] == "50.0"


def test_runs_without_confidences_or_missing_are_refused(tmp_path):
    write_eval(tmp_path / "x", {"full": {"first": [1, 0]}, "a": {"first": [1, 1]}, "b": {"first": [0, 0]}})
    with pytest.raises(SystemExit, match="--confidence"):
        main([str(tmp_path / "x" / "eval.json"), "--runs", "a,b"])
    with pytest.raises(SystemExit, match=r"run\(s\) c"):
        main([str(tmp_path / "x" / "eval.json"), "--runs", "a,c"])
    with pytest.raises(SystemExit):
        main([str(tmp_path / "x" / "eval.json"), "--runs", "a"])


def test_the_surest_by_the_first_tokens_against_the_surest_by_the_whole_answer(tmp_path):
    # per question a's and b's answers, token by token; their means over the whole answer and over the first k
    a = [[-0.1, -2.0], [-0.5, -0.5], [-1.0], None]
    b = [[-0.3, -0.3], [-0.2, -1.6], [-1.0, -0.1], [-0.4]]
    write_eval(
        tmp_path / "blk-real",
        {"full": {"first": [1, 1, 1, 1] * 10}, "a": {"first": [1, 1, 0, 0] * 10}, "b": {"first": [0, 0, 1, 1] * 10}},
        token_logprobs={"a": {"first": a * 10}, "b": {"first": b * 10}},
    )
    text = main([str(tmp_path / "blk-real" / "eval.json"), "--runs", "a,b", "--first-tokens", "1,2"])
    row = next(line for line in text.splitlines() if line.startswith("| blk-real | 5 | first |")).split(" | ")
    # whole answers: q0 b (-0.3 > -1.05), q1 a (-0.5 > -0.9), q2 b (-0.55 > -1.0), q3 b (a has none): 0, 1, 1, 1
    assert row[6].startswith("-25.0")
    assert row[7] == "10 / 30"
    # first token: q0 a (-0.1), q1 b (-0.2), q2 a (tie), q3 b: 1, 0, 0, 1; against the whole answer's 0, 1, 1, 1
    assert row[9].startswith("-25.0 [")  # +1, -1, -1, 0 per group of four
    assert row[10] == "30"  # q0, q1, q2 kept from the other run
    # answer tokens against a's alone (2 + 2 + 1 + 0 = 5 per four questions): both in full, 5 + 7 = 12
    assert row[8] == "2.40"
    # at k = 1 the answer kept in full, the other's first token: q0 a 2 + 1, q1 b 2 + 1, q2 a 1 + 1, q3 b 1 + 0
    assert row[11] == "1.80"
    # first two tokens: the whole answers here, but q2's b (-0.55 > -1.0): the same choice throughout; every answer
    # is at most 2 tokens, so nothing is saved
    assert row[12].startswith("+0.0") and row[13] == "0" and row[14] == "2.40 |"


def test_first_tokens_need_the_token_log_probabilities(tmp_path):
    write_eval(
        tmp_path / "x",
        {"full": {"first": [1, 0]}, "a": {"first": [1, 1]}, "b": {"first": [0, 0]}},
        confidence={"a": {"first": [-0.1, -0.2]}, "b": {"first": [-0.3, -0.1]}},
    )
    with pytest.raises(SystemExit, match="token log-probabilities"):
        main([str(tmp_path / "x" / "eval.json"), "--runs", "a,b", "--first-tokens", "2"])
    with pytest.raises(SystemExit):
        main([str(tmp_path / "x" / "eval.json"), "--runs", "a,b", "--first-tokens", "0"])


def test_a_last_row_pools_every_cell_of_every_file(tmp_path):
    # two files, the same question ids: pooled, each question of each file counts once
    write_eval(
        tmp_path / "one",
        {"full": {"first": [1, 0] * 10}, "a": {"first": [1, 1] * 10}, "b": {"first": [0, 0] * 10}},
        confidence={"a": {"first": [-0.1, -0.9] * 10}, "b": {"first": [-0.5, -0.2] * 10}},
    )
    write_eval(
        tmp_path / "two",
        {"full": {"last": [0, 0] * 10}, "a": {"last": [0, 0] * 10}, "b": {"last": [1, 1] * 10}},
        confidence={"a": {"last": [-0.1, -0.1] * 10}, "b": {"last": [-0.5, -0.2] * 10}},
    )
    text = main([str(tmp_path / name / "eval.json") for name in ("one", "two")] + ["--runs", "a,b"])
    last = text.splitlines()[-1].split(" | ")
    assert last[0] == "| all"
    assert last[3] == "25.0"  # full: 10 of 40
    # kept: one's a (1), b (0); two's a (0), a (0): 10 of 40, against full's 10
    assert last[6].startswith("+0.0") and last[7] == "30 / 10 |"
    single = main([str(tmp_path / "one" / "eval.json"), "--runs", "a,b"])
    assert not single.splitlines()[-1].startswith("| all")  # one cell: nothing to pool
