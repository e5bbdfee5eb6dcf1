"""Answering from the best single document (engine/best_document.py): the request asked once per document, the
answer with the highest mean token log-probability kept; through `LLM.generate`/`LLM.chat` it must equal the most
confident of the same one-document requests made one by one."""

from __future__ import annotations

import contextlib
import itertools
import statistics

import hypothesis
import pytest
from hypothesis import strategies as st

from lazyattn import LLM, SamplingParams
from lazyattn.engine.best_document import (
    ANSWER_STRATEGIES,
    FirstRound,
    answer_for,
    candidates,
    check_answer,
    check_default_answer,
    ordered_answers,
    pick_answers,
    with_confidence,
)
from lazyattn.engine.outputs import CompletionOutput, RequestOutput
from lazyattn.errors import InvalidRequestError


def scripted(text: str, logprobs: list[float], documents: int = 1) -> RequestOutput:
    tokens = list(range(len(logprobs)))
    completion = CompletionOutput(0, text, tokens, "stop", logprobs=[{t: lp} for t, lp in zip(tokens, logprobs)])
    return RequestOutput("r", [1, 2], 10 * documents, [completion])


def test_pick_answers_keeps_the_highest_mean_token_log_probability():
    owners = [0, 0, 0, 1, 1, 2]
    outputs = [
        # means -1.0, -0.25, -0.5: b's answer, though a's first token is the surest and c's sum is the highest
        scripted("Lyon", [-0.1, -1.9]),
        scripted("Paris", [-0.3, -0.2, -0.3, -0.2]),
        scripted("Nice", [-0.5]),
        # a tie: the first document's answer
        scripted("4", [-0.5, -0.5]),
        scripted("5", [-1.0, 0.0]),
        # a request without documents: asked as it is
        scripted("no", [-2.0], documents=0),
    ]
    picked = pick_answers(owners, outputs, [0, 1, 2, 0, 1, None], [False, True, False])
    assert [(o.text, o.answered_from) for o in picked] == [("Paris", 1), ("4", 0), ("no", None)]
    # the log-probabilities only where the request asked for them
    assert [o.logprobs is None for o in picked] == [True, False, True]
    # one document's request failed: the answer is that failure, not the surest of the rest
    failed = scripted("", [])
    failed.error = "the engine failed this request"
    picked = pick_answers([0, 0, 0], [outputs[1], failed, scripted("x", [-9.0])], [0, 1, 2], [True])
    assert (picked[0].error, picked[0].answered_from) == ("the engine failed this request", 1)


def test_candidates_of_each_strategy():
    docs = [["a", "b"], [], ["c"]]
    assert candidates(docs, "joint") == ([0, 1, 2], [["a", "b"], [], ["c"]], [None, None, None])
    # every document alone; a request without documents as it is
    assert candidates(docs, "best-document") == ([0, 0, 1, 2], [["a"], ["b"], [], ["c"]], [0, 1, None, 0])
    # the request as given first (it wins a tie), then each document alone; one document is asked once
    assert candidates(docs, "best-document-or-joint") == (
        [0, 0, 0, 1, 2],
        [["a", "b"], ["a"], ["b"], [], ["c"]],
        [None, 0, 1, None, 0],
    )
    # each document alone where there are two or more; with fewer, the request as given (its answer is the answer)
    assert candidates(docs, "confidence-order") == ([0, 0, 1, 2], [["a"], ["b"], [], ["c"]], [0, 1, None, None])
    # the request as given too, then each document alone where there are two or more
    assert candidates(docs, "confidence-order-or-joint") == (
        [0, 0, 0, 1, 2],
        [["a", "b"], ["a"], ["b"], [], ["c"]],
        [None, 0, 1, None, None],
    )
    # the request as given, then every document but the last moved last in turn, the others in their places
    three = [["a", "b", "c"], ["d"]]
    assert candidates(three, "each-last") == (
        [0, 0, 0, 1],
        [["a", "b", "c"], ["b", "c", "a"], ["a", "c", "b"], ["d"]],
        [None, (1, 2, 0), (0, 2, 1), None],
    )
    # the request as given, then its documents reversed where it has two or more
    assert candidates(three, "both-orders") == (
        [0, 0, 1],
        [["a", "b", "c"], ["c", "b", "a"], ["d"]],
        [None, (2, 1, 0), None],
    )
    # the request as given, then the same read in parallel where it has two or more documents
    assert candidates(three, "both-placements") == (
        [0, 0, 1],
        [["a", "b", "c"], ["a", "b", "c"], ["d"]],
        [None, "parallel", None],
    )


