"""The greedy pick (kernels/greedy.py): argmax and the chosen token's logprob, against the PyTorch definition.
CPU: TRITON_INTERPRET=1; `gpu`: the 8B vocabulary, and the sampler's choice of path."""

from __future__ import annotations

import pytest
import torch

from lazyattn.kernels.greedy import greedy_pick, greedy_pick_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("rows,vocab", [(1, 100), (3, 4096), (2, 9000)])  # one chunk, exactly one, ragged third
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_argmax_and_log_softmax(rows, vocab, dtype):
    g = torch.Generator().manual_seed(vocab + rows)
    logits = (torch.randn(rows, vocab, generator=g) * 4).to(dtype).to(DEVICE)
    ids, logprobs = greedy_pick(logits)
    want_ids, want = greedy_pick_reference(logits)
    assert ids.dtype == torch.int64 and logprobs.dtype == torch.float32
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(logprobs, want, rtol=1e-5, atol=1e-5)


def test_ties_go_to_the_first_index_across_chunks():
    """Equal maxima in two chunks and within one: the lowest index wins, as torch.argmax."""
    logits = torch.zeros(3, 10000, device=DEVICE)
    logits[0, [9000, 5000]] = 7.0  # chunks 2 and 1
    logits[1, [4097, 4200, 8191]] = 3.0  # all in chunk 1
    logits[2, :] = -1.0  # every entry ties
    ids, logprobs = greedy_pick(logits)
    assert ids.tolist() == [5000, 4097, 0]
    torch.testing.assert_close(logprobs, greedy_pick_reference(logits)[1])
    # Hand-computed: row 2 is uniform, log(1/10000).
    assert abs(logprobs[2].item() - (-torch.log(torch.tensor(10000.0)).item())) < 1e-5


def test_the_logprob_is_nan_exactly_for_rows_that_are_not_a_distribution():
    """NaN, +inf or every entry -inf: NaN, as log_softmax gives (the engine ends such a request). A whole chunk of
    -inf in an otherwise finite row adds nothing to its sum."""
    logits = torch.randn(5, 9000, device=DEVICE)
    logits[1, 7] = float("nan")
    logits[2, 100] = float("inf")
    logits[3] = float("-inf")
    logits[4, :4096] = float("-inf")
    ids, logprobs = greedy_pick(logits)
    want_ids, want = greedy_pick_reference(logits)
    assert torch.equal(ids, want_ids)
    assert torch.isnan(logprobs).tolist() == [False, True, True, True, False]
    torch.testing.assert_close(logprobs, want, equal_nan=True)


def test_bad_logits_are_refused():
    with pytest.raises(ValueError, match="unit last stride"):
        greedy_pick(torch.zeros(8, 4, device=DEVICE).t())
    with pytest.raises(ValueError, match="vocab > 0"):
        greedy_pick(torch.zeros(2, 0, device=DEVICE))
    assert greedy_pick(torch.zeros(0, 5, device=DEVICE))[0].shape == (0,)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_sampler_takes_the_kernel_for_plain_greedy_rows_only(monkeypatch):
    """128K vocabulary, fp32 logits as the model gives them: the sampler's result equals its PyTorch path, with the
    kernel used only where every row is greedy, asks for no logprobs and suppresses nothing."""
    from lazyattn.engine.sampling import Sampler, SamplingParams
    from lazyattn.kernels import greedy

    calls = []
    real = greedy.greedy_pick
    monkeypatch.setattr(greedy, "greedy_pick", lambda x: calls.append(x.shape) or real(x))
    logits = torch.randn(4, 128256, device="cuda") * 3
    greedy_params = [SamplingParams(temperature=0.0)] * 4
    got = Sampler().sample(logits, greedy_params, [None] * 4)
    assert calls == [(4, 128256)]
    want_ids, want = greedy_pick_reference(logits)
    assert torch.equal(got.token_ids, want_ids)
    torch.testing.assert_close(got.logprobs, want, rtol=1e-5, atol=1e-5)
    Sampler().sample(logits, [SamplingParams(temperature=0.0, logprobs=2)] * 4, [None] * 4)
    Sampler().sample(logits, greedy_params, [None] * 4, suppress_token_ids=[[int(want_ids[0])], [], [], []])
    assert len(calls) == 1  # logprobs asked for, or a token suppressed: the PyTorch path
