"""Request and response bodies: OpenAI's schemas, plus documents and a few vLLM-style sampling extensions.

Requests forbid unknown fields (a typo or an unsupported OpenAI feature is a 400 naming the field, never
silently ignored). Range checks live in one place, `SamplingParams.validate`, so the offline API and the
server say the same thing about a bad value; the models here check types and shapes only.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# -- requests ---------------------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DocumentText(_Strict):
    """A document given inline."""

    title: str | None = None
    text: str


class DocumentRef(_Strict):
    """A document registered with POST /v1/documents, by its id."""

    id: str


# A plain string is a document without a title.
DocumentInput = str | DocumentText | DocumentRef


class StreamOptions(_Strict):
    include_usage: bool = False


class _GenerationRequest(_Strict):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model: str | None = None  # optional: a server serves one model
    n: int = Field(1, ge=1, le=128)
    temperature: float | None = None  # OpenAI's default is 1
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Accepted for compatibility; anything but the neutral value is rejected (the engine has no penalties).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # lazyattn: the RAG inputs, and the tenant salt of the document cache.
    documents: list[DocumentInput] | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=256)
    # Sampling extensions, named as in vLLM.
    top_k: int = -1
    min_p: float = 0.0
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True


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
    max_tokens: int | None = None  # deprecated by OpenAI in favour of max_completion_tokens; both accepted
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # e.g. {"enable_thinking": false} for Qwen3


class CompletionRequest(_GenerationRequest):
    # One prompt, a batch of prompts, or token ids (one list, or one per prompt).
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's default for completions
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class DocumentCreateRequest(_Strict):
    text: str
    title: str | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=256)


# -- responses --------------------------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens whose KV came from the document cache


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatChunkChoice(BaseModel):
    index: int
    delta: dict[str, str]  # only the fields that changed: {"role"} first, then {"content"}, then {}
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None  # sent only with stream_options.include_usage (then null but on the last)


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None  # always set on a full response; streams follow stream_options


class DocumentObject(BaseModel):
    id: str
    object: Literal["document"] = "document"
    title: str | None
    num_tokens: int  # the document segment's tokens, as a request placing it would have them
    created: int


class DocumentContent(DocumentObject):
    """GET /v1/documents/{id}: the document with its text."""

    text: str


class DocumentList(BaseModel):
    object: Literal["list"] = "list"
    data: list[DocumentObject]


class DocumentDeleted(BaseModel):
    id: str
    object: Literal["document.deleted"] = "document.deleted"
    deleted: bool = True


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "lazyattn"
    max_model_len: int
    mode: str  # lazy, block, prefix or full (docs/design.md, Modes)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
