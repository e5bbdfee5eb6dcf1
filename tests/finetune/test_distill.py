"""`lazyattn finetune --distill` on the built-in `tiny` model: the KL loss against a kl_div reference, zero where
block and full attention coincide, made prompts rendered as the engine renders them and answered by the
teacher's greedy decoding, a short run lowering the KL, and the CLI writing an adapter lazyattn loads."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch

from lazyattn.cli import main
from lazyattn.engine.llm import LLM
from lazyattn.engine.prompt import PromptLayout, encode_document
from lazyattn.engine.sampling import SamplingParams
from lazyattn.errors import InvalidRequestError
from lazyattn.finetune.base import load_base
from lazyattn.finetune.corpus import Document, passages, read_documents, stdlib_docstrings
from lazyattn.finetune.data import Example, encode_item
from lazyattn.finetune.distill import DistillConfig, kl_loss, load_prompts, teacher_examples
from lazyattn.finetune.prompts import make_prompts, read_questions
from lazyattn.finetune.train import FinetuneConfig, Objective, _with_lora, finetune, make_batch
from lazyattn.model.adapter import is_adapter_dir, read_adapter

# A short layout keeps rows a few dozen byte tokens long (the default system prompt alone is ~250).
SHORT = PromptLayout(system_prompt="S", question_format="Q: {question}")
CPU = torch.device("cpu")
TEXTS = {
    "alder": "Alder trees grow by rivers. Their cones stay all winter long.",
    "basalt": "Basalt cools fast from lava. It forms columns near the sea.",
    "cobalt": "Cobalt paints glass a deep blue colour. Potters mix it in glaze.",
    "dunlin": "Dunlins are small wading birds. They feed on mud flats in flocks.",
}


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    for i, (name, text) in enumerate(TEXTS.items()):
        (folder / ("sub" if i % 2 else "") / f"{name}.txt").write_text(text + "\n")
    (folder / "notes.json").write_text("{}")  # not a document
    return folder


@pytest.fixture(scope="module")
def tiny():
    return load_base("tiny")


def lora(model, seed: int | None = None):
    """A LoRA-wrapped copy; `seed` draws non-zero B matrices so the adapter changes the outputs."""
    import copy

    model = _with_lora(copy.deepcopy(model), FinetuneConfig(lora_rank=4))
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.data = 0.05 * torch.randn(p.shape, generator=g)
    return model


def test_kl_loss_matches_kl_div_and_a_hand_computation():
    g = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(7, 11, generator=g), torch.randn(7, 11, generator=g)
    for t in (1.0, 2.5):
        want = torch.nn.functional.kl_div(
            torch.log_softmax(student / t, -1),
            torch.log_softmax(teacher / t, -1),
            log_target=True,
            reduction="batchmean",
        )
        assert torch.allclose(kl_loss(student, teacher, t), want * t * t, atol=1e-6)
    # teacher (1/2, 1/2), student (3/4, 1/4): 1/2 log(2/3) + 1/2 log 2 = 1/2 log(4/3); forward, not reverse, KL
    got = kl_loss(torch.tensor([[math.log(3.0), 0.0]]), torch.tensor([[0.0, 0.0]]))
    assert got.item() == pytest.approx(0.5 * math.log(4 / 3), abs=1e-6)
    assert kl_loss(teacher, teacher).item() == pytest.approx(0.0, abs=1e-7)


def distill_example(tokenizer, item, one_segment: bool) -> Example:
    e = encode_item(tokenizer, item, SHORT)
    segments = [[t for s in e.segments for t in s]] if one_segment else e.segments
    return Example(segments, e.final, e.answer, distill=True)


ITEM = {
    "question": "What colour?",
    "answers": ["blue"],
    "documents": [{"title": n, "text": t} for n, t in list(TEXTS.items())[:3]],
}


def test_kl_is_zero_exactly_where_block_and_full_attention_coincide(tiny):
    """One segment before the question: the block row is the causal row, so a student with the teacher's weights
    matches it; with three documents it does not. teacher="self" uses the adapter's weights, "base" drops them."""
    one, three = (distill_example(tiny.tokenizer, ITEM, flag) for flag in (True, False))
    for model, teacher in ((lora(tiny.model), "base"), (lora(tiny.model, seed=1), "self")):
        cfg = FinetuneConfig(model="tiny", distill=DistillConfig(documents="-", teacher=teacher))
        objective = Objective(model.eval(), cfg)
        assert objective.mean_kl([one], CPU) == pytest.approx(0.0, abs=1e-6)
        assert objective.mean_kl([three], CPU) > 1e-4
    cfg = FinetuneConfig(model="tiny", distill=DistillConfig(documents="-", teacher="base"))
    assert Objective(lora(tiny.model, seed=1).eval(), cfg).mean_kl([one], CPU) > 1e-4


