"""SamplingParams validation and the batched Sampler: greedy, truncation, distribution, seeding, logprobs."""

from __future__ import annotations

import pytest
import torch

from lazyattn.engine.sampling import (
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    Sampler,
    SamplingParams,
)
from lazyattn.errors import InvalidRequestError

V = 64
SAMPLER = Sampler()


def logits(batch: int, vocab: int = V, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sample(x: torch.Tensor, params: SamplingParams | list[SamplingParams], generators=None):
    plist = params if isinstance(params, list) else [params] * x.shape[0]
    return SAMPLER.sample(x, plist, generators if generators is not None else [None] * x.shape[0])


def test_greedy_is_argmax_and_equivalents():
    x = logits(16)
    expected = x.argmax(-1)
    for params in (
        SamplingParams(temperature=0.0),
        SamplingParams(top_k=1),
        SamplingParams(top_p=1e-6),
        SamplingParams(top_k=1, temperature=5.0),
        SamplingParams(min_p=1.0),
    ):
        torch.manual_seed(1)
        assert torch.equal(sample(x, params).token_ids, expected), params


def test_top_k_never_leaves_the_k_largest():
    x = logits(4).repeat(500, 1)
    k = 5
    out = sample(x, SamplingParams(temperature=2.0, top_k=k)).token_ids
    allowed = x.topk(k, dim=-1).indices
    assert bool((allowed == out[:, None]).any(-1).all())
    assert len(set(out.tolist())) > 4  # and it does sample, not just argmax


def test_top_p_never_leaves_the_nucleus():
    x = logits(1)
    probs = x.softmax(-1)[0]
    top_p = 0.6
    sorted_probs, order = probs.sort(descending=True)
    # The nucleus: the smallest set of most likely tokens whose mass reaches top_p.
    size = int((sorted_probs.cumsum(0) < top_p).sum()) + 1
    nucleus = set(order[:size].tolist())
    out = sample(x.repeat(2000, 1), SamplingParams(top_p=top_p)).token_ids
    assert set(out.tolist()) == nucleus


@pytest.mark.parametrize("top_p", [1e-30, 1e-46, 1e-300, 5e-324])
def test_a_tiny_top_p_keeps_the_likeliest_token(top_p):
    """A top_p that float32 rounds to 0 (below ~7e-46) once dropped every token: each row drew id 0."""
    x = logits(8)
    SamplingParams(top_p=top_p).validate(V)
    for seeded in (False, True):
        generators = [gen(i) for i in range(8)] if seeded else None
        out = sample(x, SamplingParams(temperature=1.0, top_p=top_p), generators).token_ids
        assert out.tolist() == x.argmax(-1).tolist()


def test_min_p_drops_unlikely_tokens():
    x = logits(1)
    probs = x.softmax(-1)[0]
    allowed = set((probs >= 0.2 * probs.max()).nonzero().flatten().tolist())
    out = sample(x.repeat(2000, 1), SamplingParams(min_p=0.2)).token_ids
    assert set(out.tolist()) == allowed


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_temperature_sampling_matches_softmax(temperature):
    vocab, draws = 6, 30000
    x = torch.tensor([[1.0, 0.5, 0.0, -0.5, -1.0, 2.0]])
    torch.manual_seed(0)
    out = sample(x.repeat(draws, 1), SamplingParams(temperature=temperature)).token_ids
    counts = torch.bincount(out, minlength=vocab).double()
    expected = (x[0].double() / temperature).softmax(-1) * draws
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 25.7  # chi-square, 5 degrees of freedom, p = 1e-4


def test_truncated_distribution_is_renormalised():
    """Inside the top-k set, frequencies follow the softmax restricted to that set."""
    x = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    draws = 30000
    torch.manual_seed(0)
    out = sample(x.repeat(draws, 1), SamplingParams(top_k=3)).token_ids
    counts = torch.bincount(out, minlength=5).double()
    assert counts[3:].sum() == 0
    expected = x[0, :3].double().softmax(-1) * draws
    assert float(((counts[:3] - expected) ** 2 / expected).sum()) < 18.4  # 2 dof, p = 1e-4


def test_seeded_rows_reproducible_and_independent_of_the_batch():
    x = logits(1, seed=3)
    params = SamplingParams(temperature=1.5, top_p=0.95, top_k=40, seed=7)

    def run(batch_builder) -> list[int]:
        g = gen(7)
        tokens = []
        for step in range(20):
            batch, plist, gens, row = batch_builder(step, g)
            tokens.append(int(sample(batch, plist, gens).token_ids[row]))
        return tokens

    alone = run(lambda step, g: (x, [params], [g], 0))
    again = run(lambda step, g: (x, [params], [g], 0))

    # Neighbours change from step to step: another seeded row, an unseeded row, a greedy row.
    def crowded(step, g):
        others = logits(3, seed=100 + step)
        batch = torch.cat([others[:1], x, others[1:]])
        plist = [SamplingParams(top_k=3, seed=step), params, SamplingParams(), SamplingParams(temperature=0.0)]
        return batch, plist, [gen(step), g, None, None], 1

    mixed = run(crowded)
    assert alone == again == mixed
    assert len(set(alone)) > 1
    different_seed = [int(sample(x, [params], [gen(8)]).token_ids[0]) for _ in range(20)]
    assert different_seed != alone


def test_mixed_batch_each_row_follows_its_params():
    x = logits(3)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(top_k=1, temperature=3.0),
        SamplingParams(temperature=1.0, top_k=2),
    ]
    out = sample(x, params).token_ids
    assert out[0] == x[0].argmax() and out[1] == x[1].argmax()
    assert int(out[2]) in x[2].topk(2).indices.tolist()


