"""Continuous batching over the shared document cache, for every mode, and every change of a sequence's state.

A step is plain data flowing one way (docs/design.md, "One step"): `schedule` returns the step's `StepPlan`, the
executor runs it and gives back a `StepOutput`, and `update(plan, output)` applies it: encodes and filled pages
become ready, sampled tokens are appended, the sequences they end are finished and what they hold released, and the
requests the step failed end alone; an abort is `finish`. Nothing else changes a sequence once it exists: the
helpers the scheduler calls return what changes and it applies it — admission what a sequence acquired (`Admitted`,
engine/admission.py), the output processor what a sampled token adds (`NewToken`, engine/output_processor.py).

Each step fills one forward pass with *work*: chunks of runs (kernels/paged.py entries). Order within a
step: running sequences that decode (one token each), then, in admission order, the document encodes a
sequence waits on, followed by that sequence's own prefill chunk, all under a per-step token budget.
What a sequence reuses and how it reads it is its mode's (engine/modes/); what it holds in the cache is acquired
at admission and given back at its end (engine/admission.py, which also queues the shared document encodes, *jobs*).
The scheduler keeps the queues, the budget, the order of a step's work, the private copies a mode asks for (block)
and preemption. A plan's runs count as computed once it is made (the executor runs every plan it is given); what
its forward pass makes ready for others (a document, a prefix page) is marked by its update.

Overlapped scheduling (docs/design.md, "Overlapped scheduling") is one step in flight and a placeholder per running
sequence: when the next step only continues the step in flight (`can_continue`), `schedule(after=...)` holds a
`PLACEHOLDER` in each run for the token in flight and plans their decode from it (`StepPlan.continues`); the update
of the step in flight puts the token in its place. A sequence that ends while a step in flight may still read its
pages keeps them until that step's update (`ended`).

A prefill-only sequence (documents encoded ahead of requests) has segments and no final segment: it waits
for its documents like any other sequence and is done once they are cached.

A document found in the host tier (cache/host_tier.py) is promoted at admission: its copy to the GPU runs beside
the step's forward pass, and the sequences that read it wait for it the way they wait for an encode.

A relinked sequence (lazy mode, docs/design.md "Relink") computes its recomputed document rows, one entry per
document in document order, before (or in the same step as) its first chunk.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

from lazyattn.cache.document_cache import DocumentCache
from lazyattn.engine.admission import Admission, Keyer
from lazyattn.engine.batch import Copy, SegmentJob, StepOutput, StepPlan, StepUpdate, Work
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.isolation import NON_FINITE
from lazyattn.engine.modes import Mode
from lazyattn.engine.output_processor import OutputProcessor
from lazyattn.engine.sampling import SampleResult
from lazyattn.engine.sequence import ModeState, Part, Run, Sequence, Status
from lazyattn.errors import OutOfPagesError
from lazyattn.kernels.paged import EntryPages, cdiv, page_fill

logger = logging.getLogger("lazyattn.engine")

# The token a run holds in place of one sampled by the step in flight, until that step's update; the step that
# feeds it back takes it from the device. Never a vocabulary id.
PLACEHOLDER = -1


@dataclass
class _Draft:
    """The plan being built: the preemptions of the same `schedule` call still edit it (`_preempt`)."""

    works: list[Work] = field(default_factory=list)
    copies: list[Copy] = field(default_factory=list)
    encoded: list[Sequence] = field(default_factory=list)


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        mode: Mode,
        cache: DocumentCache,
        keyer: Keyer,
        outputs: OutputProcessor | None = None,
    ) -> None:
        """`outputs`: what a sampled token adds to a sequence's outputs and whether it ends it; None: the sampled
        tokens are only appended (tests that drive a scheduler without a model)."""
        self.config = config
        self.outputs = outputs
        # the context limit a sequence ends at (the engine's, which defaults to the model's)
        self.max_model_len = outputs.max_model_len if outputs is not None else config.max_model_len or 1 << 62
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
        self._draft: _Draft | None = None  # the plan being built, see _preempt
        self._planned = 0  # plans made so far: the next plan's index
        self._in_flight: set[int] = set()  # indices of plans made and not updated yet
        self._placeholders: set[int] = set()  # seq_ids whose run ends in a PLACEHOLDER (a token in flight)
        # Sequences that ended while a step in flight may still use their pages: released by the next update.
        self.ended: list[Sequence] = []
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
        """Queue a new sequence; a sampled one gets what it decodes with (its detokenizer, its seeded generator, the
        guide of its guided choice)."""
        if self.outputs is not None and not seq.prefill_only:
            seq.detokenizer, seq.generator, seq.guide = self.outputs.start(seq)
        self._waiting.append(seq)
        self.num_waiting += 1

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.num_waiting)

    def finish(self, seq: Sequence, reason: str | None = None) -> None:
        """End a sequence (its last token read, its documents cached, aborted, or failed): its outputs are final
        (`reason`: the finish reason, unless its last token set one) and it is never scheduled again. What it holds
        goes back now, or, while a step in flight may still use it, at the next update (`ended`). O(1) for a
        waiting sequence."""
        if reason is not None:
            seq.finish_reason = reason
        if seq.detokenizer is not None:
            seq.text += seq.detokenizer.finish()  # the held-back tail, now final
        seq.metrics.finished = time.monotonic()
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
            self._contexts.pop(seq.seq_id, None)
            if self._in_flight:
                self.ended.append(seq)
            else:
                self._release(seq)
        elif seq.status is Status.WAITING:
            self.num_waiting -= 1
        seq.status = Status.FINISHED

    # -- one step ---------------------------------------------------------------------------------

    def schedule(self, after: StepPlan | None = None) -> StepPlan:
        """The next step's plan; its runs count as computed from here on. `after`: the plan of the step in flight,
        which `can_continue`: each running sequence holds a placeholder for the token it sampled there, and the plan
        `continues` it when it is exactly their decode."""
        if after is not None:
            for seq in self.running:
                seq.run.tokens.append(PLACEHOLDER)
                self._placeholders.add(seq.seq_id)
        self.admission.drop_dead_jobs()
        batch = self._draft = _Draft()
        budget = self.config.max_num_batched_tokens
        if not self._starved or not self.running:
            self._admit_waiting(budget)
        self.cache.poll()  # promotions from the host tier that landed (on the CPU: those just started) are ready
        self._starved = False
        scheduled: set[int] = set()  # sequences with work in this batch: never preemption victims
        # jobs whose last chunk is in this batch, or in the step in flight (a continuation: marked ready by its update)
        job_done = {k for k, j in self.jobs.items() if not j.run.pending}
        for seq in sorted(self.running, key=lambda s: s.run.pending != 1):  # decodes first
            if budget <= 0:
                break
            if seq.status is Status.RUNNING:  # not preempted earlier in this loop
                budget = self._schedule_sequence(seq, batch, budget, scheduled, job_done)
        self._when_nothing_runs(batch)
        self._draft = None
        plan = StepPlan(tuple(batch.works), tuple(batch.copies), tuple(batch.encoded), self._planned)
        if after is not None and self._continues(plan):
            plan = StepPlan(plan.works, index=plan.index, continues=True)
        self._planned += 1
        self._in_flight.add(plan.index)
        for w in plan.works:  # the executor runs every plan it is given: its rows count as computed
            w.run.num_computed = w.hi
            prefill = w.prefill_rows
            self.prefilled_tokens += prefill
            self.decoded_tokens += w.hi - w.lo - prefill
            if w.seq is not None:
                w.seq.metrics.prefilled_tokens += w.hi - w.lo
        return plan

    def _continues(self, plan: StepPlan) -> bool:
        """The plan is the decode of exactly the running sequences (each from its placeholder), nothing else."""
        ids = [w.seq.seq_id for w in plan.works if w.seq is not None]
        return (
            plan.is_decode
            and not plan.copies
            and not plan.encoded
            and len(ids) == len(plan.works)
            and sorted(ids) == sorted(s.seq_id for s in self.running)
        )

    def can_continue(self, plan: StepPlan) -> bool:
        """Whether the next step can be planned before the tokens of `plan` (in flight) are read: it would decode
        exactly the running sequences, one token each, from the ids `plan` sampled, without admitting, encoding,
        evicting or preempting; none of them may end with that token (max_tokens, the context limit), nor be guided
        (a guided choice's next tokens depend on that one, engine/guided.py)."""
        if plan.encoded or self.num_waiting or self.cache.promoting or not self.running:
            return False
        if any(j.run.pending for j in self.jobs.values()):
            return False
        sampled = {s.seq_id for s in plan.samples}
        new_pages = 0
        for seq in self.running:
            run = seq.run
            if seq.seq_id not in sampled or run.pending or seq.seq_id in self._placeholders:
                return False  # not sampled by plan (a prefill chunk in progress), or not caught up
            if seq.guide is not None:
                return False
            # plan's token is the sequence's len(output)+1-th: if that one must end it, never plan another.
            if len(seq.output) + 1 >= seq.params.max_tokens or seq.total_len + 1 >= self.max_model_len:
                return False
            new_pages += cdiv(len(run.tokens) + 1, self.page_size) > len(run.pages)
        # Free pages only: evicting a cached document (or preempting) is the synchronous path's business.
        return self.cache.pool.num_free >= new_pages

    def update(self, plan: StepPlan, output: StepOutput) -> StepUpdate:
        """Apply a completed step (the caller has waited for it): its encodes and the prefix pages it filled are
        ready; what ended while it ran goes back; each sampled token is appended (in place of its placeholder) and
        the sequences it ends finish; prefill-only sequences whose documents it cached finish; and the requests it
        failed (at launch, or with logits that are not finite) end alone, every sequence of theirs."""
        self._in_flight.discard(plan.index)
        self._complete(plan, output)
        self.release_ended()  # ended before the step after this one was planned: out of it, and this one is done
        touched: dict[str, None] = {}
        ended = dict(output.failed)
        now = time.monotonic()
        for seq in plan.samples:
            if seq.seq_id not in output.sampled or seq.is_finished:  # failed, or ended while this step ran
                continue
            sampled = output.sampled[seq.seq_id]
            if sampled is not None and sampled[1] in sampled[0].non_finite_rows:
                logger.warning("request %s: non-finite logits; ending it", seq.request_id)
                ended.setdefault(seq.request_id, NON_FINITE)
            elif sampled is not None and self._append(seq, *sampled, now):
                self.finish(seq)
            touched[seq.request_id] = None
        for seq in plan.encoded:  # prefill-only: its documents are cached now
            if not seq.is_finished:
                self.finish(seq, "stop")
                touched[seq.request_id] = None
        for request_id in ended:
            for seq in self._live(request_id):
                self.finish(seq, "abort")
            touched[request_id] = None
        return StepUpdate(tuple(touched), ended)

    def _complete(self, plan: StepPlan, output: StepOutput) -> None:
        """What the step's forward pass made ready for others: documents whose encode it finished, the prefix pages
        a sequence's run filled. A failed encode is aborted (its readers failed with it)."""
        for segment in output.failed_encodes:
            self.cache.abort(segment)
        failed_encodes = {id(s) for s in output.failed_encodes}
        for w in plan.works:
            if w.job is not None:
                if id(w.job.segment) not in failed_encodes and w.hi == len(w.run.tokens):
                    self.cache.mark_ready(w.job.segment)
                    self.jobs.pop(w.job.segment.key, None)
            elif w.run is w.seq.run and w.seq.request_id not in output.failed:
                self.admission.mark_filled_ready(w.seq, w.hi)

    def _append(self, seq: Sequence, result: SampleResult, row: int, now: float) -> bool:
        """Append the sequence's sampled token; returns whether it ends the sequence."""
        token = result.ids[row]
        if seq.seq_id in self._placeholders:  # the step after this one fed it back on the device already
            self._placeholders.discard(seq.seq_id)
            seq.run.tokens[-1] = token
        else:
            seq.run.tokens.append(token)
        if self.outputs is None:
            seq.output.append(token)
            return len(seq.output) >= seq.params.max_tokens
        new = self.outputs.new_token(seq, result, row)
        seq.output.append(token)
        seq.text += new.text
        if new.logprobs is not None:
            seq.logprobs.append(new.logprobs)
        if new.first_token_logprobs is not None:
            seq.first_token_logprobs = new.first_token_logprobs
        if seq.metrics.first_token is None:
            seq.metrics.first_token = now
        if new.finish_reason is not None:
            seq.finish_reason, seq.stop_reason = new.finish_reason, new.stop_reason
        return new.finish_reason is not None

    def _live(self, request_id: str) -> list[Sequence]:
        """The request's sequences that have not ended (a request's n samples), in sample order."""
        seqs = [s for s in [*self.running, *self.waiting] if s.request_id == request_id]
        return sorted(seqs, key=lambda s: s.index)

    def release_ended(self) -> None:
        """Release what the sequences that ended while a step was in flight hold (that step has completed)."""
        ended, self.ended = self.ended, []
        for seq in ended:
            self._release(seq)

    def _schedule_sequence(
        self, seq: Sequence, batch: _Draft, budget: int, scheduled: set[int], job_done: set[str]
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
            budget, whole = self._schedule_relinks(seq, batch, budget, scheduled)
            if budget <= 0 or not whole:  # its chunk reads every recomputed row: in this step only after them all
                return budget
        return self._schedule_chunk(seq, batch, budget, scheduled)

    def _schedule_chunk(self, seq: Sequence, batch: _Draft, budget: int, scheduled: set[int]) -> int:
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

    def _when_nothing_runs(self, batch: _Draft) -> None:
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
                admitted = self.admission.admit(seq)
            except OutOfPagesError:
                if not self.running and not self.jobs:
                    raise  # cannot happen for a validated request; never spin silently
                return
            self._waiting.popleft()
            self.num_waiting -= 1
            self.running.append(seq)
            seq.status = Status.RUNNING
            seq.parts, seq.run, seq.mode_state = admitted.parts, admitted.run, admitted.mode_state
            seq.metrics.cached_tokens = admitted.cached_tokens
            backlog += seq.run.pending

    # -- per-step helpers -------------------------------------------------------------------------

    def _schedule_jobs(self, parts: list[Part], batch: _Draft, budget: int, job_done: set[str]) -> int:
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

    def _make_copies(self, seq: Sequence, batch: _Draft) -> bool:
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

    def _schedule_relinks(self, seq: Sequence, batch: _Draft, budget: int, scheduled: set[int]) -> tuple[int, bool]:
        """A relinked sequence's recomputed rows, in document order: document i's rows attend to the documents
        before it as this sequence reads them, so its entry follows theirs (same step or later; each layer writes
        every row's K/V before any row attends). Returns the budget left and whether every recomputed row is now
        computed or in this batch, so that the sequence's own chunk may follow them in the same step."""
        missing = [r for r in seq.mode_state.runs if not r.pages]
        pages = self._allocate(seq, cdiv(sum(len(r.tokens) for r in missing), self.page_size), scheduled)
        if pages is None:
            self._starved = True
            return budget, False
        slot = 0  # packed: each run's rows right after the previous run's, in shared pages
        for r in missing:
            r.first_slot = slot % self.page_size
            r.pages = pages[slot // self.page_size : cdiv(slot + len(r.tokens), self.page_size)]
            slot += len(r.tokens)
        whole = True
        for r in seq.mode_state.runs:
            if not r.pending:
                continue
            if budget <= 0:
                whole = False
                break
            hi = r.num_computed + min(r.pending, budget)
            batch.works.append(Work(r, r.num_computed, hi, self.mode.context(seq, self.page_size, before=r), seq))
            budget -= hi - r.num_computed
            whole = whole and hi == len(r.tokens)
            scheduled.add(seq.seq_id)
        return budget, whole

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

    def _release(self, seq: Sequence) -> None:
        self._placeholders.discard(seq.seq_id)
        self.admission.release(seq)
        seq.parts, seq.run, seq.mode_state = [], None, ModeState()

    def _preempt(self, seq: Sequence) -> None:
        """Recompute-style preemption: drop everything; the sequence re-prefills prompt + output later."""
        self._release(seq)
        self.running.remove(seq)
        self._contexts.pop(seq.seq_id, None)
        if self._draft is not None:
            # Pages just freed may be handed out again in this very step: nothing in the batch may still
            # write to them (encodes of documents nobody holds any more, this sequence's copies).
            self._draft.works = [w for w in self._draft.works if w.job is None or w.job.segment.refcount]
            self._draft.copies = [c for c in self._draft.copies if c.seq_id != seq.seq_id]
            self.admission.drop_dead_jobs()
        seq.status = Status.WAITING
        self._waiting.appendleft(seq)
        self.num_waiting += 1
        self.num_preemptions += 1
