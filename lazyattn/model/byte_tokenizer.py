"""The byte tokenizer of the built-in `tiny` model: one id per byte, a few control tokens, a small chat template."""

from __future__ import annotations

import re
from collections.abc import Sequence

from lazyattn.model.tokenizer_base import TokenizerBase, check_text, special_pattern

_BYTE_SPECIALS = ("<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<pad>")

_BYTE_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


class ByteTokenizer(TokenizerBase):
    """Ids 0-255 are UTF-8 bytes, 256 `<s>` (BOS), 257 `</s>` (EOS), then chat specials, then reserved
    specials up to VOCAB_SIZE. Any text round-trips; no files needed."""

    VOCAB_SIZE = 320

    def __init__(self) -> None:
        reserved = [f"<|reserved_{i}|>" for i in range(self.VOCAB_SIZE - 256 - len(_BYTE_SPECIALS))]
        self._specials = list(_BYTE_SPECIALS) + reserved
        self._special_ids = {tok: 256 + i for i, tok in enumerate(self._specials)}
        self._special_re = special_pattern(self._specials)
        self.bos_token, self.eos_token, self.pad_token = "<s>", "</s>", "<pad>"
        self.chat_template = _BYTE_CHAT_TEMPLATE
        self.add_bos_token = True

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        check_text(text)
        ids: list[int] = [256] if add_special_tokens else []
        pos = 0
        for m in self._special_re.finditer(text):
            ids.extend(text[pos : m.start()].encode("utf-8"))
            ids.append(self._special_ids[m.group()])
            pos = m.end()
        ids.extend(text[pos:].encode("utf-8"))
        if add_special_tokens and len(ids) > 1 and ids[1] == 256:  # the text itself began with "<s>"
            del ids[0]
        return ids

    @property
    def special_token_pattern(self) -> re.Pattern[str] | None:
        return self._special_re

    def _encode_with_plain_specials(self, spans: Sequence[tuple[str, bool]]) -> list[int]:
        # Bytes do not merge, so the spans can be encoded one by one; a special straddling two spans is not
        # inside a trusted one and stays bytes.
        ids: list[int] = []
        for text, trusted in spans:
            ids.extend(self.encode(text) if trusted else text.encode("utf-8"))
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        parts: list[str] = []
        pending = bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < 256:
                pending.append(i)
            elif 256 <= i < self.VOCAB_SIZE and not skip_special_tokens:
                parts.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
                parts.append(self._specials[i - 256])
            # Other ids (skipped specials, out of range) decode to nothing, as in the tokenizers library.
        parts.append(pending.decode("utf-8", errors="replace"))
        return "".join(parts)

    def token_to_id(self, token: str) -> int | None:
        return self._special_ids.get(token)

    def token_bytes(self, token_id: int) -> bytes:
        if 0 <= token_id < 256:
            return bytes([token_id])
        return self._specials[token_id - 256].encode() if 256 <= token_id < self.VOCAB_SIZE else b""

    @property
    def vocab_size(self) -> int:
        return self.VOCAB_SIZE

    @property
    def eos_token_ids(self) -> list[int]:
        # `<|end|>` closes every chat turn, so it ends generation like `</s>` (cf. Llama 3.1's eot_id).
        return [257, self._special_ids["<|end|>"]]
