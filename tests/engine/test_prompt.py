"""Prompt rendering into segments: layout, BOS once, document ids independent of slot, validation."""

from __future__ import annotations

import pytest

from lazyattn.engine.prompt import (
    BLOCK_ATTENTION_SYSTEM_PROMPT,
    TULU3_BLOCK_FT_LAYOUT,
    PromptLayout,
    RenderedPrompt,
    encode_document,
    from_token_ids,
    render_chat,
    render_completion,
)
from lazyattn.errors import InvalidRequestError
from lazyattn.model.byte_tokenizer import ByteTokenizer
from lazyattn.model.tokenizer import Tokenizer
from tests.model.test_tokenizer import CHATML_TEMPLATE, write_hf_tokenizer

TOK = ByteTokenizer()
BOS = TOK.bos_token_id
DOCS = [{"title": "Paris", "text": "Paris is the capital of France."}, "Untitled fact.", {"text": "Third, no title."}]
QUESTION = [{"role": "user", "content": "What is the capital?"}]


def text_of(ids: list[int], tok=TOK) -> str:
    return tok.decode(ids, skip_special_tokens=False)


def test_default_layout_is_block_attention_format():
    r = render_chat(TOK, QUESTION, DOCS)
    assert len(r.segments) == 1 + len(DOCS)
    system, *docs = (text_of(s) for s in r.segments)
    assert system == f"<s><|system|>\n{BLOCK_ATTENTION_SYSTEM_PROMPT}\n\n"
    assert docs == ["- Title: Paris\nParis is the capital of France.\n", "Untitled fact.\n", "Third, no title.\n"]
    final = text_of(r.final)
    assert final.startswith("<|end|>\n<|user|>\nPlease write a high-quality answer")
    assert final.endswith("Question: What is the capital?<|end|>\n<|assistant|>\n")
    # Cutting changes nothing in the text: it is the conversation rendered with the documents inline.
    inline = [
        {"role": "system", "content": BLOCK_ATTENTION_SYSTEM_PROMPT + "\n\n" + "".join(docs)},
        {"role": "user", "content": final.split("<|user|>\n")[1].split("<|end|>")[0]},
    ]
    assert text_of(r.token_ids) == TOK.apply_chat_template(inline)
    assert r.num_tokens == len(r.token_ids)


def test_bos_only_once_at_the_start():
    for r in (
        render_chat(TOK, QUESTION, DOCS),
        render_chat(TOK, QUESTION),
        render_completion(TOK, "Q?", DOCS),
        render_completion(TOK, "Q?"),
        render_chat(TOK, QUESTION, DOCS, PromptLayout(documents_in_user_turn=True)),
    ):
        assert r.token_ids.count(BOS) == 1
        assert (r.segments[0] if r.segments else r.final)[0] == BOS
        assert all(BOS not in d for d in r.segments[1:])


def test_same_document_same_ids_in_any_slot_and_request():
    a, b = DOCS[0], DOCS[1]
    r1 = render_chat(TOK, QUESTION, [a, b])
    r2 = render_chat(
        TOK, [{"role": "system", "content": "Other system."}, {"role": "user", "content": "Q2"}], [b, "filler", a]
    )
    r3 = render_completion(TOK, "plain", [a])
    ids_a = encode_document(TOK, a)
    assert r1.segments[1] == r2.segments[3] == r3.segments[1] == ids_a
    assert r1.segments[2] == r2.segments[1] == encode_document(TOK, b)


def test_conversation_system_message_replaces_default_system_prompt():
    chat = [{"role": "system", "content": "Answer in French."}, *QUESTION]
    r = render_chat(TOK, chat, DOCS)
    assert text_of(r.segments[0]) == "<s><|system|>\nAnswer in French.\n\n"
    r = render_chat(TOK, QUESTION, DOCS, PromptLayout(system_prompt=""))
    assert text_of(r.segments[0]) == "<s><|system|>\n"


def test_documents_in_user_turn_and_custom_formats():
    layout = PromptLayout(
        documents_in_user_turn=True, document_format="[{title}] {text}\n\n", question_format="Q: {question}"
    )
    r = render_chat(TOK, QUESTION, DOCS[:2], layout)
    assert text_of(r.segments[0]).endswith("<|end|>\n<|user|>\n")
    assert text_of(r.segments[1]) == "[Paris] Paris is the capital of France.\n\n"
    assert text_of(r.final) == "Q: What is the capital?<|end|>\n<|assistant|>\n"
    # Multi-turn: the documents open the last user turn, the history stays before them.
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}, *QUESTION]
    r = render_chat(TOK, turns, DOCS[:1], layout)
    assert "Hello" in text_of(r.segments[0]) and "Q: What" in text_of(r.final)


