"""The engine client: everything the server (lazyattn/server/) and the cluster's ingress (lazyattn/cluster/) may call
on an engine they do not drive themselves, as a protocol, after vLLM's `EngineClient`.

Two loops implement it: `server/engine_loop.py`'s `EngineLoop` (the engine on a thread of this process) and
`cluster/ingress.py`'s `RemoteEngineLoop` (engines on Ray Serve replicas). The server talks to them through this
protocol only, never to the engine itself, its executor or its runner. Offline callers (eval, bench) drive an
engine through `LLM` and `LLMEngine`'s public methods and options instead (tests/server/test_engine_client.py and
tests/test_engine_boundary.py hold them to it).

Threading: `submit`, `drop_documents` are coroutines of the server's event loop, a stream's `abort` never blocks; the
model's description (tokenizer, mode, context limit, vocabulary, `max_new_tokens`) never changes after start-up, so any
thread may read it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from lazyattn.engine.choice import Choice
from lazyattn.engine.modes import Mode
from lazyattn.engine.outputs import EngineStats, RequestOutput
from lazyattn.engine.prompt import RenderedPrompt
from lazyattn.engine.request_options import ENGINE_DEFAULTS, RequestOptions
from lazyattn.engine.sampling import SamplingParams
from lazyattn.model.tokenizer_base import TokenizerBase

# One engine request of a submission: (request id, rendered prompt, params; None: prefill-only, documents encoded
# ahead).
EngineRequest = tuple[str, RenderedPrompt, SamplingParams | None]


@runtime_checkable
class OutputObserver(Protocol):
    """Sees every output and every abort (the server's metrics); called on the engine's side, so it must not block."""

    def on_output(self, out: RequestOutput, now: float) -> None: ...

    def on_abort(self, request_id: str) -> None: ...


@runtime_checkable
class OutputStream(Protocol):
    """The outputs of the requests of one `submit`. Iterating yields lists of outputs, the newest of each request
    that moved (outputs are cumulative); it ends once every request has finished, or raises the engine's error.
    `abort()` stops what has not finished; safe to call any number of times."""

    request_ids: list[str]
    pending: set[str]

    def __aiter__(self) -> AsyncIterator[list[RequestOutput]]: ...

    def abort(self) -> None: ...


@runtime_checkable
class EngineClient(Protocol):
    """An engine as the server sees it: what it serves, its lifetime, and its requests."""

    observer: OutputObserver | None  # set once, before `start`

    # -- what it serves (fixed after start-up) ---------------------------------------------------------------------

    @property
    def tokenizer(self) -> TokenizerBase: ...

    @property
    def mode(self) -> Mode: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def ape_prefix(self) -> bool:
        """Whether a request that does not say otherwise has its documents encoded after its first segment (the
        engine's `ape_prefix`)."""
        ...

    def max_new_tokens(self, prompt: RenderedPrompt, n: int = 1, options: RequestOptions = ENGINE_DEFAULTS) -> int:
        """The most tokens each of `n` samples of this prompt can generate (the server's default max_tokens)."""
        ...

    # -- lifetime ------------------------------------------------------------------------------------------------

    def start(self) -> None: ...

    def stop(self, timeout: float = 30.0) -> None:
        """Fail what is in flight and stop; no request is taken afterwards."""
        ...

    @property
    def alive(self) -> bool: ...

    def stalled_for(self) -> float:
        """Seconds the engine has had work without making progress (0 when idle or moving): /health."""
        ...

    @property
    def stats(self) -> EngineStats:
        """The engine's counters as of its latest step (never waits for one)."""
        ...

    # -- requests ------------------------------------------------------------------------------------------------

    async def submit(
        self,
        requests: list[EngineRequest],
        *,
        cache_salt: str | None,
        arrival: float,
        options: RequestOptions = ENGINE_DEFAULTS,
        choices: list[Choice | None] | None = None,
    ) -> OutputStream:
        """Add requests, all or none (raises the engine's validation error, and adds nothing, if one is bad). They
        are stopped, and their pages freed, through the returned stream's `abort`. `choices[i]`: the choice among
        candidates request i joins (engine/choice.py; None: none); candidates submitted apart may land on engines
        apart (a cluster), where each then answers in full."""
        ...

    async def drop_documents(self, segments: list[list[int]], cache_salt: str | None) -> None:
        """Remove documents' KV from the engine's cache (a deleted registered document)."""
        ...
