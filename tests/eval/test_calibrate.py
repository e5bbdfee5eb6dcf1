"""`lazyattn eval --calibrate` on the built-in `tiny` model: the first-token KL of each lazy-mode setting against
full attention equals torch's own, a single document read after the system prompt is full attention exactly (so
that setting is chosen, with a KL of zero), gold positions are reported apart, and bad combinations of flags are
one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from lazyattn import LLM, SamplingParams
from lazyattn.cli import main
from lazyattn.engine.request_options import RequestOptions
from lazyattn.errors import InvalidRequestError
from lazyattn.eval.calibrate import CalibrationPrompt, Setting, calibrate, grid, markdown, position_of

TEXTS = {
    "alder": "Alder trees grow by rivers. Their cones stay on the branches all winter long.",
    "basalt": "Basalt cools fast from lava. It forms tall columns near the sea in many places.",
    "cobalt": "Cobalt paints glass a deep blue colour. Potters mix it into their glaze.",
    "dunlin": "Dunlins are small wading birds. They feed on mud flats in large flocks.",
}
QUESTION = [{"role": "user", "content": "What grows by rivers?"}]


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for name, text in TEXTS.items():
        (folder / f"{name}.txt").write_text(text + "\n")
    return folder


def llm(mode: str) -> LLM:
    return LLM(model="tiny", mode=mode, device="cpu", page_size=16, progress=False)


PARAMS = SamplingParams(max_tokens=3, temperature=0.0, first_token_logprobs=True)


def test_each_settings_kl_is_torchs_and_positions_are_apart():
    docs = [{"title": n, "text": t} for n, t in TEXTS.items()]
    prompts = [
        CalibrationPrompt(QUESTION, docs[:3], "first"),
        CalibrationPrompt(QUESTION, [docs[1], docs[0], docs[2]], "middle"),
        CalibrationPrompt(QUESTION, [docs[2], docs[1], docs[0]], "last"),
    ]
    settings = [Setting(False), Setting(True, 0.5, 2.0)]
    cal = calibrate(lambda: llm("full"), lambda: llm("lazy"), prompts, settings, PARAMS)
    full, lazy = llm("full"), llm("lazy")
    messages, documents = [p.messages for p in prompts], [p.documents for p in prompts]
    want_p = [o.outputs[0].first_token_logprobs.double() for o in full.chat(messages, PARAMS, documents=documents)]
    for result in cal.results:
        got = lazy.chat(messages, PARAMS, documents=documents, options=RequestOptions(**result.setting.options))
        want = [
            torch.nn.functional.kl_div(o.outputs[0].first_token_logprobs.double(), p, log_target=True, reduction="sum")
            for o, p in zip(got, want_p)
        ]
        assert result.kl == pytest.approx([w.item() for w in want], rel=1e-4)  # fp32: the same prompts, another batch
        assert result.kl_by_position() == pytest.approx(dict(zip(("first", "middle", "last"), result.kl)))
        assert result.worst_kl == max(result.kl) > 0
    assert cal.chosen == min(cal.results, key=lambda r: r.worst_kl).setting
    assert "| setting | mean KL [95 % CI] | KL, gold first | KL, gold middle | KL, gold last |" in markdown(cal)


def test_plain_prompts_and_relinked_last_rows_are_calibrated_as_generate_answers_them():
    """A few-shot prompt is plain text: each setting's KL (relinked last rows among them) is what `LLM.generate`
    gives for the same plain prompts, full attention against lazy mode with those options."""
    docs = [{"title": "", "text": f"Text: {t}\nLabel: {n}"} for n, t in TEXTS.items()]
    question = "Text: Rivers feed the alders.\nLabel:"
    prompts = [
        CalibrationPrompt(QUESTION, docs, "original", question),
        CalibrationPrompt(QUESTION, docs[::-1], "original", question),
    ]
    settings = [Setting(True), Setting(True, relink_last_tokens=3), Setting(False, relink_last_tokens=5)]
    cal = calibrate(lambda: llm("full"), lambda: llm("lazy"), prompts, settings, PARAMS)
    full, lazy = llm("full"), llm("lazy")
    documents = [p.documents for p in prompts]
    want_p = [
        o.outputs[0].first_token_logprobs.double() for o in full.generate([question] * 2, PARAMS, documents=documents)
    ]
    kls = []
    for result in cal.results:
        got = lazy.generate(
            [question] * 2, PARAMS, documents=documents, options=RequestOptions(**result.setting.options)
        )
        want = [
            torch.nn.functional.kl_div(o.outputs[0].first_token_logprobs.double(), p, log_target=True, reduction="sum")
            for o, p in zip(got, want_p)
        ]
        assert result.kl == pytest.approx([w.item() for w in want], rel=1e-4)
        kls.append(result.kl)
    assert kls[0] != pytest.approx(kls[1], rel=1e-3)  # recomputing the last rows changes the answer's distribution
    with pytest.raises(InvalidRequestError, match="all chat or all plain"):
        calibrate(llm("full"), llm("lazy"), [prompts[0], CalibrationPrompt(QUESTION, docs, "first")], settings, PARAMS)


def test_a_few_shot_set_is_calibrated_on_plain_prompts(tmp_path):
    out = tmp_path / "out"
    argv = ["eval", "--calibrate", "--model", "tiny", "--device", "cpu", "--page-size", "16", "--max-tokens", "2"]
    argv += ["--dataset", "builtin:icl-language", "--limit", "2", "--num-docs", "5", "--temperatures", "1"]
    argv += ["--calibrate-prefix", "on", "--relink-last", "0,3", "--out", str(out)]
    assert main(argv) == 0
    data = json.loads((out / "calibrate.json").read_text())
    assert data["meta"]["plain_prompt"] is True
    assert [r["relink_last_tokens"] for r in data["settings"]] == [0, 3]


def test_one_document_after_the_system_prompt_is_full_attention_and_is_chosen(tmp_path, corpus):
    """With one document a prompt is [system][document][question]: lazy mode with the shared prefix encodes the
    document after the system prompt at its own positions, which is what full attention computes, so its KL is
    zero to rounding; without the prefix, or with a temperature, it is not. A tilt on one document is no tilt: the
    same KL, and the tie goes to the setting listed first (tilt 0)."""
    out = tmp_path / "out"
    argv = ["eval", "--calibrate", "--model", "tiny", "--device", "cpu", "--page-size", "16"]
    argv += ["--calibrate-documents", str(corpus), "--num-docs", "1", "--limit", "4", "--max-tokens", "3"]
    argv += ["--temperatures", "0.5,1", "--scales", "1", "--tilts=0,-2", "--calibrate-prefix", "both"]
    assert main([*argv, "--out", str(out)]) == 0
    data = json.loads((out / "calibrate.json").read_text())
    rows = {(r["ape_prefix"], r["ape_temperature"], r["ape_tilt"]): r for r in data["settings"]}
    assert set(rows) == {(p, t, tilt) for p in (True, False) for t in (0.5, 1.0) for tilt in (0.0, -2.0)}
    assert rows[True, 1.0, 0.0]["mean_kl"] < 1e-6
    assert min(rows[k]["mean_kl"] for k in rows if k[:2] != (True, 1.0)) > 1e-3
    for p, t, _ in rows:
        assert rows[p, t, -2.0]["mean_kl"] == pytest.approx(rows[p, t, 0.0]["mean_kl"], rel=1e-5, abs=1e-9)
    assert data["chosen"] == {
        "ape_prefix": True,
        "ape_temperature": 1.0,
        "ape_scale": 1.0,
        "ape_tilt": 0.0,
        "relink_last_tokens": 0,
        "serve_flags": "--ape-prefix",
    }
    assert "**prefix on, T 1, S 1**" in (out / "calibrate.md").read_text()


def test_grid_and_positions():
    assert [s.label for s in grid("off", [1.0], [0.5, 2.0])] == ["prefix off, T 1, S 0.5", "prefix off, T 1, S 2"]
    assert len(grid("both", [0.8, 1.0], [1.0])) == 4
    assert Setting(True, 0.9, 1.0).serve_flags == "--ape-prefix --ape-temperature 0.9"
    assert Setting(False).serve_flags == ""
    assert Setting(True, 1.0, 1.0, 1.5).serve_flags == "--ape-prefix --ape-tilt 1.5"
    assert Setting(True, 1.0, 1.0, 1.5).label == "prefix on, T 1, S 1, tilt 1.5"
    assert len(grid("on", [1.0], [1.0], [0.0, 1.0, 2.0])) == 3
    relinked = grid("on", [1.0], [1.0], relink_last=[0, 3])
    assert [s.label for s in relinked] == ["prefix on, T 1, S 1", "prefix on, T 1, S 1, last 3"]
    assert relinked[1].serve_flags == "--ape-prefix --relink-last-tokens 3"
    assert relinked[1].options["relink_last_tokens"] == 3
    assert [position_of(g, 5) for g in range(5)] == ["first", "middle", "middle", "middle", "last"]
    assert position_of(0, 1) == "first"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--calibrate", "--fidelity"], "two different runs"),
        (["--calibrate-documents", "x"], "only with --calibrate"),
        (["--calibrate", "--calibrate-documents", "DOCS", "--num-docs", "3,5"], "one count"),
        (["--calibrate", "--calibrate-documents", "DOCS", "--temperatures", "0"], "positive"),
        (["--calibrate", "--calibrate-documents", "DOCS", "--temperatures", "a"], "comma-separated numbers"),
        (["--calibrate", "--calibrate-documents", "DOCS", "--relink-last", "0,-1"], "0 or more"),
        (["--calibrate", "--calibrate-documents", "DOCS", "--relink-last", "0,2.5"], "comma-separated whole numbers"),
    ],
)
def test_bad_flags_are_one_line_errors(corpus, capsys, extra, message):
    argv = ["eval", "--model", "tiny", "--device", "cpu"] + [str(corpus) if a == "DOCS" else a for a in extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_settings_the_prompts_do_not_tell_apart_are_named():
    """The chosen setting's mean-KL interval against the others': a setting whose KL values lie far above is told
    apart, one whose values straddle the chosen one's is not."""
    from lazyattn.eval.calibrate import Calibration, SettingResult, overlapping

    positions = ["first", "middle", "last"] * 4
    low = [0.10, 0.12, 0.11, 0.09] * 3
    near = [0.08, 0.15, 0.10, 0.13] * 3
    far = [5.0, 5.2, 4.9, 5.1] * 3
    results = [
        SettingResult(Setting(True), low, [True] * 12, positions),
        SettingResult(Setting(False), far, [False] * 12, positions),
        SettingResult(Setting(True, 0.9), near, [True] * 12, positions),
    ]
    cal = Calibration(results, 12)
    assert cal.chosen == Setting(True)
    assert overlapping(cal) == [Setting(True, 0.9)]
