"""benchmarks/finetune_prefix_summary.py: every trained adapter's row and its paired difference from `block`,
checked against accuracies chosen by hand."""

from __future__ import annotations

from benchmarks.finetune_prefix_summary import main

from .eval_files import write_eval

POSITIONS = ("first", "middle", "last")


def write_adapter_eval(root, model: str, scores: dict[str, list[float]]) -> None:
    """eval/<model>-real-short-answer/eval.json: run -> accuracy per question, the same at every gold position."""
    write_eval(
        root / "eval" / f"{model}-real-short-answer", {r: dict.fromkeys(POSITIONS, a) for r, a in scores.items()}
    )


def test_each_adapter_is_compared_with_block(tmp_path):
    n = 40
    write_adapter_eval(
        tmp_path, "block", {"full": [1.0] * 20 + [0.0] * 20, "lazy:ape_prefix=true": [1.0] * 10 + [0.0] * 30}
    )
    write_adapter_eval(
        tmp_path, "cloze", {"full": [1.0] * 20 + [0.0] * 20, "lazy:ape_prefix=true": [1.0] * 20 + [0.0] * 20}
    )
    write_adapter_eval(tmp_path, "labelled", {"full": [0.0] * n, "lazy:ape_prefix=true": [1.0] * 10 + [0.0] * 30})
    text = main(tmp_path)
    table, versus = text.split("same questions:")
    rows = {line.split(" | ")[3]: line for line in table.splitlines() if line.startswith("| real | short-answer | 5 |")}
    # the per-model rows: block 50 % / 25 %, cloze 50 % / 50 %, labelled 0 % / 25 %
    assert "| block | 50.0 | 25.0 | -25.0" in rows["block"]
    assert "| cloze | 50.0 | 50.0 | +0.0" in rows["cloze"]
    assert "| labelled | 0.0 | 25.0 | +25.0" in rows["labelled"]
    versus = [line for line in versus.splitlines() if line.startswith("| real")]
    assert len(versus) == 2  # one per trained adapter, none for block itself
    cloze, labelled = (next(v for v in versus if f"| {m} |" in v) for m in ("cloze", "labelled"))
    assert cloze.split(" | ")[4].startswith("+0.0") and cloze.split(" | ")[5].startswith("+25.0")
    assert labelled.split(" | ")[4].startswith("-50.0") and labelled.split(" | ")[5].startswith("+0.0")
