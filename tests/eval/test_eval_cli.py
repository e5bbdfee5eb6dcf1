"""`lazyattn eval` end to end on the tiny model (random weights: the scores are not the point, the plumbing
is: every run answers every cell, modes with the same semantics answer alike, files are written)."""

from __future__ import annotations

import json
import statistics

import pytest

from lazyattn.cli import main
from lazyattn.eval.harness import CellResult, RunSpec
from lazyattn.eval.metrics import Scores
from lazyattn.qa.dataset import read_jsonl
from lazyattn.qa.synthetic import generate

ARGS = [
    "eval",
    "--model",
    "tiny",
    "--device",
    "cpu",
    "--page-size",
    "16",
    "--limit",
    "2",
    "--max-tokens",
    "4",
    "--no-progress",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval")
    code = main(ARGS + ["--num-docs", "2,3", "--out", str(out)])
    return code, out, json.loads((out / "eval.json").read_text())


def test_every_run_answers_every_cell(run):
    code, out, data = run
    assert code == 0
    cells = [(c["run"], c["num_docs"], c["position"]) for c in data["cells"]]
    # two documents, one gold: "middle" shows what "first" shows and is not re-run
    expected_cells = [(2, "first"), (2, "last"), (3, "first"), (3, "middle"), (3, "last")]
    assert cells == [(m, n, p) for m in ("full", "prefix", "block", "lazy") for n, p in expected_cells]
    assert data["aliases"] == {"2 docs, gold middle": "2 docs, gold first"}
    for c in data["cells"]:
        assert c["n"] == 2 and [i["id"] for i in c["items"]] == ["eval-0-0", "eval-0-1"]
    for name in ("eval.json", "eval.md", "accuracy.png"):
        assert (out / name).stat().st_size > 0
    assert "| full | " in (out / "eval.md").read_text()


def test_scores_are_those_of_the_stored_answers(run):
    _, _, data = run
    items = {i.id: i for i in generate(2, 3, seed=0)}
    for c in data["cells"]:
        for r in c["items"]:
            assert Scores(r["accuracy"], r["exact_match"], r["f1"]) == Scores.of(r["output"], items[r["id"]].answers)
        assert c["accuracy"] == pytest.approx(sum(r["accuracy"] for r in c["items"]) / 2)


def test_results_reload_from_the_json(run):
    _, _, data = run
    for c in data["cells"]:
        again = CellResult.from_dict(c).to_dict()
        assert json.loads(json.dumps(again)) == c


def test_same_semantics_same_answers(run):
    # lazy and block compute the same block attention; prefix and full the same causal attention
    _, _, data = run
    out = {(c["run"], c["num_docs"], c["position"]): [r["output"] for r in c["items"]] for c in data["cells"]}
    for (mode, n, p), answers in out.items():
        twin = {"lazy": "block", "block": "lazy", "prefix": "full", "full": "prefix"}[mode]
        assert answers == out[(twin, n, p)]


def test_documents_shared_across_cells_are_reused_by_lazy(run):
    _, _, data = run
    lazy = [c for c in data["cells"] if c["run"] == "lazy"]
    full = [c for c in data["cells"] if c["run"] == "full"]
    assert all(c["cached_tokens_mean"] == 0 for c in full)
    # the 2-document cells come first; later cells show the same documents again, in other slots
    assert lazy[-1]["cached_tokens_mean"] > 0
    assert all(c["prompt_tokens_mean"] > 0 and c["ttft_ms_mean"] > 0 for c in data["cells"])


def test_a_jsonl_file_in_original_order(tmp_path, capsys):
    assert main(ARGS + ["--num-docs", "3", "--write-dataset", str(tmp_path / "set.jsonl")]) == 0
    written = read_jsonl(tmp_path / "set.jsonl")
    assert written == generate(2, 3, "first", seed=0)
    assert main(ARGS + ["--dataset", str(tmp_path / "set.jsonl"), "--modes", "lazy", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "eval.json").read_text())
    assert [(c["run"], c["num_docs"], c["position"]) for c in data["cells"]] == [("lazy", None, "original")]
    assert "all docs / original" in capsys.readouterr().out


def test_run_options_reach_the_engine(capsys):
    # an engine option given per run is passed to LLM(...): an invalid one is the engine's error
    assert main(ARGS + ["--modes", "lazy:page_size=24"]) == 2
    assert "page_size must be a power of two" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--modes", "fast"], "unknown mode 'fast'"),
        (["--gold-position", "top"], "--gold-position: unknown top"),
        (["--num-docs", "0"], "--num-docs: expected positive"),
        (["--num-docs", "all"], "needs a dataset file"),
        (["--dataset", "builtin:huge"], "unknown built-in size"),
        (["--engine-option", "page_size"], "not key=value"),
        (["--modes", "lazy:answer=vote"], "unknown answer='vote'"),
    ],
)
def test_bad_arguments_are_clear_errors(capsys, extra, message):
    assert main(ARGS + extra) == 2
    assert message in capsys.readouterr().err