def confidence_orders(owners, outputs, sources, count):
    """The whole first round at once: `FirstRound` fed every output in order."""
    first = FirstRound(owners, sources, count)
    for i, out in enumerate(outputs):
        first.record(i, out)
    return first.orders, first.firsts


def test_confidence_orders_put_the_surest_document_last():
    owners = [0, 0, 0, 1, 2, 2]
    outputs = [
        scripted("Lyon", [-0.1, -1.9]),  # mean -1.0
        scripted("Paris", [-0.3, -0.2]),  # -0.25: the surest, read last
        scripted("Nice", [-1.0]),  # -1.0: a tie with the first, kept in the given order
        scripted("no", [-2.0], documents=0),  # a request asked as given
        scripted("a", [-0.5]),
        scripted("", []),  # an empty answer: the least sure of all
    ]
    orders, done = confidence_orders(owners, outputs, [0, 1, 2, None, 0, 1], 3)
    assert orders == [[0, 2, 1], None, [1, 0]]
    assert [d.text if d else None for d in done] == [None, "no", None]
    # one candidate failed: the request's answer is that failure, and it is asked no further
    failed = scripted("", [])
    failed.error = "the engine failed this request"
    orders, done = confidence_orders([0, 0], [outputs[0], failed], [0, 1], 1)
    assert orders == [None] and done[0].error == "the engine failed this request"
    # asked as given too (confidence-order-or-joint): that answer comes back beside the order
    orders, firsts = confidence_orders([0, 0, 0], [outputs[3], outputs[1], outputs[0]], [None, 0, 1], 1)
    assert orders == [[1, 0]] and firsts[0].text == "no"
    # ... unless the order is the given one: then the request as given is the joint round, already answered
    orders, firsts = confidence_orders([0, 0, 0], [outputs[3], outputs[0], outputs[1]], [None, 0, 1], 1)
    assert orders == [None] and firsts[0].text == "no"


def test_ordered_answers_keep_the_reordered_answer_unless_the_one_as_given_is_as_sure():
    given = scripted("Oslo", [-0.5, -0.5])
    surer, as_sure = scripted("Bergen", [-0.1]), scripted("Bergen", [-0.5])
    answers = ordered_answers(
        [given, given, None],
        [[1, 0], [1, 0], [0, 1]],
        {0: surer, 1: as_sure, 2: as_sure},
        [
            True,
            False,
            False,
        ],
    )
    assert [(a.text, a.document_order) for a in answers] == [("Bergen", [1, 0]), ("Oslo", None), ("Bergen", [0, 1])]
    assert [a.logprobs is None for a in answers] == [False, True, True]
    # nothing to order: the first answer as it is
    assert ordered_answers([given], [None], {}, [True])[0].text == "Oslo"


@pytest.mark.parametrize(
    ("answer", "n", "stream", "param"),
    [
        ("best", 1, False, "answer"),
        ("best-document", 2, False, "n"),
        ("best-document", 1, True, "stream"),
        ("best-document-or-joint", 3, False, "n"),
        ("best-document-or-joint", 1, True, "stream"),
        ("confidence-order", 2, False, "n"),
        ("confidence-order", 1, True, "stream"),
        ("confidence-order-or-joint", 2, False, "n"),
    ],
)
def test_check_answer_names_the_field(answer, n, stream, param):
    with pytest.raises(InvalidRequestError) as e:
        check_answer(answer, n, stream)
    assert e.value.param == param
    check_answer("joint", 4, True)  # the default strategy takes any n and streams


