"""The model against transformers' own forward: prefill, decode, and the lazy identity of docs/design.md, Semantics."""

import pytest
import torch

from lazyattn.kernels.reference import block_mask
from lazyattn.model import load_model
from tests.model.checkpoints import CASES, hf_logits
from tests.model.runner import PagedRunner, Run

TOL = 1e-4


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def random_tokens(n: int, seed: int, vocab: int = 300) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("name", list(CASES))
def test_prefill_and_decode_match_transformers(name, checkpoint):
    path, hf = checkpoint(name)
    model, cfg = load_model(path, dtype=torch.float32)
    runner = PagedRunner(model, cfg)
    tokens = [1] + random_tokens(20, seed=0)
    seg = runner.segment(32)
    got = runner.run([Run(tokens, seg)])[0]
    assert rel_err(got, hf_logits(hf, tokens)) < TOL
    nxt = int(got[-1].argmax())
    got = runner.run([Run([nxt], seg)])[0]
    assert rel_err(got[0], hf_logits(hf, tokens + [nxt])[-1]) < TOL


@pytest.mark.parametrize("name", list(CASES))
def test_lazy_identity_with_reordered_documents(name, checkpoint):
    """Documents encoded once, alone, at local positions; two final segments place them in both orders.

    Each must equal transformers over the concatenation at logical positions with the block mask, and
    the two orders must differ (the deltas really move the documents).
    """
    path, hf = checkpoint(name)
    model, cfg = load_model(path, dtype=torch.float32)
    runner = PagedRunner(model, cfg)
    docs = {"a": [1] + random_tokens(12, seed=1), "b": random_tokens(21, seed=2)}
    question = random_tokens(7, seed=3)
    segs = {k: runner.segment(len(v)) for k, v in docs.items()}
    runner.run([Run(docs[k], segs[k]) for k in docs])  # both documents in one batch, two entries

    orders = [["a", "b"], ["b", "a"]]
    finals, contexts, starts = [], [], []
    for order in orders:
        ctx, start = [], 0
        for k in order:
            ctx.append((segs[k], start))  # delta = logical start; the document was cached at 0
            start += len(docs[k])
        finals.append(runner.segment(len(question) + 1))
        contexts.append(ctx)
        starts.append(start)
    # Both requests share the documents' pages and run as one batch: prefill, then one decode step.
    prefill = runner.run([Run(question, f, s, c) for f, s, c in zip(finals, starts, contexts)])
    nexts = [int(lg[-1].argmax()) for lg in prefill]
    decode = runner.run([Run([t], f, s, c) for t, f, s, c in zip(nexts, finals, starts, contexts)])

    for order, got, nxt, dec in zip(orders, prefill, nexts, decode):
        concat = [t for k in order for t in docs[k]]
        tokens = concat + question + [nxt]
        visible = block_mask([len(docs[k]) for k in order], len(question) + 1)
        want = hf_logits(hf, tokens, positions=list(range(len(tokens))), visible=visible)
        assert rel_err(got, want[len(concat) : -1]) < TOL
        assert rel_err(dec[0], want[-1]) < TOL
    assert rel_err(prefill[0], prefill[1]) > 1e-3