def test_run_spec_parsing():
    assert RunSpec.parse("lazy:relink_tokens=16:tag=x") == RunSpec(
        "lazy:relink_tokens=16:tag=x", "lazy", {"relink_tokens": 16, "tag": "x"}
    )
    assert RunSpec.parse(" full ") == RunSpec("full", "full", {})
    # the answering strategy is the run's, not an engine option
    assert RunSpec.parse("lazy:ape_prefix=true:answer=best-document") == RunSpec(
        "lazy:ape_prefix=true:answer=best-document", "lazy", {"ape_prefix": True}, "best-document"
    )


def test_best_document_runs_end_to_end(tmp_path):
    out = tmp_path / "best"
    assert main(ARGS + ["--num-docs", "3", "--modes", "lazy,lazy:answer=best-document", "--out", str(out)]) == 0
    data = json.loads((out / "eval.json").read_text())
    assert [r["answer"] for r in data["runs"]] == ["joint", "best-document"]
    cells = [c for c in data["cells"] if c["run"] == "lazy:answer=best-document"]
    assert cells and all(c["answer"] == "best-document" and c["n"] == 2 for c in cells)
    # each answer names the document it read, and whether that one holds the answer (the cell's gold slot)
    for c in cells:
        gold_slot = {"first": 0, "middle": 1, "last": 2}[c["position"]]
        items = c["items"]
        assert all(i["answered_from"] in (0, 1, 2) for i in items)
        assert [i["read_gold"] for i in items] == [i["answered_from"] == gold_slot for i in items]
        assert c["read_gold"] == sum(i["read_gold"] for i in items) / len(items)
    joint = [c for c in data["cells"] if c["run"] == "lazy"]
    assert all(c["read_gold"] is None and i["answered_from"] is None for c in joint for i in c["items"])
    assert "read gold %" in (out / "eval.md").read_text()


def test_each_last_runs_end_to_end_and_says_whether_it_read_the_gold_document_last(tmp_path):
    out = tmp_path / "each"
    assert main(ARGS + ["--num-docs", "3", "--modes", "lazy:answer=each-last", "--out", str(out)]) == 0
    cells = json.loads((out / "eval.json").read_text())["cells"]
    assert cells and all(c["answer"] == "each-last" for c in cells)
    for c in cells:
        gold_slot = {"first": 0, "middle": 1, "last": 2}[c["position"]]
        for i in c["items"]:
            order = i["document_order"]
            assert i["answered_from"] is None
            # moved: one document taken out of its place and put last, the others in the given order
            assert order is None or (order[:-1] == sorted(order[:-1]) and order[-1] != 2 and sorted(order) == [0, 1, 2])
            assert i["read_gold"] == (None if order is None else order[-1] == gold_slot)


def test_every_accuracy_has_its_bootstrap_interval_and_runs_are_compared_pairwise(run):
    _, out, data = run
    for c in data["cells"]:
        lo, hi = c["accuracy_ci"]
        assert 0.0 <= lo <= c["accuracy"] <= hi <= 1.0
    by_cell = {(c["run"], c["num_docs"], c["position"]): c for c in data["cells"]}
    comps = data["comparisons"]
    assert {(d["run"], d["baseline"]) for d in comps} == {(m, "full") for m in ("prefix", "block", "lazy")}
    for d in comps:
        a = by_cell[("full", d["num_docs"], d["position"])]["accuracy"]
        b = by_cell[(d["run"], d["num_docs"], d["position"])]["accuracy"]
        assert d["accuracy_diff"] == pytest.approx(b - a)
        assert d["significant"] == (d["ci"][0] > 0 or d["ci"][1] < 0)
    md = (out / "eval.md").read_text()
    assert "95% bootstrap CI" in md and "Accuracy difference from full" in md


def test_limit_applies_to_the_real_set(tmp_path, capsys):
    path = tmp_path / "real.jsonl"
    assert (
        main(["eval", "--dataset", "builtin:real", "--limit", "7", "--num-docs", "10", "--write-dataset", str(path)])
        == 0
    )
    items = read_jsonl(path)
    assert len(items) == 7 and all(len(i.documents) == 10 and i.gold == (0,) for i in items)
    code = main(["eval", "--dataset", "builtin:real", "--num-docs", "21", "--write-dataset", str(path)])
    assert code != 0 and "20 documents" in capsys.readouterr().err


@pytest.mark.parametrize("dataset", ["builtin:real", "builtin:icl-language", "builtin:small", "FILE"])
def test_skip_leaves_out_the_first_questions(tmp_path, capsys, dataset):
    """--skip N --limit M is questions N .. N+M-1 of what --limit N+M reads, for every kind of set; a skip past the
    end is a one-line error."""
    file = tmp_path / "qs.jsonl"
    assert main(["eval", "--dataset", "builtin:real", "--limit", "9", "--write-dataset", str(file)]) == 0
    dataset = str(file) if dataset == "FILE" else dataset
    docs = ["--num-docs", "5"] + (["--gold-position", "first"] if dataset == "builtin:real" else [])

    def written(*flags: str) -> list:
        path = tmp_path / "out.jsonl"
        assert main(["eval", "--dataset", dataset, *docs, *flags, "--write-dataset", str(path)]) == 0
        return read_jsonl(path)

    whole = written("--limit", "7")
    assert [i.question for i in written("--skip", "3", "--limit", "4")] == [i.question for i in whole[3:7]]
    assert [i.question for i in written("--skip", "5", "--limit", "2")] == [i.question for i in whole[5:7]]
    capsys.readouterr()
    assert main(["eval", "--dataset", str(file), "--skip", "9", "--write-dataset", str(tmp_path / "x.jsonl")]) != 0
    assert "--skip 9 leaves no question" in capsys.readouterr().err


