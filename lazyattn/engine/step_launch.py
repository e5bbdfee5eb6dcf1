"""Launching a step: a plan's forward pass on the executor and its sampling, queued on the device, with the sampled
results on their way to the host (`LaunchedStep`); once the step has completed, its `StepOutput` is plain data. A
forward pass or sampling that fails is redone part by part, so that the failure is pinned on the requests whose
parts fail (engine/isolation.py)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from lazyattn.cache.host_tier import HostTier
from lazyattn.engine import isolation
from lazyattn.engine.batch import Sampled, StepOutput, StepPlan
from lazyattn.engine.executor.base import Executor
from lazyattn.engine.graph_inputs import FedBack
from lazyattn.engine.output_processor import OutputProcessor
from lazyattn.engine.sampling import Sampler, SampleResult
from lazyattn.engine.sequence import Sequence
from lazyattn.engine.step_report import StepReport
from lazyattn.errors import TensorParallelError

logger = logging.getLogger("lazyattn.engine")


@dataclass
class LaunchedStep:
    """A step whose forward pass and sampling are queued on the device, its results on their way to the host."""

    plan: StepPlan
    output: StepOutput  # its host results are read only after `wait`
    sampled_ids: torch.Tensor | None  # every row's sampled id on the device, when one result holds them all
    rows: dict[int, int]  # seq_id -> row of sampled_ids
    done: torch.cuda.Event | None  # recorded after the copies to the host (None on the CPU: already done)
    report: StepReport | None = None  # while a step observer is set (engine/step_pipeline.py)

    @property
    def feeds_back(self) -> bool:
        """The next step may take its input tokens from this one's sampled ids on the device."""
        return not self.output.failed and self.sampled_ids is not None

    def fed_back(self, plan: StepPlan) -> FedBack:
        """Where each work of `plan` (which continues this step) finds its input token among this step's ids."""
        return FedBack(self.sampled_ids, [self.rows[w.seq.seq_id] for w in plan.works])

    def wait(self) -> StepOutput:
        if self.done is not None:
            self.done.synchronize()
        return self.output


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

    @property
    def graph_passes(self) -> int:
        """Forward passes so far that replayed a CUDA graph."""
        return self.executor.runner.graph_replays

    def launch(self, plan: StepPlan, running: list[Sequence], after: LaunchedStep | None = None) -> LaunchedStep:
        """Queue the plan's forward pass and sampling, and the copies of the sampled tokens to the host. `after`:
        the step in flight that a continuing plan takes its input tokens from. `running`: the scheduler's running
        sequences (whom a failed copy or encode fails)."""
        if after is not None:
            plan = dataclasses.replace(plan, fed_back=after.fed_back(plan))
        if not plan.works:
            return launched(plan, [], {}, [], self.device)
        logits, failed, failed_encodes = self._forward(plan, running)
        picked, unsampled = self._sample(plan, logits, failed)
        return launched(plan, picked, {**failed, **unsampled}, failed_encodes, self.device)

    def _forward(self, plan: StepPlan, running: list[Sequence]) -> tuple[torch.Tensor, dict[str, str], list]:
        if self.tier is not None and self.tier.mover is not None and self.tier.mover.cuda:
            self.tier.mover.before_forward(plan.written_pages(self.page_size))
        try:
            parts = split_mixed(plan) if self.split_mixed else None
            if parts is None:
                return self.executor.run(plan), {}, []
            self.split_steps += 1
            prefill, decode, order = parts
            # A graph's logits are its static output, which a later replay of a graph of the same memory pool may
            # overwrite: the first part's are copied (queued) before the second part runs.
            first = self.executor.run(prefill).clone()
            logits = torch.cat([self.executor.run(decode), first])  # the scheduler's order: decode rows first
            if order is None:
                return logits, {}, []
            if logits.is_cuda:  # pinned, so that the copy does not wait for the step's passes
                order = order.pin_memory()
            return logits.index_select(0, order.to(logits.device, non_blocking=True)), {}, []
        except TensorParallelError:
            raise  # a rank is gone: nothing to isolate
        except Exception as error:
            if plan.fed_back is not None:
                raise  # the caller launches the plan again once its input tokens are on the host
            logger.warning("a step failed (%s); redoing its parts one by one", error)
            isolated = isolation.forward_parts(self.executor.run, plan, running)
            return isolated.logits, isolated.failed, isolated.failed_encodes

    def _sample(self, plan: StepPlan, logits: torch.Tensor, failed: dict[str, str]):
        seqs = [s for s in plan.samples if s.request_id not in failed]
        unread = 1 if plan.continues else 0  # the tokens being fed back count as generated

        def sample(rows: torch.Tensor, part: list[Sequence]) -> SampleResult:
            return self.sampler.sample(
                rows,
                [s.params for s in part],
                [s.generator for s in part],
                suppress_token_ids=[self.outputs.suppressed(s, unread) for s in part],
                allowed_token_ids=[self.outputs.allowed(s) for s in part],
            )

        return isolation.sample_rows(sample, logits, seqs)


def launched(
    plan: StepPlan,
    picked: list[tuple[Sequence, Sampled | None]],
    failed: dict[str, str],
    failed_encodes: list,
    device: torch.device,
) -> LaunchedStep:
    """Queue the copies of the step's sampled results to the host and record the event that says they landed."""
    host: dict[int, SampleResult] = {}
    sampled: dict[int, Sampled | None] = {}
    for seq, pick in picked:
        if pick is None:
            sampled[seq.seq_id] = None
            continue
        result, row = pick
        if id(result) not in host:
            host[id(result)] = result.to_host()
        sampled[seq.seq_id] = (host[id(result)], row)
    results = {id(p[0]): p[0] for _, p in picked if p is not None}
    whole = len(results) == 1 and all(p is not None for _, p in picked)  # not sampled row by row (isolation)
    sampled_ids = next(iter(results.values())).token_ids if whole else None
    rows = {seq.seq_id: p[1] for seq, p in picked if p is not None} if whole else {}
    done = None
    if device.type == "cuda":
        done = torch.cuda.Event()
        done.record()
    output = StepOutput(sampled, failed, tuple(failed_encodes))
    return LaunchedStep(plan, output, sampled_ids, rows, done)


def split_mixed(plan: StepPlan) -> tuple[StepPlan, StepPlan, torch.Tensor | None] | None:
    """A step with decode rows (one sampled row of a sequence) and other work, as a prefill part and a decode part,
    and the order that puts the logits of [decode part's rows, prefill part's sampling rows] back in plan order
    (None: already, as the scheduler orders a step: decode rows first). None for a step that is all of one kind, or a
    fed-back one (a decode step).

    The prefill part runs first, with the block copies: a decode row may read a document encoded in this step (lazy
    mode), never what another sequence's rows write, and no prefill row reads a decode row's keys."""
    if plan.fed_back is not None:
        return None
    decode = [w for w in plan.works if w.job is None and w.samples and w.hi - w.lo == 1]
    if len(decode) < 2 or len(decode) == len(plan.works):
        return None
    chosen = {id(w) for w in decode}
    prefill = [w for w in plan.works if id(w) not in chosen]
    rows = {id(w): i for i, w in enumerate(decode)}
    rows.update((id(w), len(decode) + i) for i, w in enumerate(w for w in prefill if w.samples))
    order = [rows[id(w)] for w in plan.works if w.samples]
    index = None if order == list(range(len(order))) else torch.tensor(order, dtype=torch.int64)
    return StepPlan(works=tuple(prefill), copies=plan.copies), StepPlan(works=tuple(decode)), index
