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
