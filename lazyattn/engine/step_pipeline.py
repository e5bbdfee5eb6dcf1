"""How `LLMEngine.step` orders a step's launch and the reading of its tokens, chosen once per engine.

A step is *launched* (forward pass and sampling queued, the sampled results on their way to the host) and later
*read* (its tokens appended, the sequences they end finished). `SyncPipeline` reads each step in the call that
launched it; `OverlappedPipeline` (engine/overlap.py) leaves it in flight and reads it in the next call, after
launching the step that follows. Both own the same state: the step in flight, and the sequences that ended while a
step may still use their pages, which are released only once it has completed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lazyattn.engine.batch import ScheduledBatch
from lazyattn.engine.sampling import SampleResult
from lazyattn.engine.scheduler import Scheduler
from lazyattn.engine.sequence import Sequence
from lazyattn.engine.step_report import StepReport

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
    report: StepReport | None = None  # while LLMEngine.step_observer is set

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


Launch = Callable[[ScheduledBatch], LaunchedStep]  # the engine's: queue a batch's forward pass and sampling
Read = Callable[[LaunchedStep], None]  # the engine's: append a completed step's tokens, finish what they end


class StepPipeline(ABC):
    """The engine's step loop: when steps are launched and read, and when an ended sequence's pages go back."""

    in_flight: LaunchedStep | None = None  # launched, not read yet: the next `step` reads it
    overlapped_steps = 0  # steps launched while the one before them ran

    def __init__(self, launch: Launch) -> None:
        self.launch = launch
        self.ended: list[Sequence] = []  # ended while a step in flight (or being built) may use their pages

    @abstractmethod
    def step(self, scheduler: Scheduler, read: Read) -> None:
        """Schedule and launch the next step, if there is work, and read every step that has to be read now."""

    @abstractmethod
    def end(self, scheduler: Scheduler, seq: Sequence) -> None:
        """Finish `seq` in the scheduler: its pages go back now, or once no step in flight may use them."""

    @abstractmethod
    def drain(self, scheduler: Scheduler) -> None:
        """Every request has ended: wait for the step in flight, if any (nobody will read it), and release the pages
        it held."""


class SyncPipeline(StepPipeline):
    """Each step is launched, waited for and read within one `LLMEngine.step`: nothing stays in flight."""

    def step(self, scheduler: Scheduler, read: Read) -> None:
        if scheduler.running or scheduler.num_waiting:
            step = self.launch(scheduler.schedule())
            step.wait()
            read(step)

    def end(self, scheduler: Scheduler, seq: Sequence) -> None:
        scheduler.finish(seq)

    def drain(self, scheduler: Scheduler) -> None:
        pass