def test_labelled_rows_keep_the_transformers_loss(tiny):
    """Mixed batch: cross-entropy over the labelled rows equals transformers' own loss on those rows alone."""
    labelled = encode_item(tiny.tokenizer, ITEM, SHORT)
    mixed = [labelled, distill_example(tiny.tokenizer, ITEM, False)]
    cfg = FinetuneConfig(model="tiny", distill=DistillConfig(documents="-"))
    model = lora(tiny.model, seed=2).eval()
    with torch.no_grad():
        terms = Objective(model, cfg)(mixed, [True, True], CPU)
        want = model(**make_batch([labelled], [True]), use_cache=False).loss
    assert terms.ce.item() == pytest.approx(want.item(), rel=1e-5)
    assert terms.kl.item() > 0
    assert terms.total(0.5).item() == pytest.approx(0.5 * terms.ce.item() + terms.kl.item(), rel=1e-6)


def test_documents_from_a_folder_a_jsonl_and_questions_by_id(tmp_path, corpus):
    docs = read_documents(str(corpus))
    assert [d.id for d in docs] == ["alder.txt", "cobalt.txt", "sub/basalt.txt", "sub/dunlin.txt"]
    assert docs[0].title == "alder" and docs[0].text == TEXTS["alder"]
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text('{"text": "one two", "title": "T", "id": "a"}\n\n{"text": "three"}\n')
    assert [(d.id, d.title, d.text) for d in read_documents(str(jsonl))] == [
        ("a", "T", "one two"),
        ("2", None, "three"),
    ]
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question": "Q?", "documents": ["a", "inline text", {"title": "X", "text": "y"}]}))
    (prompt,) = read_questions(questions, read_documents(str(jsonl)))
    assert prompt.documents == [{"title": "T", "text": "one two"}, "inline text", {"title": "X", "text": "y"}]
    assert prompt.answer is None
    parts = passages(docs[:1], 30)
    assert [p.text for p in parts] == ["Alder trees grow by rivers.", "Their cones stay all winter", "long."]
    assert [(p.id, p.title) for p in parts][1] == ("alder.txt#2", "alder (part 2)")


def test_stdlib_corpus_leaves_out_the_evaluation_texts():
    from pydoc_data.topics import topics

    docs = stdlib_docstrings()
    assert len(docs) > 300
    assert not [d for d in docs if d.id.split(".")[0] in ("pydoc_data", "pydoc", "builtins")]
    evaluated = set(topics.values())
    assert not [d for d in docs if d.text in evaluated]
    assert "json.dumps" in {d.id for d in docs}


def reference_greedy(model, tokens: list[int], n: int, eos: list[int]) -> list[int]:
    """Greedy decoding by full forward passes of the unpadded prompt (no cache, no batching)."""
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([tokens + out]), use_cache=False).logits[0, -1]
            out.append(int(logits.argmax()))
            if out[-1] in eos:
                break
    return out


