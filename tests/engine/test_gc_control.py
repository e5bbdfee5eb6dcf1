"""EngineConfig.gc_control (engine/gc_control.py): while an engine holds requests Python's automatic collection is
off, the young generations are collected between steps and the full one waits for idle or gc_full_interval_s; the
collector is as it was once every engine is idle, shut down or dropped, in any order."""

from __future__ import annotations

import gc

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from lazyattn.engine import gc_control
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.gc_control import GcControl
from lazyattn.engine.llm_engine import LLMEngine
from lazyattn.engine.prompt import RenderedPrompt
from lazyattn.engine.sampling import SamplingParams
from lazyattn.errors import InvalidRequestError

PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture(autouse=True)
def collector():
    """The collector as the test found it, afterwards; and no engine left holding it."""
    enabled, threshold = gc.isenabled(), gc.get_threshold()
    yield
    gc.set_threshold(*threshold)
    (gc.enable if enabled else gc.disable)()
    holders, gc_control._shared.holders = gc_control._shared.holders, 0
    assert holders == 0, "a control still held the collector"


class Collections:
    """Every collection while installed: (generation, whether `busy()` said the engine held requests, collected)."""

    def __init__(self, busy=lambda: True) -> None:
        self.busy = busy
        self.seen: list[tuple[int, bool, int]] = []

    def __enter__(self) -> Collections:
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "stop":
            self.seen.append((info["generation"], self.busy(), info["collected"]))

    def generations(self, busy: bool) -> set[int]:
        return {g for g, b, _ in self.seen if b == busy}


def engine(gc_control: bool | None = True, **kw) -> LLMEngine:
    config = EngineConfig(model="tiny", mode="lazy", page_size=16, progress=False, gc_control=gc_control, **kw)
    return LLMEngine(config)


def add(e: LLMEngine, name: str) -> None:
    e.add_request(name, RenderedPrompt([[1, 2, 3, 4] * 4], [5, len(name) + 6]), PARAMS)


def cycles(n: int = 3000) -> None:
    """Cyclic garbage, as a request's structures that refer to each other become when it ends."""
    for _ in range(n):
        a: list = []
        a.append(a)


def run(e: LLMEngine, *, garbage: int = 3000) -> int:
    """Step until idle, making cyclic garbage between steps; the steps taken."""
    steps = 0
    while e.has_unfinished():
        cycles(garbage)
        e.step()
        steps += 1
    return steps


def frequent_collections(e: LLMEngine) -> None:
    """Thresholds at which Python's automatic collection would run a full collection every few steps: the heap
    frozen (gc_freeze) and collected once, so that the full collections' long-lived share is small and cheap."""
    gc.collect()
    gc.set_threshold(100, 2, 2)


def busy_run(e, collector_on: bool) -> Collections:
    """The collections of four requests run to the end on frequent thresholds; checks whether Python's automatic
    collection was on while they ran."""
    frequent_collections(e)
    with Collections(e.has_unfinished) as seen:
        for i in range(4):
            add(e, f"r{i}")
        assert gc.isenabled() is collector_on
        run(e)
    return seen


@pytest.mark.parametrize("overlap", [False, True])
def test_no_full_collection_while_requests_run(overlap):
    e = engine(gc_freeze=True, async_scheduling=overlap)
    try:
        seen = busy_run(e, collector_on=False)
        assert gc.isenabled()  # idle: automatic collection is back
        assert 2 not in seen.generations(busy=True)
        assert seen.generations(busy=True) >= {0, 1}  # the young ones ran, between steps
        assert sum(c for _, busy, c in seen.seen if busy) >= 3000  # and freed the cycles made meanwhile
    finally:
        e.shutdown()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_off_changes_nothing():
    """With gc_control off, the same run leaves collection to Python: automatic, full ones included."""
    e = engine(gc_control=False, gc_freeze=True)
    try:
        seen = busy_run(e, collector_on=True)
        assert 2 in seen.generations(busy=True)  # what the option prevents
    finally:
        e.shutdown()
    assert gc.isenabled()


