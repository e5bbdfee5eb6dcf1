"""`lazyattn finetune` on the built-in `tiny` model: the training rows compute what the engine serves, training
lowers the loss, and the saved adapter / merged checkpoint give the same greedy tokens in lazyattn and
transformers."""

from __future__ import annotations

import json

import pytest
import torch

from lazyattn.engine.llm import LLM
from lazyattn.engine.sampling import SamplingParams
from lazyattn.errors import InvalidRequestError
from lazyattn.finetune import masks
from lazyattn.finetune.base import load_base
from lazyattn.finetune.data import Example, builtin_items, encode_item, encode_items
from lazyattn.finetune.train import FinetuneConfig, finetune, make_batch
from lazyattn.model.adapter import is_adapter_dir, read_adapter
from lazyattn.model.hub import resolve_model

GEN = 4
# Short documents: the byte tokenizer spends one token per character, and CPU time is scarce.
ITEMS = [
    {
        "question": f"Where does {name} live?",
        "answers": [town],
        "documents": [
            {"title": name, "text": f"{name} lives in {town}."},
            {"title": other, "text": f"{other} lives in {far}."},
        ],
        "gold": [0],
    }
    for name, town, other, far in [
        ("Ana", "Oslo", "Bo", "Rome"),
        ("Cy", "Lima", "Di", "Kyiv"),
        ("Ed", "Baku", "Flo", "Doha"),
        ("Gus", "Riga", "Hal", "Nice"),
    ]
]


@pytest.fixture(scope="module")
def tiny():
    return load_base("tiny")


def row_logprobs(model, example: Example, block: bool, ape_prefix: bool = False) -> torch.Tensor:
    """Log-probs after the last prompt token and after each answer token, from one training row."""
    return logprobs_of(model, make_batch([example], [block], ape_prefix=ape_prefix), example)


def logprobs_of(model, batch: dict, example: Example) -> torch.Tensor:
    batch = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        logits = model(**batch, use_cache=False).logits[0].double()
    first = batch["input_ids"].shape[1] - len(example.answer) - 1
    return torch.log_softmax(logits[first:], -1)


def served(llm, item, params) -> tuple[list[int], list, Example]:
    """The engine's greedy tokens and log-probs for `item`, and the training example of the same tokens."""
    messages = [{"role": "user", "content": item["question"]}]
    out = llm.chat(messages, params, documents=[item["documents"]])[0].outputs[0]
    rendered = llm.render_chat(messages, item["documents"])
    return list(out.token_ids), out.logprobs, Example(rendered.segments, rendered.final, list(out.token_ids))


def assert_serves(got_ids, got_logprobs, want) -> None:
    assert got_ids == [int(lp.argmax()) for lp in want[:GEN]]
    for got, lp in zip(got_logprobs, want):
        ids = torch.tensor(list(got))
        assert torch.allclose(torch.tensor(list(got.values()), dtype=torch.float64), lp[ids], atol=2e-4)


@pytest.mark.parametrize("mode", ["lazy", "full"])
def test_training_rows_compute_what_the_engine_serves(tiny, mode):
    """Same weights, same tokens: the engine's greedy tokens and log-probs equal the training row's (block mask +
    logical positions for lazy, causal for full), and the two semantics really differ."""
    llm = LLM(model="tiny", mode=mode, device="cpu", page_size=16)
    params = SamplingParams(max_tokens=GEN, temperature=0.0, ignore_eos=True, logprobs=5)
    ids, logprobs, example = served(llm, ITEMS[0], params)
    want = row_logprobs(tiny.model, example, block=mode == "lazy")
    assert_serves(ids, logprobs, want)
    other = row_logprobs(tiny.model, example, block=mode != "lazy")
    assert (other[0] - want[0]).abs().max() > 1e-2


# Three documents: the second and third read copies of the first segment (masks.py), the first reads it in place.
THREE = {**ITEMS[1], "documents": ITEMS[1]["documents"] + [{"title": "Jo", "text": "Jo lives in Bern."}]}