def test_made_prompts_put_the_question_after_the_documents_and_the_teacher_answers(tiny, corpus):
    cfg = DistillConfig(documents=str(corpus), prompts=5, docs_per_prompt=(2, 3))
    prompts = load_prompts(cfg, seed=1)
    examples = teacher_examples(tiny.model, tiny.tokenizer, prompts, 3, CPU, [SHORT], batch_tokens=600)
    assert len(examples) == 5
    titles = {f"{name}": TEXTS[name] for name in TEXTS}
    for prompt, e in zip(prompts, examples):
        assert 2 <= len(prompt.documents) <= 3 and len({d["title"] for d in prompt.documents}) == len(prompt.documents)
        assert all(titles[d["title"]] == d["text"] for d in prompt.documents)
        assert f'"{prompt.documents[prompt.gold]["title"]}"' in prompt.question
        # segments: system, then each document alone in prompt order; the question only in the final segment
        assert e.segments[1:] == [encode_document(tiny.tokenizer, d, SHORT) for d in prompt.documents]
        assert prompt.question in tiny.tokenizer.decode(e.final)
        assert not any(prompt.question in tiny.tokenizer.decode(s) for s in e.segments)
        assert e.distill and e.tokens[: -len(e.answer)] == [t for s in e.segments for t in s] + e.final
        assert e.answer == reference_greedy(tiny.model, e.tokens[: -len(e.answer)], 3, tiny.tokenizer.eos_token_ids)


def test_a_short_distillation_lowers_the_kl_on_its_prompts(tmp_path, tiny, corpus):
    from peft import PeftModel

    distill = DistillConfig(documents=str(corpus), prompts=6, docs_per_prompt=(2, 3), answer_tokens=3, held_out=0)
    cfg = FinetuneConfig(
        model="tiny",
        out=str(tmp_path / "out"),
        steps=12,
        batch_size=3,
        lr=5e-3,
        warmup_steps=1,
        lora_rank=4,
        save_dtype="float32",
        progress=False,
        device="cpu",
        layouts=[SHORT],
        distill=distill,
    )
    result = finetune(cfg)
    assert result.terms["kl"] and not result.terms["ce"]
    examples = teacher_examples(tiny.model, tiny.tokenizer, load_prompts(distill, 0), 3, CPU, [SHORT])
    before = Objective(lora(tiny.model).eval(), cfg).mean_kl(examples, CPU)
    trained = PeftModel.from_pretrained(load_base("tiny").model, str(tmp_path / "out")).eval()
    after = Objective(trained, cfg).mean_kl(examples, CPU)
    assert before > 1e-3 and after < 0.7 * before


def test_cli_distill_writes_an_adapter_lazyattn_loads(tmp_path, corpus):
    out = tmp_path / "adapter"
    argv = ["finetune", "--model", "tiny", "--out", str(out), "--distill", "--documents", str(corpus)]
    argv += ["--prompts", "2", "--held-out", "0", "--steps", "1", "--batch-size", "1", "--answer-tokens", "2"]
    argv += ["--docs-per-prompt", "1", "--device", "cpu", "--no-progress", "--save-dtype", "float32", "--lr", "1e-2"]
    assert main(argv) == 0
    assert is_adapter_dir(out) and read_adapter(out).base == "tiny"
    recipe = json.loads((out / "finetune.json").read_text())
    assert recipe["config"]["distill"]["documents"] == str(corpus) and recipe["distill_examples"] == 2
    assert recipe["examples"] == 0  # no labelled rows unless --labelled-share
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, logprobs=1)
    docs = [[{"title": "alder", "text": TEXTS["alder"]}]]
    stock, tuned = (
        LLM(model=m, mode="lazy", device="cpu", page_size=16).generate(["Q?"], params, documents=docs)[0].outputs[0]
        for m in ("tiny", str(out))
    )
    assert len(tuned.token_ids) == 3
    first = stock.token_ids[0]
    assert tuned.logprobs[0].get(first) != stock.logprobs[0][first]  # the trained adapter was folded in


def test_cli_rejects_documents_without_distill(tmp_path, corpus, capsys):
    assert main(["finetune", "--model", "tiny", "--out", str(tmp_path), "--documents", str(corpus)]) == 2
    assert "--distill" in capsys.readouterr().err


