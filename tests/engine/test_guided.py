"""Guided choice (SamplingParams.guided_choice, engine/guided.py): every answer is one of the listed strings, as the
tokenizer splits it alone; greedy picks what the model's own distribution ranks first among the tokens that continue
a choice, step by step; logprobs stay the raw distribution's; overlapped scheduling plans no step of a guided
sequence before its token is read; and bad lists are refused, naming the field."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lazyattn import SamplingParams
from lazyattn.engine.guided import ChoiceGuide
from lazyattn.engine.prompt import from_token_ids
from lazyattn.engine.sampling import MAX_GUIDED_CHOICE_CHARS, MAX_GUIDED_CHOICES, Sampler
from lazyattn.errors import InvalidRequestError
from lazyattn.model.byte_tokenizer import ByteTokenizer

from .test_overlap import DOCS, PROMPTS, drive, engine

EOS_IDS = ByteTokenizer().eos_token_ids  # </s> and <|im_end|>
CHOICES = ("yes", "yes sir", "no", "maybe")


def ids(text: str) -> list[int]:
    return ByteTokenizer().encode_plain(text)


# --- the prefix tree ----------------------------------------------------------------------------------------


def test_guide_allows_what_continues_a_choice_and_eos_after_a_whole_one():
    guide = ChoiceGuide([[1, 2], [1, 2, 3], [4]], eos_token_ids=[9])
    assert sorted(guide.allowed([])) == [1, 4]
    assert guide.allowed([1]) == [2]
    assert sorted(guide.allowed([1, 2])) == [3, 9]  # "1 2" is whole, "1 2 3" continues it
    assert guide.allowed([1, 2], ignore_eos=True) == [3]
    assert guide.allowed([5]) == [] and guide.allowed([1, 3]) == []
    assert not guide.ends([1, 2]) and guide.ends([1, 2, 3]) and guide.ends([4])
    assert not guide.ends([1]) and not guide.ends([]) and not guide.ends([7])


def test_guide_of_strings_tokenizes_each_alone_as_plain_text():
    tok = ByteTokenizer()
    guide = ChoiceGuide.of(tok, ["ab", "a<|im_end|>"])
    assert guide.allowed([]) == [ord("a")]
    assert sorted(guide.allowed([ord("a")])) == sorted([ord("b"), ord("<")])  # special-token text stays bytes


def test_guide_needs_a_choice():
    with pytest.raises(ValueError):
        ChoiceGuide([], eos_token_ids=[9])
    with pytest.raises(ValueError):
        ChoiceGuide([[1], []], eos_token_ids=[9])


# --- the sampler --------------------------------------------------------------------------------------------


def test_sampler_picks_the_best_allowed_token_and_keeps_the_raw_logprobs():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    allowed = [[3, 17, 40], None, [8]]
    params = [SamplingParams(temperature=0.0)] * 3
    out = Sampler().sample(logits, params, [None] * 3, allowed_token_ids=allowed)
    free = Sampler().sample(logits, params, [None] * 3)
    expected0 = max(allowed[0], key=lambda t: logits[0, t].item())
    assert out.ids == [expected0, free.ids[1], 8]
    raw = torch.log_softmax(logits, dim=-1)
    torch.testing.assert_close(out.logprobs, raw[torch.arange(3), out.token_ids])


def test_sampler_draws_only_allowed_tokens_and_in_their_proportions():
    """A row allowed tokens {2, 5}: every draw is one of them, in the ratio of their probabilities."""
    logits = torch.zeros(1, 8)
    logits[0, 2], logits[0, 5], logits[0, 7] = 1.0, 0.0, 5.0  # 7, the likeliest, is not allowed
    params = [SamplingParams(temperature=1.0)]
    draws = [
        Sampler().sample(logits, params, [torch.Generator().manual_seed(s)], allowed_token_ids=[[2, 5]]).ids[0]
        for s in range(600)
    ]
    assert set(draws) <= {2, 5}
    share = draws.count(2) / len(draws)
    expected = torch.softmax(torch.tensor([1.0, 0.0]), 0)[0].item()  # e / (e + 1)
    assert abs(share - expected) < 0.06


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.none() | st.lists(st.integers(0, 31), min_size=1, max_size=6, unique=True),
            st.sampled_from([0.0, 0.7, 1.5]),
            st.integers(0, 2**16),
        ),
        min_size=1,
        max_size=6,
    ),
    data=st.data(),
)
def test_sampler_rows_keep_to_their_allowed_tokens_whatever_the_batch(rows, data):
    """Any batch of guided and free rows, greedy and sampled: a guided row draws only an allowed token (greedy: the
    best of them by its logit), a free row draws what it draws alone, and every logprob is the raw one."""
    logits = torch.tensor(
        data.draw(
            st.lists(st.lists(st.floats(-8, 8), min_size=32, max_size=32), min_size=len(rows), max_size=len(rows))
        )
    )
    params = [SamplingParams(temperature=t) for _, t, _ in rows]
    gens = [torch.Generator().manual_seed(seed) for _, _, seed in rows]
    out = Sampler().sample(logits, params, gens, allowed_token_ids=[a for a, _, _ in rows])
    raw = torch.log_softmax(logits, dim=-1)
    for i, (allowed, t, seed) in enumerate(rows):
        token = out.ids[i]
        assert out.logprobs[i].item() == pytest.approx(raw[i, token].item(), abs=1e-6)
        if allowed is not None:
            assert token in allowed
            if t == 0.0:
                assert logits[i, token] == max(logits[i, a] for a in allowed)
        else:
            alone = Sampler().sample(logits[i : i + 1], [params[i]], [torch.Generator().manual_seed(seed)])
            assert token == alone.ids[0]


# --- validation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "choice, field",
    [
        ([], "guided_choice"),
        ([""], "guided_choice"),
        (["ok", 3], "guided_choice"),
        ("yes", "guided_choice"),  # a string, not a list of them
        (["x"] * (MAX_GUIDED_CHOICES + 1), "guided_choice"),
        (["x" * (MAX_GUIDED_CHOICE_CHARS + 1)], "guided_choice"),
    ],
)
def test_bad_choices_are_refused_naming_the_field(choice, field):
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(guided_choice=choice).validate(300)
    assert e.value.param == field


def test_min_tokens_is_refused_with_a_choice():
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(guided_choice=["a"], min_tokens=2).validate(300)
    assert e.value.param == "min_tokens"


def test_a_bad_choice_fails_its_request_only():
    e = engine(False)
    with pytest.raises(InvalidRequestError):
        e.add_request("bad", from_token_ids([1, 2]), SamplingParams(guided_choice=[""]))
    streams = drive(e, {0: [("add", "a1", SamplingParams(max_tokens=9, guided_choice=CHOICES))]})
    assert streams["a1"][-1][2][0][1] in CHOICES


# --- through the engine -------------------------------------------------------------------------------------


def final(streams: dict, name: str) -> tuple:
    """(text, token ids, finish reason) of a request's one choice when it finished."""
    _, _, ((_, text, tokens, finish, _, _),) = streams[name][-1]
    return text, list(tokens), finish


