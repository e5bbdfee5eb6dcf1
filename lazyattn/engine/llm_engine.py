"""The engine: requests in, one forward pass per `step`, outputs out.

`generate → step → schedule → model_runner.run → sample → postprocess` is the whole call path. The engine
is thread-safe at the method level (one lock), so the server's event loop can add and abort requests
while a background thread steps it.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

import torch

from lazyattn.cache.document_cache import CacheStats, DocumentCache, segment_key
from lazyattn.cache.page_pool import PagePool, bytes_per_page, pages_for_budget, pages_from_free_memory
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.cuda_graphs import DecodeGraphs
from lazyattn.engine.model_runner import ModelRunner
from lazyattn.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from lazyattn.engine.prompt import RenderedPrompt
from lazyattn.engine.sampling import Sampler, SamplingParams
from lazyattn.engine.scheduler import Scheduler
from lazyattn.engine.sequence import Sequence, Status
from lazyattn.errors import (
    CheckpointError,
    ContextTooLongError,
    InvalidRequestError,
    LazyAttnError,
    QueueFullError,
)
from lazyattn.kernels.rope import RopeTables
from lazyattn.kernels.selector import make_backend
from lazyattn.model.loader import load_model
from lazyattn.model.tokenizer import ByteTokenizer, IncrementalDecoder, TokenizerBase, load_tokenizer

CPU_DEFAULT_KV_GB = 0.5


@dataclass(frozen=True)
class EngineStats:
    cache: CacheStats
    num_pages: int
    pages_used: int
    pages_high_water: int
    page_bytes: int
    prefilled_tokens: int
    preemptions: int
    running: int
    waiting: int

    @property
    def kv_bytes_high_water(self) -> int:
        return self.pages_high_water * self.page_bytes


@dataclass
class EncodeHandle:
    """Documents being encoded ahead of requests; `done` is set once they are all cached (or failed)."""

    num_tokens: list[int]
    parts: list = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


@dataclass
class _Request:
    request_id: str
    prompt: RenderedPrompt
    seqs: list[Sequence]


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise InvalidRequestError("device 'cuda' was asked for but no CUDA GPU is available", "device")
        dtype = config.torch_dtype
        self.model, self.model_config = load_model(
            config.model, dtype=dtype, device=self.device, seed=config.seed, random_init=config.random_weights
        )
        self.tokenizer = self._tokenizer(config)
        mc = self.model_config
        self.max_model_len = config.max_model_len or mc.max_position
        if self.max_model_len > mc.max_position:
            raise InvalidRequestError(
                f"max_model_len {self.max_model_len} exceeds the model's max_position_embeddings "
                f"{mc.max_position}", "max_model_len")
        ps = config.page_size
        self.page_bytes = bytes_per_page(mc.num_layers, mc.num_kv_heads, mc.head_dim, ps, dtype)
        if config.kv_cache_gb is not None:
            num_pages = pages_for_budget(int(config.kv_cache_gb * 2**30), self.page_bytes)
        elif self.device.type == "cuda":
            num_pages = pages_from_free_memory(config.gpu_memory_utilization, self.device, self.page_bytes)
        else:
            num_pages = pages_for_budget(int(CPU_DEFAULT_KV_GB * 2**30), self.page_bytes)
        # Zeroed, so that never-written page tails hold finite values (masked scores times V stay 0).
        kv = torch.zeros(mc.num_layers, 2, num_pages, ps, mc.num_kv_heads, mc.head_dim, dtype=dtype,
                         device=self.device)
        tables = RopeTables.build(mc.rope, self.max_model_len, self.device)
        self.backend = make_backend(kv, tables, mc.attn_scale)
        self.pool = PagePool(num_pages)
        self.cache = DocumentCache(self.pool, ps)
        fingerprint, rope_fp = mc.fingerprint(), repr(mc.rope)

        def keyer(tokens: list[int], salt: str | None, parent: str | None) -> str:
            return segment_key(fingerprint, rope_fp, salt, tokens, parent)

        self.scheduler = Scheduler(config, self.cache, keyer)
        graphs = None
        if self.device.type == "cuda" and config.cuda_graphs:
            widest = min(-(-self.max_model_len // ps), num_pages)
            graphs = DecodeGraphs(self.model, self.backend, min(config.max_num_seqs, 256), widest, self.device)
        self.runner = ModelRunner(self.model, self.backend, self.device, graphs)
        self.sampler = Sampler()
        self.requests: dict[str, _Request] = {}
        self.encodes: list[EncodeHandle] = []
        self._seq_ids = itertools.count()
        self._lock = threading.RLock()
        if self.device.type == "cuda" and config.warm_up:
            self.warm_up()

    def warm_up(self) -> None:
        """Compile and autotune the kernels for both prefill launch shapes (split-KV for few programs, plain
        for many) and capture every decode graph, so that no request pays for it; then forget it all."""
        ps = self.config.page_size
        vocab = self.model_config.vocab_size
        # A long document's encode runs many query blocks (plain launch); short final segments in batches
        # of 1, 2, 4, ... run few (split-KV launches, whose merge is compiled per split count).
        doc_len = max(ps, min(2048, self.max_model_len // 2, (self.pool.num_pages - 4) * ps // 2))
        docs = [[(7 * i + k) % vocab for i in range(doc_len if k == 1 else 2 * ps + 3)] for k in (1, 2)]
        params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
        n = 1
        while n <= min(64, self.config.max_num_seqs):
            for i in range(n):
                final = [(11 * i + j) % vocab for j in range(8)]
                prompt = RenderedPrompt([list(d) for d in docs], final)
                try:
                    self._validate(prompt, params)
                except LazyAttnError:  # a pool too small for the warm-up shapes: warm up what fits
                    break
                self._enqueue(f"__warm_up_{n}_{i}", prompt, params, None, None)
            while self.has_unfinished():
                self.step()
            n *= 2
        if self.runner.graphs is not None:
            self.runner.graphs.capture_all()
        # Start from a clean slate: no cached warm-up documents, no counters.
        self.cache.clear()
        self.cache = DocumentCache(self.pool, ps)
        self.scheduler = Scheduler(self.config, self.cache, self.scheduler.keyer)
        self.pool.reset_high_water()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @staticmethod
    def _tokenizer(config: EngineConfig) -> TokenizerBase:
        try:
            return load_tokenizer(config.model)
        except CheckpointError:
            if not config.random_weights:
                raise
            # A bare config.json at real shapes (benchmarks): token-level input only, bytes for display.
            return ByteTokenizer()

    # -- requests ---------------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: RenderedPrompt,
        params: SamplingParams,
        *,
        cache_salt: str | None = None,
        arrival: float | None = None,
    ) -> None:
        """Validate and queue a request. Raises a specific error and changes nothing if it is bad."""
        with self._lock:
            if request_id in self.requests:
                raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
            self._validate(prompt, params)
            limit = self.config.max_waiting
            if limit is not None and len(self.scheduler.waiting) >= limit:
                raise QueueFullError(f"the waiting queue is full ({limit} requests); retry later")
            self._enqueue(request_id, prompt, params, cache_salt, arrival)

    def _enqueue(self, request_id: str, prompt: RenderedPrompt, params: SamplingParams,
                 cache_salt: str | None, arrival: float | None) -> None:
        with self._lock:
            seqs = []
            for i in range(params.n):
                seq = Sequence(next(self._seq_ids), request_id, i, [list(s) for s in prompt.segments],
                               list(prompt.final), params, salt=cache_salt)
                if arrival is not None:
                    seq.metrics.arrival = arrival
                if params.seed is not None:
                    seq.generator = torch.Generator(device=self.device).manual_seed(params.seed + i)
                seq.detokenizer = IncrementalDecoder(
                    self.tokenizer, skip_special_tokens=params.skip_special_tokens, stop=params.stop,
                    min_tokens=params.min_tokens, prompt_token_ids=prompt.final)
                seqs.append(seq)
            self.requests[request_id] = _Request(request_id, prompt, seqs)
            for seq in seqs:
                self.scheduler.add(seq)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its pages. Unknown or finished ids are ignored."""
        with self._lock:
            req = self.requests.pop(request_id, None)
            if req is None:
                return None
            for seq in req.seqs:
                if not seq.is_finished:
                    seq.finish_reason = "abort"
                    self._finish(seq)
            return self._output(req)

    def encode_documents(self, segments: list[list[int]], *, cache_salt: str | None = None) -> EncodeHandle:
        """Encode documents into the cache now (unless cached already), without a request. Poll or wait on
        the handle's `done`; the documents stay cached as any other (evictable once unreferenced)."""
        with self._lock:
            for i, seg in enumerate(segments):
                if not seg:
                    raise InvalidRequestError(f"document {i} is empty", "documents")
                bad = [t for t in seg if not 0 <= t < self.model_config.vocab_size]
                if bad:
                    raise InvalidRequestError(f"token id {bad[0]} is outside the vocabulary", "documents")
                if len(seg) > self.max_model_len:
                    raise ContextTooLongError(
                        f"document {i} has {len(seg)} tokens, over the context limit of {self.max_model_len}",
                        "documents")
            handle = EncodeHandle([len(s) for s in segments])
            handle.parts = self.scheduler.pin(segments, cache_salt)
            self.encodes.append(handle)
            self._settle_encodes()
            return handle

    def drop_documents(self, segments: list[list[int]], *, cache_salt: str | None = None) -> int:
        """Remove documents from the cache now (the server's document deletion). A segment in use stays with
        its holders and is freed on their last release; no new request hits it. Returns how many were cached.
        Lazy/block keys only: prefix mode caches page chains, which age out by LRU."""
        with self._lock:
            return sum(self.cache.remove(self.scheduler.keyer(list(s), cache_salt, None)) for s in segments)

    def has_unfinished(self) -> bool:
        with self._lock:
            return bool(self.requests or self.encodes)

    # -- one step ---------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one forward pass; returns the requests that produced tokens or finished."""
        with self._lock:
            batch = self.scheduler.schedule()
            if not batch.works:
                return []
            logits = self.runner.run(batch)
            to_sample = self.scheduler.complete(batch)
            self._settle_encodes()
            if not to_sample:
                return []
            result = self.sampler.sample(
                logits, [s.params for s in to_sample], [s.generator for s in to_sample],
                suppress_token_ids=[self._suppressed(s) for s in to_sample],
            )
            now = time.monotonic()
            touched: dict[str, _Request] = {}
            for i, seq in enumerate(to_sample):
                self._append(seq, result, i, now)
                touched[seq.request_id] = self.requests[seq.request_id]
            outputs = [self._output(r) for r in touched.values()]
            for out in outputs:
                if out.finished:
                    self.requests.pop(out.request_id, None)
            return outputs

    # -- internals ----

    def _settle_encodes(self) -> None:
        for handle in list(self.encodes):
            if any(p.segment.failed for p in handle.parts):
                handle.error = InvalidRequestError("encoding a document failed; register it again")
            elif not all(p.segment.ready for p in handle.parts):
                continue
            self.scheduler.unpin(handle.parts)
            self.encodes.remove(handle)
            handle.done.set()

    # -- helpers --------------------------------------------------------------------------------------

    def _validate(self, prompt: RenderedPrompt, params: SamplingParams) -> None:
        vocab = self.model_config.vocab_size
        params.validate(vocab)
        if not prompt.final:
            raise InvalidRequestError("the prompt is empty: the final segment needs at least one token", "prompt")
        for i, seg in enumerate(prompt.segments):
            if not seg:
                raise InvalidRequestError(f"segment {i} (a document or the system prompt) is empty", "documents")
        for name, ids in [("prompt", prompt.final)] + [("documents", s) for s in prompt.segments]:
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise InvalidRequestError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", name)
        context = sum(len(s) for s in prompt.segments) + len(prompt.final)
        if context + params.max_tokens > self.max_model_len:
            raise ContextTooLongError(
                f"this request needs {context} prompt tokens + {params.max_tokens} max_tokens = "
                f"{context + params.max_tokens} tokens, over the context limit of {self.max_model_len}", "prompt")
        need = self._pages_needed(prompt, params)
        if need > self.pool.num_pages:
            raise ContextTooLongError(
                f"this request needs {need} KV pages but the pool has {self.pool.num_pages}; raise kv_cache_gb "
                f"or shorten the request", "prompt")

    def _pages_needed(self, prompt: RenderedPrompt, params: SamplingParams) -> int:
        ps = self.config.page_size
        pages = lambda n: -(-n // ps)  # noqa: E731
        run = len(prompt.final) + params.max_tokens
        mode = self.config.mode
        if mode in ("prefix", "full"):
            return pages(sum(len(s) for s in prompt.segments) + run) * params.n
        docs = sum(pages(len(s)) for s in prompt.segments)
        moved = sum(pages(len(s)) for s in prompt.segments[1:]) if mode == "block" else 0
        return docs + (moved + pages(run)) * params.n

    def _append(self, seq: Sequence, result, i: int, now: float) -> None:
        token = int(result.token_ids[i])
        seq.output.append(token)
        seq.run.tokens.append(token)
        if result.logprobs is not None and seq.params.logprobs is not None:
            entry = {token: float(result.logprobs[i])}
            if result.top_logprobs is not None:
                for t, lp in result.top_logprobs[i]:
                    entry.setdefault(int(t), float(lp))
            seq.logprobs.append(entry)
        if seq.metrics.first_token is None:
            seq.metrics.first_token = now
        seq.text += seq.detokenizer.feed(token)
        if self._stop_reason(seq, token) is not None:
            self._finish(seq)

    def _suppressed(self, seq: Sequence) -> list[int] | None:
        """Below min_tokens, the tokens that would end the sequence may not be drawn."""
        if len(seq.output) >= seq.params.min_tokens:
            return None
        eos = [] if seq.params.ignore_eos else self.tokenizer.eos_token_ids
        return list(eos) + list(seq.params.stop_token_ids)

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        n = len(seq.output)
        if n >= p.min_tokens:
            if not p.ignore_eos and token in self.tokenizer.eos_token_ids:
                seq.finish_reason = "stop"
                return seq.finish_reason
            if token in p.stop_token_ids:
                seq.finish_reason, seq.stop_reason = "stop", token
                return seq.finish_reason
            if seq.detokenizer.stopped is not None:
                seq.finish_reason, seq.stop_reason = "stop", seq.detokenizer.stopped
                return seq.finish_reason
        if n >= p.max_tokens or seq.total_len >= self.max_model_len:
            seq.finish_reason = "length"
            return seq.finish_reason
        return None

    def _finish(self, seq: Sequence) -> None:
        seq.text += seq.detokenizer.finish()  # the held-back tail, now final
        seq.metrics.finished = time.monotonic()
        self.scheduler.finish(seq)
        seq.status = Status.FINISHED

    def _output(self, req: _Request) -> RequestOutput:
        outs = []
        for seq in req.seqs:
            # seq.text only grows by what the detokenizer released: streamed text never retracts.
            text = seq.text
            logprobs = list(seq.logprobs) if seq.params.logprobs is not None else None
            outs.append(CompletionOutput(seq.index, text, list(seq.output), seq.finish_reason,
                                         seq.stop_reason, logprobs))
        m = req.seqs[0].metrics
        end = max((s.metrics.finished or 0.0) for s in req.seqs) or None
        metrics = RequestMetrics(
            arrival=m.arrival,
            queue_time=m.queue_time,
            ttft=min((s.metrics.ttft for s in req.seqs if s.metrics.ttft is not None), default=None),
            decode_time=m.decode_time,
            e2e=None if end is None or not all(s.is_finished for s in req.seqs) else end - m.arrival,
            cached_tokens=sum(s.metrics.cached_tokens for s in req.seqs),
            prefilled_tokens=sum(s.metrics.prefilled_tokens for s in req.seqs),
        )
        return RequestOutput(req.request_id, list(req.prompt.final),
                             sum(len(s) for s in req.prompt.segments), outs, metrics)

    def stats(self) -> EngineStats:
        with self._lock:
            return EngineStats(
                cache=self.cache.stats(),
                num_pages=self.pool.num_pages,
                pages_used=self.pool.num_used,
                pages_high_water=self.pool.high_water,
                page_bytes=self.page_bytes,
                prefilled_tokens=self.scheduler.prefilled_tokens,
                preemptions=self.scheduler.num_preemptions,
                running=len(self.scheduler.running),
                waiting=len(self.scheduler.waiting),
            )
