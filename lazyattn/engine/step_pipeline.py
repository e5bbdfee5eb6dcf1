"""How `LLMEngine.step` orders a step's plan, launch and update, and holds the step in flight.

A step is plain data flowing one way (docs/design.md, "One step"): `Scheduler.schedule` gives the `StepPlan`,
`StepLauncher.launch` (engine/step_launch.py) queues it on the device, the launched step's `wait` gives its
`StepOutput`, and `Scheduler.update(plan, output)` applies it and says which requests it touched (`StepUpdate`).
Only the scheduler changes a sequence's state; this module only orders the calls.

Synchronous: each step is planned, launched, waited for and updated within one `LLMEngine.step`.

Overlapped scheduling (docs/design.md, "Overlapped scheduling"): the host prepares step N+1 while the device runs
step N. A step is launched (forward pass and sampling queued, the sampled ids copied to pinned host memory behind
them, an event recorded) and left in flight; the next call plans and launches step N+1 first, and only then waits
for step N and updates the scheduler with it. Step N+1 can be planned before step N's tokens are known when it only
continues step N (`Scheduler.can_continue`): every running sequence sampled in step N and decodes one token next,
from step N's sampled id, copied on the device (`FedBack`); the scheduler holds a placeholder in its run until the
update. Anything else (a waiting request to admit, a document encode, a promotion from the host tier, a page the
step would have to evict or preempt for, a sequence that reaches max_tokens or the context limit with step N's
token) drains: step N is updated first and step N+1 is planned as the synchronous path would.

A sequence that step N finishes (EOS, stop token or string, found only once its token is read) is already in step
N+1: its extra token is never appended, and its pages are released only once step N+1 has completed (the
scheduler's `ended`), so no page is handed out again while a step in flight may read or write it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from lazyattn.engine.batch import StepPlan, StepUpdate
from lazyattn.engine.scheduler import Scheduler
from lazyattn.engine.step_launch import LaunchedStep, StepLauncher
from lazyattn.engine.step_report import StepReport, step_report
from lazyattn.errors import TensorParallelError

logger = logging.getLogger("lazyattn.engine")


class StepPipeline:
    """Runs the steps of one engine, synchronous or overlapped (chosen once): at most one step in flight."""

    def __init__(self, launcher: StepLauncher, overlap: bool) -> None:
        self.launcher = launcher
        self.overlap = overlap
        self.in_flight: LaunchedStep | None = None  # launched, its tokens not read yet (overlap only)
        self.overlapped_steps = 0  # steps launched from the previous step's sampled ids
        # Called with each step once its tokens are read (bench/trace.py); None: steps are not reported.
        self.observer: Callable[[StepReport], None] | None = None
        self._reported = 0  # steps reported so far
        self._host_free_at = 0.0  # when the host last turned to scheduling (step call or update end), while observed

    def step(self, scheduler: Scheduler) -> list[StepUpdate]:
        """One `LLMEngine.step`: the updates of the steps whose tokens were read, in order (none, one or two)."""
        if self.observer is not None:
            self._host_free_at = time.monotonic()
        prev, self.in_flight = self.in_flight, None
        if prev is not None and prev.feeds_back and scheduler.can_continue(prev.plan):
            return self._continue(prev, scheduler)
        updates = [] if prev is None else [self._update(prev, scheduler)]
        # Nothing to plan once prev has ended every sequence (a request's last token, its first too when max_tokens
        # is 1): its outputs go back now, without an empty step's bookkeeping on the way.
        if scheduler.has_work:
            step = self._launch(scheduler.schedule(), scheduler)
            if self.overlap and step.plan.works and not step.output.failed:
                self.in_flight = step
            else:
                updates.append(self._update(step, scheduler))
        return updates

    def _continue(self, prev: LaunchedStep, scheduler: Scheduler) -> list[StepUpdate]:
        """Launch the step that continues `prev` from its sampled ids on the device, then update with `prev`."""
        plan = scheduler.schedule(after=prev.plan)
        step = None
        if plan.continues:
            self.overlapped_steps += 1
            try:
                step = self._launch(plan, scheduler, prev)
            except TensorParallelError:
                raise
            except Exception as error:  # isolation redoes it below, once the tokens are on the host
                logger.warning("an overlapped step failed (%s); redoing it synchronously", error)
        updates = []
        if step is None:  # prev's tokens take the placeholders' place first, then the plan runs from them
            updates.append(self._update(prev, scheduler))
            prev = None
            step = self._launch(dataclasses.replace(plan, continues=False), scheduler)
        self.in_flight = step
        if prev is not None:
            updates.append(self._update(prev, scheduler))
        return updates

    def drain(self, scheduler: Scheduler) -> None:
        """Every request has ended: wait for the step in flight, if any, whose tokens nobody reads (reported unread),
        and give the scheduler what it completed; what ended while it ran goes back."""
        step, self.in_flight = self.in_flight, None
        if step is not None:
            scheduler.update(step.plan, step.wait())
            if step.report is not None and self.observer is not None:
                self.observer(step.report)
        scheduler.release_ended()

    def _launch(self, plan: StepPlan, scheduler: Scheduler, after: LaunchedStep | None = None) -> LaunchedStep:
        if self.observer is None:
            return self.launcher.launch(plan, scheduler.running, after)
        launcher = self.launcher
        graph_passes, split_steps = launcher.graph_passes, launcher.split_steps
        step = launcher.launch(plan, scheduler.running, after)
        step.report = step_report(
            self._reported,
            step.plan,
            split=launcher.split_steps > split_steps,
            graph_passes=launcher.graph_passes - graph_passes,
            scheduled_at=self._host_free_at,
            launched_at=time.monotonic(),
        )
        self._reported += 1
        return step

    def _update(self, step: LaunchedStep, scheduler: Scheduler) -> StepUpdate:
        update = scheduler.update(step.plan, step.wait())
        if step.report is not None and self.observer is not None:
            self._host_free_at = time.monotonic()
            self.observer(dataclasses.replace(step.report, read_at=self._host_free_at))
        return update
