"""Drives a Scheduler without a model: every test of tests/engine/test_scheduler.py builds one through
`make_bench`, and `SchedulerBench.step` stands in for the engine's step (schedule, pretend the forward
pass ran and sampled a token for each sampling sequence, update: the scheduler finishes them at max_tokens).
Adapt construction and the step here, in one place, when the Scheduler's constructor or its mode handling
change."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace

from lazyattn.cache.document_cache import DocumentCache, Segment, segment_key
from lazyattn.cache.page_pool import PagePool
from lazyattn.engine.batch import StepOutput, StepPlan, Work
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.modes import make_mode
from lazyattn.engine.sampling import SamplingParams
from lazyattn.engine.scheduler import Scheduler
from lazyattn.engine.sequence import Sequence

PAGE = 16  # the smallest page size EngineConfig accepts
SAMPLED = 999  # the token every simulated sampling step appends


def tokens(n: int, seed: int) -> list[int]:
    """n token ids that differ from those of any other seed at every position."""
    return [1000 * seed + i for i in range(n)]


def page_count(n_tokens: int) -> int:
    return -(-n_tokens // PAGE)


@dataclass
class SchedulerBench:
    scheduler: Scheduler
    cache: DocumentCache
    pool: PagePool
    names: dict[str, str] = field(default_factory=dict)  # document key -> the name a test gave it
    _ids: itertools.count = field(default_factory=itertools.count)

    def doc(self, name: str, n: int, seed: int) -> list[int]:
        """A document's tokens, remembered by name so that `plan` can label its encodes."""
        toks = tokens(n, seed)
        self.names[self.key(toks)] = name
        return toks

    def key(self, toks: list[int], salt: str | None = None, parent: str | None = None) -> str:
        return self.scheduler.admission.keyer(toks, salt, parent)

    def segment(self, toks: list[int]) -> Segment | None:
        """The cached (lazy/block) segment of a document, pending or ready; None if not indexed."""
        return self.cache.lookup(self.key(toks))

    def add(
        self, name: str, docs: list[list[int]], prompt: list[int], max_tokens: int = 4, salt: str | None = None
    ) -> Sequence:
        """Queue a sequence named `name` (its request id): documents, then the prompt."""
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        seq = Sequence(next(self._ids), name, 0, [list(d) for d in docs], list(prompt), params, salt=salt)
        self.scheduler.add(seq)
        return seq

    def add_encode(self, name: str, docs: list[list[int]], salt: str | None = None) -> Sequence:
        """Queue a prefill-only sequence: documents encoded ahead, nothing sampled (a registration)."""
        seq = Sequence(next(self._ids), name, 0, [list(d) for d in docs], [], None, salt=salt)
        self.scheduler.add(seq)
        return seq

    def step(self) -> StepPlan:
        """One engine step with the forward pass left out: every sampling sequence samples SAMPLED."""
        plan = self.scheduler.schedule()
        self.scheduler.update(plan, sampled(plan))
        return plan

    def steps(self, n: int) -> list[StepPlan]:
        return [self.step() for _ in range(n)]

    def abort(self, seq: Sequence) -> None:
        self.scheduler.finish(seq)

    def label(self, work: Work) -> str:
        if work.seq is not None:
            return work.seq.request_id
        return self.names.get(work.job.segment.key, "?")

    def plan(self, batch: StepPlan) -> list[tuple[str, int, int]]:
        """(who, lo, hi) per work, in batch order: a document's name for its encode, else the request."""
        return [(self.label(w), w.lo, w.hi) for w in batch.works]


def sampled(plan: StepPlan, token: int = SAMPLED) -> StepOutput:
    """The output of a step that ran `plan` and sampled `token` for each of its sampling sequences."""
    seqs = plan.samples
    result = SimpleNamespace(ids=[token] * len(seqs), non_finite_rows=set())
    return StepOutput({s.seq_id: (result, i) for i, s in enumerate(seqs)})


def make_bench(
    mode: str, *, num_pages: int = 64, max_num_batched_tokens: int = 8192, max_num_seqs: int = 256
) -> SchedulerBench:
    pool = PagePool(num_pages)
    cache = DocumentCache(pool, PAGE)
    config = EngineConfig(
        mode=mode, page_size=PAGE, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs
    )

    def keyer(toks: list[int], salt: str | None, parent: str | None) -> str:
        return segment_key("scheduler-test-model", "rope:test", salt, toks, parent)

    return SchedulerBench(Scheduler(config, make_mode(mode), cache, keyer), cache, pool)