def test_full_collection_after_the_interval():
    e = engine(gc_full_interval_s=1e-6)  # every step starts past the interval
    try:
        with Collections(e.has_unfinished) as seen:
            add(e, "a")
            steps = run(e, garbage=0)
        full = [g for g, busy, _ in seen.seen if busy and g == 2]
        assert 2 <= len(full) <= steps  # at most one between two steps
    finally:
        e.shutdown()


def test_interval_on_the_clock():
    """The full collection runs once the interval has passed since the hold began or the last full one."""
    now = [0.0]
    control = GcControl(hold=True, full_interval_s=10.0, clock=lambda: now[0])
    control.busy()
    try:
        with Collections() as seen:
            for t, full in [(9.9, False), (10.0, True), (15.0, False), (19.9, False), (20.0, True)]:
                now[0] = t
                seen.seen.clear()
                control.between_steps()
                assert (2 in seen.generations(busy=True)) == full, t
    finally:
        control.close()
    assert gc.isenabled()


@pytest.mark.parametrize("first", [0, 1])
def test_two_engines_restore_the_collector_in_any_order(first):
    engines = [engine(), engine()]
    try:
        add(engines[0], "a")
        add(engines[1], "b")
        assert not gc.isenabled()
        run(engines[first], garbage=0)  # one idle, the other still busy
        assert not gc.isenabled()
        add(engines[first], "c")
        engines[first].shutdown()  # aborts its request
        assert not gc.isenabled()
    finally:
        engines[1 - first].shutdown()
    assert gc.isenabled()


def test_user_disabled_collector_stays_disabled():
    gc.disable()
    e = engine()
    try:
        with Collections(e.has_unfinished) as seen:
            add(e, "a")
            run(e)
            assert not gc.isenabled()
        assert not seen.seen  # the engine collected nothing either: the user turned collection off
    finally:
        e.shutdown()
    assert not gc.isenabled()


def test_engine_dropped_while_busy_gives_the_collector_back():
    e = engine()
    add(e, "a")
    e.step()
    assert not gc.isenabled()
    del e
    gc.collect()  # the bench drops engines, then collects (bench/replay.py, free_device_memory)
    assert gc.isenabled()


def test_defaults_and_checks():
    assert EngineConfig(device="cuda").gc_control_on and not EngineConfig(device="cpu").gc_control_on
    assert EngineConfig(device="cuda", gc_control=False).gc_control_on is False
    assert EngineConfig(gc_control=True).gc_control_on
    with pytest.raises(InvalidRequestError, match="gc_full_interval_s"):
        EngineConfig(gc_full_interval_s=0)


class Controls(RuleBasedStateMachine):
    """Several engines' controls in any order of busy, steps, idle and close: automatic collection is off exactly
    while one of them holds requests, and back as it was once none does."""

    def __init__(self) -> None:
        super().__init__()
        self.enabled = gc.isenabled()
        self.controls = [GcControl(hold=True, full_interval_s=3600.0) for _ in range(3)]
        self.busy = [False] * 3
        self.closed = [False] * 3

    @rule(i=st.integers(0, 2))
    def add_request(self, i: int) -> None:
        if not self.closed[i]:
            self.controls[i].busy()
            self.busy[i] = True

    @rule(i=st.integers(0, 2), garbage=st.integers(0, 2000))
    def step(self, i: int, garbage: int) -> None:
        cycles(garbage)
        if self.busy[i]:
            with Collections() as seen:
                self.controls[i].between_steps()
            assert 2 not in seen.generations(busy=True)

    @rule(i=st.integers(0, 2))
    def idle(self, i: int) -> None:
        self.controls[i].idle()
        self.busy[i] = False

    @rule(i=st.integers(0, 2))
    def close(self, i: int) -> None:
        self.controls[i].close()
        self.busy[i] = False
        self.closed[i] = True

    @invariant()
    def collector(self) -> None:
        assert gc.isenabled() == (self.enabled and not any(self.busy))

    def teardown(self) -> None:
        for control in self.controls:
            control.close()
        assert gc.isenabled() == self.enabled


@pytest.mark.parametrize("enabled", [True, False])
def test_controls_in_any_order(enabled):
    (gc.enable if enabled else gc.disable)()
    run_state_machine = Controls.TestCase
    run_state_machine.settings = settings(
        max_examples=60, stateful_step_count=20, deadline=None, suppress_health_check=list(HealthCheck)
    )
    run_state_machine().runTest()
