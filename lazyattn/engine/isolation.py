"""When a step fails: find the requests it can be pinned on, end them alone, and finish the step for the rest.

A batched step mixes many requests, so one bad request (a sampling parameter the sampler chokes on, a shape a
kernel rejects) would otherwise fail every request in flight. These helpers redo the failed part of the step
piece by piece: the forward pass as its block copies, then each document encode, then each sequence's own
chunk; sampling row by row. A piece that fails alone fails the requests behind it (request id -> message, in the
step's `StepOutput`), and a document encode that fails is aborted by the step's update; the other pieces' results
are used as if the step had not failed. Recomputing K/V rows writes the same values to the same slots, so redoing a
piece that already ran is harmless.

A step can also succeed with rows of logits that are not a distribution (NaN or infinite: KV gone bad, in the pool
or in a disk file whose checksums hold). Such a row is sampled with the others, each row alone, and its request
ends with NON_FINITE when the step is read (`SampleResult.non_finite_rows`, `Scheduler.update`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from lazyattn.cache.document_cache import Segment
from lazyattn.engine.batch import StepPlan
from lazyattn.engine.sampling import SampleResult
from lazyattn.engine.sequence import Sequence

logger = logging.getLogger("lazyattn.engine")

NON_FINITE = "the model produced non-finite logits (NaN or infinity) for this request; its KV may be corrupt"


@dataclass
class Isolated:
    """What redoing a failed forward pass part by part found: the logits of the sampling works that survive, in plan
    order; the requests that failed (request id -> message) and the documents whose encode failed."""

    logits: torch.Tensor
    failed: dict[str, str] = field(default_factory=dict)
    failed_encodes: list[Segment] = field(default_factory=list)


def forward_parts(run: Callable[[StepPlan], torch.Tensor], plan: StepPlan, running: list[Sequence]) -> Isolated:
    """Redo the plan's forward pass piece by piece: block copies, document encodes, then each sequence's chunks."""
    failed: dict[str, str] = {}

    def redo(part: StepPlan, culprits: set[str]) -> torch.Tensor | None:
        if culprits <= failed.keys():  # nobody left who needs it
            return None
        try:
            return run(part)
        except Exception as error:
            for request_id in culprits:
                failed.setdefault(request_id, f"the engine failed on this request: {error}")
            logger.exception("a part of a step failed on its own; ending %s", ", ".join(sorted(culprits)))
            return None

    for copy in plan.copies:
        owners = {s.request_id for s in running if s.seq_id == copy.seq_id}
        redo(StepPlan(copies=(copy,)), owners)
    failed_encodes = []
    for work in plan.works:
        if work.job is None:
            continue
        waiters = {s.request_id for s in running if any(p.segment is work.job.segment for p in s.parts)}
        if redo(StepPlan((work,)), waiters) is None:
            failed_encodes.append(work.job.segment)
    rows: dict[int, torch.Tensor] = {}
    for work in [w for w in plan.works if w.job is None]:  # after the encodes: a failed one failed its readers
        logits = redo(StepPlan((work,)), {work.seq.request_id})
        if logits is not None and work.samples:
            rows[id(work)] = logits
    sampled = [rows[id(w)] for w in plan.works if w.samples and w.seq.request_id not in failed]
    return Isolated(torch.cat(sampled) if sampled else torch.empty(0), failed, failed_encodes)


def sample_rows(
    sample: Callable[[torch.Tensor, list[Sequence]], SampleResult], logits: torch.Tensor, seqs: list[Sequence]
) -> tuple[list[tuple[Sequence, tuple[SampleResult, int] | None]], dict[str, str]]:
    """(sequence, (result, row)) for each sequence, (sequence, None) for one whose own row cannot be sampled; and
    the requests whose row could not be sampled (request id -> message)."""
    if not seqs:
        return [], {}
    try:
        result = sample(logits, seqs)
        return [(seq, (result, i)) for i, seq in enumerate(seqs)], {}
    except Exception as error:
        logger.warning("sampling a batch failed (%s); sampling row by row", error)
    picked: list[tuple[Sequence, tuple[SampleResult, int] | None]] = []
    failed: dict[str, str] = {}
    for i, seq in enumerate(seqs):
        try:
            picked.append((seq, (sample(logits[i : i + 1], [seq]), 0)))
        except Exception as error:
            failed[seq.request_id] = f"sampling failed for this request: {error}"
            logger.exception("sampling failed for request %s", seq.request_id)
            picked.append((seq, None))
    return picked, failed
