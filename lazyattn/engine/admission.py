"""What a sequence holds in the document cache: acquired when the scheduler admits it, given back when it ends or is
preempted.

Admission asks the sequence's mode what to acquire (`Mode.admit`, through this module's `DocumentSource`), queues an
encode job for each document the cache does not hold yet (one job however many sequences wait on it), and checks that
the pool has room for the sequence's peak pages (its mode's count), or gives everything back. Release lets go of the
sequence's parts, the cache segments its run fills, its run's private pages and its mode's.

Admission reads sequences and never changes them: `admit` returns what the sequence acquired (`Admitted`) and the
scheduler, which owns every change of a sequence's state, sets it; after `release` the scheduler clears it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lazyattn.cache.document_cache import DocumentCache, Segment
from lazyattn.engine.batch import SegmentJob
from lazyattn.engine.modes import Mode
from lazyattn.engine.sequence import ModeState, Part, Run, Sequence
from lazyattn.errors import OutOfPagesError

Keyer = Callable[[list[int], "str | None", "str | None"], str]  # (tokens, salt, parent) -> key


def segment_keys(keyer: Keyer, segments: list[list[int]], salt: str | None, prefix: bool = False) -> list[str]:
    """The segments' document-cache keys. With prefix (ape_prefix), a segment after the first is encoded after it:
    its key includes the first segment's key (the encoding depends on it), and a marker that sets it apart from the
    keys of prefix mode's page chains."""
    keys = [keyer(s, salt, None) for s in segments]
    if prefix and keys:
        keys[1:] = [keyer(s, salt, "ape-prefix:" + keys[0]) for s in segments[1:]]
    return keys


@dataclass(frozen=True)
class Admitted:
    """What an admitted sequence holds: its cached parts (in order), the run it computes, its mode's state, and the
    context tokens it found in the cache."""

    parts: list[Part]
    run: Run
    mode_state: ModeState
    cached_tokens: int


class Admission:
    """Acquires and releases what sequences hold in `cache`; the modes' `DocumentSource` (engine/modes/base.py).
    `jobs`: the pending encode of each document being encoded, by key (the scheduler schedules them)."""

    def __init__(self, mode: Mode, cache: DocumentCache, keyer: Keyer) -> None:
        self.mode = mode
        self.cache = cache
        self.page_size = cache.page_size
        self.keyer = keyer
        self.jobs: dict[str, SegmentJob] = {}

    def admit(self, seq: Sequence) -> Admitted:
        """Acquire the sequence's cached parts (creating jobs for missing documents) and its run. Raises
        OutOfPagesError, having given back what it took, when the pool has no room for its peak pages yet."""
        acquired: list[Part] = []
        state = self.mode.new_state()
        try:
            run = self.mode.admit(self, seq, acquired, state)
            held = sum(len(p.segment.pages) for p in acquired) + len(run.pages)
            samples = 0 if seq.prefill_only else 1
            need = (
                self.mode.pages_needed(
                    [len(s) for s in seq.segments],
                    len(seq.prompt) + len(seq.output),
                    samples,
                    self.page_size,
                    seq.options.relink,
                )
                - held
            )
            if self.cache.available_pages() < need:
                raise OutOfPagesError("not enough room for this sequence's prefill yet")
        except OutOfPagesError:
            self._let_go(acquired, state)
            self.drop_dead_jobs()  # the encodes this admission queued: nobody waits for them now
            raise
        return Admitted(acquired, run, state, sum(p.length for p in acquired if p.hit))

    def mark_filled_ready(self, seq: Sequence, computed: int) -> None:
        """The cache segments the sequence's run fills (prefix mode) are ready once it has computed their pages: its
        first `computed` tokens."""
        for segment in seq.mode_state.filled_segments()[: computed // self.page_size]:
            if not segment.ready:
                self.cache.mark_ready(segment)

    def release(self, seq: Sequence) -> None:
        """Give back everything the sequence holds (the scheduler then clears its parts, run and mode state)."""
        self._let_go(seq.parts, seq.mode_state)
        run = seq.run
        if run is not None:
            self.cache.pool.free(run.pages[run.owned :])
        for pages in seq.mode_state.private_pages():
            self.cache.pool.free(pages)

    def drop_dead_jobs(self) -> None:
        """A document nobody waits for any more was dropped by the cache: stop encoding it."""
        for key in [k for k, j in self.jobs.items() if j.segment.refcount == 0 or j.segment.failed]:
            del self.jobs[key]

    def _let_go(self, parts: list[Part], state: ModeState) -> None:
        """Release a sequence's cached parts and the segments its run fills, last to first, so that LRU evicts the
        tail of a prefix chain before what it hangs from. A filled segment not computed yet is aborted."""
        for segment in reversed(state.filled_segments()):
            if not segment.ready and not segment.failed:
                self.cache.abort(segment)
            self.cache.release(segment)
        for part in reversed(parts):
            self.cache.release(part.segment)

    # -- the modes' DocumentSource ------------------------------------------------------------------------------

    def acquire_documents(
        self,
        segments: list[list[int]],
        salt: str | None,
        acquired: list[Part],
        keys: list[str] | None = None,
        prefix: bool = False,
    ) -> None:
        """Acquire each segment as a cached document at its logical start, queueing an encode job for each one
        the cache does not hold yet (one job however many sequences wait on it). `keys`: the segments' keys if
        already computed (LLMEngine.add_request). prefix (ape_prefix): the segments after the first are encoded
        after it, at positions from its length, under keys that include its key (`segment_keys`)."""
        keys = keys if keys is not None else segment_keys(self.keyer, segments, salt, prefix)
        start = 0
        for i, tokens in enumerate(segments):
            after = len(segments[0]) if prefix and i else 0
            segment, is_new = self.cache.acquire(keys[i], len(tokens))
            acquired.append(Part(segment, start, len(tokens), hit=not is_new, rotated_at=after))
            if is_new:
                if after:  # a copy of the document: removing the document removes it
                    self.cache.link(self.keyer(tokens, salt, None), keys[i])
                run = Run(list(tokens), after, list(segment.pages))
                self.jobs[keys[i]] = SegmentJob(segment, run, acquired[0].segment if after else None)
            start += len(tokens)

    def chain_key(self, tokens: list[int], salt: str | None, parent: str | None) -> str:
        return self.keyer(tokens, salt, parent)

    def holds(self, key: str) -> bool:
        return self.cache.contains(key)

    def acquire_key(self, key: str, num_tokens: int) -> tuple[Segment, bool]:
        return self.cache.acquire(key, num_tokens)