@pytest.mark.parametrize("mode", ["lazy", "block", "full"])
def test_every_sampled_answer_is_a_choice(mode):
    e = engine(False, mode)
    script = {
        0: [
            (
                "add",
                f"{name}{seed}",
                SamplingParams(max_tokens=9, temperature=1.5, seed=seed, guided_choice=CHOICES),
            )
            for seed, name in enumerate("abcde" * 4)
        ]
    }
    streams = drive(e, script)
    for name in streams:
        text, tokens, finish = final(streams, name)
        assert text in CHOICES, (name, text)
        assert finish == "stop"
        body = [t for t in tokens if t not in EOS_IDS]
        assert body == ids(text)  # the choice's own tokenization, an EOS only after a whole one
        assert tokens == body or (tokens[:-1] == body and tokens[-1] in EOS_IDS and text == "yes")


def expected_greedy(e, name: str, choices: tuple[str, ...]) -> str:
    """Greedy guided decoding by hand: the raw next-token distribution of the prompt plus what was chosen so far
    (`first_token_logprobs` of a free request), its best token among those that continue a choice."""
    docs, prompt = PROMPTS[name]
    guide = ChoiceGuide([ids(c) for c in choices], EOS_IDS)
    out: list[int] = []
    while not guide.ends(out):
        allowed = guide.allowed(out)
        e.add_request(
            "probe",
            from_token_ids(prompt + out, [DOCS[d] for d in docs]),
            SamplingParams(max_tokens=1, temperature=0.0, first_token_logprobs=True),
        )
        row = None
        while e.has_unfinished():
            for o in e.step():
                if o.finished:
                    row = o.outputs[0].first_token_logprobs
        best = max(allowed, key=lambda t: row[t].item())
        if best in EOS_IDS:
            break
        out.append(best)
    return bytes(out).decode()


@pytest.mark.parametrize("mode", ["lazy", "full"])
def test_greedy_picks_the_models_best_continuation_step_by_step(mode):
    choices = ("the cat", "the dog", "a dog", "z")
    e = engine(False, mode)
    for name in "abc":
        streams = drive(
            e, {0: [("add", name + "1", SamplingParams(max_tokens=9, temperature=0.0, guided_choice=choices))]}
        )
        text, _, finish = final(streams, name + "1")
        assert finish == "stop"
        assert text == expected_greedy(engine(False, mode), name, choices)


