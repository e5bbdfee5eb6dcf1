"""Answering from the best single document (`answer="best-document"`, `answer="best-document-or-joint"`),
answering over every document with the best one last (`answer="confidence-order"`,
`answer="confidence-order-or-joint"`), over every document with each one last in turn (`answer="each-last"`), over
every document in the order given and reversed (`answer="both-orders"`), and over every document read in order and in
parallel (`answer="both-placements"`); docs/design.md, "Answering from one document".

A request asked this way becomes several candidate requests: one per document, each with that document alone in
the same prompt, and with "best-document-or-joint" also the request as given, over all of its documents. The answer
kept is the one whose generated tokens have the highest mean log-probability (on a tie the earlier candidate's: the
request as given, then the documents in order). The mean, not the sum: a longer answer must not lose for its length,
and not the first token alone: an answer that starts surely and then guesses must not win. In lazy mode each document
is still encoded once and read in place; each candidate prefills only the final segment.

A document alone cannot answer a question that needs two documents together; the request as given can, when the
model is surer of that answer. `LLM.generate`/`LLM.chat` and the server fan a request out with `candidates` and fold
the outputs back with `pick_answers`; `lazyattn eval` runs its `answer=...` runs through the same path.

"confidence-order" asks the same per-document candidates first, then the request once more over all of its
documents, reordered by their candidates' confidence, least first: the document the model answers best from alone
stands last, next to the question, where a causal model reads best, and a question that needs two documents still
has both. That joint answer is the answer (`answered_from` None, `document_order` the order). Reordering is free in
lazy mode: every document is still read in place from its one cached copy; in full or block mode it recomputes the
request. "confidence-order-or-joint" also asks the request as given in the first round and keeps that answer where it
is at least as sure as the reordered one (`document_order` None): the surest single document is not always the one to
read last (a two-hop question's first hop), and where the order comes out as given, no joint round is asked.
`FirstRound` turns the first round's outputs into the orders as they come in (a request's joint round can start as
soon as its one-document answers are in, beside the request as given), `ordered_answers` the joint round into the
answers.

`confidence_tokens` = k, with the ordering strategies: each one-document candidate of the first round generates at
most k tokens, and its confidence is the mean log-probability of those. Its answer is never returned (only its
confidence orders the documents), so what it costs is the first round's decode steps: k instead of the answer's
length. The request as given and the joint round answer in full, as without it.
With the strategies that choose among answers (best-document, best-document-or-joint, each-last, both-orders,
both-placements):
the candidates are ranked by the mean log-probability of their first k tokens, and as soon as every candidate of a
request has k tokens (or has ended) the engine stops all but the surest, which answers in full (engine/choice.py).
The answer kept is the one the whole-answer rule would keep wherever the first k tokens rank the candidates as
their whole answers do; what it saves is the other candidates' decode steps past the k-th.

"each-last" asks in one round: the request as given, and once more for each of its other documents with that one
moved last (every other document keeping its place), and keeps the surest of those joint answers (`document_order`
the order it read, None: as given). Every candidate holds every document, so a question that needs two of them can
still be answered; in lazy mode each prefills only the final segment, and no candidate waits for another.

"both-orders" asks in one round the request as given and, where it has two or more documents, once more with
its documents in reverse order, and keeps the surer answer (`document_order` the reversed order, None: as given).
Two requests whatever the number of documents, both over every document, both read in order: the first document
of one is the last of the other, next to the question, where a causal model reads best, so a gold document at
either end is read last by one of them (docs/quality.md). Any mode: in lazy mode the reversed request reads the
same cached copies in place.

"both-placements" asks in one round the request with its documents read one after the other and, where it has two or
more, once more with every document read from the first segment's end (`ape_parallel`, docs/design.md "APE"), and
keeps the surer answer (`read_in_parallel` says which). Two requests whatever the number of documents, both over
every document; the two placements answer different questions well (docs/quality.md). Lazy mode only, as
`ape_parallel` is; the request leaves `ape_parallel` to the strategy.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from lazyattn.engine.choice import Choice, chosen_logprobs, mean_logprob
from lazyattn.engine.request_options import RequestOptions
from lazyattn.errors import InvalidRequestError

if TYPE_CHECKING:  # kept out at run time: the command line's parsers read ANSWER_STRATEGIES without torch
    from lazyattn.engine.outputs import RequestOutput
    from lazyattn.engine.sampling import SamplingParams

# joint: one request over all of its documents (the default); the two best-document ones choose among candidates;
# the two confidence-order ones reorder the documents by theirs and answer jointly (module docstring)
ANSWER_STRATEGIES = (
    "joint",
    "best-document",
    "best-document-or-joint",
    "confidence-order",
    "confidence-order-or-joint",
    "each-last",
    "both-orders",
    "both-placements",
)
CHOOSING = ("best-document", "best-document-or-joint")
ORDERING = ("confidence-order", "confidence-order-or-joint")
EACH_LAST = "each-last"
BOTH_ORDERS = "both-orders"
BOTH_PLACEMENTS = "both-placements"
PARALLEL = "parallel"  # the source of both-placements' candidate with its documents read in parallel

# where a candidate comes from: None the request as given; i its document i alone; a tuple its documents in that
# order (each-last, both-orders); PARALLEL the request as given, its documents read in parallel (both-placements)
Source = int | tuple[int, ...] | str | None

T = TypeVar("T")


def check_answer(answer: object, n: int = 1, stream: bool = False, confidence_tokens: object = None) -> None:
    """InvalidRequestError naming `answer` for a strategy that does not exist, or any strategy but "joint" with more
    than one sample per prompt or a stream (it works on finished answers); naming `confidence_tokens` for one that is
    not a positive integer or is given with "joint"."""
    if answer not in ANSWER_STRATEGIES:
        raise InvalidRequestError(f"answer must be one of {', '.join(ANSWER_STRATEGIES)}, got {answer!r}", "answer")
    if confidence_tokens is not None:
        if isinstance(confidence_tokens, bool) or not isinstance(confidence_tokens, int) or confidence_tokens < 1:
            raise InvalidRequestError(
                f"confidence_tokens must be a positive integer, got {confidence_tokens!r}", "confidence_tokens"
            )
        if answer == "joint":
            raise InvalidRequestError(
                "confidence_tokens ranks the candidates of an answer strategy by their first tokens; answer 'joint' "
                "asks no candidates (name another strategy, or leave confidence_tokens out)",
                "confidence_tokens",
            )
    what = "orders the documents by finished answers" if answer in ORDERING else "chooses among finished answers"
    if answer != "joint" and n != 1:
        raise InvalidRequestError(f"answer {answer!r} {what}, one per prompt: n must be 1, got {n}", "n")
    if answer != "joint" and stream:
        raise InvalidRequestError(f"answer {answer!r} {what}, so it cannot stream: set stream to false", "stream")


def check_default_answer(answer: object, mode: str) -> None:
    """InvalidRequestError naming `answer` for a server default strategy (`lazyattn serve --answer`) that does not
    exist or that the engine's mode cannot run for any request ("both-placements" needs lazy mode)."""
    check_answer(answer)
    if answer == BOTH_PLACEMENTS and mode != "lazy":
        raise InvalidRequestError(
            f"answer {answer!r} reads the documents in parallel, which needs mode 'lazy', not {mode!r}", "answer"
        )


