"""Request bodies: OpenAI's schemas, plus documents and a few vLLM-style sampling extensions (the response bodies are
`server/protocol_responses.py`).

Requests forbid unknown fields (a typo or an unsupported OpenAI feature is a 400 naming the field, never
silently ignored) and are strict about types (`"max_tokens": "5"` is an error, as the schema says). The
published OpenAPI schema is the promise clients test against, so every limit a single field has is declared
here, with the same constants `SamplingParams.validate` checks (the offline API says the same thing about a
bad value). Limits that depend on the model (the vocabulary) are marked with `LIMIT` and filled in by
`server/openapi.py`. What no JSON schema can say is that a prompt and max_tokens must fit the context: that
400 carries the code `context_length_exceeded`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag

from lazyattn.engine.best_document import ANSWER_STRATEGIES
from lazyattn.engine.messages import TEMPLATE_VARIABLES
from lazyattn.engine.request_options import APE_MAX_TILT, APE_MIN_TEMPERATURE
from lazyattn.engine.sampling import (
    MAX_GUIDED_CHOICE_CHARS,
    MAX_GUIDED_CHOICES,
    MAX_LOGPROBS,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    SEED_MAX,
    SEED_MIN,
)

# Schema key naming a model-dependent maximum: "vocab_size" (top_k) or "token_id" (vocab_size - 1).
LIMIT = "x-lazyattn-maximum"


def _integral(value: Any) -> Any:
    # JSON has one number type: 5.0 is an integer to JSON Schema (and to OpenAI), only 5.5 is not.
    return int(value) if isinstance(value, float) and value.is_integer() else value


def json_int(**constraints: Any) -> Any:
    """A JSON integer: what strict mode takes (not true, not "5") plus integral floats. The constraints come
    before the validator, or pydantic cannot write them as JSON Schema keywords."""
    return Annotated[int, Field(**constraints), BeforeValidator(_integral)]


TokenId = json_int(ge=0, json_schema_extra={LIMIT: "token_id"})
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
NonEmptyText = Annotated[str, Field(min_length=1)]
Logprobs = json_int(ge=0, le=MAX_LOGPROBS)
PositiveInt = json_int(ge=1)

# -- requests ---------------------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class DocumentText(_Strict):
    """A document given inline."""

    title: str | None = None
    text: NonEmptyText


class DocumentRef(_Strict):
    """A document registered with POST /v1/documents, by its id."""

    id: str


def union_tag(name: str) -> str:
    """The tag of a union alternative: in angle brackets, which server/errors.py leaves out of the paths it reports
    (an alternative is not a field)."""
    return f"<{name}>"


_TEXT, _INLINE, _REF = union_tag("text"), union_tag("inline"), union_tag("ref")


def _document_kind(value: Any) -> str | None:
    """Which form a document takes, from its JSON shape: a validation error then speaks of that form alone
    (`documents[0].text: Field required`), not of every alternative of the union."""
    if isinstance(value, str):
        return _TEXT
    if isinstance(value, dict):
        return _REF if "id" in value else _INLINE
    # a request built in Python holds the models themselves
    return {DocumentText: _INLINE, DocumentRef: _REF}.get(type(value))  # None: the discriminator's own error


# A plain string is a document without a title.
DocumentInput = Annotated[
    Annotated[NonEmptyText, Tag(_TEXT)] | Annotated[DocumentText, Tag(_INLINE)] | Annotated[DocumentRef, Tag(_REF)],
    Discriminator(
        _document_kind,
        custom_error_type="document_type",
        custom_error_message="a document is a non-empty string, an object with 'text' (and 'title'), or "
        "an object with the 'id' of a registered document",
    ),
]


class StreamOptions(_Strict):
    include_usage: bool = False


class _GenerationRequest(_Strict):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model: str | None = None  # optional: a server serves one model
    n: json_int(ge=1, le=128) = 1
    # OpenAI's documented range; null means OpenAI's default, 1.
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    seed: json_int(ge=SEED_MIN, le=SEED_MAX) | None = None
    stream: bool = False
    stream_options: StreamOptions | None = Field(None, description="Used only with stream: true.")
    # Accepted for compatibility at their neutral values only (the engine has no penalties).
    presence_penalty: float = Field(0.0, ge=0, le=0, description="Not supported: only 0.")
    frequency_penalty: float = Field(0.0, ge=0, le=0, description="Not supported: only 0.")
    logit_bias: dict[str, float] | None = Field(None, max_length=0, description="Not supported: only {} or null.")
    user: str | None = None
    # lazyattn: the RAG inputs, and the tenant salt of the document cache.
    documents: list[DocumentInput] | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=256)
    relink_tokens: json_int(ge=0, le=1024) | None = Field(
        None,
        description="lazy mode: recompute the first k tokens of each placed document in this request's "
        "context (docs/design.md, Relink); default: the server's --relink-tokens",
    )
    relink_last_tokens: json_int(ge=0, le=1024) | None = Field(
        None,
        description="lazy mode: recompute the last k tokens of each placed document in this request's "
        "context (docs/design.md, Relink); default: the server's --relink-last-tokens",
    )
    # APE (docs/design.md): the mode rules (ape_prefix: lazy; temperature, scale and tilt: lazy or block) are the
    # engine's, checked when the request is added: a 400 naming the field.
    ape_temperature: Annotated[float, Field(ge=APE_MIN_TEMPERATURE, allow_inf_nan=False)] | None = Field(
        None,
        description="lazy or block mode: the answer's attention temperature T on the documents (their scores "
        "divided by T; 1: off, below 1 sharper); default: the server's --ape-temperature",
    )
    ape_scale: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        None,
        description="lazy or block mode: the answer's attention scale S on the documents (their weights "
        "multiplied by S; 1: off); default: the server's --ape-scale",
    )
    ape_prefix: bool | None = Field(
        None,
        description="lazy mode: encode each document after the first segment (the system prompt), which it "
        "then attends to, cached once per first segment and document; default: the server's --ape-prefix",
    )
    ape_tilt: Annotated[float, Field(ge=-APE_MAX_TILT, le=APE_MAX_TILT, allow_inf_nan=False)] | None = Field(
        None,
        description="lazy or block mode: the answer's attention weight on the first document multiplied by "
        "e^(tilt/2), on the last by e^(-tilt/2), evenly between (0: off); default: the server's --ape-tilt",
    )
    ape_parallel: bool | None = Field(
        None,
        description="lazy mode: read every document from the end of the first segment (the system prompt), the "
        "question after the longest document, instead of one after the other; not with relink; default: the "
        "server's --ape-parallel",
    )
    answer: Literal[ANSWER_STRATEGIES] | None = Field(
        None,
        description="null (the default): the server's --answer where it can answer the request (n 1, no stream, and for"
        " both-placements no ape_parallel), else joint. joint: one answer over all the documents; "
        "best-document: the request asked once per document, with that document alone, and the answer whose"
        " tokens have the highest mean log-probability kept (each choice's answered_from names that "
        "document); best-document-or-joint: the same, the request as given one more candidate "
        "(answered_from null: it won); confidence-order: the same one-document requests, then one answer "
        "over all the documents reordered by their answers' confidence, the surest last (each choice's "
        "document_order gives the order); confidence-order-or-joint: the same, the request as given also "
        "asked first and its answer kept where it is at least as sure (document_order null); each-last: in "
        "one round, the request as given and once more with each other document moved last, the surest "
        "answer kept (document_order: the order it read, null: as given); both-orders: in one round, the "
        "request as given and once more with its documents reversed, the surer answer kept (document_order: "
        "the reversed order, null: as given); both-placements (lazy mode): in "
        "one round, the documents read one after the other and read in parallel (ape_parallel, which the "
        "request leaves out), the surer answer kept (read_in_parallel says which). usage counts every "
        "request made; n must be 1 and no stream (docs/design.md, Answering from one document)",
    )
    confidence_tokens: json_int(ge=1) | None = Field(
        None,
        description="confidence-order and confidence-order-or-joint: the one-document answers that order the "
        "documents stop after this many tokens (only their confidence is used); null: the whole answer. The other "
        "strategies but joint: the candidates are ranked by their first this many tokens, and all but the surest "
        "stop there. answer joint rejects it (400)",
    )
    # Sampling extensions, named as in vLLM.
    top_k: json_int(ge=-1, json_schema_extra={LIMIT: "vocab_size"}) = Field(
        -1, description="-1 or 0: off; at most the vocabulary size."
    )
    min_p: float = Field(0.0, ge=0, le=1)
    min_tokens: json_int(ge=0) = Field(
        0, description="EOS and stop_token_ids cannot end a choice before this many tokens (past max_tokens: never)."
    )
    ignore_eos: bool = False
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    skip_special_tokens: bool = True
    guided_choice: (
        Annotated[
            list[Annotated[str, Field(min_length=1, max_length=MAX_GUIDED_CHOICE_CHARS)]],
            Field(min_length=1, max_length=MAX_GUIDED_CHOICES),
        ]
        | None
    ) = Field(
        None,
        description="the answer is exactly one of these strings, each produced as the tokenizer splits it alone; "
        "a choice that no other continues ends the answer (finish_reason stop). Not with min_tokens "
        "(docs/design.md, Guided choice)",
    )


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: PositiveInt | None = None  # deprecated by OpenAI in favour of max_completion_tokens; both accepted
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool = False
    top_logprobs: Logprobs | None = Field(None, description="Used only with logprobs: true.")
    # e.g. {"enable_thinking": false} for Qwen3; the renderer's own variables are not the client's to set.
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, json_schema_extra={"propertyNames": {"not": {"enum": sorted(TEMPLATE_VARIABLES)}}}
    )


class CompletionRequest(_GenerationRequest):
    # One prompt, a batch of prompts, or token ids (one list, or one per prompt).
    prompt: (
        NonEmptyText
        | Annotated[list[NonEmptyText], Field(min_length=1)]
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
    )
    max_tokens: PositiveInt | None = 16  # OpenAI's default for completions
    logprobs: Logprobs | None = None
    echo: bool = Field(False, description="Not supported: only false.", json_schema_extra={"enum": [False]})
    suffix: None = Field(None, description="Not supported: only null.")
    best_of: json_int(ge=1, le=1) | None = Field(None, description="Not supported: only 1 or null.")


class DocumentCreateRequest(_Strict):
    text: NonEmptyText
    title: str | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=256)
