"""benchmarks/quality_runs_summary.py: each run's paired difference from full attention, or from a run named as the
baseline, on the mean over gold positions and per position, checked against accuracies chosen by hand."""

from __future__ import annotations

from benchmarks.quality_runs_summary import main

from .eval_files import write_eval


def test_every_run_against_full_and_against_a_named_baseline(tmp_path):
    half, none, every = [1.0] * 20 + [0.0] * 20, [0.0] * 40, [1.0] * 40
    write_eval(
        tmp_path / "blk-real-short-answer",
        {
            "full": {"first": half, "middle": half, "last": half},  # 50 %
            "lazy": {"first": none, "middle": half, "last": half},  # 33.3 %: -50 with the gold document first
            "lazy:x": {"first": half, "middle": half, "last": every},  # 66.7 %: +50 with it last
        },
    )
    text = main(tmp_path)
    assert "### `lazy` − full" in text and "### `lazy:x` − full" in text and "### `full`" not in text
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| blk | real | short-answer | 5 |")]
    lazy, x = rows
    assert lazy[4] == "50.0" and lazy[5].startswith("-16.7") and lazy[6].startswith("-50.0")
    assert lazy[7].startswith("+0.0") and lazy[7].endswith("n.s.")
    assert x[5].startswith("+16.7") and x[8].startswith("+50.0")
    # against lazy: full gains 50 points with the gold document first, lazy:x the same there and 50 more last
    rows = [line.split(" | ") for line in main(tmp_path, "lazy").splitlines() if line.startswith("| blk |")]
    assert "### `full` − lazy" in main(tmp_path, "lazy")
    full, x = rows
    assert full[4] == "33.3" and full[5].startswith("+16.7") and full[6].startswith("+50.0")
    assert x[5].startswith("+33.3") and x[6].startswith("+50.0") and x[8].startswith("+50.0")


def test_the_share_of_answers_read_in_parallel_per_gold_position(tmp_path):
    half = [1.0] * 20 + [0.0] * 20
    runs = {"full": {"first": half, "middle": half, "last": half}, "lazy:answer=both-placements": {}}
    runs["lazy:answer=both-placements"] = runs["full"]
    write_eval(tmp_path / "base-real-block-attention", runs, {"lazy:answer=both-placements": {"first": 10, "last": 4}})
    text = main(tmp_path)
    assert "### `lazy:answer=both-placements`: answers read in parallel (%)" in text
    row = next(line for line in text.splitlines() if line.startswith("| base | real | block-attention | 5 | 25 "))
    assert row.split(" | ")[4:] == ["25", "0", "10 |"]  # 10, 0 and 4 of 40
    # no table where the run read nothing in parallel
    write_eval(tmp_path / "none" / "blk-real-block-attention", runs)
    assert "read in parallel" not in main(tmp_path / "none")


def test_the_share_of_answers_read_in_another_order_per_gold_position(tmp_path):
    half = [1.0] * 20 + [0.0] * 20
    runs = {"full": {"first": half, "middle": half, "last": half}, "lazy:answer=both-orders": {}}
    runs["lazy:answer=both-orders"] = runs["full"]
    write_eval(
        tmp_path / "blk-real-short-answer", runs, reordered={"lazy:answer=both-orders": {"first": 30, "middle": 2}}
    )
    text = main(tmp_path)
    assert "### `lazy:answer=both-orders`: answers read in another order (%)" in text
    assert "read in parallel" not in text
    row = next(line for line in text.splitlines() if line.startswith("| blk | real | short-answer | 5 | 75 "))
    assert row.split(" | ")[4:] == ["75", "5", "0 |"]  # 30, 2 and 0 of 40