def test_labelled_rows_mix_with_distillation_rows(tmp_path, corpus):
    data = tmp_path / "labelled.jsonl"
    data.write_text(json.dumps({**ITEM, "gold": [2]}) + "\n")
    distill = DistillConfig(documents=str(corpus), prompts=3, docs_per_prompt=(2,), answer_tokens=2, held_out=0)
    cfg = FinetuneConfig(
        model="tiny",
        out=str(tmp_path / "out"),
        data=str(data),
        examples=None,
        steps=3,
        batch_size=4,
        lora_rank=4,
        progress=False,
        device="cpu",
        layouts=[SHORT],
        distill=distill,
        labelled_share=0.5,
        labelled_weight=0.5,
    )
    result = finetune(cfg)
    assert len(result.losses) == 3 and result.terms["ce"] and result.terms["kl"]
    assert len(result.terms["ce"]) + len(result.terms["kl"]) > 3  # some step mixed both kinds of rows
    recipe = json.loads((tmp_path / "out" / "finetune.json").read_text())
    assert (recipe["examples"], recipe["distill_examples"]) == (1, 3)
    with pytest.raises(InvalidRequestError):
        FinetuneConfig(labelled_share=0.5)  # mixing needs distillation


def test_ape_prefix_distillation_compares_the_prefix_row_with_the_full_row(tiny):
    """With ape_prefix the student row is longer (copies of the first segment before documents 2 and 3) than the
    teacher's full row; the KL pairs the final segment's and the answer's positions of both, as computed by hand."""
    e = distill_example(tiny.tokenizer, ITEM, one_segment=False)
    assert len(e.segments) == 4
    model = lora(tiny.model, seed=3).eval()
    cfg = FinetuneConfig(model="tiny", distill=DistillConfig(documents="-"), ape_prefix=True)
    got = Objective(model, cfg).mean_kl([e], CPU)
    n = len(e.final) + len(e.answer) - 1  # the logits predicting the final segment's rest and the answer
    with torch.no_grad():
        batch = make_batch([e], [True], ape_prefix=True)
        batch.pop("labels")
        assert batch["input_ids"].shape[1] == e.num_tokens + 2 * len(e.segments[0])
        student = model(**batch, use_cache=False).logits[0, -n - 1 : -1]
        with model.disable_adapter():
            teacher = model(input_ids=torch.tensor([e.tokens]), use_cache=False).logits[0, -n - 1 : -1]
    assert got == pytest.approx(kl_loss(student, teacher).item(), rel=1e-4)
    plain = Objective(model, FinetuneConfig(model="tiny", distill=DistillConfig(documents="-"))).mean_kl([e], CPU)
    assert abs(plain - got) > 1e-4 * got


def test_made_prompts_ask_about_the_first_middle_and_last_document_alike():
    docs = [Document(str(i), f"T{i}", f"Words of document number {i} for the question.") for i in range(12)]
    prompts = make_prompts(docs, 600, (5,), seed=0)
    counts = Counter(p.gold for p in prompts)
    assert set(counts) == {0, 2, 4} and min(counts.values()) > 150


def test_cloze_questions_blank_a_span_of_the_gold_document_and_name_no_document():
    docs = read_documents("jargon-file")[:300]
    prompts = make_prompts(passages(docs, 1000), 300, (2, 5), seed=3, kinds=("cloze",))
    blanked = [p for p in prompts if p.answer is not None]
    assert len(blanked) > 250  # nearly every passage has a sentence to blank
    for p in blanked:
        sentence = p.question.split(": ", 1)[1].strip('"')
        gold = p.documents[p.gold]
        # Filling the blank with the answer gives back a sentence of the gold passage, unwrapped.
        assert sentence.replace("___", p.answer) in " ".join(gold["text"].split())
        assert p.answer.lower() not in sentence.lower()
        assert "document titled" not in p.question
    counts = Counter(p.gold == 0 for p in blanked)
    assert counts[True] > 60 and counts[False] > 120  # gold first, middle or last alike


LONG_TEXTS = {
    "alder": "Alder trees grow by the slow rivers of the northern valleys. Their woody cones stay on bare branches "
    "all winter long.",
    "basalt": "Basalt cools quickly from lava that reaches the cold sea. It often forms tall hexagonal columns near "
    "the shore.",
    "cobalt": "Cobalt paints glass a deep blue colour that lasts for centuries. Potters in Delft mixed it into their "
    "tin glaze.",
}