def test_ape_prefix_rows_compute_what_lazy_mode_with_the_shared_prefix_serves(tiny):
    """lazy mode with ape_prefix=True (documents encoded after the first segment, read at their logical positions)
    equals the ape_prefix training row, and differs from every near miss: plain block rows, the copies of the
    first segment at its own positions, the final segment also seeing the copies, a document not seeing them."""
    llm = LLM(model="tiny", mode="lazy", device="cpu", page_size=16, ape_prefix=True)
    params = SamplingParams(max_tokens=GEN, temperature=0.0, ignore_eos=True, logprobs=5)
    ids, logprobs, example = served(llm, THREE, params)
    batch = make_batch([example], [True], ape_prefix=True)
    want = logprobs_of(tiny.model, batch, example)
    assert_serves(ids, logprobs, want)

    lens = [len(s) for s in example.segments]
    first, copies, at = lens[0], [], lens[0] + lens[1]  # [S_0][D_1][copy][D_2][copy][D_3][final + answer]
    for n in lens[2:]:
        copies += range(at, at + first)
        at += first + n
    row = masks.row(example.segments, example.final + example.answer, block=True, ape_prefix=True)
    context = len(row.tokens) - len(example.final) - len(example.answer)
    assert [row.tokens[i] for i in copies] == example.segments[0] * 2 and at == context
    misplaced = dict(batch, position_ids=batch["position_ids"].clone())
    misplaced["position_ids"][0, copies] = torch.arange(first).repeat(len(example.segments) - 2)
    final_sees_copies = dict(batch, attention_mask=batch["attention_mask"].clone())
    final_sees_copies["attention_mask"][0, 0, context:, copies] = 0.0
    doc = copies[-1] + 1  # the last document's first row
    blind = dict(batch, attention_mask=batch["attention_mask"].clone())
    blind["attention_mask"][0, 0, doc:context, copies[-first:]] = torch.finfo(torch.float32).min
    near_misses = [make_batch([example], [True]), misplaced, final_sees_copies, blind]
    for near in near_misses:
        assert (logprobs_of(tiny.model, near, example)[0] - want[0]).abs().max() > 1e-3


def test_ape_prefix_rows_without_documents_after_the_first_are_plain_rows(tiny):
    one = encode_item(tiny.tokenizer, {**ITEMS[0], "documents": ITEMS[0]["documents"][:1]})
    with_prefix = masks.row(one.segments, one.final + one.answer, block=True, ape_prefix=True)
    causal = masks.row(one.segments, one.final + one.answer, block=False)
    assert with_prefix.tokens == causal.tokens and torch.equal(with_prefix.visible, causal.visible)
    three = encode_item(tiny.tokenizer, THREE)
    lens = [len(s) for s in three.segments]
    tail = len(three.final) + len(three.answer)
    for block, prefix in ((True, True), (True, False), (False, True)):
        assert masks.row_length(lens, tail, block, prefix) == len(
            masks.row(three.segments, three.final + three.answer, block, prefix).tokens
        )


def test_examples_take_the_layouts_in_turn(tiny):
    from lazyattn.engine.prompt_layout import NAMED_LAYOUTS, named_layouts
    from lazyattn.eval.cli import LAYOUTS

    assert (
        *NAMED_LAYOUTS,
        "icl",
        "icl-language",
        "icl-language-more",
        "icl-language-heldout",
        "icl-language-heldout-wagtail",
    ) == LAYOUTS  # eval adds the few-shot sets' layouts
    layouts = named_layouts("block-attention, short-answer")
    examples = encode_items(tiny.tokenizer, ITEMS, layouts)
    for k, (item, e) in enumerate(zip(ITEMS, examples)):
        assert (e.segments, e.final) == (encode_item(tiny.tokenizer, item, layouts[k % 2]).segments, e.final)
    assert examples[0].segments[0] != examples[1].segments[0]  # two system prompts
    with pytest.raises(InvalidRequestError, match="short-answer"):
        named_layouts("block-attention,short")


def test_padding_does_not_leak_into_rows(tiny):
    short, long = (encode_item(tiny.tokenizer, item) for item in ITEMS[:2])
    long = Example(long.segments + [[65] * 40], long.final, long.answer)  # make the rows differ in length
    together = make_batch([short, long], [True, False])
    alone = make_batch([short], [True])
    with torch.no_grad():
        both = tiny.model(**together, use_cache=False).logits[0, : short.num_tokens]
        single = tiny.model(**alone, use_cache=False).logits[0]
    assert torch.allclose(both, single, atol=1e-5)
    labels = together["labels"][0]
    assert labels[labels != -100].tolist() == short.answer


def test_sdpa_rows_train_as_eager_rows():
    """The fused attention (the default) gives eager attention's loss and gradients on a step of block rows with
    the shared prefix, a full row and padding: it reads the same 4-D masks."""
    short, long = (encode_item(load_base("tiny").tokenizer, item) for item in ITEMS[:2])
    long = Example(long.segments + [[65] * 40], long.final, long.answer)
    batch = make_batch([short, long, short], [True, False, True], ape_prefix=True)
    got = {}
    for attention in ("eager", "sdpa"):
        torch.manual_seed(0)
        model = load_base("tiny", attention).model.train()
        loss = model(**batch, use_cache=False).loss
        loss.backward()
        got[attention] = loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}
    assert torch.allclose(got["sdpa"][0], got["eager"][0], rtol=1e-5)
    for name, grad in got["eager"][1].items():
        assert torch.allclose(got["sdpa"][1][name], grad, rtol=1e-4, atol=1e-6), name
    for bad in (lambda: load_base("tiny", "flash"), lambda: FinetuneConfig(attention="flash")):
        with pytest.raises(InvalidRequestError, match="attention must be one of sdpa, eager"):
            bad()