def test_logprobs_are_the_raw_distributions():
    """The chosen tokens' logprobs are those of the unconstrained distribution at the same prefix."""
    e = engine(False)
    guided = SamplingParams(max_tokens=9, temperature=0.0, guided_choice=("maybe",), logprobs=0)
    streams = drive(e, {0: [("add", "a1", guided)]})
    text, tokens, _ = final(streams, "a1")
    assert text == "maybe"
    docs, prompt = PROMPTS["a"]
    e2 = engine(False)
    got = []
    for i, t in enumerate(tokens):
        e2.add_request(
            f"p{i}",
            from_token_ids(prompt + tokens[:i], [DOCS[d] for d in docs]),
            SamplingParams(max_tokens=1, temperature=0.0, first_token_logprobs=True),
        )
        while e2.has_unfinished():
            for o in e2.step():
                if o.finished:
                    got.append(o.outputs[0].first_token_logprobs[t].item())
    entries = streams["a1"][-1][2][0][5]  # per token: (id, logprob rounded to 4 places) pairs
    assert entries is not None and len(entries) == len(tokens) == len(got)
    for entry, t, expected in zip(entries, tokens, got):
        lp = dict(entry)[t]
        assert lp == pytest.approx(expected, abs=1e-3)


def test_overlapped_scheduling_waits_for_a_guided_token_and_changes_no_answer():
    """A guided sequence's next allowed tokens depend on the token in flight: the overlapped engine plans no step
    of it before that token is read, and answers exactly as the synchronous engine does, beside free requests."""
    script = {
        0: [
            ("add", "a1", SamplingParams(max_tokens=9, temperature=1.2, seed=3, guided_choice=CHOICES)),
            ("add", "b1", SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)),
        ],
        2: [("add", "c1", SamplingParams(max_tokens=9, temperature=0.0, guided_choice=("maybe", "no")))],
    }
    sync, over = engine(False), engine(True)
    expected, got = drive(sync, script), drive(over, script)
    assert got == expected
    assert final(got, "a1")[0] in CHOICES and final(got, "c1")[0] in ("maybe", "no")
    alone = engine(True)
    drive(alone, {0: [("add", "c1", SamplingParams(max_tokens=9, temperature=0.0, guided_choice=("maybe",)))]})
    assert alone.pipeline.overlapped_steps == 0
    free = engine(True)
    drive(free, {0: [("add", "c1", SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True))]})
    assert free.pipeline.overlapped_steps > 0  # the same request, free, is overlapped


def test_a_choice_cut_by_max_tokens_ends_by_length():
    e = engine(False)
    streams = drive(e, {0: [("add", "a1", SamplingParams(max_tokens=3, temperature=0.0, guided_choice=("maybe",)))]})
    assert final(streams, "a1")[0] == "may" and final(streams, "a1")[2] == "length"


@pytest.mark.gpu
def test_gpu_guided_answers_are_choices_beside_free_requests():
    """On CUDA (pinned masks, overlapped scheduling), batch-invariant so that rows can be compared: guided answers
    are choices, a greedy one the model's best continuation step by step; the free requests beside them answer as they
    do alone."""
    from lazyattn.engine.config import EngineConfig
    from lazyattn.engine.llm_engine import LLMEngine

    def cuda_engine() -> LLMEngine:
        # deterministic: a row's logits do not depend on its neighbours (docs/design.md, "Deterministic mode")
        config = EngineConfig(
            model="tiny", mode="lazy", device="cuda", page_size=16, kv_cache_gb=0.5, deterministic=True, progress=False
        )
        return LLMEngine(config)

    guided = {
        f"{name}{seed}": SamplingParams(max_tokens=9, temperature=1.3, seed=seed, guided_choice=CHOICES)
        for seed, name in enumerate("abcde" * 3)
    }
    free = {f"{name}9": SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True) for name in "abc"}
    greedy = {"dg": SamplingParams(max_tokens=9, temperature=0.0, guided_choice=("the cat", "the dog", "z"))}
    mixed = drive(cuda_engine(), {0: [("add", k, p) for k, p in {**guided, **free, **greedy}.items()]})
    for name in guided:
        assert final(mixed, name)[0] in CHOICES and final(mixed, name)[2] == "stop"
    alone = drive(cuda_engine(), {0: [("add", k, p) for k, p in free.items()]})
    for name in free:
        assert final(mixed, name)[1] == final(alone, name)[1]
    assert final(mixed, "dg")[0] == expected_greedy(cuda_engine(), "d", ("the cat", "the dog", "z"))