def test_write_questions_gives_a_set_that_eval_and_the_labelled_recipe_read(tmp_path, tiny, capsys):
    from lazyattn.qa.dataset import read_jsonl

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"title": k, "text": v}) + "\n" for k, v in LONG_TEXTS.items()))
    out = tmp_path / "cloze.jsonl"
    argv = ["finetune", "--model", "tiny", "--out", str(tmp_path / "unused"), "--distill", "--documents", str(docs)]
    argv += ["--prompts", "12", "--docs-per-prompt", "2,3", "--write-questions", str(out)]
    assert main(argv + ["--question-kinds", "cloze,summary"]) == 0
    assert not (tmp_path / "unused").exists()  # nothing trained
    items = read_jsonl(out)
    assert 2 <= len(items) < 12  # the cloze prompts only: the summaries carry no answer
    for item in items:
        gold_text = " ".join(item.documents[item.gold[0]]["text"].split())
        assert item.answers[0] in gold_text and item.answers[0] not in item.question
        example = encode_item(tiny.tokenizer, item, SHORT)
        assert tiny.tokenizer.decode(example.answer[:-1]) == item.answers[0]
    assert main(argv + ["--question-kinds", "about,summary"]) == 2  # no kind that writes an answer
    assert "add cloze" in capsys.readouterr().err
    with pytest.raises(InvalidRequestError, match="question kinds"):
        DistillConfig(documents="jargon-file", kinds=("about", "riddle"))


JARGON_SAMPLE = """\
                                The Jargon File

(version 4.4.7)

   Table of Contents

   1. Hacker Slang and Hacker Culture

Chapter 1. Hacker Slang and Hacker Culture

   This document is a collection of slang terms used by various subcultures
   of computer hackers. Though some technical material is included for
   background and flavor, it is not a technical dictionary; what we describe
   here is the language hackers use among themselves for fun, social
   communication, and technical debate.

\u250c\u2500\u2500\u2510
\u2502x \u2502
\u2514\u2500\u2500\u2518

Glossary

   0

   foo

  F

   foo

   fum

   :foo: /foo/

   1. interj. Term of disgust. 2. [very common] Used very generally as a
   sample name for absolutely anything, esp. programs and files (esp.
   scratch files). 3. First on the standard list of metasyntactic variables
   used in syntax examples. See also {bar}, {baz}, {qux}, {quux}, {garply}.

   :fum: n.

   See {foo}.

  G

   gabriel

Appendix A. Hacker Folklore

   Table of Contents

   The Meaning of 'Hack'

   This appendix contains several legends and fables that illuminate the
   meaning of various entries in the lexicon, and it has to be long enough
   to be kept, so it goes on for a while about the meaning of hack.
"""


def test_jargon_file_parser_keeps_entries_and_sections_and_drops_the_rest(monkeypatch):
    from lazyattn.finetune import jargon

    monkeypatch.setattr(jargon, "MIN_CHARS", 100)
    docs = jargon.parse(JARGON_SAMPLE)
    titles = ["Chapter 1. Hacker Slang and Hacker Culture", "foo", "Appendix A. Hacker Folklore"]
    assert [d.title for d in docs] == titles
    assert docs[0].text.startswith("This document is a collection") and "\u2502" not in docs[0].text
    assert docs[1].text.startswith("/foo/\n\n1. interj.") and "See also bar, baz, qux" in docs[1].text
    assert "gabriel" not in docs[1].text and "Table of Contents" not in docs[2].text
    assert docs[2].text.startswith("This appendix contains")