def test_both_placements_runs_end_to_end_and_keeps_one_placements_answer(tmp_path):
    """Beside the documents read in order and read in parallel, each answer of both-placements is the answer of the
    placement it says it kept."""
    out = tmp_path / "placements"
    p = "lazy:ape_prefix=true"
    modes = f"{p},{p}:ape_parallel=true,{p}:answer=both-placements"
    assert main(ARGS + ["--num-docs", "3", "--modes", modes, "--batch-size", "1", "--out", str(out)]) == 0
    cells = json.loads((out / "eval.json").read_text())["cells"]
    by = {(c["run"], c["position"]): {i["id"]: i for i in c["items"]} for c in cells}
    chosen = [c for c in cells if c["answer"] == "both-placements"]
    assert chosen
    for c in chosen:
        for item in c["items"]:
            placed = f"{p}:ape_parallel=true" if item["read_in_parallel"] else p
            assert item["output"] == by[(placed, c["position"])][item["id"]]["output"]
            assert item["read_gold"] is None and item["document_order"] is None


def placements_with_confidence(out, chosen: str, batch: int) -> tuple[list[dict], dict]:
    """Cells of the shared prefix read in order, in parallel and as `chosen` (a both-placements run), evaluated with
    --confidence; and their items by (run, gold position) and question id."""
    p = "lazy:ape_prefix=true"
    modes = f"{p},{p}:ape_parallel=true,{p}:{chosen}"
    args = ["--num-docs", "3", "--modes", modes, "--batch-size", str(batch), "--confidence", "--out", str(out)]
    assert main(ARGS + args) == 0
    cells = json.loads((out / "eval.json").read_text())["cells"]
    return cells, {(c["run"], c["position"]): {i["id"]: i for i in c["items"]} for c in cells}


def test_confidence_is_recorded_and_is_what_both_placements_chose_by(tmp_path):
    """With --confidence every answer carries its mean token log-probability; a both-placements answer carries the
    confidence of the placement it kept, which is the higher of the two placements' own (asked as runs of their
    own); without the flag none is recorded."""
    p = "lazy:ape_prefix=true"
    cells, by = placements_with_confidence(tmp_path / "confidence", "answer=both-placements", 1)
    items = [i for c in cells for i in c["items"]]
    assert items and all(i["confidence"] is not None and -50 < i["confidence"] <= 0 for i in items)
    for c in cells:
        if c["answer"] != "both-placements":
            continue
        for item in c["items"]:
            given, parallel = (by[(run, c["position"])][item["id"]] for run in (p, f"{p}:ape_parallel=true"))
            kept = parallel if item["read_in_parallel"] else given
            assert item["confidence"] == pytest.approx(kept["confidence"], abs=1e-6)
            assert item["confidence"] == pytest.approx(max(given["confidence"], parallel["confidence"]), abs=1e-6)
    plain = tmp_path / "plain"
    assert main(ARGS + ["--num-docs", "3", "--modes", "lazy", "--out", str(plain)]) == 0
    assert all(
        i["confidence"] is None for c in json.loads((plain / "eval.json").read_text())["cells"] for i in c["items"]
    )


def test_token_logprobs_are_recorded_and_a_first_token_choice_keeps_the_surer_first_token(tmp_path):
    """With --confidence every answer carries its tokens' log-probabilities (their mean its confidence); a
    both-placements run with confidence_tokens=1 keeps, per question, the placement whose first token is surer (in
    order on a tie), in full."""
    p = "lazy:ape_prefix=true"
    cells, by = placements_with_confidence(tmp_path / "first", "answer=both-placements:confidence_tokens=1", 2)
    for item in (i for c in cells for i in c["items"]):
        assert item["confidence"] == pytest.approx(statistics.fmean(item["token_logprobs"]), abs=1e-6)
    chosen = [c for c in cells if c["answer"] == "both-placements"]
    assert chosen and all(c["confidence_tokens"] == 1 for c in chosen)
    for c in chosen:
        for item in c["items"]:
            given, parallel = (by[(run, c["position"])][item["id"]] for run in (p, f"{p}:ape_parallel=true"))
            surer = parallel if parallel["token_logprobs"][0] > given["token_logprobs"][0] else given
            assert item["read_in_parallel"] == (surer is parallel)
            assert item["output"] == surer["output"]
            assert item["token_logprobs"] == pytest.approx(surer["token_logprobs"], abs=1e-6)