def test_without_documents_the_prompt_is_one_plain_sequence():
    r = render_chat(TOK, QUESTION)
    assert r.segments == []
    assert r.final == TOK.encode(TOK.apply_chat_template(QUESTION))
    r = render_completion(TOK, "Once upon a time")
    assert r == RenderedPrompt([], [BOS, *TOK.encode("Once upon a time")])


def test_completion_layout():
    r = render_completion(TOK, "Answer:", DOCS[:2], PromptLayout(completion_system_prompt="Context:\n"))
    assert [text_of(s) for s in r.segments] == [
        "<s>Context:\n",
        "- Title: Paris\nParis is the capital of France.\n",
        "Untitled fact.\n",
    ]
    assert text_of(r.final) == "Answer:"


def test_add_bos_override():
    r = render_chat(TOK, QUESTION, DOCS, PromptLayout(add_bos=False))
    assert BOS not in r.token_ids and text_of(r.segments[0]).startswith("<|system|>")
    r = render_completion(TOK, "x", DOCS, PromptLayout(add_bos=False))
    assert r.segments == [encode_document(TOK, d) for d in DOCS]  # no BOS, no text: no system segment


def test_hf_template_writing_bos_is_not_doubled(llama3):
    bos = llama3.bos_token_id
    r = render_chat(llama3, QUESTION, DOCS)
    assert r.token_ids.count(bos) == 1 and r.segments[0][0] == bos
    assert text_of(r.segments[0], llama3).endswith(
        "Below are some reference documents that may help you in answering the user's question.\n\n"
    )
    assert text_of(r.final, llama3).startswith("<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n")
    assert text_of(r.final, llama3).endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert r.segments[1] == llama3.encode("- Title: Paris\nParis is the capital of France.\n")
    plain = render_chat(llama3, QUESTION)
    assert plain.final == llama3.encode(llama3.apply_chat_template(QUESTION)) and plain.final.count(bos) == 1


def test_hf_template_without_bos_gets_one_when_the_tokenizer_adds_it(tmp_path, llama3):
    tok = Tokenizer(write_hf_tokenizer(tmp_path, CHATML_TEMPLATE))  # Llama-3 vocabulary, ChatML template
    r = render_chat(tok, QUESTION, DOCS)
    assert r.segments[0][0] == tok.bos_token_id and r.token_ids.count(tok.bos_token_id) == 1
    assert text_of(r.segments[0], tok).startswith("<|begin_of_text|><|im_start|>system\n")


def test_model_without_bos(chatml):
    r = render_chat(chatml, QUESTION, DOCS)
    assert text_of(r.segments[0], chatml).startswith("<|im_start|>system\nYou are an intelligent")
    assert text_of(r.final, chatml).endswith("<|im_start|>assistant\n")
    r = render_completion(chatml, "x", DOCS)
    assert len(r.segments) == len(DOCS)  # nothing to put in a system segment: no BOS, no system text
    assert from_token_ids([5], [[1], [2]], bos=None) == RenderedPrompt([[1], [2]], [5])


def test_template_that_drops_the_document_slot_is_an_error(tmp_path):
    drops_system = "{% for m in messages %}{% if m['role'] != 'system' %}{{ m['content'] }}{% endif %}{% endfor %}"
    tok = Tokenizer(write_hf_tokenizer(tmp_path, drops_system))
    with pytest.raises(InvalidRequestError, match="documents_in_user_turn=True") as e:
        render_chat(tok, QUESTION, DOCS)
    assert e.value.param == "documents"
    r = render_chat(tok, QUESTION, DOCS, PromptLayout(documents_in_user_turn=True))
    assert text_of(r.segments[1], tok).startswith("- Title: Paris")


def test_tulu3_block_ft_layout(tmp_path):
    """Reproduces the blocks of Block-Attention's Tulu conversion: user turn = system text + documents, then
    the instruction; no BOS."""
    tulu_like = (
        "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
    )
    tok = Tokenizer(write_hf_tokenizer(tmp_path, tulu_like))
    r = render_chat(tok, QUESTION, DOCS[:2], TULU3_BLOCK_FT_LAYOUT)
    texts = [text_of(s, tok) for s in r.segments]
    assert texts == [
        f"<|user|>\n{BLOCK_ATTENTION_SYSTEM_PROMPT}\n\n",
        "- Title: Paris\nParis is the capital of France.\n",
        "Untitled fact.\n",
    ]
    assert text_of(r.final, tok) == (
        "\n\nPlease write a high-quality answer for the given question using only the "
        "provided search documents (some of which might be irrelevant).\n"
        "Question: What is the capital?\n<|assistant|>\n"
    )
    assert tok.bos_token_id not in r.token_ids


