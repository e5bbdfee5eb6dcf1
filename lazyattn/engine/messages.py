"""Client-given conversation parts, checked and made safe before a chat template renders them: roles, text
content, template kwargs, and the special-token text a client wrote (kept out of the control tokens)."""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from lazyattn.errors import InvalidRequestError
from lazyattn.model.tokenizer import TokenizerBase, check_text

# OpenAI's "developer" role is the newer name for "system"; chat templates only know the latter.
_ROLE_ALIASES = {"developer": "system"}
_ROLES = frozenset({"system", "user", "assistant", "tool"})


# The variables the renderer itself gives a chat template (`TokenizerBase.apply_chat_template`): a request's
# chat_template_kwargs may not replace them.
TEMPLATE_VARIABLES = frozenset(
    {
        "messages",
        "add_generation_prompt",
        "bos_token",
        "eos_token",
        "pad_token",
        "unk_token",
        "raise_exception",
        "strftime_now",
    }
)
# How deep client-given values (template kwargs, message fields) may nest; real ones are a few levels.
_MAX_NESTING = 32


def _text_content(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if content is None:  # OpenAI's assistant turn that only made tool calls; an empty turn for other roles
        return ""
    # OpenAI's content parts: only text parts can be rendered by a text-only model.
    if isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "\n".join(p["text"] for p in content)
    raise InvalidRequestError(f"{param} must be a string (or a list of text parts)", param=param)


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(messages, (str, Mapping)) or not isinstance(messages, Sequence) or not messages:
        raise InvalidRequestError("messages must be a non-empty list", param="messages")
    chat: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidRequestError(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = message.get("role")
        role = _ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
        if role not in _ROLES:
            raise InvalidRequestError(
                f"messages[{i}].role must be one of {sorted(_ROLES | set(_ROLE_ALIASES))}, got {message.get('role')!r}",
                param=f"messages[{i}].role",
            )
        content = _text_content(message.get("content"), f"messages[{i}].content")
        chat.append({**message, "role": role, "content": content})
    return chat


def template_kwargs(kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise InvalidRequestError("chat_template_kwargs must be an object", param="chat_template_kwargs")
    reserved = sorted(TEMPLATE_VARIABLES & set(kwargs))
    if reserved:
        raise InvalidRequestError(
            f"chat_template_kwargs may not set {', '.join(reserved)}: the server sets those template variables itself",
            param=f"chat_template_kwargs.{reserved[0]}",
        )
    return dict(kwargs)


class UserText:
    """Keeps the client's special-token text out of the control tokens of a rendered conversation.

    `hide` copies the client's values with each special-token string swapped for a placeholder (a random
    nonce, so client text cannot spell one), checking every string is encodable on the way; after rendering,
    `encode` reads the placeholders back as untrusted spans. A template that only places the client's strings
    (or trims them) renders them exactly as before; nothing is hidden when there is no special-token text,
    and then `encode` is the tokenizer's plain call on the rendered text."""

    def __init__(self, tokenizer: TokenizerBase, parse_special_tokens: bool = False) -> None:
        self.tokenizer = tokenizer
        self.pattern = None if parse_special_tokens else tokenizer.special_token_pattern
        self.nonce = secrets.token_hex(8)
        self.placeholders: dict[str, str] = {}  # special-token text -> its placeholder
        self.originals: dict[str, str] = {}  # placeholder -> special-token text

    def hide(self, value: Any, param: str, depth: int = 0) -> Any:
        if depth > _MAX_NESTING:
            raise InvalidRequestError(f"{param} is nested more than {_MAX_NESTING} levels deep", param=param)
        if isinstance(value, str):
            check_text(value, param)
            return value if self.pattern is None else self.pattern.sub(self._placeholder, value)
        if isinstance(value, Mapping):
            return {k: self.hide(v, f"{param}.{k}", depth + 1) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.hide(v, f"{param}[{i}]", depth + 1) for i, v in enumerate(value)]
        return value

    def _placeholder(self, match: re.Match[str]) -> str:
        special = match.group()
        if special not in self.placeholders:
            placeholder = f"<<lazyattn-text-{self.nonce}-{len(self.placeholders)}>>"
            self.placeholders[special] = placeholder
            self.originals[placeholder] = special
        return self.placeholders[special]

    def encode(self, rendered: str) -> list[int]:
        if not self.originals:
            return self.tokenizer.encode(rendered)
        split = re.compile("(" + "|".join(map(re.escape, self.originals)) + ")")
        spans = [(self.originals.get(part, part), part not in self.originals) for part in split.split(rendered) if part]
        return self.tokenizer.encode_spans(spans)