@pytest.mark.parametrize(
    ("answer", "tokens", "message"),
    [
        ("confidence-order", 0, "positive integer"),
        ("confidence-order-or-joint", -2, "positive integer"),
        ("confidence-order", 2.0, "positive integer"),
        ("confidence-order", True, "positive integer"),
        ("confidence-order", "4", "positive integer"),
        ("each-last", 0, "positive integer"),
        ("joint", 4, "asks no candidates"),
    ],
)
def test_check_answer_rejects_a_confidence_cap_it_cannot_apply(answer, tokens, message):
    with pytest.raises(InvalidRequestError, match=message) as e:
        check_answer(answer, confidence_tokens=tokens)
    assert e.value.param == "confidence_tokens"
    for answer in ANSWER_STRATEGIES[1:]:  # every strategy that asks candidates
        check_answer(answer, confidence_tokens=1)
        check_answer(answer, confidence_tokens=64)


@pytest.mark.parametrize(
    "n, stream, parallel, both_placements, each_last",
    [
        (1, False, None, "both-placements", "each-last"),  # a request the default can answer
        (2, False, None, "joint", "joint"),  # several samples: no choice among finished answers
        (1, True, None, "joint", "joint"),  # a stream: the same
        (1, False, True, "joint", "each-last"),  # its own ape_parallel: both placements would set it
        (1, False, False, "joint", "each-last"),
    ],
)
def test_a_default_strategy_answers_only_what_it_can(n, stream, parallel, both_placements, each_last):
    assert answer_for(None, "both-placements", n, stream, parallel) == both_placements
    assert answer_for(None, "each-last", n, stream, parallel) == each_last
    assert answer_for(None, "joint", n, stream, parallel) == "joint"
    # a strategy the request names is its own, whatever it asks with (check_answer then judges it)
    for asked in ("joint", "best-document", "both-placements"):
        assert answer_for(asked, "each-last", n, stream, parallel) == asked


def test_a_default_strategy_the_mode_cannot_run_is_refused():
    for mode in ("lazy", "block", "prefix", "full"):
        for answer in ANSWER_STRATEGIES:
            if answer == "both-placements" and mode != "lazy":
                with pytest.raises(InvalidRequestError, match=f"needs mode 'lazy', not '{mode}'") as e:
                    check_default_answer(answer, mode)
                assert e.value.param == "answer"
            else:
                check_default_answer(answer, mode)
    with pytest.raises(InvalidRequestError, match="answer must be one of"):
        check_default_answer("surest", "lazy")


def test_with_confidence_caps_only_the_one_document_candidates_of_the_ordering_strategies():
    params = SamplingParams(max_tokens=16, min_tokens=8, temperature=0.0)
    as_given = with_confidence(params, None, 4, "confidence-order-or-joint")
    assert (as_given.max_tokens, as_given.min_tokens, as_given.logprobs) == (16, 8, 0)
    alone = with_confidence(params, 2, 4, "confidence-order")
    assert (alone.max_tokens, alone.min_tokens, alone.logprobs) == (4, 4, 0)
    assert (params.max_tokens, params.logprobs) == (16, None)  # the caller's params are not touched
    assert with_confidence(params, 2, 32, "confidence-order").max_tokens == 16  # a cap above max_tokens: no change
    # a choosing strategy's one-document answer may be the answer: it is stopped by the engine's choice, not capped
    chosen = with_confidence(params, 2, 4, "best-document")
    assert (chosen.max_tokens, chosen.min_tokens, chosen.logprobs) == (16, 8, 0)
    asked = SamplingParams(max_tokens=3, logprobs=2)
    assert with_confidence(asked, 0, None) is asked  # nothing to change


def mean_logprob(out: RequestOutput, tokens: int | None = None) -> float:
    return statistics.fmean(next(iter(step.values())) for step in out.logprobs[:tokens])


DOCS = [
    ["The river Ouse floods the town every spring.", "Ada keeps bees on the hill.", "Nine ships left the harbour."],
    ["Copper turns green in the rain.", "The bakery opens at six."],
    [],
]
PROMPTS = ["Who keeps bees?", "When does the bakery open?", "Say something."]


@pytest.fixture(scope="module")
def llm():
    with LLM(model="tiny", mode="lazy", device="cpu", progress=False) as llm:
        yield llm


