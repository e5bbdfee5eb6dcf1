"""One step as plain data (engine/batch.py): the scheduler's `update(plan, output)` applied to hand-built outputs
ends, appends, releases and fails exactly as the output says, and a continuing plan's placeholders are the
scheduler's alone."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from lazyattn.engine.batch import StepOutput
from lazyattn.engine.isolation import NON_FINITE
from lazyattn.engine.scheduler import PLACEHOLDER
from lazyattn.engine.sequence import Status
from tests.engine.scheduler_bench import SAMPLED, make_bench, sampled, tokens


def result(ids: list[int], non_finite: set[int] = frozenset()) -> SimpleNamespace:
    return SimpleNamespace(ids=ids, non_finite_rows=set(non_finite))


def test_a_plan_is_frozen_and_says_what_the_step_does():
    b = make_bench("lazy")
    d = b.doc("D", 20, 1)
    s1 = b.add("s1", [d], tokens(5, 50))
    plan = b.scheduler.schedule()
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.works = ()  # type: ignore[misc]
    assert [j.segment.key for j in plan.encodes] == [b.key(d)]
    assert [w.seq for w in plan.chunks] == [s1] and plan.samples == [s1] and plan.decodes == []
    assert plan.prefill_rows == plan.num_tokens == 25
    # the runs count as computed once planned; the document is ready only once the step's update says it ran
    assert s1.run.pending == 0 and not b.segment(d).ready
    b.scheduler.update(plan, sampled(plan))
    assert b.segment(d).ready and not b.scheduler.jobs and s1.output == [SAMPLED]
    plan = b.scheduler.schedule()
    assert plan.decodes == [s1] and plan.chunks == [] and plan.is_decode


def test_update_appends_the_sampled_token_and_finishes_at_max_tokens():
    b = make_bench("lazy")
    s1 = b.add("s1", [], tokens(5, 50), max_tokens=2)
    s2 = b.add("s2", [], tokens(7, 60), max_tokens=5)
    plan = b.scheduler.schedule()
    update = b.scheduler.update(plan, StepOutput({s1.seq_id: (result([41, 42]), 0), s2.seq_id: (result([41, 42]), 1)}))
    assert update.touched == ("s1", "s2") and not update.failed
    assert s1.output == [41] and s2.output == [42] and s1.run.tokens[-1] == 41 and s2.run.tokens[-1] == 42
    plan = b.scheduler.schedule()
    pages = list(s1.run.pages)
    update = b.scheduler.update(plan, StepOutput({s1.seq_id: (result([43, 44]), 0), s2.seq_id: (result([43, 44]), 1)}))
    assert s1.is_finished and s1.run is None and not any(b.pool.is_used(p) for p in pages)  # released at once
    assert s2.status is Status.RUNNING and s2.output == [42, 44] and b.scheduler.running == [s2]


def test_a_failed_request_ends_every_sequence_of_its_own_and_nobody_else():
    b = make_bench("lazy")
    r0 = b.add("r", [], tokens(5, 50))
    r1 = b.add("r", [], tokens(5, 50))
    other = b.add("o", [], tokens(6, 60))
    plan = b.scheduler.schedule()
    # r's first row could not be sampled (isolation); its second row sampled, but the request fails whole
    rows = result([7, 8])
    output = StepOutput({r0.seq_id: None, r1.seq_id: (rows, 0), other.seq_id: (rows, 1)}, {"r": "x"})
    update = b.scheduler.update(plan, output)
    assert dict(update.failed) == {"r": "x"} and set(update.touched) == {"r", "o"}
    assert r0.is_finished and r1.is_finished and r0.run is None and r1.run is None
    assert other.output == [8] and not other.is_finished


def test_non_finite_logits_end_their_request_alone():
    b = make_bench("lazy")
    s1, s2 = b.add("s1", [], tokens(5, 50)), b.add("s2", [], tokens(5, 60))
    plan = b.scheduler.schedule()
    rows = result([3, 4], non_finite={0})
    update = b.scheduler.update(plan, StepOutput({s1.seq_id: (rows, 0), s2.seq_id: (rows, 1)}))
    assert dict(update.failed) == {"s1": NON_FINITE}
    assert s1.is_finished and s1.output == [] and s2.output == [4]


def test_a_failed_encode_is_aborted_by_the_update():
    b = make_bench("lazy")
    d = b.doc("D", 20, 1)
    s1 = b.add("s1", [d], tokens(5, 50))
    plan = b.scheduler.schedule()
    segment = plan.encodes[0].segment
    b.scheduler.update(plan, StepOutput({}, {"s1": "encode failed"}, (segment,)))
    assert segment.failed and s1.is_finished and not b.segment(d)
    b.step()
    assert not b.scheduler.jobs and b.pool.num_used == 0


def test_a_continuing_plan_holds_placeholders_that_the_update_of_the_step_in_flight_fills():
    b = make_bench("lazy")
    s1 = b.add("s1", [], tokens(5, 50), max_tokens=4)
    s2 = b.add("s2", [], tokens(5, 60), max_tokens=4)
    first = b.scheduler.schedule()
    assert b.scheduler.can_continue(first)
    second = b.scheduler.schedule(after=first)  # planned before first's tokens are read
    assert second.continues and second.decodes == [s1, s2] and second.index == first.index + 1
    assert s1.run.tokens[-1] == PLACEHOLDER and s2.run.tokens[-1] == PLACEHOLDER
    pages = list(s1.run.pages)
    rows = result([70, 71])
    b.scheduler.update(first, StepOutput({s1.seq_id: (rows, 0), s2.seq_id: (rows, 1)}))
    assert s1.run.tokens[-1] == 70 and s2.run.tokens[-1] == 71 and s1.output == [70]
    # an abort while `second` is in flight keeps the sequence's pages until second's update
    b.scheduler.finish(s1, "abort")
    assert b.scheduler.ended == [s1] and all(b.pool.is_used(p) for p in pages)
    b.scheduler.update(second, StepOutput({s1.seq_id: (rows, 0), s2.seq_id: (rows, 1)}))
    assert not b.scheduler.ended and not any(b.pool.is_used(p) for p in pages)
    assert s1.output == [70] and s2.output == [71, 71]  # s1's token from the step in flight is dropped


def test_no_continuation_past_max_tokens_or_with_work_waiting():
    b = make_bench("lazy")
    s1 = b.add("s1", [], tokens(5, 50), max_tokens=1)
    plan = b.scheduler.schedule()
    assert not b.scheduler.can_continue(plan)  # its first token is its last
    b.scheduler.update(plan, sampled(plan))
    s2 = b.add("s2", [], tokens(5, 60), max_tokens=9)
    plan = b.scheduler.schedule()
    b.add("s3", [], tokens(5, 70))
    assert not b.scheduler.can_continue(plan)  # s3 waits for admission
    b.scheduler.update(plan, sampled(plan))
    assert s1.is_finished and s2.output == [SAMPLED]
