"""Overlapped scheduling: the host prepares step N+1 while the GPU runs step N (docs/design.md, "Overlapped
scheduling").

A synchronous step ends by waiting for its sampled tokens; the host then processes them (detokenise, stop
checks) and schedules and stages the next step while the GPU idles. With overlap a step is *launched* (forward
pass and sampling queued, the sampled ids copied to pinned host memory behind them, an event recorded) and left
in flight; the next `LLMEngine.step` schedules and launches step N+1 first, and only then waits for step N's
tokens and processes them.

Step N+1 can be built before step N's tokens are known when it only continues step N: every running sequence
sampled in step N and decodes one token next. Its input token is step N's sampled id, copied on the device
(`FedBack`); the host holds a `PLACEHOLDER` in the run until it reads the token. Anything else (a waiting request
to admit, a document encode, a promotion from the host tier, a page the step would have to evict or preempt for,
a sequence that reaches max_tokens or the context limit with step N's token) drains the pipeline: step N is
processed first and step N+1 is scheduled as the synchronous path would.

A sequence that step N finishes (EOS, stop token or string, found only once its token is read) is already in step
N+1: its extra token is never appended, and its pages are released only once step N+1 has completed, so no page is
handed out again while a step in flight may read or write it.
"""

from __future__ import annotations

import contextlib
import logging

from lazyattn.engine.batch import ScheduledBatch
from lazyattn.engine.graph_inputs import FedBack
from lazyattn.engine.scheduler import Scheduler
from lazyattn.engine.sequence import PLACEHOLDER, Sequence, Status
from lazyattn.engine.step_pipeline import Launch, LaunchedStep, Read, StepPipeline
from lazyattn.errors import TensorParallelError
from lazyattn.kernels.paged import cdiv

logger = logging.getLogger("lazyattn.engine")


class OverlappedPipeline(StepPipeline):
    """A step is left in flight; the next `step` launches the step after it first, when that one only continues
    it (`continuation`), and reads it afterwards. Anything else drains: the step in flight is read first."""

    def __init__(self, launch: Launch, max_model_len: int) -> None:
        super().__init__(launch)
        self.max_model_len = max_model_len
        self.building = False  # a step is being scheduled and launched

    def step(self, scheduler: Scheduler, read: Read) -> None:
        prev, self.in_flight = self.in_flight, None
        running = continuation(prev, scheduler, self.max_model_len) if prev is not None else None
        if running is not None:
            self._continue(prev, running, scheduler, read)
        else:
            if prev is not None:
                self._read(prev, scheduler, read)
            # Nothing to schedule once prev has ended every sequence (a request's last token, its first too when
            # max_tokens is 1): its outputs go back now, without an empty step's bookkeeping on the way.
            if scheduler.running or scheduler.num_waiting:
                batch = scheduler.schedule()
                with self._building():
                    step = self.launch(batch)
                if batch.works and not step.failed:
                    self.in_flight = step
                else:
                    self._read(step, scheduler, read)
        if self.in_flight is None:
            self._release(scheduler)

    def _continue(self, prev: LaunchedStep, running: list[Sequence], scheduler: Scheduler, read: Read) -> None:
        """Launch the step that continues `prev` from its sampled ids on the device, then read `prev`."""
        with self._building():  # pages of sequences prev finishes stay held: this step uses them too
            batch = schedule_continuation(prev, scheduler, running)
            step = None
            if batch.fed_back is not None:
                self.overlapped_steps += 1
                try:
                    step = self.launch(batch)
                except TensorParallelError:
                    raise
                except Exception as error:  # isolation redoes it below, once the tokens are on the host
                    logger.warning("an overlapped step failed (%s); redoing it synchronously", error)
            if step is None:
                self._read(prev, scheduler, read)  # the placeholders get their tokens
                prev = None
                batch.fed_back = None
                step = self.launch(batch)
        self.in_flight = step
        if prev is not None:
            self._read(prev, scheduler, read)

    def _read(self, step: LaunchedStep, scheduler: Scheduler, read: Read) -> None:
        step.wait()
        self._release(scheduler)  # ended before the step after this one was scheduled: out of it, done with
        read(step)

    def end(self, scheduler: Scheduler, seq: Sequence) -> None:
        if seq.status is Status.RUNNING and (self.in_flight is not None or self.building):
            scheduler.finish(seq, release=False)  # a step in flight may still use its pages
            self.ended.append(seq)
        else:
            scheduler.finish(seq)

    def drain(self, scheduler: Scheduler) -> None:
        if self.in_flight is not None:
            last, self.in_flight = self.in_flight, None
            last.wait()
            self._release(scheduler)

    def _release(self, scheduler: Scheduler) -> None:
        """Release the pages of sequences that ended while a step was in flight, once it has completed."""
        ended, self.ended = self.ended, []
        for seq in ended:
            scheduler.release(seq)

    @contextlib.contextmanager
    def _building(self):
        self.building = True
        try:
            yield
        finally:
            self.building = False


def continuation(prev: LaunchedStep, scheduler: Scheduler, max_model_len: int) -> list[Sequence] | None:
    """The running sequences, if the next step can be scheduled before `prev`'s tokens are read: it would decode
    exactly them, one token each, from `prev`'s sampled ids, without admitting, encoding, evicting or preempting.
    None when it cannot (the caller drains)."""
    if prev.failed or prev.sampled_ids is None or prev.batch.encoded:
        return None
    if scheduler.num_waiting or scheduler.jobs or scheduler.cache.promoting or not scheduler.running:
        return None
    new_pages = 0
    for seq in scheduler.running:
        run = seq.run
        if seq.seq_id not in prev.rows or run.pending or run.tokens[-1] == PLACEHOLDER:
            return None  # not sampled by prev (a prefill chunk in progress), or not caught up
        # prev's token is the sequence's len(output)+1-th: if that one must end it, never schedule another.
        if len(seq.output) + 1 >= seq.params.max_tokens or seq.total_len + 1 >= max_model_len:
            return None
        new_pages += cdiv(len(run.tokens) + 1, scheduler.page_size) > len(run.pages)
    # Free pages only: evicting a cached document (or preempting) is the synchronous path's business.
    if scheduler.cache.pool.num_free < new_pages:
        return None
    return list(scheduler.running)


def schedule_continuation(prev: LaunchedStep, scheduler: Scheduler, running: list[Sequence]) -> ScheduledBatch:
    """Hold a placeholder for `prev`'s token in every running sequence and schedule the next step, with the
    FedBack that gives it its input tokens; none if the scheduler built anything but the expected decode step."""
    for seq in running:
        seq.run.tokens.append(PLACEHOLDER)
    batch = scheduler.schedule()
    ids = [w.seq.seq_id for w in batch.works if w.seq is not None]
    if (
        not batch.is_decode
        or batch.copies
        or batch.encoded
        or len(ids) != len(batch.works)
        or sorted(ids) != sorted(s.seq_id for s in running)
    ):
        return batch
    batch.fed_back = FedBack(prev.sampled_ids, [prev.rows[i] for i in ids])
    return batch