def test_generate_best_document_is_the_most_confident_one_document_answer(llm):
    params = SamplingParams(max_tokens=6, temperature=0.0)
    got = llm.generate(PROMPTS, params, documents=DOCS, answer="best-document")
    scored = SamplingParams(max_tokens=6, temperature=0.0, logprobs=0)
    for prompt, docs, out in zip(PROMPTS, DOCS, got):
        alone = llm.generate([prompt] * max(1, len(docs)), scored, documents=[[d] for d in docs] or [[]])
        means = [mean_logprob(o) for o in alone]
        best = means.index(max(means))
        assert out.token_ids == alone[best].token_ids
        assert out.answered_from == (best if docs else None)
        assert out.num_document_tokens == alone[best].num_document_tokens
        assert out.logprobs is None  # not asked for


def test_best_document_or_joint_also_weighs_the_request_as_given(llm):
    params = SamplingParams(max_tokens=6, temperature=0.0)
    got = llm.generate(PROMPTS, params, documents=DOCS, answer="best-document-or-joint")
    scored = SamplingParams(max_tokens=6, temperature=0.0, logprobs=0)
    for prompt, docs, out in zip(PROMPTS, DOCS, got):
        # the candidates, asked one by one: the prompt as given (when it has two or more documents), each one alone
        sets = ([docs] if len(docs) > 1 or not docs else []) + [[d] for d in docs]
        alone = [llm.generate([prompt], scored, documents=[s])[0] for s in sets]
        means = [mean_logprob(o) for o in alone]
        best = means.index(max(means))
        assert out.token_ids == alone[best].token_ids
        whole = len(docs) > 1 or not docs
        assert out.answered_from == (None if whole and best == 0 else best - whole)


def test_confidence_order_answers_jointly_with_the_surest_document_last(llm):
    params = SamplingParams(max_tokens=6, temperature=0.0)
    got = llm.generate(PROMPTS, params, documents=DOCS, answer="confidence-order")
    scored = SamplingParams(max_tokens=6, temperature=0.0, logprobs=0)
    for prompt, docs, out in zip(PROMPTS, DOCS, got):
        assert out.answered_from is None and out.logprobs is None
        if len(docs) < 2:  # nothing to order: the request as given
            assert out.document_order is None
            assert out.token_ids == llm.generate([prompt], params, documents=[docs])[0].token_ids
            continue
        alone = llm.generate([prompt] * len(docs), scored, documents=[[d] for d in docs])
        means = [mean_logprob(o) for o in alone]
        order = sorted(range(len(docs)), key=lambda i: (means[i], i))
        assert out.document_order == order and order[-1] == means.index(max(means))
        # the answer is the joint request's over the documents in that order, made by hand
        by_hand = llm.generate([prompt], params, documents=[[docs[i] for i in order]])[0]
        assert out.token_ids == by_hand.token_ids
        assert out.num_document_tokens == by_hand.num_document_tokens