def check_default_confidence_tokens(confidence_tokens: object) -> None:
    """InvalidRequestError naming `confidence_tokens` for a server default (`lazyattn serve --confidence-tokens`) that
    is not None or a positive integer."""
    if confidence_tokens is not None:
        check_answer(BOTH_PLACEMENTS, confidence_tokens=confidence_tokens)


def confidence_tokens_for(asked: int | None, default: int | None, answer: str) -> int | None:
    """The k a request is answered with: its own; without one the server's `default` where its strategy `answer`
    (as `answer_for` chose it) asks candidates, else None."""
    if asked is not None:
        return asked
    return None if answer == "joint" else default


def answer_for(asked: str | None, default: str, n: int, stream: bool, ape_parallel: bool | None) -> str:
    """The strategy that answers a request: the one it asks for; without one the server's `default` where that can
    answer it (one sample per prompt, no stream, and for "both-placements" no `ape_parallel` of the request's own),
    else "joint"."""
    if asked is not None:
        return asked
    if n != 1 or stream or (default == BOTH_PLACEMENTS and ape_parallel is not None):
        return "joint"
    return default


def candidates(documents: Sequence[Sequence[T]], answer: str) -> tuple[list[int], list[list[T]], list[Source]]:
    """The requests that `answer` makes of requests with these documents: the request each belongs to, its
    documents, and its source (`Source`). "joint" makes each request as given; "best-document" one per document (a
    request without documents as given); "best-document-or-joint" the request as given, then one per document when it
    has two or more; "confidence-order" (its first round) one per document when it has two or more, else the request
    as given, whose answer is then the answer; "confidence-order-or-joint" the request as given, then one per document
    when it has two or more; "each-last" the request as given, then, for each document but the last, all of them
    with that one moved last; "both-orders" the request as given, then its documents reversed when it has two or
    more; "both-placements" the request as given, then the same read in parallel when it has
    two or more documents (its options: `placement_groups`)."""
    owners: list[int] = []
    sets: list[list[T]] = []
    sources: list[Source] = []
    for owner, docs in enumerate(documents):
        docs = list(docs)
        several = len(docs) > 1
        whole = (
            answer in ("joint", EACH_LAST, BOTH_ORDERS, BOTH_PLACEMENTS)
            or not docs
            or (answer in ("best-document-or-joint", "confidence-order-or-joint") and several)
            or (answer in ORDERING and not several)
        )
        if whole:
            owners.append(owner)
            sets.append(docs)
            sources.append(None)
        if answer in CHOOSING and docs or answer in ORDERING and several:
            for i, d in enumerate(docs):
                owners.append(owner)
                sets.append([d])
                sources.append(i)
        for order in _reorders(answer, len(docs)):
            owners.append(owner)
            sets.append([docs[j] for j in order])
            sources.append(order)
        if answer == BOTH_PLACEMENTS and several:
            owners.append(owner)
            sets.append(docs)
            sources.append(PARALLEL)
    return owners, sets, sources


