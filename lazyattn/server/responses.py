"""Engine outputs to OpenAI response bodies: usage, logprobs, and the deltas a stream sends.

A choice's index is `prompt_index * n + sample_index` (OpenAI's order for a batch of prompts with n > 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lazyattn.engine.outputs import CompletionOutput, RequestOutput
from lazyattn.model.tokenizer import TokenizerBase
from lazyattn.server.protocol_responses import (
    ChatLogprobs,
    CompletionLogprobs,
    PromptTokensDetails,
    TokenLogprob,
    TopLogprob,
    Usage,
)


def usage(outputs: list[RequestOutput]) -> Usage:
    prompt = completion = cached = 0
    for out in outputs:
        n_prompt = out.num_document_tokens + len(out.prompt_token_ids)
        prompt += n_prompt
        completion += sum(len(c.token_ids) for c in out.outputs)
        if out.metrics is not None:
            # With n > 1 each sample counts its own hits; the prompt is cached at most once.
            cached += min(out.metrics.cached_tokens, n_prompt)
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
    )


class TokenText:
    """Token strings and bytes for logprobs, cached per id (the same ids recur across a response)."""

    def __init__(self, tokenizer: TokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}
        self._bytes: dict[int, list[int]] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            self._cache[token_id] = text
        return text

    def bytes_of(self, token_id: int) -> list[int]:
        """The token's own bytes (tokenizer.token_bytes): part of a UTF-8 character where the token is one, so that
        a response's bytes join up to its text."""
        raw = self._bytes.get(token_id)
        if raw is None:
            raw = self._bytes[token_id] = list(self._tokenizer.token_bytes(token_id))
        return raw


def chat_logprobs(c: CompletionOutput, start: int, top: int, text: TokenText) -> ChatLogprobs | None:
    """Logprobs of tokens [start:] of a choice; None when the request did not ask for them."""
    if c.logprobs is None:
        return None
    content = []
    for token_id, entry in zip(c.token_ids[start:], c.logprobs[start:]):
        best = sorted(entry.items(), key=lambda kv: -kv[1])[:top]
        token = text(token_id)
        content.append(
            TokenLogprob(
                token=token,
                logprob=entry[token_id],
                bytes=text.bytes_of(token_id),
                top_logprobs=[TopLogprob(token=text(t), logprob=lp, bytes=text.bytes_of(t)) for t, lp in best],
            )
        )
    return ChatLogprobs(content=content)


def completion_logprobs(
    c: CompletionOutput, start: int, top: int, text: TokenText, offset: int
) -> CompletionLogprobs | None:
    """Tokens [start:] in the legacy completions format; `offset` is the text length before them."""
    if c.logprobs is None:
        return None
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    for token_id, entry in zip(c.token_ids[start:], c.logprobs[start:]):
        token = text(token_id)
        tokens.append(token)
        token_logprobs.append(entry[token_id])
        top_logprobs.append({text(t): lp for t, lp in sorted(entry.items(), key=lambda kv: -kv[1])[:top]})
        offsets.append(offset)
        offset += len(token)
    return CompletionLogprobs(
        tokens=tokens, token_logprobs=token_logprobs, top_logprobs=top_logprobs, text_offset=offsets
    )


@dataclass
class ChoiceProgress:
    """What a stream has sent of one choice."""

    chars: int = 0
    tokens: int = 0
    done: bool = False


@dataclass
class StreamState:
    """Per-choice progress of a streaming response; `deltas` says what each new output adds."""

    n: int
    prompt_index: dict[str, int]  # engine request id -> its prompt's index in the batch
    choices: dict[int, ChoiceProgress] = field(default_factory=dict)
    finals: dict[str, RequestOutput] = field(default_factory=dict)

    def deltas(self, out: RequestOutput) -> list[tuple[int, CompletionOutput, str, int]]:
        """(choice index, output, new text, first new token) for each choice that moved or finished."""
        if out.finished:
            self.finals[out.request_id] = out
        moved = []
        for c in out.outputs:
            index = self.prompt_index[out.request_id] * self.n + c.index
            progress = self.choices.setdefault(index, ChoiceProgress())
            if progress.done:
                continue
            new_text = c.text[progress.chars :]
            first_token = progress.tokens
            if not new_text and len(c.token_ids) == first_token and not c.finished:
                continue
            progress.chars, progress.tokens, progress.done = len(c.text), len(c.token_ids), c.finished
            moved.append((index, c, new_text, first_token))
        return moved
