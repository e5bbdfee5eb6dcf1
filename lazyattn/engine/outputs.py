"""What `generate` returns and the server streams, and what the engine's `stats` reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from lazyattn.cache.disk_tier import DiskTierStats
    from lazyattn.cache.document_cache import CacheStats
    from lazyattn.cache.host_tier import HostTierStats
    from lazyattn.model.tokenizer_cache import TokenizerCacheStats


@dataclass
class RequestMetrics:
    arrival: float
    queue_time: float | None  # arrival -> first scheduled
    ttft: float | None  # arrival -> first token
    decode_time: float | None  # first token -> finished
    e2e: float | None  # arrival -> finished
    cached_tokens: int  # context tokens found in the document cache
    prefilled_tokens: int  # tokens the request computed itself


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort"; None while running
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    logprobs: list[dict[int, float]] | None = None  # per token: {token id: logprob}, chosen one first
    # fp32 [vocab]: log-softmax of the first generated token's distribution (SamplingParams.first_token_logprobs)
    first_token_logprobs: torch.Tensor | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]  # the final segment's tokens (documents are in `num_document_tokens`)
    num_document_tokens: int
    outputs: list[CompletionOutput] = field(default_factory=list)
    metrics: RequestMetrics | None = None
    error: str | None = None  # set when the engine failed this request alone (finish_reason "abort")
    # An answer chosen among candidates (answer="best-document", "best-document-or-joint"): the index, among the
    # request's documents, of the one it was read from alone; None: the request as given (all of its documents)
    answered_from: int | None = None
    # answer="confidence-order"/"confidence-order-or-joint"/"each-last"/"both-orders": the indices of the request's
    # documents in the order the answer read them (None: as given, or another strategy)
    document_order: list[int] | None = None
    # answer="both-placements": whether the answer kept read every document from the first segment's end (the
    # request's documents read in parallel, `ape_parallel`); False for the documents read in order, or another strategy
    read_in_parallel: bool = False

    @property
    def finished(self) -> bool:
        return all(o.finished for o in self.outputs)

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def logprobs(self) -> list[dict[int, float]] | None:
        return self.outputs[0].logprobs


@dataclass(frozen=True)
class EngineStats:
    """The engine's counters and gauges at one moment (LLMEngine.stats)."""

    cache: CacheStats
    num_pages: int
    pages_used: int
    pages_high_water: int
    page_bytes: int
    prefilled_tokens: int  # prefill rows computed (documents, prompts, recomputation after preemption)
    decoded_tokens: int  # decode rows computed (one per generated token fed back)
    preemptions: int
    running: int
    waiting: int
    host: HostTierStats | None = None  # the host tier's, when the engine has one
    disk: DiskTierStats | None = None  # the disk tier's, when the engine has one
    tokenizer_cache: TokenizerCacheStats | None = None  # documents' token ids, when the tokenizer keeps them