def _reorders(answer: str, n: int) -> list[tuple[int, ...]]:
    """The orders of n documents that `answer` asks besides the one given: for "each-last" each document but the last
    moved last, the others in place; for "both-orders" (n >= 2) the reversed order; none for the other strategies."""
    if answer == EACH_LAST:
        return [(*range(i), *range(i + 1, n), i) for i in range(n - 1)]
    if answer == BOTH_ORDERS and n > 1:
        return [tuple(reversed(range(n)))]
    return []


def placement_groups(
    options: RequestOptions, answer: str, sources: Sequence[Source]
) -> list[tuple[RequestOptions, list[int]]]:
    """The candidates (made from `sources`, as `candidates` lists them) grouped by the options they ask with, each
    group queued as one: all of them with `options`, or for "both-placements" those read in order (the requests as
    given), then those read in parallel (PARALLEL). InvalidRequestError naming `ape_parallel` where such a request
    sets it: the strategy asks both."""
    if answer != BOTH_PLACEMENTS:
        return [(options, list(range(len(sources))))]
    if options.ape_parallel is not None:
        raise InvalidRequestError(
            f"answer {answer!r} reads the documents both in order and in parallel: leave ape_parallel out, "
            f"got {options.ape_parallel!r}",
            "ape_parallel",
        )
    groups = []
    for parallel in (False, True):
        which = [i for i, source in enumerate(sources) if (source == PARALLEL) == parallel]
        if which:
            groups.append((dataclasses.replace(options, ape_parallel=parallel), which))
    return groups


