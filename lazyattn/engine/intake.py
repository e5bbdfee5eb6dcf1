"""A request to the sequences the scheduler runs: its options resolved (its own, or the engine's) and checked against
the mode, its segments' document-cache keys computed once (the scheduler takes them from the sequences), the whole
request checked against the engine's limits (engine/limits.py) before anything is queued, and one `Sequence` per
sample."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from dataclasses import dataclass

from lazyattn.engine.admission import Keyer, segment_keys
from lazyattn.engine.limits import RequestLimits
from lazyattn.engine.modes import Mode
from lazyattn.engine.prompt import RenderedPrompt
from lazyattn.engine.request_options import ENGINE_DEFAULTS, RequestOptions
from lazyattn.engine.sampling import SamplingParams
from lazyattn.engine.sequence import Metrics, Sequence
from lazyattn.errors import InvalidRequestError, QueueFullError


@dataclass
class Request:
    """A request the engine holds until it ends: its prompt and its sequences, one per sample."""

    request_id: str
    prompt: RenderedPrompt
    seqs: list[Sequence]


class RequestIntake:
    """Turns requests into sequences for an engine of `mode` and `limits`; `max_waiting`: the most sequences its
    waiting queue holds (None: no bound)."""

    def __init__(self, mode: Mode, limits: RequestLimits, keyer: Keyer, max_waiting: int | None) -> None:
        self.mode = mode
        self.limits = limits
        self.keyer = keyer
        self.max_waiting = max_waiting
        self._seq_ids = itertools.count()

    def request(
        self,
        request_id: str,
        prompt: RenderedPrompt,
        params: SamplingParams | None,
        *,
        cached: Callable[[str], bool],
        num_pages: int,
        num_waiting: int,
        cache_salt: str | None = None,
        options: RequestOptions = ENGINE_DEFAULTS,
        arrival: float | None = None,
    ) -> Request:
        """The request with its sequences, or a specific error if it is bad or the waiting queue (`num_waiting`
        sequences now) is full. `cached(key)`: whether the document cache holds a segment; `num_pages`: the pages
        requests may use. `options`: the request's own (engine/request_options.py), resolved here. `arrival`: when the
        request arrived (time.monotonic), if not now."""
        options = self.limits.options(options, prefill_only=params is None)
        keys = self._segment_keys(prompt, cache_salt, options.ape_prefix)
        # A segment the cache holds had its ids checked by the request that put it there (only admitted requests
        # add to the cache), which saves host time on every cached request (docs/benchmarks.md, "Kernel constants").
        # New segments are checked.
        hits = [cached(k) for k in keys] if keys is not None else [False] * len(prompt.segments)
        self.limits.check(prompt, params, options.relink, hits, num_pages)
        if keys is None and self.mode.caches_documents:  # the keyer refused an id the range check let through
            raise InvalidRequestError("a document holds a value that is not an integer token id", "documents")
        limit = self.max_waiting
        samples = params.n if params is not None else 1
        if limit is not None and num_waiting + samples > limit:
            raise QueueFullError(f"the waiting queue is full ({num_waiting} of {limit} sequences); retry later")
        # The sequences share the prompt's lists (nothing in the engine changes them): copying ~10K cached ids per
        # request, and freeing the copies when it ends, costs host time on the time to first token
        # (docs/benchmarks.md, "Kernel constants").
        seqs = [
            Sequence(
                next(self._seq_ids),
                request_id,
                i,
                prompt.segments,
                prompt.final,
                params,
                salt=cache_salt,
                segment_keys=keys,
                options=options,
                metrics=Metrics() if arrival is None else Metrics(arrival),
            )
            for i in range(samples)
        ]
        return Request(request_id, prompt, seqs)

    def _segment_keys(self, prompt: RenderedPrompt, salt: str | None, prefix: bool = False) -> list[str] | None:
        """The segments' document-cache keys (lazy/block), computed once per request. None in modes that do not
        cache documents, or for an id that is no int64."""
        if not self.mode.caches_documents:
            return None
        try:
            return segment_keys(self.keyer, prompt.segments, salt, prefix)
        except (struct.error, OverflowError, TypeError):
            return None  # RequestLimits.check names an out-of-range id; `request` refuses anything else
