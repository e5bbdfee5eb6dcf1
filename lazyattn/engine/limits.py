"""What one request may ask of an engine: token ids within the vocabulary, a context within `max_model_len`, its
peak pages (its mode's count) within the pool, and relink rows and APE options its mode allows. The engine checks a
request here before queueing it, so that a bad one raises a specific error and changes nothing; the server asks
`max_new_tokens` for its default.
"""

from __future__ import annotations

from lazyattn.engine.modes import Mode
from lazyattn.engine.prompt import RenderedPrompt
from lazyattn.engine.request_options import OFF, RequestOptions
from lazyattn.engine.sampling import SamplingParams
from lazyattn.errors import ContextTooLongError, InvalidRequestError


class RequestLimits:
    """An engine's limits: its mode, page size, context limit, vocabulary and the options a request that sets none
    gets (`defaults`, resolved). The pool's page count is passed per call (`LLMEngine.set_kv_budget` changes it)."""

    def __init__(
        self,
        mode: Mode,
        page_size: int,
        max_model_len: int,
        vocab_size: int,
        defaults: RequestOptions = OFF,
    ) -> None:
        self.mode = mode
        self.page_size = page_size
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.defaults = defaults

    def options(self, requested: RequestOptions, prefill_only: bool = False) -> RequestOptions:
        """A request's options: its own choices, or the engine's defaults; checked against the mode."""
        return requested.resolve(self.defaults, self.mode.name, prefill_only)

    def max_new_tokens(self, prompt: RenderedPrompt, n: int, options: RequestOptions, num_pages: int) -> int:
        """The most tokens each of `n` samples of this prompt can generate: within the context limit, and with
        the request's peak pages (its mode's count) within `num_pages`. 0 when nothing fits. Of the request's options
        only relink rows take pages; they are not checked here (`options` checks them)."""
        lens = [len(s) for s in prompt.segments]
        k, m = (d if o is None else o for o, d in zip(options.relink, self.defaults.relink))
        lo, hi = 0, self.max_model_len - sum(lens) - len(prompt.final)
        while lo < hi:  # pages grow with the tokens: the largest count that fits, by bisection
            mid = (lo + hi + 1) // 2
            if self.mode.pages_needed(lens, len(prompt.final) + mid, n, self.page_size, (k, m)) <= num_pages:
                lo = mid
            else:
                hi = mid - 1
        return max(lo, 0)

    def check(
        self,
        prompt: RenderedPrompt,
        params: SamplingParams | None,
        relink: tuple[int, int],
        cached: list[bool],
        num_pages: int,
    ) -> None:
        """Raise if the request is bad. `cached[i]`: segment i is in the document cache, its ids checked when it
        was encoded. `params=None`: prefill-only."""
        vocab = self.vocab_size
        if params is None:
            if prompt.final or not prompt.segments:
                raise InvalidRequestError("a prefill-only request has documents and no final segment", "prompt")
            if not self.mode.caches_documents:
                raise InvalidRequestError(
                    f"{self.mode.name} mode does not cache documents: nothing to encode ahead", "documents"
                )
        else:
            params.validate(vocab)
            if not prompt.final:
                raise InvalidRequestError("the prompt is empty: the final segment needs at least one token", "prompt")
        for i, seg in enumerate(prompt.segments):
            if not seg:
                raise InvalidRequestError(f"segment {i} (a document or the system prompt) is empty", "documents")
        unchecked = [s for s, hit in zip(prompt.segments, cached) if not hit]  # cached: checked when encoded
        for name, ids in [("prompt", prompt.final)] + [("documents", s) for s in unchecked]:
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise InvalidRequestError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", name)
        context = sum(len(s) for s in prompt.segments) + len(prompt.final)
        max_tokens = params.max_tokens if params is not None else 0
        if context + max_tokens > self.max_model_len:
            raise ContextTooLongError(
                f"this request needs {context} prompt tokens + {max_tokens} max_tokens = "
                f"{context + max_tokens} tokens, over the context limit of {self.max_model_len}",
                "prompt",
            )
        samples = params.n if params is not None else 0
        need = self.mode.pages_needed(
            [len(s) for s in prompt.segments],
            len(prompt.final) + max_tokens,
            samples,
            self.page_size,
            relink,
        )
        if need > num_pages:
            raise ContextTooLongError(
                f"this request needs {need} KV pages but the pool has {num_pages}; raise kv_cache_gb "
                f"or shorten the request",
                "prompt",
            )