def test_from_token_ids_never_doubles_bos():
    """A first document that already starts with BOS carries it: no BOS segment of its own in front of it."""
    assert from_token_ids([7], [[BOS, 1, 2], [3]], bos=BOS) == RenderedPrompt([[BOS, 1, 2], [3]], [7])
    assert from_token_ids([BOS, 7], [[BOS, 1]], bos=BOS) == RenderedPrompt([[BOS, 1]], [7])
    assert from_token_ids([7], [[1], [BOS, 3]], bos=BOS) == RenderedPrompt([[BOS], [1], [BOS, 3]], [7])
    assert from_token_ids([BOS, 7], [[BOS, 1]]) == RenderedPrompt([[BOS, 1]], [BOS, 7])  # bos=None: as given


def test_from_token_ids():
    assert from_token_ids([7, 8], [[1, 2], [3]], bos=BOS) == RenderedPrompt([[BOS], [1, 2], [3]], [7, 8])
    assert from_token_ids([BOS, 7], [[1]], bos=BOS) == RenderedPrompt([[BOS], [1]], [7])
    assert from_token_ids([7], bos=BOS) == RenderedPrompt([], [BOS, 7])
    assert from_token_ids([BOS, 7], bos=BOS) == RenderedPrompt([], [BOS, 7])
    # A lone BOS after documents stays the final segment: generation needs a token to continue from.
    assert from_token_ids([BOS], [[1]], bos=BOS) == RenderedPrompt([[BOS], [1]], [BOS])
    for args, param in [
        (([],), "prompt_token_ids"),
        (([], [[1]]), "prompt_token_ids"),
        (([1], [[]]), "document_token_ids[0]"),
        (([1], [[1], [320]]), "document_token_ids[1]"),
        (([-1],), "prompt_token_ids"),
        ((["a"],), "prompt_token_ids"),
        (("abc",), "prompt_token_ids"),
        (([1], "ab"), "document_token_ids"),
    ]:
        with pytest.raises(InvalidRequestError) as e:
            from_token_ids(*args, bos=BOS, vocab_size=320)
        assert e.value.param == param, args


def test_content_parts_and_developer_role():
    parts = [
        {"role": "developer", "content": "Sys."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]
    expected = "<s><|system|>\nSys.<|end|>\n<|user|>\na\nb<|end|>\n<|assistant|>\n"
    assert text_of(render_chat(TOK, parts).final) == expected


@pytest.mark.parametrize(
    "messages, documents, param",
    [
        ([], (), "messages"),
        ("hello", (), "messages"),
        (["hello"], (), "messages[0]"),
        ([{"role": "wizard", "content": "x"}], (), "messages[0].role"),
        ([{"content": "x"}], (), "messages[0].role"),
        ([{"role": "user", "content": 5}], (), "messages[0].content"),
        ([{"role": "user", "content": "a\ud800b"}], (), "messages[0].content"),  # a lone surrogate
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], (), "messages[0].content"),
        (QUESTION, ["ok", ""], "documents[1].text"),
        (QUESTION, ["a\udfffb"], "documents[0].text"),
        (QUESTION, [{"title": "t"}], "documents[0].text"),
        (QUESTION, [{"text": 3}], "documents[0].text"),
        (QUESTION, [{"title": 3, "text": "x"}], "documents[0].title"),
        (QUESTION, [42], "documents[0]"),
        (QUESTION, "a single string", "documents"),
    ],
)
def test_chat_validation_errors(messages, documents, param):
    with pytest.raises(InvalidRequestError) as e:
        render_chat(TOK, messages, documents)
    assert e.value.param == param


def test_completion_validation_errors():
    for prompt, docs, param in [
        ("", (), "prompt"),
        ("", ["d"], "prompt"),
        (None, (), "prompt"),
        ("x", [""], "documents[0].text"),
    ]:
        with pytest.raises(InvalidRequestError) as e:
            render_completion(TOK, prompt, docs)
        assert e.value.param == param


def test_layout_validation():
    with pytest.raises(InvalidRequestError) as e:
        PromptLayout(document_format="{title}")
    assert e.value.param == "document_format"
    with pytest.raises(InvalidRequestError):
        PromptLayout(question_format="no placeholder")
    with pytest.raises(InvalidRequestError, match="valid format string"):
        PromptLayout(document_format="{text} {source}")
    assert render_completion(TOK, "x", ["a"], PromptLayout(untitled_document_format="{{{text}}}\n")).segments[
        1
    ] == TOK.encode("{a}\n")