@pytest.mark.parametrize("answer", ["confidence-order", "confidence-order-or-joint"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_confidence_tokens_order_by_the_first_tokens_and_answer_in_full(llm, answer, tokens):
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=0)
    got = llm.generate(PROMPTS, params, documents=DOCS, answer=answer, confidence_tokens=tokens)
    for prompt, docs, out in zip(PROMPTS, DOCS, got):
        assert len(out.token_ids) == 6  # the answer returned is never one of the capped ones
        if len(docs) < 2:
            assert out.document_order is None
            continue
        # by hand: each document alone answered in full; its confidence is the mean over the first `tokens` steps
        alone = llm.generate([prompt] * len(docs), params, documents=[[d] for d in docs])
        means = [mean_logprob(o, tokens) for o in alone]
        order = sorted(range(len(docs)), key=lambda i: (means[i], i))
        reordered = llm.generate([prompt], params, documents=[[docs[i] for i in order]])[0]
        if answer == "confidence-order":
            assert out.document_order == order
            assert out.token_ids == reordered.token_ids
            continue
        given = llm.generate([prompt], params, documents=[docs])[0]
        surer = order != sorted(order) and mean_logprob(reordered) > mean_logprob(given)
        want = reordered if surer else given
        assert (out.token_ids, out.document_order) == (want.token_ids, order if surer else None)


def test_confidence_order_or_joint_keeps_the_answer_as_given_where_it_is_as_sure(llm):
    scored = SamplingParams(max_tokens=6, temperature=0.0, logprobs=0)
    got = llm.generate(PROMPTS, scored, documents=DOCS, answer="confidence-order-or-joint")
    as_given = llm.generate(PROMPTS, scored, documents=DOCS)
    ordered = llm.generate(PROMPTS, scored, documents=DOCS, answer="confidence-order")
    for docs, out, given, reordered in zip(DOCS, got, as_given, ordered):
        moved = len(docs) > 1 and reordered.document_order != sorted(reordered.document_order)
        surer = moved and mean_logprob(reordered) > mean_logprob(given)
        want = reordered if surer else given
        assert (out.token_ids, out.document_order) == (want.token_ids, want.document_order if surer else None)
        assert out.logprobs is not None  # asked for


def test_each_last_is_the_most_confident_joint_answer_with_each_document_last(llm):
    params = SamplingParams(max_tokens=6, temperature=0.0)
    got = llm.generate(PROMPTS, params, documents=DOCS, answer="each-last")
    scored = SamplingParams(max_tokens=6, temperature=0.0, logprobs=0)
    for prompt, docs, out in zip(PROMPTS, DOCS, got):
        assert out.answered_from is None and out.logprobs is None
        # by hand: every order with one document moved to the end, the rest kept in place; the order as given first
        orders = [list(range(len(docs)))] + [[j for j in range(len(docs)) if j != i] + [i] for i in range(len(docs))]
        orders = [o for k, o in enumerate(orders) if o not in orders[:k]]
        asked = [llm.generate([prompt], scored, documents=[[docs[i] for i in o]])[0] for o in orders]
        means = [mean_logprob(o) for o in asked]
        best = means.index(max(means))
        assert out.token_ids == asked[best].token_ids
        assert out.document_order == (None if best == 0 else orders[best])
        assert out.num_document_tokens == asked[best].num_document_tokens


@pytest.mark.parametrize("mode", ["lazy", "block", "full"])
def test_both_orders_is_the_surer_of_the_documents_as_given_and_reversed(llm, mode):
    other = (
        contextlib.nullcontext(llm) if mode == "lazy" else LLM(model="tiny", mode=mode, device="cpu", progress=False)
    )
    with other as engine:
        _surer_of_both_orders(engine)


def _surer_of_both_orders(engine: LLM) -> None:
    params = SamplingParams(max_tokens=6, temperature=0.0)
    got = engine.generate(PROMPTS, params, documents=DOCS, answer="both-orders")
    scored = SamplingParams(max_tokens=6, temperature=0.0, logprobs=0)
    kept = []
    for prompt, docs, out in zip(PROMPTS, DOCS, got):
        assert out.answered_from is None and not out.read_in_parallel and out.logprobs is None
        # by hand: the request as given, and (two or more documents) the same documents last to first; as given wins
        # a tie
        orders = [list(range(len(docs)))] + ([list(range(len(docs)))[::-1]] if len(docs) > 1 else [])
        asked = [engine.generate([prompt], scored, documents=[[docs[i] for i in o]])[0] for o in orders]
        means = [mean_logprob(o) for o in asked]
        best = means.index(max(means))
        assert out.token_ids == asked[best].token_ids
        assert out.document_order == (None if best == 0 else orders[best])
        kept.append(best)
    assert set(kept) == {0, 1}  # each order wins somewhere: the check sees both


@pytest.mark.parametrize("ape", [{}, {"ape_temperature": 0.5}], ids=["T1", "T0.5"])
def test_both_placements_is_the_surer_of_the_documents_in_order_and_in_parallel(llm, ape):
    params = SamplingParams(max_tokens=6, temperature=0.0)
    got = llm.generate(PROMPTS, params, documents=DOCS, answer="both-placements", ape_prefix=True, **ape)
    scored = SamplingParams(max_tokens=6, temperature=0.0, logprobs=0)
    kept, moved = [], []
    for prompt, docs, out in zip(PROMPTS, DOCS, got):
        assert out.answered_from is None and out.document_order is None and out.logprobs is None
        # by hand: the request read in order, and (two or more documents) read in parallel, each with the request's
        # APE options; in order wins a tie
        asked = [
            llm.generate([prompt], scored, documents=[docs], ape_prefix=True, ape_parallel=parallel, **ape)[0]
            for parallel in ([False, True] if len(docs) > 1 else [False])
        ]
        means = [mean_logprob(o) for o in asked]
        best = means.index(max(means))
        assert out.token_ids == asked[best].token_ids
        assert out.read_in_parallel == (best == 1)
        kept.append(best)
        plain = llm.generate([prompt], scored, documents=[docs], ape_prefix=True, ape_parallel=best == 1)[0]
        moved.append(mean_logprob(plain) != means[best])
    assert set(kept) == {0, 1}  # each placement wins somewhere: the check sees both
    assert any(moved) == bool(ape)  # the temperature changes what the candidates answer: the check sees it


def _by_hand(answer: str, docs: list[str]) -> list[tuple[list[str], bool | None]]:
    """The candidates of a choosing strategy, in tie order, written out: (documents, ape_parallel)."""
    if len(docs) < 2:
        return [(docs, None)]
    if answer == "best-document-or-joint":
        return [(docs, None)] + [([d], None) for d in docs]
    if answer == "each-last":
        return [(docs, None)] + [([d for d in docs if d != last] + [last], None) for last in docs[:-1]]
    if answer == "both-orders":
        return [(docs, None), (docs[::-1], None)]
    return [(docs, False), (docs, True)]  # both-placements


def _kept(answer: str, docs: list[str], out) -> int:
    """Which of `_by_hand(answer, docs)`'s candidates `out` says it answered as."""
    if answer == "both-placements":
        return int(out.read_in_parallel)
    if answer == "best-document-or-joint":
        return 0 if out.answered_from is None else 1 + out.answered_from
    order = out.document_order
    return 0 if order is None else [d for d, _ in _by_hand(answer, docs)].index([docs[i] for i in order])


@pytest.mark.parametrize("answer", ["best-document-or-joint", "each-last", "both-orders", "both-placements"])
@pytest.mark.parametrize("tokens", [1, 2])
def test_confidence_tokens_choose_after_the_first_tokens_and_stop_the_other_candidates(llm, answer, tokens):
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    before = llm.engine.stats().decoded_tokens
    got = llm.generate(PROMPTS, params, documents=DOCS, answer=answer, confidence_tokens=tokens, ape_prefix=True)
    decoded = llm.engine.stats().decoded_tokens - before
    scored = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=0)
    want_decoded, other_answer = 0, False
    for prompt, docs, out in zip(PROMPTS, DOCS, got):
        # by hand: every candidate answered in full, one by one; the surest by its first `tokens` tokens, the first
        # on a tie, is the answer, in full
        asked = [
            llm.generate([prompt], scored, documents=[d], ape_prefix=True, ape_parallel=parallel)[0]
            for d, parallel in _by_hand(answer, docs)
        ]
        means = [mean_logprob(o, tokens) for o in asked]
        best = means.index(max(means))
        assert out.token_ids == asked[best].token_ids and len(out.token_ids) == 6
        assert _kept(answer, docs, out) == best
        whole = [mean_logprob(o) for o in asked]
        other_answer |= whole.index(max(whole)) != best
        # the work: the answer's 5 decode rows (its first token comes from the prefill), each other candidate's
        # `tokens` - 1 before it was stopped (and, where steps overlap, one more in flight)
        losers = len(asked) - 1
        want_decoded += 5 + losers * (tokens - 1 + llm.engine.pipeline.overlap)
    assert decoded == want_decoded
    # by the first token the choice differs from the whole answers' somewhere: the check sees which rule is applied
    assert other_answer or tokens > 1
    assert not llm.engine.has_unfinished() and not len(llm.engine.choices)


