"""The engine: requests in, one forward pass per `step`, outputs out.

`add_request → step → scheduler.schedule → launcher.launch (executor.run, sampler) → scheduler.update` is the whole
call path: a request becomes sequences (engine/intake.py); a step is a `StepPlan` from the scheduler, a `StepOutput`
from the launch (engine/step_launch.py) and the scheduler's update with both, ordered by the step pipeline
(engine/step_pipeline.py, which holds the step in flight when scheduling overlaps). A request with documents and no
final segment (`params=None`) is prefill-only: it encodes its documents into the cache and finishes once they are
cached (the server's document registration).

Threading: not thread-safe. One thread drives an engine — the caller of `LLM.generate`, or the server's engine
thread (server/engine_loop.py), which is the only one that touches it.
"""

from __future__ import annotations

import gc
import logging
import time
import weakref
from collections.abc import Callable

import torch

from lazyattn import envs
from lazyattn.cache.disk_tier import make_disk_tier
from lazyattn.cache.document_cache import DocumentCache, SegmentKeyer
from lazyattn.cache.host_tier import make_host_tier
from lazyattn.cache.page_pool import PagePool
from lazyattn.engine.batch import StepUpdate
from lazyattn.engine.choice import Choice, Choices
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.executor.base import Executor
from lazyattn.engine.executor.local import LocalExecutor
from lazyattn.engine.executor.tensor_parallel import TensorParallelExecutor
from lazyattn.engine.gc_control import GcControl
from lazyattn.engine.intake import Request, RequestIntake
from lazyattn.engine.invariants import check_engine
from lazyattn.engine.limits import RequestLimits
from lazyattn.engine.modes import make_mode
from lazyattn.engine.output_processor import OutputProcessor
from lazyattn.engine.outputs import EngineStats, RequestOutput
from lazyattn.engine.prompt import RenderedPrompt
from lazyattn.engine.request_options import ENGINE_DEFAULTS, RequestOptions
from lazyattn.engine.sampling import Sampler, SamplingParams
from lazyattn.engine.scheduler import Scheduler
from lazyattn.engine.step_launch import StepLauncher
from lazyattn.engine.step_pipeline import StepPipeline
from lazyattn.engine.step_report import StepReport
from lazyattn.errors import (
    CacheInvariantError,
    CheckpointError,
    InvalidRequestError,
)
from lazyattn.kernels.paged import transposes_v
from lazyattn.model.byte_tokenizer import ByteTokenizer
from lazyattn.model.tokenizer import TokenizerBase, load_tokenizer
from lazyattn.model.tokenizer_cache import TokenizerCache

logger = logging.getLogger("lazyattn.engine")


