"""benchmarks/quality_positions.py: the rows it builds for each document placement, its batched greedy decoding,
and its summary table."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import quality_positions as qp
from lazyattn.finetune.masks import additive, row

segments_st = st.lists(st.lists(st.integers(1, 90), min_size=1, max_size=6), min_size=2, max_size=5)
tail_st = st.lists(st.integers(1, 90), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(segments_st, tail_st)
def test_spread_one_is_the_served_row_with_the_shared_prefix(segments, tail):
    """Spread 1 reads every document at its sequential start: the training rows' construction of lazy mode with
    the shared prefix (finetune/masks.py)."""
    tokens, positions, mask = qp.placed_row(segments, tail, 1.0)
    want = row(segments, tail, block=True, ape_prefix=True)
    assert tokens == want.tokens and positions == want.positions
    assert torch.equal(mask, additive(want.visible))


def test_spread_zero_puts_every_document_at_the_first_segments_end():
    """A hand case: S_0 of 2 tokens, documents of 3 and 2, a tail of 2, every document at L_0 = 2."""
    tokens, positions, mask = qp.placed_row([[1, 2], [3, 4, 5], [6, 7]], [8, 9], 0.0, scale=0.5)
    assert tokens == [1, 2, 3, 4, 5, 6, 7, 8, 9]  # no copy of S_0: every document starts where S_0 ends
    assert positions == [0, 1, 2, 3, 4, 2, 3, 5, 6]  # the tail after the longer document
    seen = mask > torch.finfo(torch.float32).min
    want = torch.zeros(9, 9, dtype=torch.bool)
    want[0, 0] = want[1, :2] = True
    for lo, hi in ((2, 5), (5, 7)):
        for i in range(lo, hi):
            want[i, :2] = True
            want[i, lo : i + 1] = True
    want[7, :8] = want[8, :9] = True
    assert torch.equal(seen, want)
    # ln(scale) on the tail's document scores only
    assert torch.allclose(mask[7:, 2:7], torch.full((2, 5), math.log(0.5)))
    assert torch.equal(mask[7:, :2], torch.zeros(2, 2)) and mask[2:7][seen[2:7]].eq(0).all()


def test_a_document_read_after_its_sequential_start_sees_its_own_copy_of_the_first_segment():
    """Spread 0.5: the second document starts at L_0 + floor(0.5 * 3) = 3, so it is encoded after a copy of S_0 at
    positions 1..2 (as lazy mode encodes it after S_0); the tail never sees the copy."""
    tokens, positions, mask = qp.placed_row([[1, 2], [3, 4, 5], [6, 7]], [8], 0.5)
    assert tokens == [1, 2, 3, 4, 5, 1, 2, 6, 7, 8]
    assert positions == [0, 1, 2, 3, 4, 1, 2, 3, 4, 5]
    seen = mask > torch.finfo(torch.float32).min
    assert seen[7, 5:8].all() and not seen[7, :5].any()  # the document: its copy and itself
    assert not seen[9, 5:7].any() and seen[9, :5].all() and seen[9, 7:].all()


def test_two_placements_read_every_document_twice_the_second_moved_to_end_where_the_first_does():
    """A hand case of spread=1+0:end: S_0 of 2 tokens, documents of 3 and 2, a tail of 1. In order the documents
    start at 2 and 5 and end at 7; at spread 0 both start at 2 and end by 5, so `end` moves them 2 later, to 4.
    Every copy read somewhere other than L_0 has its own copy of S_0 just before it; the tail, at 7, sees S_0 and
    the four document copies, ln(scale) on each."""
    tokens, positions, mask = qp.placed_row([[1, 2], [3, 4, 5], [6, 7]], [8], (1.0, 0.0), scale=0.5, end=True)
    assert tokens == [1, 2, 3, 4, 5, 1, 2, 6, 7, 1, 2, 3, 4, 5, 1, 2, 6, 7, 8]
    assert positions == [0, 1, 2, 3, 4, 3, 4, 5, 6, 2, 3, 4, 5, 6, 2, 3, 4, 5, 7]
    seen = mask > torch.finfo(torch.float32).min
    documents = [2, 3, 4, 7, 8, 11, 12, 13, 16, 17]
    assert seen[18].tolist() == [i in (0, 1, 18, *documents) for i in range(19)]
    assert torch.allclose(mask[18, documents], torch.full((10,), math.log(0.5))) and mask[18, :2].eq(0).all()
    assert seen[13].tolist() == [i in (9, 10, 11, 12, 13) for i in range(19)]  # its copy of S_0 and itself
    # the first placement alone, without `end`, is the served row
    want = row([[1, 2], [3, 4, 5], [6, 7]], [8], block=True, ape_prefix=True)
    assert qp.placed_row([[1, 2], [3, 4, 5], [6, 7]], [8], (1.0,), end=True)[:2] == (want.tokens, want.positions)


def test_modes_parse_and_reject():
    assert qp.parse_mode("full") is None
    assert qp.parse_mode("spread=0.25:scale=0.5") == ((0.25,), 0.5, False)
    assert qp.parse_mode("spread=1+0:scale=0.5:end") == ((1.0, 0.0), 0.5, True)
    for bad in (
        "spread=2", "scale=0.5", "spread=0:scale=0", "spread=1:temperature=2", "spread", "spread=x", "spread=1+1",
        "spread=1+", "spread=1:end=2",
    ):  # fmt: skip
        with pytest.raises(ValueError):
            qp.parse_mode(bad)


def test_batched_greedy_equals_one_row_at_a_time_without_a_cache():
    """The left-padded, cached batch gives each row the tokens that re-running its whole row for every new token
    gives (an independent, uncached decoding of the same rows)."""
    torch.manual_seed(0)
    model, _ = qp.load("tiny", torch.device("cpu"), torch.float32)
    rows = [
        qp.mode_row([[1, 2, 3], [4, 5, 6, 7], [8, 9]], [10, 11], "spread=0.5"),
        qp.mode_row([[1, 2], [12, 13]], [14], "full"),
        qp.mode_row([[3, 4], [5, 6, 7], [8]], [9, 10, 11], "spread=0:scale=0.5"),
    ]
    got = qp.greedy(model, rows, 5, set(), torch.device("cpu"), torch.float32)
    for (tokens, positions, mask), (answer, sureness) in zip(rows, got):
        tokens, positions, want, logprobs = list(tokens), list(positions), [], []
        for _ in range(5):
            n = len(tokens)
            full = torch.full((n, n), torch.finfo(torch.float32).min)
            full[: mask.shape[0], : mask.shape[1]] = mask
            full[mask.shape[0] :, :] = torch.where(torch.ones(n, n).tril().bool(), 0.0, full)[mask.shape[0] :]
            with torch.no_grad():
                logits = model(
                    input_ids=torch.tensor([tokens]),
                    position_ids=torch.tensor([positions]),
                    attention_mask=full[None, None],
                ).logits
            nxt = int(logits[0, -1].argmax())
            logprobs.append(float(logits[0, -1].log_softmax(-1)[nxt]))
            want.append(nxt)
            tokens.append(nxt)
            positions.append(positions[-1] + 1)
        assert answer == want
        assert sureness == pytest.approx(sum(logprobs) / len(logprobs), abs=1e-4)


def test_summary_reads_per_question_accuracies():
    """Two questions, hand-made: full answers both at every position, spread=0 one of them first only."""
    results = {}
    for p in qp.POSITIONS:
        results[f"m|s|5|{p}|full"] = {"ids": ["a", "b"], "accuracy": [1.0, 1.0], "outputs": ["", ""]}
        acc = [1.0, 0.0] if p == "first" else [0.0, 0.0]
        results[f"m|s|5|{p}|spread=0"] = {"ids": ["a", "b"], "accuracy": acc, "outputs": ["", ""]}
    text = qp.summary(results)
    assert "| full | 100.0 | 100.0 | 100.0 | 100.0 | - | - | - | - |" in text
    line = next(x for x in text.splitlines() if x.startswith("| spread=0 |"))
    cells = [c.strip() for c in line.split("|")[1:-1]]
    assert cells[1:5] == ["50.0", "0.0", "0.0", "16.7"]
    assert cells[5].startswith("-83.3") and cells[7].startswith("-100.0")


def test_run_and_summary_end_to_end(tmp_path, capsys):
    """The command line on the tiny model: every (model, set, position, mode) answered for each question, and the
    summary's table of them."""
    out = tmp_path / "positions.json"
    qp.main(["run", str(out), "--models", "tiny", "--sets", "real-heldout", "--modes", "full,spread=0", "--limit", "2"])
    results = json.loads(out.read_text())
    want = [f"tiny|real-heldout|5|{p}|{m}" for p in qp.POSITIONS for m in ("full", "spread=0")]
    assert sorted(results) == sorted(want)
    for r in results.values():
        assert len(r["ids"]) == len(r["accuracy"]) == len(r["outputs"]) == len(r["confidence"]) == 2
        assert all(c <= 0 for c in r["confidence"])
    capsys.readouterr()
    qp.main(["summary", str(out), "--surer", "full,spread=0"])
    text = capsys.readouterr().out
    assert "### `tiny`, `builtin:real-heldout`, 5 documents (2 questions)" in text and "| spread=0 |" in text
    assert "| surer:full,spread=0 |" in text


def test_surer_keeps_each_questions_most_confident_answer():
    """Hand case: per question the mode with the higher mean log-probability wins, the earlier one on a tie."""
    results = {
        "m|s|5|first|a": {"ids": ["x", "y", "z"], "accuracy": [1.0, 0.0, 1.0], "outputs": ["a1", "a2", "a3"],
                        "confidence": [-0.1, -2.0, -1.0]},
        "m|s|5|first|b": {"ids": ["x", "y", "z"], "accuracy": [0.0, 1.0, 0.0], "outputs": ["b1", "b2", "b3"],
                        "confidence": [-0.5, -0.2, -1.0]},
        "m|s|5|middle|a": {"ids": ["x"], "accuracy": [1.0], "outputs": ["a"], "confidence": [-1.0]},
    }  # fmt: skip
    got = qp.with_surer(results, ["a", "b"])
    picked = got["m|s|5|first|surer:a,b"]
    assert picked["outputs"] == ["a1", "b2", "a3"] and picked["accuracy"] == [1.0, 1.0, 1.0]
    assert "m|s|5|middle|surer:a,b" not in got  # b did not answer there
    assert all(got[k] == v for k, v in results.items())