def test_jargon_corpus_shares_no_text_with_the_evaluation_sets():
    import gzip
    import re
    from pathlib import Path

    import lazyattn.eval

    def grams(text: str) -> set[tuple[str, ...]]:
        words = re.findall(r"\w+", text.lower())
        return {tuple(words[i : i + 8]) for i in range(len(words) - 7)}

    docs = read_documents("jargon-file")
    assert len(docs) == 1636 and all(d.title and len(d.text) >= 250 for d in docs)
    corpus = set().union(*(grams(d.text) for d in docs))
    for name in ("real", "real-heldout"):
        path = Path(lazyattn.eval.__file__).parent / "data" / f"{name}.jsonl.gz"
        with gzip.open(path, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
        passages_text = [r["text"] for r in rows if "passage" in r and "text" in r]
        assert len(passages_text) > 100
        assert not corpus & set().union(*(grams(t) for t in passages_text)), name


def test_cli_trains_ape_prefix_rows_in_both_layouts(tmp_path, corpus):
    out = tmp_path / "adapter"
    data = tmp_path / "labelled.jsonl"
    data.write_text(json.dumps({**ITEM, "gold": [1]}) + "\n")
    argv = ["finetune", "--model", "tiny", "--out", str(out), "--distill", "--documents", str(corpus)]
    argv += ["--prompts", "2", "--held-out", "0", "--steps", "2", "--batch-size", "2", "--answer-tokens", "2"]
    argv += ["--docs-per-prompt", "3", "--device", "cpu", "--no-progress", "--save-dtype", "float32"]
    argv += ["--data", str(data), "--labelled-share", "0.5", "--ape-prefix"]
    argv += ["--prompt-layouts", "block-attention,short-answer"]
    assert main(argv) == 0
    recipe = json.loads((out / "finetune.json").read_text())
    assert recipe["config"]["ape_prefix"] is True
    assert recipe["config"]["layouts"] == ["block-attention", "short-answer"]
    assert main([*argv[:-1], "block-attention,nope"]) == 2


def test_a_start_teacher_is_the_initial_adapter_frozen(tmp_path, corpus):
    """`--teacher start` continuing an adapter: the teacher is that adapter as training starts, frozen. On full
    rows its first KL is zero (the student reads what it reads, with the same weights), where the `base` teacher
    (adapter off) differs. On block rows its first step equals the `self` teacher's, and later steps do not (the
    `self` teacher moves with the training). The teacher's answers are the starting adapter's greedy ones."""
    from peft import PeftModel

    data = tmp_path / "labelled.jsonl"
    data.write_text(json.dumps({**ITEM, "gold": [2]}) + "\n")
    common = dict(model="tiny", batch_size=2, lora_rank=4, save_dtype="float32", progress=False, device="cpu")
    common.update(warmup_steps=1, layouts=[SHORT])
    first = tmp_path / "first"
    finetune(FinetuneConfig(out=str(first), data=str(data), examples=None, steps=3, lr=5e-2, **common))
    kl = {}
    for teacher, full_share in (("start", 1.0), ("base", 1.0), ("start", 0.0), ("self", 0.0)):
        distill = DistillConfig(
            documents=str(corpus),
            prompts=6,
            docs_per_prompt=(2,),
            answer_tokens=3,
            held_out=1,
            teacher=teacher,
            full_share=full_share,
        )
        out = tmp_path / f"{teacher}-{full_share}"
        cfg = FinetuneConfig(out=str(out), steps=4, lr=5e-2, init_adapter=str(first), distill=distill, **common)
        kl[teacher, full_share] = finetune(cfg).terms["kl"]
    assert kl["start", 1.0][0] < 1e-6 < 1e-4 < kl["base", 1.0][0]
    assert kl["start", 0.0][0] == pytest.approx(kl["self", 0.0][0], rel=1e-5) and kl["start", 0.0][0] > 1e-4
    assert any(abs(a - b) > 1e-3 * a for a, b in zip(kl["start", 0.0][1:], kl["self", 0.0][1:]))

    recipe = json.loads((tmp_path / "start-1.0" / "finetune.json").read_text())
    tiny = load_base("tiny")
    adapter = PeftModel.from_pretrained(load_base("tiny").model, str(first)).eval()
    prompts = load_prompts(DistillConfig(documents=str(corpus), prompts=6, docs_per_prompt=(2,)), 0)
    answers = {
        name: [tiny.tokenizer.decode(e.answer) for e in teacher_examples(m, tiny.tokenizer, prompts, 3, CPU, [SHORT])]
        for name, m in (("start", adapter), ("base", tiny.model))
    }
    assert answers["start"] != answers["base"]
    assert [s["teacher_answer"] for s in recipe["distill_samples"]] == answers["start"][1:]


def test_distilled_full_rows_need_a_frozen_teacher():
    with pytest.raises(InvalidRequestError, match="frozen teacher"):
        DistillConfig(documents="-", teacher="self", full_share=0.5)
    with pytest.raises(InvalidRequestError, match="full_share"):
        DistillConfig(documents="-", teacher="start", full_share=1.5)
