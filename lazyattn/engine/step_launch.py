"""Launching a step (the `Launch` of engine/step_pipeline.py): a scheduled batch's forward pass on the executor, its
runs advanced past it, and the sampling, all queued on the device, with the sampled results on their way to the
host. A forward pass or sampling that fails is redone part by part, so that the failure is pinned on the requests
whose parts fail (engine/isolation.py)."""

from __future__ import annotations

import logging

import torch

from lazyattn.cache.host_tier import HostTier
from lazyattn.engine import isolation
from lazyattn.engine.batch import ScheduledBatch
from lazyattn.engine.executor.base import Executor
from lazyattn.engine.output_processor import OutputProcessor
from lazyattn.engine.sampling import Sampler, SampleResult
from lazyattn.engine.scheduler import Scheduler
from lazyattn.engine.sequence import Sequence
from lazyattn.engine.step_pipeline import LaunchedStep, Picked, launched
from lazyattn.errors import TensorParallelError

logger = logging.getLogger("lazyattn.engine")


class StepLauncher:
    """Launches an engine's steps on its executor; `tier`: its host tier, told which pages a forward pass writes."""

    def __init__(
        self,
        executor: Executor,
        sampler: Sampler,
        outputs: OutputProcessor,
        tier: HostTier | None,
        page_size: int,
        device: torch.device,
        split_mixed: bool = False,
    ) -> None:
        self.executor = executor
        self.sampler = sampler
        self.outputs = outputs
        self.tier = tier
        self.page_size = page_size
        self.device = device
        self.split_mixed = split_mixed  # EngineConfig.split_mixed_steps
        self.split_steps = 0  # steps run as a prefill pass and a decode pass

    def launch(self, scheduler: Scheduler, batch: ScheduledBatch) -> LaunchedStep:
        """Queue the batch's forward pass and sampling, and the copies of the sampled tokens to the host."""
        failed: dict[str, str] = {}
        picked: Picked = []
        if batch.works:
            logits = self._forward(scheduler, batch, failed)
            to_sample = scheduler.complete(batch)
            picked = self._sample(logits, to_sample, failed)
        return launched(batch, picked, failed, self.device)

    def _forward(self, scheduler: Scheduler, batch: ScheduledBatch, failed: dict[str, str]) -> torch.Tensor:
        if self.tier is not None and self.tier.mover is not None and self.tier.mover.cuda:
            self.tier.mover.before_forward(batch.written_pages(self.page_size))
        try:
            parts = split_mixed(batch) if self.split_mixed else None
            if parts is None:
                return self.executor.run(batch)
            self.split_steps += 1
            prefill, decode, order = parts
            # A graph's logits are its static output, which a later replay of a graph of the same memory pool may
            # overwrite: the first part's are copied (queued) before the second part runs.
            first = self.executor.run(prefill).clone()
            logits = torch.cat([self.executor.run(decode), first])  # the scheduler's order: decode rows first
            if order is None:
                return logits
            if logits.is_cuda:  # pinned, so that the copy does not wait for the step's passes
                order = order.pin_memory()
            return logits.index_select(0, order.to(logits.device, non_blocking=True))
        except TensorParallelError:
            raise  # a rank is gone: nothing to isolate
        except Exception as error:
            if batch.fed_back is not None:
                raise  # the caller redoes the step once its input tokens are on the host
            logger.warning("a step failed (%s); redoing its parts one by one", error)
            return isolation.forward_parts(self.executor.run, batch, scheduler.running, scheduler.cache, failed)

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence], failed: dict[str, str]) -> Picked:
        seqs = [s for s in seqs if s.request_id not in failed]

        def sample(rows: torch.Tensor, part: list[Sequence]) -> SampleResult:
            return self.sampler.sample(
                rows,
                [s.params for s in part],
                [s.generator for s in part],
                suppress_token_ids=[self.outputs.suppressed(s) for s in part],
            )

        return isolation.sample_rows(sample, logits, seqs, failed)


def split_mixed(batch: ScheduledBatch) -> tuple[ScheduledBatch, ScheduledBatch, torch.Tensor | None] | None:
    """A step with decode rows (one sampled row of a sequence) and other work, as a prefill part and a decode part,
    and the order that puts the logits of [decode part's rows, prefill part's sampling rows] back in batch order
    (None: already, as the scheduler orders a step: decode rows first). None for a step that is all of one kind, or a
    fed-back one (a decode step).

    The prefill part runs first, with the block copies: a decode row may read a document encoded in this step (lazy
    mode), never what another sequence's rows write, and no prefill row reads a decode row's keys."""
    if batch.fed_back is not None:
        return None
    decode = [w for w in batch.works if w.job is None and w.samples and w.hi - w.lo == 1]
    if len(decode) < 2 or len(decode) == len(batch.works):
        return None
    chosen = {id(w) for w in decode}
    prefill = [w for w in batch.works if id(w) not in chosen]
    rows = {id(w): i for i, w in enumerate(decode)}
    rows.update((id(w), len(decode) + i) for i, w in enumerate(w for w in prefill if w.samples))
    order = [rows[id(w)] for w in batch.works if w.samples]
    index = None if order == list(range(len(order))) else torch.tensor(order, dtype=torch.int64)
    return ScheduledBatch(works=prefill, copies=batch.copies), ScheduledBatch(works=decode), index
