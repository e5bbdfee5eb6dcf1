"""Continuous batching over the shared document cache, for every mode.

Each step fills one forward pass with *work*: chunks of runs (kernels/paged.py entries). Order within a
step: running sequences that decode (one token each), then, in admission order, the document encodes a
sequence waits on, followed by that sequence's own prefill chunk, all under a per-step token budget.
What a sequence reuses and how it reads it is its mode's (engine/modes/); what it holds in the cache is acquired
at admission and given back at its end (engine/admission.py, which also queues the shared document encodes, *jobs*).
The scheduler keeps the queues, the budget, the order of a step's work, the private copies a mode asks for (block)
and preemption.

A prefill-only sequence (documents encoded ahead of requests) has segments and no final segment: it waits
for its documents like any other sequence and is done once they are cached.

A document found in the host tier (cache/host_tier.py) is promoted at admission: its copy to the GPU runs beside
the step's forward pass, and the sequences that read it wait for it the way they wait for an encode.

A relinked sequence (lazy mode, docs/design.md "Relink") computes its recomputed document rows, one entry per
document in document order, before (or in the same step as) its first chunk.
"""

from __future__ import annotations

import time
from collections import deque

from lazyattn.cache.document_cache import DocumentCache
from lazyattn.engine.admission import Admission, Keyer
from lazyattn.engine.batch import Copy, ScheduledBatch, SegmentJob, Work
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.modes import Mode
from lazyattn.engine.sequence import Part, Run, Sequence, Status
from lazyattn.errors import OutOfPagesError
from lazyattn.kernels.paged import EntryPages, cdiv, page_fill