def engine_tokenizer(config: EngineConfig) -> TokenizerBase:
    """The tokenizer an engine of `config` uses (the cluster's ingress renders requests with its own)."""
    try:
        tokenizer = load_tokenizer(config.model)
    except CheckpointError:
        if not config.random_weights:
            raise
        # A bare config.json at real shapes (benchmarks): token-level input only, bytes for display.
        tokenizer = ByteTokenizer()
    if config.tokenizer_cache_tokens:
        tokenizer.cache = TokenizerCache(config.tokenizer_cache_tokens)
    return tokenizer


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        # The kernels' toggles are this engine's settings from here on, before the model loads, warms up and is
        # captured: graphs and eager steps launch the same kernels (lazyattn/envs.py, the invariant).
        previous = envs.activate(config.env)
        if previous is not None and previous != config.env:
            logger.warning(
                "LAZYATTN_* settings differ from the previous engine's in this process (%s): an engine still running "
                "launches by the new ones outside its captured graphs",
                ", ".join(envs.changed(previous, config.env)),
            )
        self.mode = make_mode(config.mode)
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise InvalidRequestError("device 'cuda' was asked for but no CUDA GPU is available", "device")
        # One process, or a driver and a worker per other rank (tensor parallelism): both load the model here.
        executor = TensorParallelExecutor if config.tensor_parallel_size > 1 else LocalExecutor
        self.executor: Executor = executor(config, self.device)
        self.model_config = mc = self.executor.model_config
        try:
            self.tokenizer = engine_tokenizer(config)
            self.max_model_len = config.max_model_len or mc.max_position
            if self.max_model_len > mc.max_position:
                raise InvalidRequestError(
                    f"max_model_len {self.max_model_len} exceeds the model's max_position_embeddings {mc.max_position}",
                    "max_model_len",
                )
            self.limits = RequestLimits(
                self.mode, config.page_size, self.max_model_len, mc.vocab_size, config.request_defaults
            )
            self.executor.build(self.max_model_len)
        except BaseException:
            self.executor.shutdown()
            raise
        self.pool = PagePool(self.executor.num_pages)
        self.keyer = SegmentKeyer(mc.fingerprint(), repr(mc.rope))
        self.intake = RequestIntake(self.mode, self.limits, self.keyer, config.max_waiting)
        # The host tier copies a whole pool: not under tensor parallelism (EngineConfig refuses it).
        kv = self.executor.local_kv
        self.tier = make_host_tier(config, kv) if kv is not None else None
        self.disk = None
        if kv is not None:
            self.disk = make_disk_tier(config, kv, mc.fingerprint(), self._before_fill, transposes_v(kv.dtype))
        self.cache = DocumentCache(self.pool, config.page_size, self.tier, self.disk)
        self.sampler = Sampler(deterministic=config.deterministic)
        self.outputs = OutputProcessor(self.tokenizer, self.max_model_len, self.device)
        self.scheduler = Scheduler(config, self.mode, self.cache, self.keyer, self.outputs)
        self.launcher = StepLauncher(
            self.executor,
            self.sampler,
            self.outputs,
            self.tier,
            config.page_size,
            self.device,
            config.split_mixed_steps_on,
        )
        self.requests: dict[str, Request] = {}
        self.choices = Choices()  # candidates that stop once another is surer (engine/choice.py)
        # Python's garbage collector around the steps (engine/gc_control.py): given back at shutdown, or when the
        # engine is dropped (the finalizer holds the control, not the engine).
        self.gc_control = GcControl(config.gc_control_on, config.gc_full_interval_s)
        self._gc_finalizer = weakref.finalize(self, self.gc_control.close)
        self.check_invariants = config.check_invariants or config.env.check_invariants
        # Overlapped scheduling (engine/step_pipeline.py) or not, chosen once: the pipeline holds the step in flight.
        self.pipeline = StepPipeline(self.launcher, overlap=config.async_scheduling_on)
        if self.device.type == "cuda" and config.warm_up:
            try:
                self.executor.warm_up()
            except BaseException:
                self.shutdown()
                raise
        if config.gc_freeze:  # EngineConfig.gc_freeze: full collections walk only what requests make
            self.gc_control.freeze()

    # -- requests ---------------------------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: RenderedPrompt,
        params: SamplingParams | None,
        *,
        cache_salt: str | None = None,
        arrival: float | None = None,
        options: RequestOptions = ENGINE_DEFAULTS,
        choice: Choice | None = None,
    ) -> None:
        """Validate and queue a request. Raises a specific error and changes nothing if it is bad. The engine keeps
        the prompt's lists until the request ends: the caller must not change them meanwhile.
        `params=None`: prefill-only (the prompt has segments and no final segment). `options`: the request's relink
        rows and APE settings (engine/request_options.py; docs/design.md, "Relink" and "APE"), each None the
        engine's. `choice`: the request is a candidate of that choice, stopped once another is surer after their
        first tokens (engine/choice.py); it must ask for its tokens' log-probabilities, one sequence."""
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
        if choice is not None:
            self.choices.check(choice)
            if params is None or params.logprobs is None or params.n != 1:
                raise InvalidRequestError(
                    "a candidate of a choice is one sequence that asks for its tokens' log-probabilities "
                    "(n 1, logprobs set)",
                    "choice",
                )
        req = self.intake.request(
            request_id,
            prompt,
            params,
            cached=self.cache.contains,
            num_pages=self.num_pages,
            num_waiting=self.scheduler.num_waiting,
            cache_salt=cache_salt,
            options=options,
            arrival=arrival,
        )
        for seq in req.seqs:
            self.scheduler.add(seq)
        self.requests[request_id] = req
        if choice is not None:
            self.choices.add(request_id, choice)
        self.gc_control.busy()

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its pages. Unknown or finished ids are ignored."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        self.choices.forget(request_id)
        for seq in req.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
        if not self.requests:  # nobody left to read the step in flight
            self._drain()
        return self.outputs.output(req.request_id, req.prompt, req.seqs)

    def drop_documents(self, segments: list[list[int]], *, cache_salt: str | None = None) -> int:
        """Remove documents from the cache now (the server's document deletion). A segment in use stays with
        its holders and is freed on their last release; no new request hits it. Returns how many were cached.
        Modes that cache documents only: prefix mode caches page chains, which age out by LRU."""
        return sum(self.cache.remove(self.keyer(list(s), cache_salt, None)) for s in segments)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    @property
    def step_in_flight(self) -> bool:
        """A launched step waits on the device for the next `step` to read it (overlapped scheduling)."""
        return self.pipeline is not None and self.pipeline.in_flight is not None

    @property
    def step_observer(self) -> Callable[[StepReport], None] | None:
        """Called with each step once its tokens are read (bench/trace.py); None: steps are not reported."""
        return self.pipeline.observer

    @step_observer.setter
    def step_observer(self, observer: Callable[[StepReport], None] | None) -> None:
        self.pipeline.observer = observer

    # -- one step ---------------------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one forward pass; returns the requests that produced tokens or finished.

        A failure is pinned on the requests whose parts fail when the step is redone part by part
        (engine/isolation.py), or whose rows of logits are not finite: those requests end alone, with `error` on
        their output; the others go on. Candidates that lose a choice in this step (engine/choice.py) end with it,
        their final outputs among the step's.

        With overlapped scheduling (engine/step_pipeline.py) a step is left running on the device and its outputs
        are returned by the next call, after that call has queued the step that follows it.
        """
        if self.requests:  # the collections due since the last step, before this one starts (engine/gc_control.py)
            self.gc_control.between_steps()
        prefilled, start = self.scheduler.prefilled_tokens, time.perf_counter()
        updates = self.pipeline.step(self.scheduler)  # the steps read in this call: plan, launch, update
        if self.disk is not None:  # the disk tier's guard weighs a read against an encode at this rate
            self.disk.observe_encode(self.scheduler.prefilled_tokens - prefilled, time.perf_counter() - start)
        outputs = self._outputs(updates)
        if len(self.choices):
            outputs = self._stop_losers(outputs, self.choices.update(outputs))
        for out in outputs:
            if out.finished:
                self.requests.pop(out.request_id, None)
        # Every sequence of a step still in flight has ended (this step's outputs included): nobody will read it, and
        # the pages of what ended go back now, while the engine is seen idle (reset_cache, shutdown).
        if not self.requests:
            self._drain()
        if self.check_invariants:
            self.check()
        return outputs

    def _outputs(self, updates: list[StepUpdate]) -> list[RequestOutput]:
        """The outputs of the live requests the updates touched, in the order they were first touched."""
        failed = {request_id: error for u in updates for request_id, error in u.failed.items()}
        touched = [self.requests.get(request_id) for request_id in dict.fromkeys(r for u in updates for r in u.touched)]
        return [self.outputs.output(r.request_id, r.prompt, r.seqs, failed.get(r.request_id)) for r in touched if r]

    def _stop_losers(self, outputs: list[RequestOutput], losers: list[str]) -> list[RequestOutput]:
        """Stop the candidates that lost a choice in this step (engine/choice.py); `outputs` with each one's final
        output in place of the one it had (finish reason "abort")."""
        final = {}
        for request_id in losers:
            req = self.requests[request_id]
            for seq in req.seqs:
                if not seq.is_finished:
                    self.scheduler.finish(seq, "abort")
            final[request_id] = self.outputs.output(req.request_id, req.prompt, req.seqs)
        return [final.pop(out.request_id, out) for out in outputs] + list(final.values())

    def _drain(self) -> None:
        """Wait for the step in flight, which nobody will read (every request has ended); reported unread. The
        engine is idle: the garbage collector is as it was (engine/gc_control.py)."""
        self.pipeline.drain(self.scheduler)
        self.gc_control.idle()

    # -- state ------------------------------------------------------------------------------------------------

    def _before_fill(self, pages: list[int]) -> None:
        """The disk tier writes these GPU pages: after the host tier's copies still reading them."""
        if self.tier is not None and self.tier.mover is not None and self.tier.mover.cuda:
            self.tier.mover.before_forward(set(pages))

    def shutdown(self) -> None:
        """Abort what is in flight and give the device memory back (weights, KV pool, CUDA graphs) now, rather
        than when the garbage collector gets to it. The engine cannot be used afterwards."""
        for request_id in list(self.requests):
            self.abort(request_id)
        self._gc_finalizer()  # the hold on the collector and the freeze given back
        self.executor.shutdown()
        if self.disk is not None:
            self.disk.close()  # the writes still queued land
        # Everything that holds a tier or the executor's buffers goes with them (the engine object may outlive this).
        self.scheduler = self.cache = self.tier = self.disk = self.launcher = self.pipeline = None  # type: ignore[assignment]
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    def check(self) -> None:
        """Check the document cache's, its tiers' and the scheduler's bookkeeping whole (engine/invariants.py);
        CacheInvariantError names what is broken. Runs after every step with the `check_invariants` option."""
        check_engine(self.cache, self.scheduler, self.scheduler.ended)

    def reset_cache(self) -> None:
        """Forget every cached document and restart the counters (the engine must be idle)."""
        if self.requests:
            raise InvalidRequestError("reset_cache needs an idle engine; requests are still in flight")
        # A step still in flight holds the pages of the sequences it ended: they go back to this cache first. The
        # cache is emptied in place, never replaced, so that nothing can hand a segment back to a cache that does
        # not hold it.
        self._drain()
        self.cache.poll(wait=True)  # promotions of aborted requests still hold their segments
        self.cache.clear()
        left = self.cache.live_segments()
        if left:
            raise CacheInvariantError(f"an idle engine's cache still holds {len(left)} referenced segment(s)")
        self.cache.reset_stats()
        for tier in (self.tier, self.disk):
            if tier is not None:
                tier.reset_stats()
        self.scheduler = Scheduler(self.config, self.mode, self.cache, self.keyer, self.outputs)
        self.pool.reset_high_water()
        if self.check_invariants:
            self.check()

    def set_kv_budget(self, num_pages: int | None) -> None:
        """Use only `num_pages` pages of the pool (None: all of it), exactly as if the pool were that small, without
        loading the model again (the serving benchmark's KV-budget sweep). Empties the cache; idle engine only."""
        self.reset_cache()
        if num_pages is not None and not 0 < num_pages <= self.pool.num_pages:
            raise InvalidRequestError(
                f"a budget of {num_pages} pages does not fit the pool of {self.pool.num_pages}", "num_pages"
            )
        self.pool.set_budget(num_pages)
        self.pool.reset_high_water()

    def set_host_budget(self, num_pages: int | None) -> None:
        """Use only `num_pages` pages of the host tier (None: all of it, 0: none), as `set_kv_budget` does for the
        GPU pool. Empties the cache; idle engine only."""
        if self.tier is None:
            if num_pages:
                raise InvalidRequestError("this engine has no host tier (host_cache_gb)", "host_cache_gb")
            return
        self.reset_cache()
        self.tier.set_capacity(num_pages)

    @property
    def num_pages(self) -> int:
        """Pages requests and the cache may use."""
        return self.pool.num_pages - self.pool.num_withheld

    def stats(self) -> EngineStats:
        withheld = self.pool.num_withheld
        return EngineStats(
            cache=self.cache.stats(),
            num_pages=self.num_pages,
            pages_used=self.pool.num_used - withheld,
            pages_high_water=self.pool.high_water - withheld,
            page_bytes=self.executor.page_bytes,
            prefilled_tokens=self.scheduler.prefilled_tokens,
            decoded_tokens=self.scheduler.decoded_tokens,
            preemptions=self.scheduler.num_preemptions,
            running=len(self.scheduler.running),
            waiting=self.scheduler.num_waiting,
            host=self.tier.stats() if self.tier is not None else None,
            disk=self.disk.stats() if self.disk is not None else None,
            tokenizer_cache=self.tokenizer.cache.stats() if self.tokenizer.cache is not None else None,
        )

    # -- limits (the checks themselves: self.limits, engine/limits.py) -----------------------------------------

    def max_new_tokens(self, prompt: RenderedPrompt, n: int = 1, options: RequestOptions = ENGINE_DEFAULTS) -> int:
        """The most tokens each of `n` samples of this prompt can generate now, with these options
        (engine/limits.py)."""
        return self.limits.max_new_tokens(prompt, n, options, self.num_pages)
