"""A choice among candidate requests made after their first tokens (`confidence_tokens` = k of the choosing answer
strategies, engine/best_document.py; docs/design.md, "Answering from one document").

The candidates of one answer are added with the same `Choice` key, each with its index. A candidate's score is the
mean log-probability of its first k tokens (of all of them if it ends sooner); it is fixed once the candidate has k
tokens or has ended, since later tokens do not change it, except by a failure: a candidate the engine fails scores
+inf whenever it fails, as `pick_answers` ranks a failure, which is then the answer. As soon as every candidate of a
key is added and scored, the surest (the lowest index on a tie) goes on and the engine stops the others where they
are: they ranked lower on what `pick_answers` reads, so their answers would never be returned, and their decode
steps are saved. A choice whose candidate is aborted from outside is dropped,
and the others answer in full; so is one whose candidates added so far have all ended before the rest were added
(candidates queued apart, which a cluster may route to different engines): a candidate added after that answers in
full. Either way the answer kept is the same (`pick_answers` ranks by the same first tokens); only less is saved.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lazyattn.errors import InvalidRequestError

if TYPE_CHECKING:  # kept out at run time, as in engine/best_document.py, which imports this module
    from lazyattn.engine.outputs import RequestOutput


@dataclass(frozen=True)
class Choice:
    """Candidate `index` of the `size` candidates of choice `key`, ranked by their first `tokens` tokens."""

    key: str
    index: int
    size: int
    tokens: int

    def check(self) -> None:
        """InvalidRequestError for a choice that cannot be made."""
        for name, value, least in (("size", self.size, 1), ("tokens", self.tokens, 1), ("index", self.index, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InvalidRequestError(f"a choice's {name} must be an integer >= {least}, got {value!r}", "choice")
        if self.index >= self.size:
            raise InvalidRequestError(
                f"a choice's index must be below its size {self.size}, got {self.index}", "choice"
            )


def chosen_logprobs(out: RequestOutput) -> list[float]:
    """The log-probability of each token of the answer, in order (the chosen token's entry of each step)."""
    return [next(iter(step.values())) for step in out.outputs[0].logprobs or []]


def mean_logprob(logprobs: Sequence[float], tokens: int | None = None) -> float:
    """The mean of `logprobs`, of the first `tokens` only where given; -inf for none."""
    picked = logprobs[:tokens] if tokens is not None else logprobs
    return sum(picked) / len(picked) if picked else -math.inf


def first_tokens_score(out: RequestOutput, tokens: int) -> float | None:
    """A candidate's score once it is fixed (module docstring), None while it has fewer than `tokens` tokens and runs
    on."""
    if out.error is not None:
        return math.inf
    if not out.finished and len(out.outputs[0].token_ids) < tokens:
        return None
    return mean_logprob(chosen_logprobs(out), tokens)


@dataclass
class _Open:
    size: int
    tokens: int
    members: dict[int, str] = field(default_factory=dict)  # index -> request id
    scores: dict[int, float] = field(default_factory=dict)  # index -> fixed score
    ended: set[int] = field(default_factory=set)  # indices whose request has finished


class Choices:
    """The engine's open choices (module docstring). `add` as candidates are added, `update` with every step's
    outputs, `forget` when a candidate is aborted from outside."""

    def __init__(self) -> None:
        self._open: dict[str, _Open] = {}
        self._of: dict[str, tuple[str, int]] = {}  # request id -> (key, index)

    def __len__(self) -> int:
        return len(self._open)

    def check(self, choice: Choice) -> None:
        """InvalidRequestError if `choice` cannot join its key (a bad spec, or one that disagrees with the key's)."""
        choice.check()
        known = self._open.get(choice.key)
        if known is None:
            return
        if (known.size, known.tokens) != (choice.size, choice.tokens):
            raise InvalidRequestError(
                f"choice {choice.key!r} has size {known.size} and tokens {known.tokens}, "
                f"not {choice.size} and {choice.tokens}",
                "choice",
            )
        if choice.index in known.members:
            raise InvalidRequestError(f"choice {choice.key!r} already has candidate {choice.index}", "choice")

    def add(self, request_id: str, choice: Choice) -> None:
        """Candidate `request_id` joins its choice (checked first with `check`)."""
        self.check(choice)
        known = self._open.setdefault(choice.key, _Open(choice.size, choice.tokens))
        known.members[choice.index] = request_id
        self._of[request_id] = (choice.key, choice.index)

    def forget(self, request_id: str) -> None:
        """Drop the choice `request_id` is a candidate of (it was aborted): its other candidates answer in full."""
        where = self._of.get(request_id)
        if where is not None:
            self._close(where[0])

    def update(self, outputs: Iterable[RequestOutput]) -> list[str]:
        """Score the candidates these outputs show; the ids of the running candidates that lost a choice decided
        now, for the engine to stop."""
        touched = []
        for out in outputs:
            where = self._of.get(out.request_id)
            if where is None:
                continue
            key, index = where
            known = self._open[key]
            if out.finished:
                known.ended.add(index)
            if index not in known.scores or out.error is not None:  # a failure wins whenever it comes
                score = first_tokens_score(out, known.tokens)
                if score is not None:
                    known.scores[index] = score
            touched.append(key)
        stop = []
        for key in dict.fromkeys(touched):
            known = self._open[key]
            if len(known.members) < known.size or len(known.scores) < known.size:
                if len(known.ended) == len(known.members):  # nothing left to stop: the rest, if any, answer in full
                    self._close(key)
                continue
            best = max(known.scores, key=lambda i: (known.scores[i], -i))
            stop += [rid for i, rid in sorted(known.members.items()) if i != best and i not in known.ended]
            self._close(key)
        return stop

    def _close(self, key: str) -> None:
        for rid in self._open.pop(key).members.values():
            del self._of[rid]