class Scheduler:
    def __init__(self, config: EngineConfig, mode: Mode, cache: DocumentCache, keyer: Keyer) -> None:
        self.config = config
        self.mode = mode
        self.cache = cache
        self.page_size = cache.page_size
        self.admission = Admission(mode, cache, keyer)
        # Waiting sequences in admission order. An aborted one is only marked finished and skipped when it reaches
        # the front, so that aborting is O(1) however long the queue (a client that drops a huge batch).
        self._waiting: deque[Sequence] = deque()
        self.num_waiting = 0
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.prefilled_tokens = 0  # prefill rows computed by forward passes (documents, prompts, recomputation)
        self.decoded_tokens = 0  # decode rows (one per sampled token that was fed back)
        self._batch: ScheduledBatch | None = None  # the batch being built, see _preempt
        # A running sequence lacked pages in the last step: admit nobody until it has moved on, or a
        # preempted sequence re-admitted first would take the very pages the older one waits for.
        self._starved = False
        # seq_id -> (run, context of that run): a context is fixed from the run's first chunk to its end (the parts
        # and private pages it lists are acquired at admission, relinks and copies made before that chunk), so it
        # is made once, not per step (~165 pages a lazy RAG sequence); a re-admitted sequence has a new run.
        self._contexts: dict[int, tuple[Run, EntryPages]] = {}

    @property
    def jobs(self) -> dict[str, SegmentJob]:
        """The pending encode of each document being encoded, by key (engine/admission.py queues them)."""
        return self.admission.jobs

    # -- queue ------------------------------------------------------------------------------------

    @property
    def waiting(self) -> list[Sequence]:
        return [s for s in self._waiting if s.status is Status.WAITING]

    def add(self, seq: Sequence) -> None:
        self._waiting.append(seq)
        self.num_waiting += 1

    def finish(self, seq: Sequence, release: bool = True) -> None:
        """Release everything a sequence holds (finished or aborted). O(1) for a waiting sequence.
        release=False: stop scheduling it but keep its pages until `release` (a step in flight may still use
        them, engine/overlap.py)."""
        if seq.status is Status.RUNNING:
            if release:
                self.admission.release(seq)
            self.running.remove(seq)
            self._contexts.pop(seq.seq_id, None)
        elif seq.status is Status.WAITING:
            self.num_waiting -= 1
        seq.status = Status.FINISHED

    # -- one step ---------------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch:
        self.admission.drop_dead_jobs()
        batch = self._batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        if not self._starved or not self.running:
            self._admit_waiting(budget)
        self.cache.poll()  # promotions from the host tier that landed (on the CPU: those just started) are ready
        self._starved = False
        scheduled: set[int] = set()  # sequences with work in this batch: never preemption victims
        job_done: set[str] = set()  # jobs whose last chunk is in this batch
        for seq in sorted(self.running, key=lambda s: s.run.pending != 1):  # decodes first
            if budget <= 0:
                break
            if seq.status is Status.RUNNING:  # not preempted earlier in this loop
                budget = self._schedule_sequence(seq, batch, budget, scheduled, job_done)
        self._when_nothing_runs(batch)
        self._batch = None
        return batch

    def _schedule_sequence(
        self, seq: Sequence, batch: ScheduledBatch, budget: int, scheduled: set[int], job_done: set[str]
    ) -> int:
        """One running sequence's work in this step, stage by stage: the encodes of the documents it waits on,
        its private copies, its recomputed rows, then its own chunk. Returns the budget left."""
        if any(p.segment.failed for p in seq.parts):
            self._preempt(seq)  # its encoder gave up: start over, now as the encoder
            return budget
        budget = self._schedule_jobs(seq.parts, batch, budget, job_done)
        if seq.prefill_only:
            if all(p.segment.ready or p.segment.key in job_done for p in seq.parts):
                batch.encoded.append(seq)
            return budget
        if budget <= 0 or not self._parts_ready(seq, job_done):
            return budget
        if self.mode.copies_needed(seq):
            if not self._make_copies(seq, batch):
                self._starved = True
                return budget
            scheduled.add(seq.seq_id)  # its copies are in this batch
        if any(r.pending for r in seq.mode_state.runs):
            budget = self._schedule_relinks(seq, batch, budget, scheduled)
            if budget <= 0 or any(r.pending for r in seq.mode_state.runs):
                return budget
        return self._schedule_chunk(seq, batch, budget, scheduled)

    def _schedule_chunk(self, seq: Sequence, batch: ScheduledBatch, budget: int, scheduled: set[int]) -> int:
        """The sequence's own next chunk of its run, as much as the budget allows."""
        chunk = min(seq.run.pending, budget)
        if not self._reserve(seq, seq.run.num_computed + chunk, scheduled):
            self._starved = True
            return budget
        hi = seq.run.num_computed + chunk
        context = self._context(seq)
        batch.works.append(Work(seq.run, seq.run.num_computed, hi, context, seq, samples=hi == len(seq.run.tokens)))
        scheduled.add(seq.seq_id)
        if seq.metrics.scheduled is None:
            seq.metrics.scheduled = time.monotonic()
        return budget - chunk

    def _context(self, seq: Sequence) -> EntryPages:
        cached = self._contexts.get(seq.seq_id)
        if cached is None or cached[0] is not seq.run:
            cached = self._contexts[seq.seq_id] = (seq.run, self.mode.context(seq, self.page_size))
        return cached[1]

    def _when_nothing_runs(self, batch: ScheduledBatch) -> None:
        """A step with no work: wait for the host tier's copies, or free the newest sequence if pages ran out."""
        if batch.works or batch.encoded:
            return
        if self.cache.promoting:
            self.cache.poll(wait=True)  # only copies from the host tier are left to wait for: wait here, not spin
        elif self.running and not self.jobs:
            # Nothing could run (pages exhausted by sequences that each wait for more): free the newest.
            batch.copies.clear()
            self._preempt(self.running[-1])
            self._starved = True

    def complete(self, batch: ScheduledBatch) -> list[Sequence]:
        """Advance runs after the forward pass; returns the sequences that sample now, in batch order."""
        to_sample = []
        for w in batch.works:
            w.run.num_computed = w.hi
            prefill = w.run.prefill_rows(w.lo, w.hi)
            self.prefilled_tokens += prefill
            self.decoded_tokens += w.hi - w.lo - prefill
            if w.job is not None:
                if w.run.pending == 0:
                    self.cache.mark_ready(w.job.segment)
                    self.jobs.pop(w.job.segment.key, None)
                continue
            w.seq.metrics.prefilled_tokens += w.hi - w.lo
            self.admission.mark_filled_ready(w.seq)
            if w.samples:
                to_sample.append(w.seq)
        return to_sample

    # -- admission --------------------------------------------------------------------------------

    def _admit_waiting(self, budget: int) -> None:
        backlog = sum(s.run.pending for s in self.running if s.run.pending > 1)
        backlog += sum(j.run.pending for j in self.jobs.values())
        while self._waiting and len(self.running) < self.config.max_num_seqs and backlog < budget:
            seq = self._waiting[0]
            if seq.status is not Status.WAITING:  # aborted while it waited
                self._waiting.popleft()
                continue
            try:
                self.admission.admit(seq)
            except OutOfPagesError:
                if not self.running and not self.jobs:
                    raise  # cannot happen for a validated request; never spin silently
                return
            self._waiting.popleft()
            self.num_waiting -= 1
            self.running.append(seq)
            seq.status = Status.RUNNING
            backlog += seq.run.pending

    # -- per-step helpers -------------------------------------------------------------------------

    def _schedule_jobs(self, parts: list[Part], batch: ScheduledBatch, budget: int, job_done: set[str]) -> int:
        """Schedule the encodes of the documents a sequence waits on, before its own chunk."""
        for part in parts:
            job = self.jobs.get(part.segment.key)
            if job is None or job.segment is not part.segment or part.segment.key in job_done:
                continue
            if any(w.run is job.run for w in batch.works) or budget <= 0:
                continue
            context = EntryPages([], [], [])
            if job.prefix is not None:  # ape_prefix: the first segment's rows, written before (or in) this step
                if not (job.prefix.ready or job.prefix.key in job_done):
                    continue
                fill = page_fill(job.run.start_pos, self.page_size)
                context = EntryPages(list(job.prefix.pages), [0] * len(fill), fill)
            chunk = min(job.run.pending, budget)
            hi = job.run.num_computed + chunk
            batch.works.append(Work(job.run, job.run.num_computed, hi, context, job=job))
            budget -= chunk
            if hi == len(job.run.tokens):
                job_done.add(part.segment.key)
        return budget

    def _parts_ready(self, seq: Sequence, job_done: set[str]) -> bool:
        """A sequence's own chunk may run once every part it reads is (or becomes, within this batch, for lazy: K/V
        of all rows is written before any row attends) ready."""
        for p in seq.parts:
            if p.segment.ready:
                continue
            if self.mode.reads_documents_in_same_step and p.segment.key in job_done:
                continue
            return False
        return True

    def _make_copies(self, seq: Sequence, batch: ScheduledBatch) -> bool:
        """The sequence's private re-rotated copies its mode asks for (block: the documents placed after
        position 0), into the batch before its first chunk."""
        src, deltas = self.mode.copy_sources(seq)
        try:
            dst = self.cache.allocate(len(src))
        except OutOfPagesError:
            return False
        batch.copies.append(Copy(seq.seq_id, src, dst, deltas))
        self.mode.set_copies(seq, dst)
        return True

    def _schedule_relinks(self, seq: Sequence, batch: ScheduledBatch, budget: int, scheduled: set[int]) -> int:
        """A relinked sequence's recomputed rows, in document order: document i's rows attend to the documents
        before it as this sequence reads them, so its entry follows theirs (same step or later)."""
        missing = [r for r in seq.mode_state.runs if not r.pages]
        pages = self._allocate(seq, sum(cdiv(len(r.tokens), self.page_size) for r in missing), scheduled)
        if pages is None:
            self._starved = True
            return budget
        for r in missing:
            n = cdiv(len(r.tokens), self.page_size)
            r.pages, pages = pages[:n], pages[n:]
        for i, r in enumerate(seq.mode_state.runs, start=1):
            if not r.pending:
                continue
            if budget <= 0:
                break
            hi = r.num_computed + min(r.pending, budget)
            batch.works.append(Work(r, r.num_computed, hi, self.mode.context(seq, self.page_size, upto=i), seq))
            budget -= hi - r.num_computed
            scheduled.add(seq.seq_id)
        return budget

    def _reserve(self, seq: Sequence, upto: int, scheduled: set[int]) -> bool:
        """Make sure the run has pages for its first `upto` tokens, evicting and preempting as needed."""
        run = seq.run
        pages = self._allocate(seq, cdiv(upto, self.page_size) - len(run.pages), scheduled)
        if pages is None:
            return False
        run.pages += pages
        return True

    def _allocate(self, seq: Sequence, need: int, scheduled: set[int]) -> list[int] | None:
        """`need` free pages for `seq`, evicting and preempting sequences not in this batch as needed; None if
        that is not enough."""
        while need > 0:
            try:
                return self.cache.allocate(need)
            except OutOfPagesError:
                victims = [s for s in self.running if s.seq_id not in scheduled and s is not seq]
                if not victims:
                    return None
                self._preempt(victims[-1])
        return []

    # -- releasing ---------------------------------------------------------------------------------

    def release(self, seq: Sequence) -> None:
        """Release what a sequence finished with `finish(seq, release=False)` still holds."""
        self.admission.release(seq)

    def _preempt(self, seq: Sequence) -> None:
        """Recompute-style preemption: drop everything; the sequence re-prefills prompt + output later."""
        self.admission.release(seq)
        self.running.remove(seq)
        self._contexts.pop(seq.seq_id, None)
        if self._batch is not None:
            # Pages just freed may be handed out again in this very step: nothing in the batch may still
            # write to them (encodes of documents nobody holds any more, this sequence's copies).
            self._batch.works = [w for w in self._batch.works if w.job is None or w.job.segment.refcount]
            self._batch.copies = [c for c in self._batch.copies if c.seq_id != seq.seq_id]
            self.admission.drop_dead_jobs()
        seq.status = Status.WAITING
        self._waiting.appendleft(seq)
        self.num_waiting += 1
        self.num_preemptions += 1