def with_confidence(
    params: SamplingParams, source: Source = None, confidence_tokens: int | None = None, answer: str = "joint"
) -> SamplingParams:
    """The parameters a candidate made from `source` (as `candidates` lists them) asks with: `params`, asking for the
    chosen tokens' log-probabilities (what `confidence` reads) where they ask for none; with an ordering `answer` a
    one-document candidate generates at most `confidence_tokens` tokens (None: as many as `params` allow; its answer
    is never returned)."""
    changes: dict = {} if params.logprobs is not None else {"logprobs": 0}
    one_document = isinstance(source, int) and answer in ORDERING
    if one_document and confidence_tokens is not None and confidence_tokens < params.max_tokens:
        changes.update(max_tokens=confidence_tokens, min_tokens=min(params.min_tokens, confidence_tokens))
    return dataclasses.replace(params, **changes) if changes else params


def confidence(out: RequestOutput, tokens: int | None = None) -> float:
    """The mean log-probability of the answer's tokens, of its first `tokens` only where given (-inf for an answer
    without tokens)."""
    return mean_logprob(chosen_logprobs(out), tokens)


def choices(owners: Sequence[int], key: str, answer: str, confidence_tokens: int | None) -> list[Choice | None]:
    """The engine's choice (engine/choice.py) each candidate joins (`owners[i]` owns candidate i, as `candidates`
    lists them for `answer`): with `confidence_tokens` set and a strategy that chooses among answers, one per request
    of two or more candidates, keyed `key` and the request's index; else None for every candidate."""
    if confidence_tokens is None or answer == "joint" or answer in ORDERING:
        return [None] * len(owners)
    size, seen = Counter(owners), Counter()
    made: list[Choice | None] = []
    for owner in owners:
        index, seen[owner] = seen[owner], seen[owner] + 1
        made.append(Choice(f"{key}{owner}", index, size[owner], confidence_tokens) if size[owner] > 1 else None)
    return made


def pick_answers(
    owners: Sequence[int],
    outputs: Sequence[RequestOutput],
    sources: Sequence[Source],
    keep_logprobs: Sequence[bool],
    confidence_tokens: int | None = None,
) -> list[RequestOutput]:
    """For each request r (`owners[i]` owns `outputs[i]`, made from `sources[i]` as `candidates` lists them), the most
    confident of its outputs (by its first `confidence_tokens` tokens where given), with `answered_from` set to that
    source's document (one document alone), `document_order` to its order (each-last, both-orders) or `read_in_parallel`
    (both-placements' PARALLEL); a request of which one output failed gets that output.
    `keep_logprobs[r]` False drops the log-probabilities that `with_confidence` added."""
    best: dict[int, tuple[float, RequestOutput, Source]] = {}
    for owner, out, source in zip(owners, outputs, sources, strict=True):
        # A request the engine failed alone fails the whole answer, as it fails a joint request: its output (the
        # first such) is returned, error set, rather than a choice among the others that looks complete.
        score = math.inf if out.error is not None else confidence(out, confidence_tokens)
        if owner not in best or score > best[owner][0]:
            best[owner] = (score, out, source)
    picked = []
    for owner, keep in enumerate(keep_logprobs):
        _, out, source = best[owner]
        read = list(source) if isinstance(source, tuple) else None
        alone = source if isinstance(source, int) else None
        picked.append(
            dataclasses.replace(
                out,
                outputs=_completions(out, keep),
                answered_from=alone,
                document_order=read,
                read_in_parallel=source == PARALLEL,
            )
        )
    return picked


