"""engine/choice.py: a choice among candidates after their first k tokens. By hand: who wins, who is stopped and
when; and a state-machine test driving candidates that are added, produce tokens and end in any interleaving,
checking after every step against a reference written from the rule (the mean log-probability of the first k tokens,
a failure first, the lowest index on a tie; decided on the first step at which every candidate is added and each has
k tokens or has ended)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from lazyattn.engine.choice import Choice, Choices, first_tokens_score
from lazyattn.engine.outputs import CompletionOutput, RequestOutput
from lazyattn.errors import InvalidRequestError


def output(rid: str, logprobs: list[float], finished: bool = False, error: str | None = None) -> RequestOutput:
    tokens = list(range(len(logprobs)))
    reason = "abort" if error is not None else "length" if finished else None
    completion = CompletionOutput(0, "", tokens, reason, logprobs=[{t: lp} for t, lp in zip(tokens, logprobs)])
    return RequestOutput(rid, [1], 0, [completion], error=error)


def test_the_surest_first_tokens_go_on_and_the_others_stop_once_all_are_scored():
    choices = Choices()
    for i, rid in enumerate("abc"):
        choices.add(rid, Choice("q", i, 3, 2))
    # a has its 2 tokens; b one; c ended after one token (its score: that token)
    assert choices.update([output("a", [-0.5, -0.5]), output("b", [-0.1]), output("c", [-0.2], finished=True)]) == []
    # b's second token decides: a -0.5, b -0.3 (its first two: -0.1, -0.5), c -0.2: c, already ended, wins
    assert choices.update([output("a", [-0.5, -0.5, -9.0]), output("b", [-0.1, -0.5])]) == ["a", "b"]
    assert len(choices) == 0
    assert choices.update([output("a", [-0.5, -0.5, -9.0, -1.0])]) == []  # decided: nothing more to stop


def test_a_tie_goes_to_the_lowest_index_and_a_failure_wins():
    choices = Choices()
    choices.add("y", Choice("t", 1, 2, 1))
    choices.add("x", Choice("t", 0, 2, 1))
    assert choices.update([output("y", [-0.4]), output("x", [-0.4])]) == ["y"]
    choices.add("f", Choice("u", 0, 2, 3))
    choices.add("g", Choice("u", 1, 2, 3))
    assert choices.update([output("g", [-0.1, -0.1, -0.1]), output("f", [], error="failed alone")]) == ["g"]
    # a failure after the candidate's score was fixed still wins: the failure is the answer, the others stop
    choices.add("h", Choice("v", 0, 3, 1))
    choices.add("i", Choice("v", 1, 3, 1))
    assert choices.update([output("h", [-0.1]), output("i", [-0.9])]) == []
    assert choices.update([output("i", [-0.9], error="failed alone")]) == []  # "j" is not added yet
    choices.add("j", Choice("v", 2, 3, 1))
    assert choices.update([output("j", [-0.5])]) == ["h", "j"]
    assert first_tokens_score(output("n", [], finished=True), 2) == -math.inf  # ended without a token
    assert first_tokens_score(output("m", [-1.0]), 2) is None  # runs on, one token short


def test_a_choice_waits_for_every_candidate_and_is_dropped_when_one_is_aborted():
    choices = Choices()
    choices.add("a", Choice("w", 0, 2, 1))
    assert choices.update([output("a", [-0.1, -0.2])]) == []  # b is not added yet
    choices.add("b", Choice("w", 1, 2, 1))
    assert choices.update([output("b", [-0.3])]) == ["b"]
    choices.add("c", Choice("v", 0, 2, 1))
    choices.add("d", Choice("v", 1, 2, 1))
    choices.forget("d")  # aborted from outside: c answers in full
    assert len(choices) == 0 and choices.update([output("c", [-0.1]), output("d", [-0.0])]) == []
    # the candidates added so far all ended before the last was added: nothing to stop, the choice is closed
    choices.add("e", Choice("z", 0, 2, 1))
    assert choices.update([output("e", [-0.1], finished=True)]) == [] and len(choices) == 0


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        (Choice("k", 0, 0, 1), "size must be an integer >= 1"),
        (Choice("k", 0, 2, 0), "tokens must be an integer >= 1"),
        (Choice("k", -1, 2, 1), "index must be an integer >= 0"),
        (Choice("k", 2, 2, 1), "index must be below its size 2"),
        (Choice("k", 0, 2, True), "tokens must be an integer"),
        (Choice("q", 1, 3, 2), "has size 2 and tokens 1"),
        (Choice("q", 0, 2, 1), "already has candidate 0"),
    ],
)
def test_a_choice_that_cannot_be_made_is_refused_and_changes_nothing(choice, message):
    choices = Choices()
    choices.add("a", Choice("q", 0, 2, 1))
    with pytest.raises(InvalidRequestError, match=message) as e:
        choices.add("b", choice)
    assert e.value.param == "choice"
    choices.add("b", Choice("q", 1, 2, 1))  # the refused one left the choice as it was
    assert choices.update([output("a", [-1.0]), output("b", [-0.5])]) == ["a"]


class ChoiceMachine(RuleBasedStateMachine):
    """Candidates of a few choices, each with the answer it would give in full (its tokens' log-probabilities) and
    the step at which the engine fails it, if it does; each step some of the running ones produce a token or fail;
    the engine stops the ones `update` names; a caller may abort one. The reference keeps each choice open, decided
    or dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.choices = Choices()
        self.planned: dict[str, tuple[Choice, list[float], int | None]] = {}  # rid -> choice, answer, failing step
        self.made: dict[str, int] = {}  # rid -> tokens produced so far
        self.status: dict[str, str] = {}  # rid -> running / ended / stopped / aborted
        self.failed: set[str] = set()
        self.state: dict[str, str] = {}  # key -> open / decided / dropped

    @initialize(
        plans=st.lists(
            st.tuples(
                st.integers(1, 3),  # tokens
                st.lists(
                    st.tuples(
                        st.lists(st.sampled_from([-1.0, -0.5, 0.0]), min_size=0, max_size=8),
                        st.one_of(st.none(), st.none(), st.none(), st.integers(0, 4)),  # fails at that step, mostly not
                    ),
                    min_size=1,
                    max_size=4,
                ),
            ),
            min_size=1,
            max_size=3,
        )
    )
    def plan_the_choices(self, plans):
        for key, (tokens, answers) in enumerate(plans):
            self.state[f"k{key}"] = "open"
            for i, (logprobs, fails) in enumerate(answers):
                self.planned[f"k{key}-{i}"] = (Choice(f"k{key}", i, len(answers), tokens), logprobs, fails)

    @precondition(lambda self: any(rid not in self.status for rid in self.planned))
    @rule(data=st.data())
    def add_a_candidate(self, data):
        rid = data.draw(st.sampled_from(sorted(r for r in self.planned if r not in self.status)))
        self.choices.add(rid, self.planned[rid][0])
        self.status[rid], self.made[rid] = "running", 0

    @precondition(lambda self: "running" in self.status.values())
    @rule(data=st.data(), rarely=st.integers(0, 7))
    def abort_a_candidate(self, data, rarely):
        if rarely:  # one draw in eight aborts: most choices run to their decision
            return
        rid = data.draw(st.sampled_from(sorted(r for r, s in self.status.items() if s == "running")))
        self.choices.forget(rid)
        self.status[rid] = "aborted"
        key = self.planned[rid][0].key
        if self.state[key] == "open":
            self.state[key] = "dropped"

    @precondition(lambda self: "running" in self.status.values())
    @rule(data=st.data())
    def step(self, data):
        running = sorted(r for r, s in self.status.items() if s == "running")
        moved = data.draw(st.lists(st.sampled_from(running), min_size=1, unique=True))
        outs = []
        for rid in moved:
            _, logprobs, fails = self.planned[rid]
            if fails is not None and self.made[rid] >= fails:
                outs.append(output(rid, logprobs[: self.made[rid]], error="failed alone"))
                self.status[rid] = "ended"
                self.failed.add(rid)
                continue
            self.made[rid] = min(self.made[rid] + 1, len(logprobs))
            done = self.made[rid] == len(logprobs)
            outs.append(output(rid, logprobs[: self.made[rid]], finished=done))
            if done:
                self.status[rid] = "ended"
        want = []
        for key in sorted({self.planned[rid][0].key for rid in moved}):
            if self.state[key] != "open":
                continue
            members = [rid for rid, (c, _, _) in self.planned.items() if c.key == key]
            added = [rid for rid in members if rid in self.status]
            scores = {self.planned[rid][0].index: self._score(rid) for rid in added}
            if len(added) == len(members) and all(v is not None for v in scores.values()):
                self.state[key] = "decided"
                best = max(scores, key=lambda i: (scores[i], -i))
                want += [r for r in added if self.planned[r][0].index != best and self.status[r] == "running"]
            elif all(self.status[r] != "running" for r in added):
                self.state[key] = "dropped"
        stopped = self.choices.update(outs)
        assert sorted(stopped) == sorted(want)
        for rid in stopped:
            self.status[rid] = "stopped"

    @rule()
    def a_step_that_touches_no_candidate(self):
        assert self.choices.update([]) == []

    def _score(self, rid: str) -> float | None:
        """The reference score: +inf for a failure, else the mean of the first k tokens once it has k or ended."""
        choice, logprobs, _ = self.planned[rid]
        if rid in self.failed:
            return math.inf
        seen = logprobs[: self.made[rid]]
        if self.status[rid] == "running" and len(seen) < choice.tokens:
            return None
        first = seen[: choice.tokens]
        return sum(first) / len(first) if first else -math.inf

    @invariant()
    def a_choice_is_held_only_while_it_can_still_stop_someone(self):
        assert len(self.choices) <= sum(1 for s in self.state.values() if s != "decided")
        if all(r in self.status for r in self.planned) and "running" not in self.status.values():
            assert len(self.choices) == 0


ChoiceMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
)
TestChoiceMachine = ChoiceMachine.TestCase
