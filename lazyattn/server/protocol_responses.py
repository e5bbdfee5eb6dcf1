"""Response bodies: OpenAI's schemas for completions, chat completions and their stream chunks, plus documents,
models, health and errors, and the OpenAPI `responses` of each route. The request bodies are `server/protocol.py`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


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
    answered_from: int | None = None  # an answer chosen among candidates: its document (null: all); not in joint ones
    document_order: list[int] | None = None  # the confidence-order answers: the order read (null: as given)
    read_in_parallel: bool = False  # both-placements: the answer kept read the documents in parallel


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
    answered_from: int | None = None  # an answer chosen among candidates: its document (null: all); not in joint ones
    document_order: list[int] | None = None  # the confidence-order answers: the order read (null: as given)
    read_in_parallel: bool = False  # both-placements: the answer kept read the documents in parallel


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


class HealthStatus(BaseModel):
    status: str  # "ok", or why the engine is not serving


_ERROR_DESCRIPTIONS = {
    400: "Invalid request: its schema or a value's range, or (code `context_length_exceeded`) a prompt and "
    "max_tokens that do not fit the context or the KV pool.",
    401: "Missing or invalid API key (when the server has keys).",
    404: "Unknown model or document id.",
    413: "The request body is over the server's limit (`lazyattn serve --max-body-mb`).",
    503: "At capacity (waiting queue or document registry full), the document registry's database unavailable, or "
    "shutting down; retry later.",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the errors a route can answer with, each with OpenAI's error body."""
    return {s: {"model": ErrorResponse, "description": _ERROR_DESCRIPTIONS[s]} for s in statuses}


def generation_responses(model: type[BaseModel], chunk: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """/v1/chat/completions and /v1/completions: a JSON body, or with `stream: true` server-sent events whose
    data is a `chunk`, an error body (the engine failed mid-stream), or the final `[DONE]`."""
    # Refs point at components: server/openapi.py moves the `$defs` this schema carries there.
    chunk_schema = chunk.model_json_schema(ref_template="#/components/schemas/{model}")
    definitions = {chunk.__name__: chunk_schema, **chunk_schema.pop("$defs", {})}
    event = {
        "type": "object",
        "required": ["data"],
        "$defs": definitions,
        "properties": {
            "data": {
                "anyOf": [
                    {"const": "[DONE]"},
                    {
                        "contentMediaType": "application/json",
                        "contentSchema": {
                            "anyOf": [
                                {"$ref": f"#/components/schemas/{chunk.__name__}"},
                                {"$ref": "#/components/schemas/ErrorResponse"},
                            ]
                        },
                    },
                ]
            }
        },
    }
    ok = {
        "model": model,
        "description": "The response; with stream: true, server-sent events "
        "(`data: {chunk}` per event, then `data: [DONE]`).",
        "content": {"text/event-stream": {"schema": event}},
    }
    return {200: ok, **error_responses(400, 401, 404, 413, 503)}