def test_examples_are_the_engines_segments_plus_the_answer(tiny):
    llm_render = LLM(model="tiny", device="cpu").render_chat
    example = encode_item(tiny.tokenizer, ITEMS[1])
    rendered = llm_render([{"role": "user", "content": ITEMS[1]["question"]}], ITEMS[1]["documents"])
    assert (example.segments, example.final) == (rendered.segments, rendered.final)
    assert example.answer == tiny.tokenizer.encode("Lima") + [tiny.tokenizer.eos_token_ids[0]]


def test_builtin_training_items_come_from_the_training_split():
    from lazyattn.qa.synthetic import generate

    train = builtin_items(42, seed=3)
    assert len(train) == 42 and all(item.id.startswith("train-") for item in train)
    evaluated = {item.question for item in generate(60, num_docs=10, split="eval")}
    assert not evaluated & {item.question for item in train}


def test_finetune_tiny_lowers_the_loss_and_saves_loadable_checkpoints(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in ITEMS))
    cfg = FinetuneConfig(
        model="tiny",
        out=str(tmp_path / "out"),
        data=str(data),
        examples=None,
        steps=16,
        batch_size=4,
        lr=3e-3,
        warmup_steps=2,
        full_share=0.0,
        lora_rank=4,
        merge=True,
        save_dtype="float32",
        progress=False,
        device="cpu",
    )
    result = finetune(cfg)
    assert sum(result.losses[-3:]) / 3 < 0.7 * sum(result.losses[:3]) / 3

    adapter_dir, merged_dir = tmp_path / "out" / "adapter", tmp_path / "out"
    assert is_adapter_dir(adapter_dir) and read_adapter(adapter_dir).base == "tiny"
    import transformers

    merged = transformers.AutoModelForCausalLM.from_pretrained(merged_dir, attn_implementation="eager").eval()
    params = SamplingParams(max_tokens=GEN, temperature=0.0, ignore_eos=True, logprobs=5)
    for mode in ("lazy", "full"):
        llm = LLM(model=str(adapter_dir), mode=mode, device="cpu", page_size=16)
        item = ITEMS[2]
        out = llm.chat([{"role": "user", "content": item["question"]}], params, documents=[item["documents"]])[0]
        rendered = llm.render_chat([{"role": "user", "content": item["question"]}], item["documents"])
        example = Example(rendered.segments, rendered.final, list(out.outputs[0].token_ids))
        want = row_logprobs(merged, example, block=mode == "lazy")
        assert out.outputs[0].token_ids == [int(lp.argmax()) for lp in want[:GEN]]


@pytest.mark.parametrize("name", ["smollm2-block", "smollm2-block-prefix"])
def test_named_adapters_are_the_shipped_folders(name):
    adapter = read_adapter(resolve_model(name))
    assert adapter.base == "smollm2" and adapter.path.name == name
    assert (adapter.path / "finetune.json").is_file()


def test_smollm2_block_prefix_records_the_recipe_the_docs_give():
    """docs/finetune.md, "smollm2-block-prefix": continued from smollm2-block with shared-prefix rows of both layouts,
    up to 4,096 tokens, half of them labelled block rows, half distilled from the frozen start."""
    record = json.loads((read_adapter(resolve_model("smollm2-block-prefix")).path / "finetune.json").read_text())
    cfg = record["config"]
    assert (cfg["init_adapter"], cfg["ape_prefix"], cfg["max_tokens"], cfg["attention"]) == (
        "smollm2-block",
        True,
        4096,
        "sdpa",
    )
    assert cfg["layouts"] == ["block-attention", "short-answer"]
    assert (cfg["labelled_share"], cfg["full_share"], cfg["lr"]) == (0.5, 0.0, 3e-4)
    assert cfg["distill"]["teacher"] == "start" and cfg["distill"]["documents"] == "jargon-file"
    assert record["steps_done"] == 280


def test_init_adapter_continues_from_its_weights(tmp_path):
    from safetensors.torch import load_file

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in ITEMS))
    common = dict(model="tiny", data=str(data), examples=None, batch_size=2, lora_rank=4, save_dtype="float32")
    common.update(progress=False, device="cpu", warmup_steps=1)
    first = tmp_path / "first"
    finetune(FinetuneConfig(out=str(first), steps=2, lr=1e-2, **common))
    again = tmp_path / "again"
    finetune(FinetuneConfig(out=str(again), steps=1, lr=0.0, init_adapter=str(first), **common))  # lr 0: unchanged
    want, got = (load_file(str(d / "adapter_model.safetensors")) for d in (first, again))
    assert want.keys() == got.keys() and any(t.abs().max() > 0 for k, t in want.items() if "lora_B" in k)
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert read_adapter(again).base == "tiny"
    with pytest.raises(InvalidRequestError, match="not over --model"):
        finetune(FinetuneConfig(**{**common, "model": "smollm2"}, out=str(tmp_path / "x"), init_adapter=str(first)))
