"""When a step fails: find the requests it can be pinned on, end them alone, and finish the step for the rest.

A batched step mixes many requests, so one bad request (a sampling parameter the sampler chokes on, a shape a
kernel rejects) would otherwise fail every request in flight. These helpers redo the failed part of the step
piece by piece: the forward pass as its block copies, then each document encode, then each sequence's own
chunk; sampling row by row. A piece that fails alone fails the requests behind it (`failed`: request id ->
message); the other pieces' results are used as if the step had not failed. Recomputing K/V rows writes the
same values to the same slots, so redoing a piece that already ran is harmless.

A step can also succeed with rows of logits that are not a distribution (NaN or infinite: KV gone bad, in the pool
or in a disk file whose checksums hold). Such a row is sampled with the others, each row alone, and its request
ends with NON_FINITE when the step is read (`SampleResult.non_finite_rows`, `LLMEngine._read`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from lazyattn.cache.document_cache import DocumentCache
from lazyattn.engine.batch import ScheduledBatch, Work
from lazyattn.engine.sampling import SampleResult
from lazyattn.engine.sequence import Sequence

logger = logging.getLogger("lazyattn.engine")

NON_FINITE = "the model produced non-finite logits (NaN or infinity) for this request; its KV may be corrupt"


def forward_parts(
    run: Callable[[ScheduledBatch], torch.Tensor],
    batch: ScheduledBatch,
    running: list[Sequence],
    cache: DocumentCache,
    failed: dict[str, str],
) -> torch.Tensor:
    """Logits of the batch's sampling works that survive, in batch order; failed works leave `batch.works` (and
    a failed document encode is aborted in the cache), so that completing the batch marks nothing of theirs."""

    def redo(part: ScheduledBatch, culprits: set[str]) -> torch.Tensor | None:
        if culprits <= failed.keys():  # nobody left who needs it
            return None
        try:
            return run(part)
        except Exception as error:
            for request_id in culprits:
                failed.setdefault(request_id, f"the engine failed on this request: {error}")
            logger.exception("a part of a step failed on its own; ending %s", ", ".join(sorted(culprits)))
            return None

    for copy in list(batch.copies):
        owners = {s.request_id for s in running if s.seq_id == copy.seq_id}
        if redo(ScheduledBatch(copies=[copy]), owners) is None:
            batch.copies.remove(copy)
    jobs = [w for w in batch.works if w.job is not None]
    for work in jobs:
        waiters = {s.request_id for s in running if any(p.segment is work.job.segment for p in s.parts)}
        if redo(ScheduledBatch(works=[work]), waiters) is None:
            cache.abort(work.job.segment)
            batch.works.remove(work)
    rows: dict[int, torch.Tensor] = {}
    for work in [w for w in batch.works if w.job is None]:  # after the encodes: a failed one failed its readers
        logits = redo(ScheduledBatch(works=[work]), {work.seq.request_id})
        if logits is not None and work.samples:
            rows[id(work)] = logits
    batch.works = [w for w in batch.works if _alive(w, failed)]
    sampled = [rows[id(w)] for w in batch.works if w.samples]
    return torch.cat(sampled) if sampled else torch.empty(0)


def _alive(work: Work, failed: dict[str, str]) -> bool:
    return work.seq is None or work.seq.request_id not in failed


def sample_rows(
    sample: Callable[[torch.Tensor, list[Sequence]], SampleResult],
    logits: torch.Tensor,
    seqs: list[Sequence],
    failed: dict[str, str],
) -> list[tuple[Sequence, tuple[SampleResult, int] | None]]:
    """(sequence, (result, row)) for each sequence; (sequence, None) for one whose own row cannot be sampled."""
    if not seqs:
        return []
    try:
        result = sample(logits, seqs)
        return [(seq, (result, i)) for i, seq in enumerate(seqs)]
    except Exception as error:
        logger.warning("sampling a batch failed (%s); sampling row by row", error)
    picked: list[tuple[Sequence, tuple[SampleResult, int] | None]] = []
    for i, seq in enumerate(seqs):
        try:
            picked.append((seq, (sample(logits[i : i + 1], [seq]), 0)))
        except Exception as error:
            failed[seq.request_id] = f"sampling failed for this request: {error}"
            logger.exception("sampling failed for request %s", seq.request_id)
            picked.append((seq, None))
    return picked
