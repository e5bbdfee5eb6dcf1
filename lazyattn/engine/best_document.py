"""Answering from the best single document (`answer="best-document"`; docs/design.md, "Answering from one
document").

A request asked this way becomes one request per document, each with that document alone in the same prompt, and
the answer kept is the one whose generated tokens have the highest mean log-probability (the first document's on a
tie). The mean, not the sum: a longer answer must not lose for its length, and not the first token alone: an answer
that starts surely and then guesses must not win. In lazy mode each document is still encoded once and read in
place; each of the N requests prefills only the final segment.

It answers a different prompt than the one given: a question that needs two documents together cannot be answered
from either alone. `LLM.generate`/`LLM.chat` and the server fan a request out with `one_document_each` and fold the
outputs back with `pick_answers`; `lazyattn eval` runs its `answer=best-document` through the same path.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from lazyattn.errors import InvalidRequestError

if TYPE_CHECKING:  # kept out at run time: the command line's parsers read ANSWER_STRATEGIES without torch
    from lazyattn.engine.outputs import RequestOutput
    from lazyattn.engine.sampling import SamplingParams

ANSWER_STRATEGIES = ("joint", "best-document")  # joint: one request over all of its documents (the default)

T = TypeVar("T")


def check_answer(answer: object, n: int = 1, stream: bool = False) -> None:
    """InvalidRequestError naming `answer` for a strategy that does not exist, or best-document with more than one
    sample per prompt or a stream (it picks among finished answers)."""
    if answer not in ANSWER_STRATEGIES:
        raise InvalidRequestError(f"answer must be one of {', '.join(ANSWER_STRATEGIES)}, got {answer!r}", "answer")
    if answer == "best-document" and n != 1:
        raise InvalidRequestError(f"answer 'best-document' keeps one answer per prompt: n must be 1, got {n}", "n")
    if answer == "best-document" and stream:
        raise InvalidRequestError(
            "answer 'best-document' chooses among finished answers, so it cannot stream: set stream to false", "stream"
        )


def one_document_each(documents: Sequence[Sequence[T]]) -> tuple[list[int], list[list[T]]]:
    """Each request's documents one at a time: the request each new one belongs to, and its one document. A request
    without documents is asked as it is."""
    owners: list[int] = []
    alone: list[list[T]] = []
    for i, docs in enumerate(documents):
        for d in docs or [None]:
            owners.append(i)
            alone.append([] if d is None else [d])
    return owners, alone


def with_confidence(params: SamplingParams) -> SamplingParams:
    """`params`, asking for the chosen tokens' log-probabilities (what `confidence` reads) where they ask for none."""
    return params if params.logprobs is not None else dataclasses.replace(params, logprobs=0)


def confidence(out: RequestOutput) -> float:
    """The mean log-probability of the answer's tokens (-inf for an answer without tokens)."""
    picked = [next(iter(step.values())) for step in out.outputs[0].logprobs or []]
    return sum(picked) / len(picked) if picked else -math.inf


def pick_answers(
    owners: Sequence[int],
    outputs: Sequence[RequestOutput],
    num_documents: Sequence[int],
    keep_logprobs: Sequence[bool],
) -> list[RequestOutput]:
    """For each request r (`num_documents[r]`: how many documents it has), the most confident of its one-document
    outputs (`owners[i]` owns `outputs[i]`, in document order), with `answered_from` set to that document's index
    among the request's (None for a request without documents); a request of which one output failed gets that output.
    `keep_logprobs[r]` False drops the log-probabilities that `with_confidence` added."""
    best: dict[int, tuple[float, int, RequestOutput]] = {}
    seen: dict[int, int] = {}
    for owner, out in zip(owners, outputs, strict=True):
        index = seen.get(owner, 0)
        seen[owner] = index + 1
        # A request the engine failed alone fails the whole answer, as it fails a joint request: its output (the
        # first such) is returned, error set, rather than a choice among the others that looks complete.
        score = math.inf if out.error is not None else confidence(out)
        if owner not in best or score > best[owner][0]:
            best[owner] = (score, index, out)
    picked = []
    for owner, docs in enumerate(num_documents):
        _, index, out = best[owner]
        completions = out.outputs
        if not keep_logprobs[owner]:
            completions = [dataclasses.replace(c, logprobs=None) for c in out.outputs]
        picked.append(dataclasses.replace(out, outputs=completions, answered_from=index if docs else None))
    return picked