def test_both_placements_leaves_ape_parallel_to_itself_and_needs_lazy_mode(llm):
    params = SamplingParams(max_tokens=2, temperature=0.0)
    for parallel in (True, False):
        with pytest.raises(InvalidRequestError, match="leave ape_parallel out") as err:
            llm.generate(PROMPTS[:1], params, documents=DOCS[:1], answer="both-placements", ape_parallel=parallel)
        assert err.value.param == "ape_parallel"
    assert not llm.engine.has_unfinished()
    with LLM(model="tiny", mode="block", device="cpu", progress=False) as block:
        with pytest.raises(InvalidRequestError, match="ape_parallel needs mode 'lazy'"):
            block.generate(PROMPTS[:1], params, documents=[DOCS[0][:2]], answer="both-placements")
        assert not block.engine.has_unfinished()


def test_chat_best_document_keeps_the_log_probabilities_asked_for(llm):
    params = SamplingParams(max_tokens=5, temperature=0.0, logprobs=2)
    messages = [[{"role": "user", "content": p}] for p in PROMPTS[:2]]
    got = llm.chat(messages, params, documents=DOCS[:2], answer="best-document")
    for conv, docs, out in zip(messages, DOCS[:2], got):
        alone = llm.chat([conv] * len(docs), params, documents=[[d] for d in docs])
        means = [mean_logprob(o) for o in alone]
        assert out.answered_from == means.index(max(means))
        expected = alone[out.answered_from].logprobs
        # the same tokens; values equal up to the rounding of another batch's arithmetic
        assert [list(step) for step in out.logprobs] == [list(step) for step in expected]
        values = [v for step in out.logprobs for v in step.values()]
        assert values == pytest.approx([v for step in expected for v in step.values()], abs=1e-5)
        assert all(len(step) >= 2 for step in out.logprobs)  # the chosen token and the top 2


