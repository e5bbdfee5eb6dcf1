"""`lazyattn finetune --distill --few-shot`: few-shot prompts made from labelled texts, balanced in rounds, their
labels shown as themselves or as a mapping only the demonstrations teach; the built-in texts share nothing with the
evaluation's few-shot sets; and a plain prompt's training row computes what lazy mode with the shared prefix serves
for the same completion request."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

from lazyattn.cli import main
from lazyattn.engine.llm import LLM
from lazyattn.engine.prompt import PromptLayout
from lazyattn.engine.sampling import SamplingParams
from lazyattn.errors import InvalidRequestError
from lazyattn.eval import icl
from lazyattn.finetune import few_shot
from lazyattn.finetune.data import Example
from lazyattn.finetune.distill import DistillConfig, load_prompts, render_prompt
from lazyattn.finetune.prompts import Prompt
from lazyattn.finetune.train import make_batch

from .test_finetune import GEN, assert_serves, logprobs_of, tiny  # noqa: F401  (tiny: the module fixture)

# label -> texts; each text names its label, so every demonstration can be traced back to its true label
EXAMPLES = {label: [f"{label} text {i}" for i in range(6)] for label in ("oak", "elm", "ash", "yew", "fir", "box")}


def parse(line: str) -> tuple[str, str, str, str]:
    """'Field: text\\nName: label' -> (field, text, name, label)."""
    first, second = line.split("\n")
    field, text = first.split(": ", 1)
    name, label = second.split(": ", 1) if ": " in second else (second.rstrip(":"), "")
    return field, text, name, label


def test_prompts_show_balanced_rounds_with_one_consistent_labelling():
    prompts = few_shot.make_prompts(EXAMPLES, 400, seed=2)
    arbitrary = 0
    sizes = Counter()
    for p in prompts:
        assert p.plain and p.answer is None and p.system in few_shot.SYSTEM_LINES
        demos = [parse(d) for d in p.documents]
        field, test_text, name, empty = parse(p.question)
        assert empty == "" and {(f, n) for f, _, n, _ in demos} == {(field, name)} and (field, name) in few_shot.FIELDS
        true = [text.split(" ")[0] for _, text, _, _ in demos]
        drawn = sorted(set(true))
        assert 2 <= len(drawn) <= 6 and len(p.documents) % len(drawn) == 0
        per = len(p.documents) // len(drawn)
        assert 1 <= per <= 4
        sizes[len(drawn), per] += 1
        for r in range(per):  # round r: one demonstration of every drawn label
            assert sorted(true[r * len(drawn) : (r + 1) * len(drawn)]) == drawn
        shown = {t: s for t, (_, _, _, s) in zip(true, demos)}
        assert all(shown[t] == s for t, (_, _, _, s) in zip(true, demos))  # one shown label per true label
        assert len(set(shown.values())) == len(drawn)  # and no two alike
        if shown != {t: t for t in drawn}:
            arbitrary += 1
            assert any(set(shown.values()) <= set(words) for words in few_shot.ARBITRARY)
        assert test_text.split(" ")[0] in drawn and test_text not in {text for _, text, _, _ in demos}
        assert len({text for _, text, _, _ in demos}) == len(demos)
    assert 150 < arbitrary < 250
    assert len(sizes) == 5 * 4  # every label count with every round count


def test_texts_with_one_label_or_too_few_texts_are_refused(tmp_path):
    path = tmp_path / "texts.jsonl"
    path.write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": "x"}\n{"text": "c", "label": "y"}\n')
    with pytest.raises(InvalidRequestError, match="two labels with two texts"):
        few_shot.read_examples(str(path))
    path.write_text('{"text": "a", "label": "x"}\n{"text": "a b"}\n')
    with pytest.raises(InvalidRequestError, match=r"texts.jsonl:2: expected"):
        few_shot.read_examples(str(path))
    path.write_text("{not json\n")
    with pytest.raises(InvalidRequestError, match="not JSON"):
        few_shot.read_examples(str(path))
    with pytest.raises(InvalidRequestError, match="sphinx-languages"):
        few_shot.read_examples(str(tmp_path / "missing.jsonl"))
    with pytest.raises(InvalidRequestError, match="exactly one of"):
        DistillConfig(documents="jargon-file", few_shot="sphinx-languages")


def test_builtin_texts_share_no_label_and_no_text_with_the_evaluation_sets():
    examples = few_shot.read_examples(few_shot.SPHINX_LANGUAGES)
    assert set(examples) == set(few_shot.LANGUAGES) and min(map(len, examples.values())) >= 50
    evaluated_labels = {label for s in icl.SETS.values() for label in s.labels}
    assert len(evaluated_labels) == 25 and not set(examples) & evaluated_labels
    texts = {t for ts in examples.values() for t in ts}
    for s in icl.SETS.values():
        with gzip.open(s.data_path, "rt", encoding="utf-8") as f:
            evaluated = {json.loads(line).get("text") for line in f}
        assert len(evaluated) > 100 and not texts & evaluated
    # a text under two labels would teach nothing: none is
    assert sum(map(len, examples.values())) == len(texts)


def test_a_plain_prompt_row_computes_what_lazy_mode_with_the_shared_prefix_serves(tiny):  # noqa: F811
    """The engine completing a plain prompt after cached demonstrations (ape_prefix=True, the system line as the
    first segment) gives the training row's tokens and log-probs: the few-shot row is what is served."""
    system = "Ex:\n\n"
    documents = ["Text: ab\nLabel: x", "Text: cd\nLabel: y", "Text: ef\nLabel: x"]
    question = "Text: cb\nLabel:"
    layout = PromptLayout(completion_system_prompt=system, untitled_document_format="{text}\n\n")
    llm = LLM(model="tiny", mode="lazy", device="cpu", page_size=16, ape_prefix=True, layout=layout)
    params = SamplingParams(max_tokens=GEN, temperature=0.0, ignore_eos=True, logprobs=5)
    out = llm.generate([question], params, documents=[documents])[0].outputs[0]
    rendered = render_prompt(tiny.tokenizer, Prompt(question, documents, system=system, plain=True), PromptLayout())
    assert tiny.tokenizer.decode(rendered.segments[1]) == "Text: ab\nLabel: x\n\n"
    example = Example(rendered.segments, rendered.final, list(out.token_ids))
    want = logprobs_of(tiny.model, make_batch([example], [True], ape_prefix=True), example)
    assert_serves(list(out.token_ids), out.logprobs, want)


