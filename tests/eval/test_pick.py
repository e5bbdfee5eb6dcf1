"""`lazyattn eval --pick-on N`: the documented way to pick a setting on labelled questions of your own, in one
command. Every run on the first N questions, the run closest to full attention in its worst cell picked, then full
attention and the pick on the other questions. It must be what the two commands of docs/quality.md give: one run
with `--limit N`, then one with `--skip N` and the picked run."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from lazyattn.cli import main
from lazyattn.engine.config import cli_flags
from lazyattn.errors import InvalidRequestError
from lazyattn.eval.harness import RunSpec
from lazyattn.qa.dataset import read_jsonl, write_jsonl

BASE = ["eval", "--model", "tiny", "--device", "cpu", "--page-size", "16", "--max-tokens", "4", "--no-progress"]
DOCS = ["--num-docs", "2,3", "--gold-position", "first"]
MODES = "full,lazy,block,lazy:relink_tokens=2"
N, TOTAL = 4, 10


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Ten questions the tiny model's full attention answers in part: random weights answer noise, so every other
    question's answer is made what full attention says to it, and the runs then differ from full attention by
    different amounts."""
    root = tmp_path_factory.mktemp("pick")
    path = root / "questions.jsonl"
    assert main(["eval", "--dataset", "builtin:small", "--limit", str(TOTAL), "--write-dataset", str(path)]) == 0
    full = root / "full"
    assert main([*BASE, "--dataset", str(path), *DOCS, "--modes", "full", "--out", str(full)]) == 0
    said = {i["id"]: i["output"] for c in json.loads((full / "eval.json").read_text())["cells"] for i in c["items"]}
    items = read_jsonl(path)
    items = [replace(item, answers=(said[item.id],)) if k % 2 == 0 else item for k, item in enumerate(items)]
    write_jsonl(path, items)
    return path


