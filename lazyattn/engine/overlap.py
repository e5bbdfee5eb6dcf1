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

from dataclasses import dataclass

import torch

from lazyattn.engine.batch import ScheduledBatch
from lazyattn.engine.graph_inputs import FedBack
from lazyattn.engine.sampling import SampleResult
from lazyattn.engine.scheduler import Scheduler
from lazyattn.engine.sequence import PLACEHOLDER, Sequence
from lazyattn.kernels.paged import cdiv

Picked = list[tuple[Sequence, "tuple[SampleResult, int] | None"]]


@dataclass
class LaunchedStep:
    """A step whose forward pass and sampling are queued on the device, its results on their way to the host."""

    batch: ScheduledBatch
    picked: Picked  # (sequence, (host result, row)) per sampling sequence; None: its row could not be sampled
    failed: dict[str, str]  # request id -> why, from failure isolation (engine/isolation.py)
    sampled_ids: torch.Tensor | None  # every row's sampled id on the device, when one result holds them all
    rows: dict[int, int]  # seq_id -> row of sampled_ids
    done: torch.cuda.Event | None  # recorded after the copies to the host (None on the CPU: already done)

    def wait(self) -> None:
        if self.done is not None:
            self.done.synchronize()


def launched(batch: ScheduledBatch, picked: Picked, failed: dict[str, str], device: torch.device) -> LaunchedStep:
    """Queue the copies of the step's sampled results to the host and record the event that says they landed."""
    host: dict[int, SampleResult] = {}
    on_host: Picked = []
    for seq, sampled in picked:
        if sampled is None:
            on_host.append((seq, None))
            continue
        result, row = sampled
        if id(result) not in host:
            host[id(result)] = result.to_host()
        on_host.append((seq, (host[id(result)], row)))
    results = {id(s[0]): s[0] for _, s in picked if s is not None}
    whole = len(results) == 1 and all(s is not None for _, s in picked)  # not sampled row by row (isolation)
    sampled_ids = next(iter(results.values())).token_ids if whole else None
    rows = {seq.seq_id: s[1] for seq, s in picked if s is not None} if whole else {}
    done = None
    if device.type == "cuda":
        done = torch.cuda.Event()
        done.record()
    return LaunchedStep(batch, on_host, failed, sampled_ids, rows, done)


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