def test_cli_refuses_what_few_shot_prompts_do_not_read(tmp_path, capsys):
    argv = ["finetune", "--model", "tiny", "--out", str(tmp_path), "--distill", "--few-shot", "sphinx-languages"]
    assert main([*argv, "--write-questions", str(tmp_path / "q.jsonl")]) == 2
    assert "--documents" in capsys.readouterr().err and not (tmp_path / "q.jsonl").exists()
    assert main([*argv, "--docs-per-prompt", "2,3", "--question-kinds", "cloze"]) == 2
    err = capsys.readouterr().err
    assert "--docs-per-prompt, --question-kinds shape prompts made from --documents" in err
    assert not (tmp_path / "adapter_config.json").exists()


def test_cli_few_shot_distillation_trains_on_made_prompts(tmp_path):
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": t, "label": k}) + "\n" for k, ts in EXAMPLES.items() for t in ts))
    out = tmp_path / "adapter"
    argv = ["finetune", "--model", "tiny", "--out", str(out), "--distill", "--few-shot", str(texts)]
    argv += ["--prompts", "5", "--held-out", "2", "--steps", "2", "--batch-size", "2", "--answer-tokens", "2"]
    argv += ["--device", "cpu", "--no-progress", "--save-dtype", "float32", "--ape-prefix"]
    assert main(argv) == 0
    recipe = json.loads((out / "finetune.json").read_text())
    assert recipe["config"]["distill"]["few_shot"] == str(texts) and recipe["distill_examples"] == 3
    trained = load_prompts(DistillConfig(few_shot=str(texts), prompts=5), 0)[2:]  # the first 2 held out
    ends = [s["prompt_end"] for s in recipe["distill_samples"]]
    assert ends == [p.question for p in trained]
    assert recipe["held_out_kl"]["prompts"] == 2 and recipe["held_out_kl"]["before"] > 0
