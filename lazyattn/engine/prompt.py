"""Requests to segments (docs/design.md, Semantics): `[system][doc 1]…[doc n]` + final
`[question + assistant header]`.

The default layout is Block-Attention's published RAG format (as in its Llama-3 data; `TULU3_BLOCK_FT_LAYOUT`
gives the variant its Tulu3-Block-FT checkpoint was trained on):

    system turn:  <BOS>{chat template's system header}{system prompt}\\n\\n    -> segments[0]
                  - Title: {title}\\n{text}\\n                               -> segments[1], one per document
                  …
    then:         {end of system turn}{user turn: instruction + question}{assistant header}  -> final

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
from lazyattn.errors import InvalidRequestError
from lazyattn.model.tokenizer import TokenizerBase, check_text

BLOCK_ATTENTION_SYSTEM_PROMPT = (
    "You are an intelligent AI assistant. Please answer questions based on the user's instructions. "
    "Below are some reference documents that may help you in answering the user's question."
)
BLOCK_ATTENTION_QUESTION = (
    "Please write a high-quality answer for the given question using only the provided search documents "
    "(some of which might be irrelevant).\nQuestion: {question}"
)

Document = str | Mapping[str, Any]  # "text" or {"title": ..., "text": ...}


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


@dataclass(frozen=True)
class PromptLayout:
    """Where documents and instructions go. Defaults: Block-Attention's published format.

    The system prompt and question format are used only when the request has documents; a request without
    documents renders exactly as the chat template (or the plain prompt) says.
    """

    # Used when the conversation has no system message of its own ("" for none).
    system_prompt: str = BLOCK_ATTENTION_SYSTEM_PROMPT
    # Between the system text and the documents (system-turn placement only).
    documents_separator: str = "\n\n"
    # Text right before the first document, in the same turn (so in the system segment).
    documents_header: str = ""
    document_format: str = "- Title: {title}\n{text}\n"
    untitled_document_format: str = "{text}\n"
    # Wraps the last user message's content; must contain "{question}".
    question_format: str = BLOCK_ATTENTION_QUESTION
    # False: documents end the system turn (published format). True: they open the last user turn, for
    # templates without a system role or models tuned that way.
    documents_in_user_turn: bool = False
    # Plain completions: text after BOS in the first segment, when there are documents.
    completion_system_prompt: str = ""
    # None: BOS iff the tokenizer adds it to plain text (tokenizer.add_bos_token). False: never, even when the
    # chat template writes it (Tulu3-Block-FT was trained without BOS). True: always.
    add_bos: bool | None = None
    # True: special-token text in messages, documents and prompts becomes control tokens, as the chat template's
    # own does. Only for input written by whoever runs the model (e.g. prompts already in its chat format).
    parse_special_tokens: bool = False

    def __post_init__(self) -> None:
        for name, needed in (
            ("document_format", "{text}"),
            ("untitled_document_format", "{text}"),
            ("question_format", "{question}"),
        ):
            fmt = getattr(self, name)
            if needed not in fmt:
                raise InvalidRequestError(f"PromptLayout.{name} must contain {needed}", param=name)
            try:
                fmt.format(title="", text="", question="")
            except (KeyError, IndexError, ValueError) as e:
                raise InvalidRequestError(
                    f"PromptLayout.{name} is not a valid format string "
                    "(fields: {title}, {text}, {question}; write braces as {{ }})",
                    param=name,
                ) from e


DEFAULT_LAYOUT = PromptLayout()

# Tulu3-Block-FT's training layout, per Block-Attention's data scripts: one user turn holding the system text
# and the documents, then "\n\n" + the instruction and question; no BOS (its blocks were tokenised without).
# With Tulu's chat template this renders `<|user|>\n{system}\n\n` | documents | `\n\nPlease write…\n<|assistant|>\n`.
TULU3_BLOCK_FT_LAYOUT = PromptLayout(
    system_prompt="",
    documents_in_user_turn=True,
    documents_header=BLOCK_ATTENTION_SYSTEM_PROMPT + "\n\n",
    question_format="\n\n" + BLOCK_ATTENTION_QUESTION,
    add_bos=False,
)


def format_document(document: Document, layout: PromptLayout = DEFAULT_LAYOUT, param: str = "document") -> str:
    """A document's text as it appears in the prompt (validated)."""
    if isinstance(document, str):
        title, text = None, document
    elif isinstance(document, Mapping):
        title, text = document.get("title"), document.get("text")
    else:
        raise InvalidRequestError(f"{param} must be a string or an object with 'text' (and 'title')", param=param)
    if text is None:
        raise InvalidRequestError(
            f"{param} has no 'text' (registered documents are referred to by id and must be resolved before rendering)",
            param=f"{param}.text",
        )
    if not isinstance(text, str):
        raise InvalidRequestError(f"{param}.text must be a string, got {type(text).__name__}", param=f"{param}.text")
    if not text:
        raise InvalidRequestError(f"{param}.text is empty", param=f"{param}.text")
    check_text(text, f"{param}.text")
    if title is not None and not isinstance(title, str):
        raise InvalidRequestError(f"{param}.title must be a string", param=f"{param}.title")
    if title:
        check_text(title, f"{param}.title")
        return layout.document_format.format(title=title, text=text)
    return layout.untitled_document_format.format(text=text)


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