class FirstRound:
    """The first round of an ordering strategy for `count` requests, as its outputs come in (candidate i, made from
    `sources[i]` for request `owners[i]` as `candidates` lists them). `record` takes each output in any order and says
    when a request's one-document candidates are all in: its order of documents is then known, and its joint round can
    start while the request as given ("confidence-order-or-joint") is still answering.

    A request's order sorts its documents by their candidates' mean log-probability, least first (on a tie the given
    order). It has none (no joint round) where it made no such candidates, where the order is the given one and the
    request as given was asked (that is the joint round, already asked), or where one of its candidates failed: its
    answer is then the first failed output (as `pick_answers` returns it)."""

    def __init__(self, owners: Sequence[int], sources: Sequence[Source], count: int) -> None:
        self.owners, self.sources = list(owners), list(sources)
        self.left = [0] * count  # one-document candidates not in yet
        self.given_asked = [False] * count
        for owner, source in zip(owners, sources, strict=True):
            if source is None:
                self.given_asked[owner] = True
            else:
                self.left[owner] += 1
        self.scores: list[dict[int, float]] = [{} for _ in range(count)]
        self.given: list[RequestOutput | None] = [None] * count
        self.failed: list[RequestOutput | None] = [None] * count
        self._orders: list[list[int] | None] = [None] * count

    def record(self, i: int, out: RequestOutput) -> int | None:
        """Candidate i's output; the request whose joint round it lets start (its order now known), if any."""
        owner, source = self.owners[i], self.sources[i]
        if out.error is not None:
            self.failed[owner] = self.failed[owner] or out
        elif source is None:
            self.given[owner] = out
        else:
            self.scores[owner][source] = confidence(out)
        if source is None:
            return None
        self.left[owner] -= 1
        if self.left[owner] or self.failed[owner]:
            return None
        scores = self.scores[owner]
        order = sorted(scores, key=lambda d: (scores[d], d))
        # in the given order, the joint round would ask the request as given again: its answer is the answer
        self._orders[owner] = None if self.given_asked[owner] and order == sorted(scores) else order
        return owner if self._orders[owner] is not None else None

    @property
    def orders(self) -> list[list[int] | None]:
        """Each request's order of documents for its joint round, or None (no joint round, or one that failed)."""
        return [None if failed else order for order, failed in zip(self._orders, self.failed)]

    @property
    def firsts(self) -> list[RequestOutput | None]:
        """Each request's first answer: the first output that failed, else the request as given where it was asked,
        else None."""
        return [failed or given for failed, given in zip(self.failed, self.given)]


def ordered_answers(
    firsts: Sequence[RequestOutput | None],
    orders: Sequence[list[int] | None],
    joint: dict[int, RequestOutput],
    keep_logprobs: Sequence[bool],
) -> list[RequestOutput]:
    """Each request's answer from `FirstRound`'s first answers and orders and the joint round's outputs
    (`joint[r]`: request r's documents in `orders[r]`): the reordered answer with its `document_order`, unless the
    request as given was asked too and its answer is at least as sure (then it, `document_order` None), or the
    request had nothing to order (its first answer). `keep_logprobs[r]` False drops the log-probabilities that
    `with_confidence` added."""
    answers = []
    for r, (first, order) in enumerate(zip(firsts, orders, strict=True)):
        out, read = first, None
        if r in joint and (first is None or confidence(joint[r]) > confidence(first)):
            out, read = joint[r], order
        assert out is not None, "a request without a first answer has a joint one"
        answers.append(dataclasses.replace(out, outputs=_completions(out, keep_logprobs[r]), document_order=read))
    return answers


def _completions(out: RequestOutput, keep_logprobs: bool) -> list:
    """`out`'s completions, without the log-probabilities that `with_confidence` added unless `keep_logprobs`."""
    return out.outputs if keep_logprobs else [dataclasses.replace(c, logprobs=None) for c in out.outputs]
