"""Requests to segments (docs/design.md, Semantics): `[system][doc 1]…[doc n]` + final
`[question + assistant header]`, laid out as a `PromptLayout` says (prompt_layout.py; the default is
Block-Attention's published RAG format).

How it is cut for a chat-templated model: the conversation is rendered once with a unique placeholder where
the documents go, and the rendered text is split there. Everything before the placeholder is the system
segment, everything after it is the final segment, and each document is tokenised on its own (no BOS), so a
document's token ids depend only on its text and title: they are the document cache's key, the same in any
slot and any request (`encode_document`). BOS appears once, at the start of the first segment.

With no documents nothing is cut: the whole prompt is the final segment, tokenised in one piece exactly as a
plain (non-RAG) engine would. That is no loss under §1: a first segment attending causally to itself and then
seen by everything after it is the same computation as one causal sequence.

Control tokens come from the chat template only. Text the client wrote (message fields, template kwargs,
documents, a completion prompt) is tokenised as plain text even where it spells a special token, or a user
could close their own turn and open a forged system one by typing `<|im_end|>`. In the conversation, each
piece of special-token text the client wrote is swapped for a random placeholder before the template renders
and encoded as plain text after (`TokenizerBase.encode_spans`); text without any is encoded exactly as before.
`PromptLayout(parse_special_tokens=True)` turns this off for trusted input written in the model's own format.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lazyattn.engine.messages import UserText, normalize_messages, template_kwargs
from lazyattn.engine.prompt_layout import (
    BLOCK_ATTENTION_QUESTION,
    BLOCK_ATTENTION_SYSTEM_PROMPT,
    DEFAULT_LAYOUT,
    TULU3_BLOCK_FT_LAYOUT,
    Document,
    PromptLayout,
    format_document,
)
from lazyattn.errors import InvalidRequestError
from lazyattn.model.tokenizer import TokenizerBase, check_text

__all__ = [
    "BLOCK_ATTENTION_QUESTION",
    "BLOCK_ATTENTION_SYSTEM_PROMPT",
    "DEFAULT_LAYOUT",
    "TULU3_BLOCK_FT_LAYOUT",
    "Document",
    "PromptLayout",
    "RenderedPrompt",
    "encode_document",
    "format_document",
    "from_token_ids",
    "render_chat",
    "render_completion",
]


@dataclass(frozen=True)
class RenderedPrompt:
    """`segments` are encoded each on its own (block attention); `final` attends to all of them and itself.
    `final` is never empty: generation continues from its last token."""

    segments: list[list[int]]
    final: list[int]

    @property
    def token_ids(self) -> list[int]:
        """All prompt tokens in logical order (what a full-attention run would be fed)."""
        return [t for segment in self.segments for t in segment] + self.final

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.segments) + len(self.final)


def encode_document(
    tokenizer: TokenizerBase, document: Document, layout: PromptLayout = DEFAULT_LAYOUT, param: str = "document"
) -> list[int]:
    """A document segment's token ids: the only place they are computed, so equal documents get equal ids.
    A document seen before is not tokenised again when the tokenizer has a cache (model/tokenizer_cache.py)."""
    text = format_document(document, layout, param)  # validation first: a bad document fails even if cached
    special = layout.parse_special_tokens
    cache = tokenizer.cache
    if cache is not None and (ids := cache.get(text, special)) is not None:
        return ids
    ids = tokenizer.encode(text) if special else tokenizer.encode_plain(text)
    if cache is not None:
        cache.put(text, special, ids)
    return ids


def render_chat(
    tokenizer: TokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    documents: Sequence[Document] = (),
    layout: PromptLayout = DEFAULT_LAYOUT,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> RenderedPrompt:
    """A chat request (OpenAI-style messages) with optional documents, through the model's chat template."""
    user_text = UserText(tokenizer, layout.parse_special_tokens)
    chat = user_text.hide(normalize_messages(messages), "messages")
    kwargs = user_text.hide(template_kwargs(chat_template_kwargs), "chat_template_kwargs")
    doc_ids = _encode_documents(tokenizer, documents, layout)
    if not doc_ids:
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, **kwargs)
        return RenderedPrompt([], _bos_fixed(user_text.encode(text), tokenizer, layout))

    # A random placeholder cannot collide with user text; it is split out again right after rendering.
    slot = f"<<lazyattn-documents-{secrets.token_hex(8)}>>"
    _place_slot(chat, slot, layout)
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, **kwargs)
    if text.count(slot) != 1:
        where = "user" if layout.documents_in_user_turn else "system"
        raise InvalidRequestError(
            f"this model's chat template does not keep the {where} message intact, so the documents cannot be "
            f"placed there; try PromptLayout(documents_in_user_turn={not layout.documents_in_user_turn})",
            param="documents",
        )
    before, after = text.split(slot)
    system = _bos_fixed(user_text.encode(before), tokenizer, layout)
    final = user_text.encode(after)
    if not final:
        raise InvalidRequestError("the chat template rendered nothing after the documents", param="messages")
    return RenderedPrompt(([system] if system else []) + doc_ids, final)