@pytest.fixture(scope="module")
def picked(dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("picked")
    assert (
        main([*BASE, "--dataset", str(dataset), *DOCS, "--modes", MODES, "--pick-on", str(N), "--out", str(out)]) == 0
    )
    return json.loads((out / "eval.json").read_text()), (out / "eval.md").read_text()


def _worst(comparisons: list, run: str) -> float:
    return min(c["accuracy_diff"] for c in comparisons if c["run"] == run)


def test_the_pick_is_the_closest_run_of_a_run_on_the_first_n(picked, dataset, tmp_path):
    data, _ = picked
    out = tmp_path / "first"
    assert main([*BASE, "--dataset", str(dataset), *DOCS, "--modes", MODES, "--limit", str(N), "--out", str(out)]) == 0
    alone = json.loads((out / "eval.json").read_text())
    assert data["comparisons"] == alone["comparisons"]
    # by hand: the run whose smallest difference from full is highest, ties to the higher mean, then listed first
    runs = MODES.split(",")[1:]
    diffs = {r: [c["accuracy_diff"] for c in alone["comparisons"] if c["run"] == r] for r in runs}
    best = max(runs, key=lambda r: (min(diffs[r]), sum(diffs[r]) / len(diffs[r]), -runs.index(r)))
    pick = data["pick"]
    assert (pick["run"], pick["baseline"], pick["on"]) == (best, "full", N)
    assert pick["worst"] == _worst(alone["comparisons"], best)
    assert len({min(d) for d in diffs.values()}) > 1  # the runs differ: the pick is not a tie's first
    spec = RunSpec.parse(best)
    assert pick["options"] == {"mode": spec.mode, **spec.options} and pick["serve_flags"] == spec.serve_flags


def test_the_check_is_a_run_of_full_and_the_pick_on_the_others(picked, dataset, tmp_path):
    data, text = picked
    pick = data["pick"]
    out = tmp_path / "others"
    modes = f"full,{pick['run']}"
    assert main([*BASE, "--dataset", str(dataset), *DOCS, "--modes", modes, "--skip", str(N), "--out", str(out)]) == 0
    alone = json.loads((out / "eval.json").read_text())
    check = pick["check"]
    assert check["questions"] == TOTAL - N
    assert check["comparisons"] == alone["comparisons"]
    assert {c["run"] for c in check["cells"]} == {"full", pick["run"]}
    ids = [i.id for i in read_jsonl(dataset)]
    for c in check["cells"]:
        assert [i["id"] for i in c["items"]] == ids[N:]
    for c in data["cells"]:  # the pick's own cells: the first N only
        assert [i["id"] for i in c["items"]] == ids[:N]
    assert check["worst"] == _worst(alone["comparisons"], pick["run"])
    losses = [c for c in alone["comparisons"] if c["significant"] and c["accuracy_diff"] < 0]
    assert check["significant_losses"] == losses
    assert f"Picked on the first {N} questions: {pick['run']}" in text
    assert f"lazyattn serve --model ... {pick['serve_flags']}" in text


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--pick-on", "0"], "--pick-on 0: it must leave questions on both sides, between 1 and 9 of the 10"),
        (["--pick-on", "10"], "--pick-on 10: it must leave questions on both sides"),
        (["--pick-on", "3", "--modes", "full"], "--pick-on needs a baseline"),
        (["--pick-on", "3", "--fidelity"], "--pick-on is for accuracy runs, not with --fidelity"),
        (["--pick-on", "3", "--calibrate"], "--pick-on is for accuracy runs, not with --calibrate"),
        (["--pick-on", "3", "--write-dataset", "x.jsonl"], "--pick-on is for accuracy runs, not with --write-dataset"),
    ],
)
def test_a_pick_that_cannot_be_made_is_refused_before_the_model_loads(dataset, capsys, flags, message):
    capsys.readouterr()
    assert main([*BASE, "--dataset", str(dataset), *DOCS, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "lazyattn eval" not in capsys.readouterr().out


def test_serve_flags_name_the_mode_options_and_answer():
    run = RunSpec.parse("lazy:ape_prefix=true:relink_last_tokens=3:ape_temperature=0.9:answer=both-orders")
    assert (
        run.serve_flags == "--mode lazy --ape-prefix --relink-last-tokens 3 --ape-temperature 0.9 --answer both-orders"
    )
    assert RunSpec.parse("full").serve_flags == "--mode full"
    assert RunSpec.parse("lazy:ape_prefix=false:relink_tokens=0").serve_flags == "--mode lazy"  # defaults left out
    assert cli_flags({"ape_parallel": True, "ape_scale": 2.0}) == "--ape-parallel --ape-scale 2"
    with pytest.raises(InvalidRequestError, match="warm_up is not an option of lazyattn serve"):
        cli_flags({"warm_up": False})


def test_a_baseline_no_better_than_a_guess_is_named(picked, tmp_path):
    """On a classification set the check names the cells in which full attention is not above chance (1 / the number
    of labels): the tiny model's random weights name no label, 0 % everywhere. A question-answering set has no
    chance level."""
    data, _ = picked
    assert data["pick"]["check"]["chance"] is None and data["pick"]["check"]["baseline_at_chance"] == []
    out = tmp_path / "labels"
    flags = ["--dataset", "builtin:icl-language", "--limit", "6", "--num-docs", "5,10", "--max-tokens", "3"]
    assert main([*BASE, *flags, "--modes", "full,lazy", "--pick-on", "3", "--out", str(out)]) == 0
    check = json.loads((out / "eval.json").read_text())["pick"]["check"]
    assert check["chance"] == 1 / 5
    full = [c for c in check["cells"] if c["run"] == "full"]
    assert all(c["accuracy"] == 0 for c in full)
    expected = [{"num_docs": c["num_docs"], "position": c["position"], "accuracy": 0.0} for c in full]
    assert check["baseline_at_chance"] == expected
    assert "full is not above chance (20 %) in 5 docs, gold original (0.0 %); 10 docs" in (out / "eval.md").read_text()
