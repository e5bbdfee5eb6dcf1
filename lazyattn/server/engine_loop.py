"""The engine's own thread, and the bridge between it and the asyncio event loop.

One thread owns the engine: it runs the commands the event loop hands it (add, abort, drop documents), then
one `engine.step()`, and dispatches the outputs to the streams of the HTTP handlers that wait for them. When the
engine has nothing to do, the thread sleeps on a condition until a command arrives.

Why commands instead of calling the engine from the event loop: the engine is not thread-safe, and a call
would block every connection for a whole forward pass anyway. Here the event loop never touches the engine's
mutable state: it enqueues a command (an O(1) append) and awaits a future, and reads engine counters from a
snapshot taken after each step. (It may read what never changes after construction: the tokenizer, the
context limit, the mode and the pool size, e.g. through `max_new_tokens`.)

`EngineLoop` is the in-process `EngineClient` (engine/client.py), the only interface the server uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

from lazyattn.engine.choice import Choice
from lazyattn.engine.client import EngineRequest, OutputObserver
from lazyattn.engine.llm_engine import EngineStats, LLMEngine
from lazyattn.engine.modes import Mode
from lazyattn.engine.outputs import RequestOutput
from lazyattn.engine.prompt import RenderedPrompt
from lazyattn.engine.request_options import ENGINE_DEFAULTS, RequestOptions
from lazyattn.errors import LazyAttnError
from lazyattn.model.tokenizer_base import TokenizerBase

logger = logging.getLogger("lazyattn.server")

# A step that returns nothing that fast did no work (e.g. admission waits for pages): yield the CPU a moment
# rather than spin on the GIL that the event loop needs.
_IDLE_STEP_S = 1e-3
_FAILED_STEP_BACKOFF_S = 0.1


class EngineStoppedError(LazyAttnError):
    status_code = 503
    error_type = "server_shutting_down"


class RequestFailedError(LazyAttnError):
    """The engine failed on this request (and only this one): see the server log."""


class LocalStream:
    """The outputs of the engine requests of one HTTP call (a completions call may hold several prompts).

    Iterating yields lists of RequestOutputs: the newest output of each request that moved since the last
    iteration. Outputs carry cumulative text and tokens, so only the newest one of each request is kept: a
    slow reader skips intermediate ones and loses nothing, and memory stays one output per request however
    far behind the reader falls. `abort()` stops whatever has not finished; safe to call any number of times.
    """

    def __init__(self, owner: EngineLoop, loop: asyncio.AbstractEventLoop, request_ids: list[str]) -> None:
        self._owner = owner
        self._loop = loop
        self._latest: dict[str, RequestOutput] = {}
        self._error: BaseException | None = None
        self._ready = asyncio.Event()
        self.request_ids = list(request_ids)
        self.pending = set(request_ids)

    def put(self, item: RequestOutput | BaseException) -> None:
        """From the engine thread."""
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody is listening any more
            self._loop.call_soon_threadsafe(self._store, item)

    def _store(self, item: RequestOutput | BaseException) -> None:
        if isinstance(item, BaseException):
            self._error = item
        else:
            self._latest[item.request_id] = item
        self._ready.set()

    async def __aiter__(self) -> AsyncIterator[list[RequestOutput]]:
        while self.pending:
            await self._ready.wait()
            self._ready.clear()
            if self._error is not None:
                self.pending.clear()
                raise self._error
            latest, self._latest = self._latest, {}
            for rid, out in latest.items():
                if out.finished:
                    self.pending.discard(rid)
            if latest:
                yield list(latest.values())

    def abort(self) -> None:
        if self.pending:
            self._owner.abort(list(self.pending))
            self.pending.clear()


class EngineLoop:
    """An `EngineClient` (engine/client.py) over an engine in this process, driven by a thread of its own."""

    def __init__(self, engine: LLMEngine, observer: OutputObserver | None = None) -> None:
        """`observer` (the server's metrics) gets `on_output(out, now)` for every output and
        `on_abort(request_id)`, on the engine thread."""
        self.engine = engine  # called on the engine thread only; the properties below read what never changes
        self.observer = observer
        self.stats: EngineStats = engine.stats()  # read by /metrics without touching the engine
        self._cv = threading.Condition()
        self._commands: deque[Callable[[], None]] = deque()
        self._streams: dict[str, LocalStream] = {}
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._turn = time.monotonic()  # when the engine thread last finished a turn (commands, then one step)
        self._busy = False

    # -- what it serves: fixed once the engine is built, read from any thread -----------------------------------

    @property
    def tokenizer(self) -> TokenizerBase:
        return self.engine.tokenizer

    @property
    def mode(self) -> Mode:
        return self.engine.mode

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.engine.model_config.vocab_size

    @property
    def ape_prefix(self) -> bool:
        return self.engine.config.ape_prefix

    def max_new_tokens(self, prompt: RenderedPrompt, n: int = 1, options: RequestOptions = ENGINE_DEFAULTS) -> int:
        return self.engine.max_new_tokens(prompt, n, options)

    # -- lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lazyattn-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stalled_for(self) -> float:
        """Seconds the engine thread has had work without finishing a turn (0 when idle or moving)."""
        busy = self._busy or bool(self._commands)
        return time.monotonic() - self._turn if busy else 0.0

    # -- called from the event loop -------------------------------------------------------------------------------

    async def submit(
        self,
        requests: list[EngineRequest],
        *,
        cache_salt: str | None,
        arrival: float,
        options: RequestOptions = ENGINE_DEFAULTS,
        choices: list[Choice | None] | None = None,
    ) -> LocalStream:
        """Add requests to the engine, all or none; raises the engine's validation errors. Params None: a
        prefill-only request (documents encoded ahead). `choices[i]`: the choice request i joins (engine/choice.py)."""
        loop = asyncio.get_running_loop()
        stream = LocalStream(self, loop, [rid for rid, _, _ in requests])
        future: asyncio.Future[None] = loop.create_future()

        def add() -> None:
            added: list[str] = []
            try:
                for (rid, prompt, params), choice in zip(requests, choices or [None] * len(requests)):
                    self.engine.add_request(
                        rid, prompt, params, cache_salt=cache_salt, arrival=arrival, options=options, choice=choice
                    )
                    added.append(rid)
                    self._streams[rid] = stream
            except BaseException as e:
                for rid in added:
                    self.engine.abort(rid)
                    self._streams.pop(rid, None)
                self._resolve(loop, future, e)
                return
            # The handler may be gone by now (its task cancelled): then nobody reads the stream, stop it.
            self._resolve(loop, future, None, on_cancelled=stream.abort)

        self._call(add)
        await future
        return stream

    def abort(self, request_ids: list[str]) -> None:
        """Stop requests and free their pages (at the next turn of the engine thread). Non-blocking."""

        def abort() -> None:
            for rid in request_ids:
                self._streams.pop(rid, None)
                if self.engine.abort(rid) is not None and self.observer is not None:
                    self.observer.on_abort(rid)

        self._call(abort, when_stopping="drop")  # stopping aborts everything anyway

    async def drop_documents(self, segments: list[list[int]], cache_salt: str | None) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def drop() -> None:
            self.engine.drop_documents(segments, cache_salt=cache_salt)
            self._resolve(loop, future, None)

        self._call(drop)
        await future

    def _call(self, command: Callable[[], None], when_stopping: str = "raise") -> None:
        with self._cv:
            if self._stopping:
                if when_stopping == "drop":
                    return
                raise EngineStoppedError("the server is shutting down")
            self._commands.append(command)
            self._cv.notify()

    @staticmethod
    def _resolve(
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future,
        error: BaseException | None,
        on_cancelled: Callable[[], None] | None = None,
    ) -> None:
        """Settle an event-loop future from the engine thread."""

        def settle() -> None:
            if future.cancelled():
                if on_cancelled is not None:
                    on_cancelled()
            elif error is not None:
                future.set_exception(error)
            else:
                future.set_result(None)

        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle)

    # -- the engine thread --------------------------------------------------------------------------------------

    def _run(self) -> None:
        busy = False
        while True:
            with self._cv:
                while not (self._commands or self._stopping or busy):
                    self._cv.wait()
                if self._stopping:
                    break
                commands, self._commands = self._commands, deque()
            for command in commands:
                try:
                    command()
                except Exception:  # a command settles its own future; this is a bug, keep serving
                    logger.exception("engine command failed")
            if self.engine.has_unfinished():
                self._step()
            self.stats = self.engine.stats()
            busy = self._busy = self.engine.has_unfinished()
            self._turn = time.monotonic()
        self._shut_down()

    def _step(self) -> None:
        start = time.monotonic()
        try:
            outputs = self.engine.step()
        except Exception as e:
            # An engine bug: fail what is in flight rather than leave clients waiting on a loop that may
            # raise again at every step.
            logger.exception("engine step failed; aborting the requests in flight")
            self._fail_all(e)
            time.sleep(_FAILED_STEP_BACKOFF_S)  # a step that keeps failing must not flood the log in a hot loop
            return
        now = time.monotonic()
        if not outputs and now - start < _IDLE_STEP_S and not self.engine.step_in_flight:  # in flight: it did work
            time.sleep(_IDLE_STEP_S)
        for out in outputs:
            if self.observer is not None:
                self.observer.on_output(out, now)
            stream = self._streams.get(out.request_id)
            if out.finished:
                self._streams.pop(out.request_id, None)
            if stream is not None:
                # A request the engine failed alone: its stream ends with the error, the others go on.
                stream.put(RequestFailedError(out.error) if out.error is not None else out)

    def _fail_all(self, error: BaseException) -> None:
        streams = dict(self._streams)
        self._streams.clear()
        for rid in streams:
            try:
                self.engine.abort(rid)
            except Exception:
                logger.exception("abort of %s failed", rid)
        for stream in set(streams.values()):
            stream.put(error)

    def _shut_down(self) -> None:
        with self._cv:
            commands, self._commands = self._commands, deque()
        for command in commands:  # settle their futures; what they add is failed right below
            try:
                command()
            except Exception:
                logger.exception("engine command failed")
        self._fail_all(EngineStoppedError("the server is shutting down"))