def render_completion(
    tokenizer: TokenizerBase,
    prompt: str,
    documents: Sequence[Document] = (),
    layout: PromptLayout = DEFAULT_LAYOUT,
) -> RenderedPrompt:
    """A plain prompt (/v1/completions, or a model without a chat template):
    `[BOS + completion_system_prompt][doc]…` + final `[prompt]`."""
    if not isinstance(prompt, str):
        raise InvalidRequestError(f"prompt must be a string, got {type(prompt).__name__}", param="prompt")
    check_text(prompt, "prompt")
    doc_ids = _encode_documents(tokenizer, documents, layout)
    if not prompt:
        # Generation continues from the prompt's last token; there must be one after the documents.
        detail = "with documents, give the text that follows them" if doc_ids else "and there are no documents"
        raise InvalidRequestError(f"prompt is empty ({detail})", param="prompt")
    trusted = layout.parse_special_tokens
    if not doc_ids:
        ids = tokenizer.encode_spans([(layout.completion_system_prompt, True), (prompt, trusted)])
        return RenderedPrompt([], _bos_fixed(ids, tokenizer, layout))
    system = _bos_fixed(tokenizer.encode(layout.completion_system_prompt), tokenizer, layout)
    return RenderedPrompt(([system] if system else []) + doc_ids, tokenizer.encode_spans([(prompt, trusted)]))


def from_token_ids(
    prompt_token_ids: Sequence[int],
    document_token_ids: Sequence[Sequence[int]] = (),
    bos: int | None = None,
    vocab_size: int | None = None,
) -> RenderedPrompt:
    """Token-level input, no rendering: `[bos][doc]…` + final `[prompt]`. Ids are checked against `vocab_size`
    if given.

    With `bos`, the sequence starts with exactly one BOS, never two: ids that already start with it (the first
    document, or the prompt when there are no documents) are used as given; otherwise BOS is its own segment in
    front of the documents (so each document's ids, its cache key, stay the same in every slot) or the prompt's
    first token. A prompt starting with BOS after documents gives it up: BOS belongs at the very start. With
    bos=None the ids are used exactly as given, as vLLM does.
    """
    prompt = _token_list(prompt_token_ids, "prompt_token_ids", vocab_size)
    if not isinstance(document_token_ids, Sequence) or isinstance(document_token_ids, str):
        raise InvalidRequestError("document_token_ids must be a list of token id lists", param="document_token_ids")
    docs = [_token_list(d, f"document_token_ids[{i}]", vocab_size) for i, d in enumerate(document_token_ids)]
    for i, d in enumerate(docs):
        if not d:
            raise InvalidRequestError(f"document_token_ids[{i}] is empty", param=f"document_token_ids[{i}]")
    if bos is not None and len(prompt) > 1 and prompt[0] == bos and docs:
        prompt = prompt[1:]  # BOS belongs to the first segment (unless it is all there is to continue from)
    if not prompt:
        raise InvalidRequestError(
            "prompt_token_ids is empty; generation continues from its last token", param="prompt_token_ids"
        )
    if not docs:
        return RenderedPrompt([], prompt if bos is None or prompt[0] == bos else [bos, *prompt])
    if bos is None or docs[0][0] == bos:
        return RenderedPrompt(docs, prompt)
    return RenderedPrompt([[bos], *docs], prompt)


# ---------------------------------------------------------------------------------------------------------------


def _bos_fixed(ids: list[int], tokenizer: TokenizerBase, layout: PromptLayout) -> list[int]:
    """Exactly one BOS at the start when wanted (a template may already write it as text), none when not."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return ids
    want = tokenizer.add_bos_token if layout.add_bos is None else layout.add_bos
    has = bool(ids) and ids[0] == bos
    if want and not has:
        return [bos, *ids]
    if layout.add_bos is False and has:
        return ids[1:]
    return ids


def _encode_documents(
    tokenizer: TokenizerBase, documents: Sequence[Document] | None, layout: PromptLayout
) -> list[list[int]]:
    if documents is None:
        return []
    if isinstance(documents, (str, Mapping)) or not isinstance(documents, Sequence):
        raise InvalidRequestError("documents must be a list", param="documents")
    return [encode_document(tokenizer, d, layout, param=f"documents[{i}]") for i, d in enumerate(documents)]


def _token_list(ids: Any, param: str, vocab_size: int | None) -> list[int]:
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise InvalidRequestError(f"{param} must be a list of token ids", param=param)
    for t in ids:
        if not isinstance(t, int) or isinstance(t, bool) or t < 0 or (vocab_size is not None and t >= vocab_size):
            bound = f" [0, {vocab_size})" if vocab_size is not None else ""
            raise InvalidRequestError(f"{param} contains {t!r}, not a token id{bound}", param=param)
    return list(ids)


def _place_slot(chat: list[dict[str, Any]], slot: str, layout: PromptLayout) -> None:
    """Put the document placeholder (and the layout's system prompt and question wrapper) into `chat`."""
    users = [i for i, m in enumerate(chat) if m["role"] == "user"]
    if users:
        last = chat[users[-1]]
        last["content"] = layout.question_format.format(question=last["content"])
    has_system = chat[0]["role"] == "system"
    if not has_system and layout.system_prompt:
        chat.insert(0, {"role": "system", "content": layout.system_prompt})
        has_system = True
        users = [i + 1 for i in users]
    if layout.documents_in_user_turn:
        if not users:
            raise InvalidRequestError("documents go in the user turn, but there is no user message", param="messages")
        chat[users[-1]]["content"] = layout.documents_header + slot + chat[users[-1]]["content"]
    elif has_system:
        system_text = chat[0]["content"]
        separator = layout.documents_separator if system_text else ""
        chat[0]["content"] = system_text + separator + layout.documents_header + slot
    else:
        chat.insert(0, {"role": "system", "content": layout.documents_header + slot})