def test_logprobs_are_log_softmax_of_raw_logits():
    x = logits(5)
    params = [
        SamplingParams(temperature=0.5, top_k=3, logprobs=4),
        SamplingParams(temperature=0.0),
        SamplingParams(logprobs=0),
        SamplingParams(top_p=0.5, logprobs=20),
        SamplingParams(logprobs=1),
    ]
    result = sample(x, params)
    reference = torch.log_softmax(x, dim=-1)
    assert torch.allclose(result.logprobs, reference.gather(1, result.token_ids[:, None]).squeeze(1))
    top = result.top_logprobs
    assert top is not None and top[1] is None and top[2] == []
    for row, k in ((0, 4), (3, 20), (4, 1)):
        values, ids = reference[row].topk(k)
        assert [t for t, _ in top[row]] == ids.tolist()
        assert torch.allclose(torch.tensor([v for _, v in top[row]]), values)
    assert sample(x, SamplingParams()).top_logprobs is None


def test_suppressed_tokens_are_never_sampled():
    x = logits(8)
    banned = x.argmax(-1)
    suppress = [[int(b)] for b in banned]
    out = SAMPLER.sample(x, [SamplingParams(temperature=0.0)] * 8, [None] * 8, suppress)
    assert bool((out.token_ids != banned).all())
    assert torch.equal(out.token_ids, x.scatter(1, banned[:, None], float("-inf")).argmax(-1))
    # Logprobs still describe the model's own distribution.
    assert torch.allclose(out.logprobs, torch.log_softmax(x, -1).gather(1, out.token_ids[:, None]).squeeze(1))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, top_p=0.9, top_k=8, seed=3),
        SamplingParams(temperature=1.0, min_p=0.1, logprobs=3),
    ],
)
def test_rows_that_are_not_a_distribution_are_flagged_and_their_neighbours_sampled_as_alone(params):
    """A NaN, a +inf or every entry -inf makes a row non-finite (its chosen logprob is NaN); a row with some -inf
    entries is a distribution. The other rows' tokens are what they would be without the bad rows."""
    x = logits(6)
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    x[3] = float("-inf")
    x[4, : V // 2] = float("-inf")
    generators = [gen(i) if params.seed is not None else None for i in range(6)]
    torch.manual_seed(0)
    out = SAMPLER.sample(x, [params] * 6, generators, [[0, 1]] * 6)
    assert out.non_finite_rows == {1, 2, 3}
    for row in (0, 4, 5):
        torch.manual_seed(0)
        g = [gen(row)] if params.seed is not None else [None]
        alone = SAMPLER.sample(x[row : row + 1], [params], g, [[0, 1]])
        assert alone.non_finite_rows == set()
        if params.seed is not None or params.greedy:  # the shared draw depends on the batch
            assert out.ids[row] == alone.ids[0]


def test_sampling_params_normalises_stop_and_is_hashable():
    p = SamplingParams(stop="\n", stop_token_ids=[5, 6])
    assert p.stop == ("\n",) and p.stop_token_ids == (5, 6)
    assert hash(p) == hash(SamplingParams(stop=["\n"], stop_token_ids=(5, 6)))
    assert SamplingParams(temperature=0).greedy and not SamplingParams().greedy
    SamplingParams().validate(V)
    SamplingParams(
        max_tokens=1,
        temperature=0.0,
        top_p=1.0,
        top_k=0,
        n=4,
        logprobs=20,
        min_tokens=1,
        seed=0,
        stop_token_ids=[V - 1],
    ).validate(V)


def test_validation_accepts_the_edges_of_every_range():
    SamplingParams(
        top_k=V, seed=2**63 - 1, stop=["x" * MAX_STOP_CHARS] * MAX_STOP_STRINGS, stop_token_ids=[0] * MAX_STOP_TOKEN_IDS
    ).validate(V)
    SamplingParams(top_k=-1, seed=-(2**63)).validate(V)
    # min_tokens past max_tokens only means EOS is held back until the length limit ends the sequence.
    SamplingParams(max_tokens=4, min_tokens=100).validate(V)
    # The largest seed of a request of n samples still seeds every sample's generator.
    n = 128
    for i in range(n):
        torch.Generator().manual_seed(2**63 - 1 + i)
        torch.Generator().manual_seed(-(2**63) + i)


def test_a_huge_top_k_is_clamped_to_the_vocabulary_in_the_sampler():
    # Validation rejects top_k > vocabulary; the sampler also clamps, so even unvalidated params cannot make
    # the batched draw raise for every row.
    x = logits(3)
    params = [SamplingParams(top_k=2**63, top_p=0.5), SamplingParams(top_k=-1, top_p=0.5), SamplingParams()]
    gens = [gen(7), gen(7), gen(8)]
    out = SAMPLER.sample(x, params, gens)
    expected = SAMPLER.sample(x, [SamplingParams(top_p=0.5)] * 2 + [SamplingParams()], [gen(7), gen(7), gen(8)])
    assert torch.equal(out.token_ids, expected.token_ids)


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"n": 0}, "n"),
        ({"logprobs": -1}, "logprobs"),
        ({"logprobs": 21}, "logprobs"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"seed": "x"}, "seed"),
        ({"seed": 2**63}, "seed"),  # outside signed 64 bits: torch's manual_seed overflows at seed + n
        ({"seed": -(2**63) - 1}, "seed"),
        ({"top_k": V + 1}, "top_k"),
        ({"top_k": 2**63, "top_p": 0.5}, "top_k"),  # would overflow the sampler's id tensor
        ({"stop": ["ok", ""]}, "stop"),
        ({"stop": ["x"] * (MAX_STOP_STRINGS + 1)}, "stop"),
        ({"stop": "x" * (MAX_STOP_CHARS + 1)}, "stop"),
        ({"stop_token_ids": [1] * (MAX_STOP_TOKEN_IDS + 1)}, "stop_token_ids"),
        ({"stop": 5}, "stop"),
        ({"stop_token_ids": 5}, "stop_token_ids"),
        ({"stop_token_ids": [V]}, "stop_token_ids"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"skip_special_tokens": 1}, "skip_special_tokens"),
    ],
)
def test_validation_errors(kwargs, param):
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(**kwargs).validate(V)
    assert e.value.param == param
