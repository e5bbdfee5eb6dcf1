"""OpenAI request bodies to engine inputs: documents resolved, prompts rendered into segments, sampling params.

Rendering is the offline API's (`engine/prompt.py`), so a request through the server and the same request
through `LLM.chat`/`LLM.generate` give the same segments, hence the same cache keys and the same outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool

from lazyattn.engine.prompt import PromptLayout, RenderedPrompt, encode_document, render_chat, render_completion
from lazyattn.engine.prompt import from_token_ids as _from_token_ids
from lazyattn.engine.request_options import ENGINE_DEFAULTS, RequestOptions
from lazyattn.engine.sampling import SamplingParams
from lazyattn.errors import ContextTooLongError, InvalidRequestError
from lazyattn.model.tokenizer import TokenizerBase
from lazyattn.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DocumentInput,
    DocumentRef,
    DocumentText,
)
from lazyattn.server.registry import DocumentRegistry

Document = str | dict[str, str]


@dataclass(frozen=True)
class Renderer:
    """What rendering needs from the server: the tokenizer, the layout and the context limit."""

    tokenizer: TokenizerBase
    layout: PromptLayout
    max_model_len: int
    vocab_size: int
    # The engine's `max_new_tokens(prompt, n)`: it reads only what never changes after start-up (context limit,
    # mode, pool size), so the event loop may call it.
    max_new_tokens: Callable[[RenderedPrompt, int, RequestOptions], int]

    def chat(self, body: ChatCompletionRequest, documents: list[Document]) -> RenderedPrompt:
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        return render_chat(self.tokenizer, messages, documents, self.layout, body.chat_template_kwargs)

    def completions(self, body: CompletionRequest, documents: list[Document]) -> list[RenderedPrompt]:
        """One rendered prompt per prompt of the batch."""
        prompt = body.prompt
        if isinstance(prompt, list) and not prompt:
            raise InvalidRequestError("prompt is an empty list", param="prompt")
        if isinstance(prompt, str):
            return [render_completion(self.tokenizer, prompt, documents, self.layout)]
        if isinstance(prompt[0], str):
            return [render_completion(self.tokenizer, p, documents, self.layout) for p in prompt]
        if isinstance(prompt[0], int):
            return [self._from_token_ids(prompt, documents)]
        return [self._from_token_ids(p, documents) for p in prompt]

    def _from_token_ids(self, ids: list[int], documents: list[Document]) -> RenderedPrompt:
        # Token prompts with text documents: the documents become segments exactly as a text prompt's would
        # (same ids, same cache keys); BOS opens the first segment when the tokenizer adds one to text.
        docs = [encode_document(self.tokenizer, d, self.layout, f"documents[{i}]") for i, d in enumerate(documents)]
        want_bos = self.tokenizer.add_bos_token if self.layout.add_bos is None else self.layout.add_bos
        bos = self.tokenizer.bos_token_id if want_bos else None
        return _from_token_ids(ids, docs, bos, self.vocab_size)

    def max_tokens(
        self,
        requested: int | None,
        prompt: RenderedPrompt,
        n: int,
        param: str,
        options: RequestOptions = ENGINE_DEFAULTS,
    ) -> int:
        """OpenAI's default is "as many as fit": what is left of the context after the prompt, and what the KV
        pool can hold for `n` samples (the engine's own page count). Of the request's options only relink rows
        take pages: APE's temperature and scale are numbers per page, and a document encoded after the first
        segment (ape_prefix) is cached under another key in as many pages as without it."""
        if requested is not None:
            return requested
        room = self.max_new_tokens(prompt, n, options)
        if room < 1:
            raise ContextTooLongError(
                f"the prompt has {prompt.num_tokens} tokens (documents included), which leaves no room to "
                f"generate within the context limit of {self.max_model_len} tokens and the KV pool",
                param=param,
            )
        return room


async def resolve_documents(
    items: list[DocumentInput] | None, registry: DocumentRegistry, scope: str | None
) -> list[Document]:
    """Inline documents as they are; registered ones (by id, in the caller's scope) as their stored text, read from
    the registry in one query, in the thread pool (it blocks on the database)."""
    items = items or []
    refs = [(i, item.id) for i, item in enumerate(items) if isinstance(item, DocumentRef)]
    found = {}
    if refs:
        ids, params = [doc_id for _, doc_id in refs], [f"documents[{i}].id" for i, _ in refs]
        docs = await run_in_threadpool(registry.get_many, scope, ids, params)
        found = {i: doc for (i, _), doc in zip(refs, docs)}
    out: list[Document] = []
    for i, item in enumerate(items):
        if i in found:
            out.append(found[i].as_input())
        elif isinstance(item, DocumentText):
            out.append(item.model_dump(exclude_none=True))
        else:
            out.append(item)
    return out


def request_options(body: ChatCompletionRequest | CompletionRequest) -> RequestOptions:
    """The engine options the request sets (None: the server's); ranges are the schema's, the mode rules the
    engine's."""
    return RequestOptions(
        relink_tokens=body.relink_tokens,
        relink_last_tokens=body.relink_last_tokens,
        ape_temperature=body.ape_temperature,
        ape_scale=body.ape_scale,
        ape_prefix=body.ape_prefix,
        ape_tilt=body.ape_tilt,
        ape_parallel=body.ape_parallel,
    )


def sampling_params(
    body: ChatCompletionRequest | CompletionRequest, max_tokens: int, logprobs: int | None
) -> SamplingParams:
    """The engine's params; ranges are checked by SamplingParams.validate when the engine adds the request.
    The neutral-only fields (penalties, logit_bias) are held to their neutral values by the schema."""
    stop = () if body.stop is None else body.stop
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k,
        min_p=body.min_p,
        seed=body.seed,
        stop=stop,
        stop_token_ids=tuple(body.stop_token_ids or ()),
        ignore_eos=body.ignore_eos,
        n=body.n,
        logprobs=logprobs,
        min_tokens=body.min_tokens,
        skip_special_tokens=body.skip_special_tokens,
        guided_choice=None if body.guided_choice is None else tuple(body.guided_choice),
    )


def requested_chat_logprobs(body: ChatCompletionRequest) -> int | None:
    # top_logprobs without logprobs is ignored, as the schema says (a cross-field rule it could not state).
    return (body.top_logprobs or 0) if body.logprobs else None


def check_completion_options(body: CompletionRequest) -> None:
    """The schema already allows only the neutral values; kept for bodies built in code."""
    if body.echo:
        raise InvalidRequestError("echo is not supported", param="echo")
    if body.suffix is not None:
        raise InvalidRequestError("suffix is not supported", param="suffix")
    if body.best_of not in (None, 1):  # 1: each choice is the one sample drawn for it, whatever n is
        raise InvalidRequestError("best_of is not supported (only 1 or null)", param="best_of")
