"""Where a prompt puts documents and instructions (`PromptLayout`), and how a document reads in it
(`format_document`). The default layout is Block-Attention's published RAG format (as in its Llama-3 data;
`TULU3_BLOCK_FT_LAYOUT` gives the variant its Tulu3-Block-FT checkpoint was trained on):

    system turn:  <BOS>{chat template's system header}{system prompt}\\n\\n    -> segments[0]
                  - Title: {title}\\n{text}\\n                               -> segments[1], one per document
                  …
    then:         {end of system turn}{user turn: instruction + question}{assistant header}  -> final

prompt.py renders a request through a layout into segments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lazyattn.errors import InvalidRequestError
from lazyattn.model.tokenizer import check_text

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


# The layout under which SmolLM2-135M-Instruct answers best with full attention (docs/quality.md): a short system
# prompt and a cue for a short answer.
SHORT_ANSWER_LAYOUT = PromptLayout(
    system_prompt="You are a helpful assistant. Answer the user's question with a short answer, "
    "using only the documents below.",
    question_format="{question}\nAnswer in a few words.",
)

# The layouts `lazyattn eval --prompt-layout` and `lazyattn finetune --prompt-layouts` take by name.
NAMED_LAYOUTS: dict[str, PromptLayout] = {
    "block-attention": DEFAULT_LAYOUT,
    "tulu3-block-ft": TULU3_BLOCK_FT_LAYOUT,
    "short-answer": SHORT_ANSWER_LAYOUT,
}


def named_layouts(names: str) -> list[PromptLayout]:
    """Layouts from comma-separated names of NAMED_LAYOUTS (each once, in the order given)."""
    chosen = list(dict.fromkeys(n.strip() for n in names.split(",") if n.strip()))
    unknown = [n for n in chosen if n not in NAMED_LAYOUTS]
    if unknown or not chosen:
        raise InvalidRequestError(
            f"unknown prompt layout {', '.join(unknown) or '(none given)'}; choose from {', '.join(NAMED_LAYOUTS)}",
            param="prompt_layouts",
        )
    return [NAMED_LAYOUTS[n] for n in chosen]


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
