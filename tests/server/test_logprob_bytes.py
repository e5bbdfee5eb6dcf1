"""Logprobs' `bytes` are each token's own bytes (OpenAI API): where tokens split a UTF-8 character, their bytes
still join up to the answer's text, instead of each reporting U+FFFD's three bytes."""

from lazyattn.engine.outputs import CompletionOutput
from lazyattn.model.byte_tokenizer import ByteTokenizer
from lazyattn.server.responses import TokenText, chat_logprobs


def test_bytes_of_split_characters_join_up_to_the_text():
    text = "é → 😀!"
    ids = list(text.encode())  # the tiny model's tokenizer: one token per byte
    top = ids[0] + 1
    out = CompletionOutput(0, text, ids, logprobs=[{i: -0.5, top: -1.5} for i in ids])
    lp = chat_logprobs(out, 0, 2, TokenText(ByteTokenizer()))
    assert [t.bytes for t in lp.content] == [[b] for b in text.encode()]
    assert b"".join(bytes(t.bytes) for t in lp.content).decode() == text
    assert lp.content[0].top_logprobs[1].bytes == [top]
