"""Python's cyclic garbage collector around the engine's steps (EngineConfig.gc_control and gc_freeze).

A full collection (generation 2) walks every object the process tracks: ~300K once torch, Triton and an engine are
built, ~110-150 ms on a 2-core CPU host, taken by whichever step's allocation crosses Python's threshold. Under load
that one step stalls, and the requests that arrive meanwhile make one large prefill after it (docs/benchmarks.md,
"Tracing a window").

While the engine is busy (it holds requests) automatic collection is off. Between steps the engine runs the young
collections itself when Python's counts say they are due (`young_due`), as Python would: cheap, and what requests
make that is cyclic dies young. The full collection waits until the engine goes idle (run then if generation 2's
count is due), or for `full_interval_s` of continuous load, a bound on the memory cyclic garbage can hold meanwhile.
Idle, automatic collection is as it was.

`gc` is one per process: every engine's controls share one count of holders (the first remembers whether automatic
collection was on, the last puts it back), and of freezers (the last to close unfreezes). If automatic collection was
off before the first holder, the engines leave the collector alone.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable


class _Shared:
    """What every engine's control in the process shares; changed under `lock`."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # reentrant: a dropped engine's finalizer may run in a collection run under it
        self.holders = 0  # engines busy with automatic collection held off
        self.restore = False  # automatic collection was on before the first holder: it goes back on after the last
        self.last_full = 0.0  # the last full collection run for a holder, or the start of the held stretch
        self.freezers = 0  # engines whose construction froze the heap (gc_freeze)


_shared = _Shared()


def young_due() -> int | None:
    """The generation Python's automatic collection would collect now, if it is young (0 or 1); None: none due.
    A count past its threshold is due, as in CPython's collect_generations; generation 1's count is the collections
    of generation 0 since its own."""
    count0, count1, _ = gc.get_count()
    threshold0, threshold1, _ = gc.get_threshold()
    if not threshold0 or count0 <= threshold0:  # a threshold of 0: automatic collection is off
        return None
    return 1 if count1 > threshold1 else 0


class GcControl:
    """One engine's hold on the collector: `busy` when it takes requests, `between_steps` before each step while it
    holds them, `idle` when it holds none, `close` at shutdown or when the engine is dropped."""

    def __init__(self, hold: bool, full_interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold = hold
        self.full_interval_s = full_interval_s
        self.clock = clock
        self.holding = False  # this engine counts among the holders
        self.frozen = False  # this engine counts among the freezers

    def freeze(self) -> None:
        """Collect, then move every tracked object out of collections (gc.freeze) until `close`: a full collection
        walks only what was made since. Frozen garbage is freed only once the last freezer closes."""
        gc.collect()
        with _shared.lock:
            gc.freeze()
            _shared.freezers += 1
        self.frozen = True

    def busy(self) -> None:
        """The engine holds requests: automatic collection off (if this is the process's first holder) until
        `idle`."""
        if not self.hold or self.holding:
            return
        with _shared.lock:
            if _shared.holders == 0:
                _shared.restore = gc.isenabled()
                _shared.last_full = self.clock()
                gc.disable()
            _shared.holders += 1
        self.holding = True

    def between_steps(self) -> None:
        """Run the collection that is due: the full one after `full_interval_s` of holding, else a young one."""
        if not (self.holding and _shared.restore):
            return
        now = self.clock()
        if now - _shared.last_full >= self.full_interval_s:
            _shared.last_full = now
            gc.collect()
            return
        generation = young_due()
        if generation is not None:
            gc.collect(generation)

    def idle(self) -> None:
        """The engine holds no requests: the full collection if generation 2's count is due, then automatic
        collection as it was, if no other engine holds it off."""
        self._release(collect=True)

    def close(self) -> None:
        """Shutdown (or the engine dropped): give back the hold and the freeze. Idempotent; collects nothing, since
        it may run inside a collection (a weakref finalizer)."""
        self._release(collect=False)
        if self.frozen:
            self.frozen = False
            with _shared.lock:
                _shared.freezers -= 1
                if _shared.freezers == 0:
                    gc.unfreeze()

    def _release(self, collect: bool) -> None:
        if not self.holding:
            return
        self.holding = False
        with _shared.lock:  # held through the collection: another engine's `busy` must see the state it leaves
            _shared.holders -= 1
            if _shared.holders or not _shared.restore:
                return
            if collect and gc.get_count()[2] > gc.get_threshold()[2]:
                _shared.last_full = self.clock()
                gc.collect()
            gc.enable()