def test_token_level_prompts_and_bad_input(llm):
    doc_ids = [[llm.tokenizer.encode_plain(d) for d in DOCS[0]]]
    prompt_ids = [llm.tokenizer.encode_plain(PROMPTS[0])]
    params = SamplingParams(max_tokens=4, temperature=0.0)
    by_ids = llm.generate(
        prompt_token_ids=prompt_ids, document_token_ids=doc_ids, sampling_params=params, answer="best-document"
    )[0]
    alone = llm.generate(
        prompt_token_ids=prompt_ids * 3,
        document_token_ids=[[d] for d in doc_ids[0]],
        sampling_params=SamplingParams(max_tokens=4, temperature=0.0, logprobs=0),
    )
    means = [mean_logprob(o) for o in alone]
    assert by_ids.answered_from == means.index(max(means))
    with pytest.raises(InvalidRequestError) as e:
        llm.generate(PROMPTS[:1], SamplingParams(n=2), documents=DOCS[:1], answer="best-document")
    assert e.value.param == "n"
    with pytest.raises(InvalidRequestError) as e:
        llm.generate(PROMPTS[:1], documents=DOCS[:1], answer="best")
    assert e.value.param == "answer"
    # a prompt's documents given as one string, not a list: a clear error, in every strategy
    for answer in ("joint", "best-document"):
        with pytest.raises(InvalidRequestError) as e:
            llm.generate(PROMPTS[:1], documents=["one document"], answer=answer)
        assert e.value.param == "documents" and "documents[0] must be a list" in str(e.value)
    assert not llm.engine.has_unfinished()  # nothing was queued


