"""The one interface of every tokenizer (`TokenizerBase`): the prompt renderer and the engine never ask which one
they hold (hf_tokenizer.py, gguf_tokenizer.py, byte_tokenizer.py; `load_tokenizer` in tokenizer.py picks one).

`encode` parses special-token strings found in the text (`<|eot_id|>`, `<s>`), as Hugging Face does: that is how a
rendered chat template turns back into the right special ids. Text a user wrote must not get that treatment (typing
`<|eot_id|>` would forge a turn boundary), so `encode_spans` reads control tokens only in the spans the caller
trusts, and `encode_plain` none at all.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jinja2

from lazyattn.errors import InvalidRequestError
from lazyattn.model.chat_template import compile_chat_template

if TYPE_CHECKING:
    from lazyattn.model.tokenizer_cache import TokenizerCache

# A lone UTF-16 surrogate ("\ud800" in a JSON string decodes to one) has no UTF-8 encoding, so no tokenizer can
# read text holding one: it is the request's error, found before a tokenizer fails on it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(text: str, param: str | None = None) -> None:
    """Raise InvalidRequestError if `text` cannot be encoded as UTF-8 (a lone surrogate)."""
    m = _SURROGATE.search(text)
    if m is not None:
        raise InvalidRequestError(
            f"{param or 'the text'} is not valid Unicode: a lone surrogate "
            f"(U+{ord(m.group()):04X}) at character {m.start()}",
            param=param,
        )


def special_pattern(tokens: Sequence[str]) -> re.Pattern[str] | None:
    # Longest first: a special never matches as a prefix of a longer one (the tokenizers library also takes
    # the leftmost-longest match).
    ordered = sorted({t for t in tokens if t}, key=len, reverse=True)
    return re.compile("|".join(re.escape(t) for t in ordered)) if ordered else None


class TokenizerBase(ABC):
    """What the engine needs from a tokenizer. `bos_token_id` is None for models without one (Qwen)."""

    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    unk_token: str | None = None
    chat_template: str | None = None
    # Whether `encode(..., add_special_tokens=True)` starts the text with BOS; the prompt renderer follows it.
    add_bos_token: bool = False
    # Documents' token ids, looked up by `encode_document` (tokenizer_cache.py); the engine gives its tokenizer
    # one (EngineConfig.tokenizer_cache_tokens). None: every document is tokenised every time.
    cache: TokenizerCache | None = None

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Special-token text in `text` becomes control tokens: for text the model's own template wrote."""

    @property
    @abstractmethod
    def special_token_pattern(self) -> re.Pattern[str] | None:
        """Matches the special-token texts that `encode` reads as control tokens (None: there are none)."""

    def encode_spans(self, spans: Sequence[tuple[str, bool]]) -> list[int]:
        """Encode the concatenation of `spans`, (text, trusted) pairs, reading special-token text as a control
        token only inside trusted spans; in an untrusted span (or across a span boundary) it is plain text.
        Whenever no special-token text touches an untrusted span, the result is `encode` of the concatenation:
        that very call."""
        untrusted, at = [], 0
        for text, trusted in spans:
            check_text(text)
            if not trusted and text:
                untrusted.append((at, at + len(text)))
            at += len(text)
        joined = "".join(text for text, _ in spans)
        pattern = self.special_token_pattern
        if (
            pattern is None
            or not untrusted
            or not any(
                start < m.end() and m.start() < end for m in pattern.finditer(joined) for start, end in untrusted
            )
        ):
            return self.encode(joined)
        return self._encode_with_plain_specials(spans)

    def encode_plain(self, text: str) -> list[int]:
        """Text a user wrote: special-token text in it is plain text, never a control token."""
        return self.encode_spans([(text, False)])

    @abstractmethod
    def _encode_with_plain_specials(self, spans: Sequence[tuple[str, bool]]) -> list[int]:
        """`encode_spans` when some untrusted span holds special-token text."""

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    @abstractmethod
    def token_to_id(self, token: str) -> int | None: ...

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for, as the logprobs of the OpenAI API report them. A byte-level token can be
        part of a UTF-8 character, which its decoded text shows only as U+FFFD; subclasses that know the token's
        bytes say so. Here: the decoded text's UTF-8."""
        return self.decode([token_id], skip_special_tokens=False).encode()

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abstractmethod
    def eos_token_ids(self) -> list[int]: ...

    @property
    def bos_token_id(self) -> int | None:
        return self.token_to_id(self.bos_token) if self.bos_token else None

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        """Render a conversation to text (not token ids). `extra` reaches the template as variables
        (e.g. `enable_thinking=False` for Qwen3, `tools=[...]`)."""
        if self.chat_template is None:
            raise InvalidRequestError(
                "this model has no chat template; send a plain prompt to /v1/completions instead", param="messages"
            )
        template = compile_chat_template(self.chat_template)
        special = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
            "unk_token": self.unk_token,
        }
        context = {k: v for k, v in special.items() if v is not None}
        context.update(extra)
        context["messages"] = list(messages)
        context["add_generation_prompt"] = add_generation_prompt
        try:
            return template.render(**context)
        except jinja2.TemplateError as e:  # raise_exception(...) in the template: the conversation is not allowed
            raise InvalidRequestError(f"the chat template rejected the conversation: {e}", param="messages") from e
        except (TypeError, KeyError, AttributeError, ValueError, IndexError, OverflowError, ZeroDivisionError) as e:
            # What a template's own expressions raise on values it did not expect (a kwarg of the wrong type,
            # sandbox limits such as range()'s): the request's values, not the server, are at fault.
            raise InvalidRequestError(
                f"the chat template could not render these messages: {e}", param="messages"
            ) from e