def test_the_joint_round_starts_while_the_request_as_given_still_answers(llm, monkeypatch):
    # -or-joint with the one-document answers capped at 1 token: they are in after the first step, so the reordered
    # request runs beside the request as given (8 tokens) instead of after it: fewer steps than two rounds of 8
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    def order(d: list[str]) -> list[int]:
        kw = dict(documents=[d], answer="confidence-order", confidence_tokens=1)
        return llm.generate(PROMPTS[:1], params, **kw)[0].document_order

    # an order the strategy moves (a noise model's confidences: found, not assumed)
    docs = next(list(d) for d in itertools.permutations(DOCS[0]) if order(list(d)) != sorted(order(list(d))))
    steps = 0
    step = llm.engine.step

    def counted():
        nonlocal steps
        steps += 1
        return step()

    monkeypatch.setattr(llm.engine, "step", counted)
    out = llm.generate(PROMPTS[:1], params, documents=[docs], answer="confidence-order-or-joint", confidence_tokens=1)[
        0
    ]
    monkeypatch.undo()
    given = llm.generate(PROMPTS[:1], params, documents=[docs])[0]
    reordered = llm.generate(PROMPTS[:1], params, documents=[[docs[i] for i in order(docs)]])[0]
    assert out.token_ids in (given.token_ids, reordered.token_ids)
    assert steps <= 8 + 2, steps  # the first step, then the joint request's 8 beside the request as given's: not 16


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(
    st.lists(
        st.tuples(st.booleans(), st.lists(st.tuples(st.integers(-40, 0), st.booleans()), max_size=4)),
        min_size=1,
        max_size=4,
    ),
    st.randoms(use_true_random=False),
)
def test_first_round_is_the_same_whatever_order_its_outputs_come_in(requests, rng):
    # requests: per prompt, (asked as given?, its one-document candidates as (mean log-prob x 10, failed?))
    owners, sources, outputs = [], [], []
    for r, (as_given, alone) in enumerate(requests):
        for source, (score, fails) in ([(None, (-5, False))] if as_given else []) + list(enumerate(alone)):
            out = scripted(f"{r}/{source}", [score / 10])
            out.error = "failed" if fails else None
            owners.append(r)
            sources.append(source)
            outputs.append(out)
    first = FirstRound(owners, sources, len(requests))
    arrival = list(range(len(outputs)))
    rng.shuffle(arrival)
    started = []
    for i in arrival:
        left = [j for j in arrival[arrival.index(i) + 1 :] if owners[j] == owners[i] and sources[j] is not None]
        r = first.record(i, outputs[i])
        if r is not None:  # said once, when the last of its one-document candidates came in
            assert r == owners[i] and sources[i] is not None and not left and r not in started
            started.append(r)
    for r, (as_given, alone) in enumerate(requests):
        # by hand: the documents by score, least first (ties in the given order); none to order if a candidate
        # failed, if there are none, or if the order is the given one and the request as given was asked
        failed = [o for j, o in enumerate(outputs) if owners[j] == r and o.error]
        order = sorted(range(len(alone)), key=lambda d: (alone[d][0], d))
        moved = alone and not (as_given and order == list(range(len(alone))))
        want = order if moved and not any(fails for _, fails in alone) and not failed else None
        assert first.orders[r] == want
        if want is not None:
            assert r in started
        given_out = next((o for j, o in enumerate(outputs) if owners[j] == r and sources[j] is None), None)
        first_failed = next((outputs[j] for j in arrival if owners[j] == r and outputs[j].error), None)
        assert first.firsts[r] is (first_failed or (None if given_out is None or given_out.error else given_out))


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(requests=st.lists(st.integers(0, 7), min_size=1, max_size=5))
def test_both_orders_asks_the_request_as_given_and_reversed_and_nothing_else(requests):
    """For any documents: the request as given first (it wins a tie), then, with two or more documents, the same
    documents last to first, its source the order that reads them from the request's; requests keep their order."""
    documents = [[f"d{r}.{i}" for i in range(n)] for r, n in enumerate(requests)]
    owners, sets, sources = candidates(documents, "both-orders")
    assert owners == sorted(owners)
    for r, docs in enumerate(documents):
        mine = [(s, src) for o, s, src in zip(owners, sets, sources, strict=True) if o == r]
        assert mine[0] == (docs, None)
        assert len(mine) == (2 if len(docs) > 1 else 1)
        if len(docs) > 1:
            reversed_docs, order = mine[1]
            assert reversed_docs == docs[::-1] and [docs[i] for i in order] == reversed_docs


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(requests=st.lists(st.integers(0, 7), min_size=1, max_size=5))
def test_each_last_asks_every_document_last_once_and_nothing_else(requests):
    """For any documents: one candidate per document that can stand last (the request as given for the last one,
    first), each holding every document once, the one moved last and the others in their given order; its source is
    that order."""
    documents = [[f"d{r}.{i}" for i in range(n)] for r, n in enumerate(requests)]
    owners, sets, sources = candidates(documents, "each-last")
    for r, docs in enumerate(documents):
        mine = [(s, src) for o, s, src in zip(owners, sets, sources, strict=True) if o == r]
        assert mine[0] == (docs, None)  # the request as given first: it wins a tie
        assert sorted(s[-1] for s, _ in mine if s) == sorted(docs)  # each document last exactly once
        for s, src in mine[1:]:
            assert [docs[i] for i in src] == s and sorted(s) == sorted(docs)
            assert [d for d in s[:-1]] == [d for d in docs if d != s[-1]]
