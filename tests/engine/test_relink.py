"""Relink (docs/design.md, "Relink"): lazy mode recomputing the first k rows of each placed document in context,
against an independent transformers reference, plus page accounting and isolation from other requests."""

from __future__ import annotations

import pytest
import torch

from lazyattn import LLM, RequestOptions, SamplingParams
from lazyattn.engine.invariants import check_runs
from lazyattn.engine.prompt import from_token_ids
from lazyattn.errors import CacheInvariantError, ContextTooLongError, InvalidRequestError
from lazyattn.finetune.masks import row
from tests.engine.test_engine import DOCS, GEN, REQUESTS, generate, greedy, make_llm, token_bos
from tests.model.checkpoints import hf_logits

ARCHS = ["llama", "llama31", "llama_bias", "qwen2", "qwen3", "mistral", "tied"]


def relinked_layout(segments: list[list[int]], k: int, tail: list[int], last: int = 0):
    """transformers' input for the relink semantics, in one forward pass: (tokens, positions, mask).

    The rows are: every segment encoded alone at its logical positions (standalone KV: each attends only
    within its own segment), then for each segment after the first its recomputed first k_i = min(k, L_i) rows
    and its recomputed last m_i = min(last, L_i - k_i) rows, then the final segment plus generated tokens. Segment
    j as a later row reads it: its recomputed first rows, its standalone rows k_j .. L_j - m_j - 1, its recomputed
    last rows. A recomputed first row of segment i sees the first segment and every earlier segment so read, and
    its own recomputed first rows causally; a recomputed last row sees the same, then segment i's recomputed first
    rows and standalone middle rows, and its own recomputed last rows causally; the final rows see every segment so
    read and themselves causally. Standalone rows that a relink replaces only serve the other standalone rows of
    their segment."""
    starts = [sum(len(s) for s in segments[:i]) for i in range(len(segments))]
    ks = [0] + [min(k, len(s)) for s in segments[1:]]
    ms = [0] + [min(last, len(s) - n) for s, n in zip(segments[1:], ks[1:])]
    rows: list[tuple[int, int]] = []  # (token, position) in input order
    standalone: list[list[int]] = []  # input rows of each segment's standalone encoding
    for seg, s in zip(segments, starts):
        standalone.append(list(range(len(rows), len(rows) + len(seg))))
        rows += [(t, s + i) for i, t in enumerate(seg)]
    heads: list[list[int]] = [[]]
    tails: list[list[int]] = [[]]
    for seg, s, n, m in zip(segments[1:], starts[1:], ks[1:], ms[1:]):
        heads.append(list(range(len(rows), len(rows) + n)))
        rows += [(t, s + i) for i, t in enumerate(seg[:n])]
        tails.append(list(range(len(rows), len(rows) + m)))
        rows += [(t, s + len(seg) - m + i) for i, t in enumerate(seg[len(seg) - m :])]
    final_lo = len(rows)
    rows += [(t, starts[-1] + len(segments[-1]) + i) for i, t in enumerate(tail)]
    mask = torch.zeros(len(rows), len(rows), dtype=torch.bool)
    for seg_rows in standalone:
        for a, r in enumerate(seg_rows):
            mask[r, seg_rows[: a + 1]] = True

    def middle(j: int) -> list[int]:  # segment j's standalone rows that are read
        return standalone[j][ks[j] : len(segments[j]) - ms[j]]

    def context(upto: int) -> list[int]:  # what segment `upto`'s recomputed rows (or the final) read before them
        seen = list(standalone[0])
        for j in range(1, upto):
            seen += heads[j] + middle(j) + tails[j]
        return seen

    for i in range(1, len(segments)):
        for a, r in enumerate(heads[i]):
            mask[r, context(i) + heads[i][: a + 1]] = True
        for a, r in enumerate(tails[i]):
            mask[r, context(i) + heads[i] + middle(i) + tails[i][: a + 1]] = True
    for r in range(final_lo, len(rows)):
        mask[r, context(len(segments)) + list(range(final_lo, r + 1))] = True
    return [t for t, _ in rows], [p for _, p in rows], mask


def hf_relinked_rollout(model, segments, prompt, k: int, last: int = 0) -> list[torch.Tensor]:
    """Greedy log-probs of each generated position under the relink semantics."""
    tail = list(prompt)
    out = []
    for _ in range(GEN):
        tokens, positions, mask = relinked_layout(segments, k, tail, last)
        lp = torch.log_softmax(hf_logits(model, tokens, positions, mask)[-1].double(), -1)
        out.append(lp)
        tail.append(int(lp.argmax()))
    return out


def assert_relinked_matches(outs, model, requests, bos, k, atol=2e-4, last=0):
    for out, (docs, prompt) in zip(outs, requests):
        rendered = from_token_ids(prompt, [DOCS[d] for d in docs], bos)
        want = hf_relinked_rollout(model, rendered.segments, rendered.final, k, last)
        assert out.token_ids == [int(lp.argmax()) for lp in want]
        for got, lp in zip(out.outputs[0].logprobs, want):
            ids = torch.tensor(list(got))
            assert torch.allclose(torch.tensor(list(got.values()), dtype=torch.float64), lp[ids], atol=atol)


@pytest.mark.parametrize("name", ARCHS)
@pytest.mark.parametrize("k", [3, 20])
def test_relink_matches_transformers(checkpoint, name, k):
    """Page size 16: k = 3 cuts a document's first page, k = 20 drops it and cuts the second; document "c"
    (16 tokens) shorter than 20 is recomputed whole. Engine default for one k, per request for the other."""
    if k == 3:
        llm = make_llm(checkpoint, name, "lazy", relink_tokens=k)
        outs = generate(llm)
    else:
        llm = make_llm(checkpoint, name, "lazy")
        outs = llm.generate(
            prompt_token_ids=[p for _, p in REQUESTS],
            document_token_ids=[[DOCS[d] for d in docs] for docs, _ in REQUESTS],
            sampling_params=greedy(logprobs=20),
            relink_tokens=k,
        )
    assert_relinked_matches(outs, checkpoint(name)[1], REQUESTS, token_bos(llm), k)


@pytest.mark.parametrize("name", ["llama", "qwen3", "tied"])
@pytest.mark.parametrize(("k", "last"), [(0, 5), (3, 20), (0, 16)])
def test_relink_last_rows_matches_transformers(checkpoint, name, k, last):
    """The last rows recomputed, alone or with the first: page size 16 and documents of 37, 20 and 16 tokens.
    (0, 5): "a"'s last page (5 rows) drops out and "b"'s and "c"'s last page is cut; (3, 20): "a" keeps only
    rows 3..16 of its shared copy, across a page boundary, "b" none of it and "c" is recomputed whole, first 3
    rows then 13; (0, 16): a whole page recomputed at the end of "a" (rows 21..36 of 37)."""
    llm = make_llm(checkpoint, name, "lazy", relink_last_tokens=last) if k == 0 else make_llm(checkpoint, name, "lazy")
    outs = llm.generate(
        prompt_token_ids=[p for _, p in REQUESTS],
        document_token_ids=[[DOCS[d] for d in docs] for docs, _ in REQUESTS],
        sampling_params=greedy(logprobs=20),
        **({} if k == 0 else {"relink_tokens": k, "relink_last_tokens": last}),
    )
    assert_relinked_matches(outs, checkpoint(name)[1], REQUESTS, token_bos(llm), k, last=last)


def prefix_relinked_last_layout(segments: list[list[int]], last: int, tail: list[int]):
    """transformers' input for documents encoded after the first segment (ape_prefix) with their last rows
    recomputed: finetune/masks.py's shared-prefix row (each document after its own copy of S_0), where each
    document's last min(last, L_i) rows instead see S_0 itself, every earlier document as its row holds it, and
    their own document causally. Recomputing them in place is the same as beside the standalone rows: only
    standalone rows after them, themselves replaced, ever read them."""
    r = row(segments, tail, block=True, ape_prefix=True)
    seen, first = r.visible.clone(), len(segments[0])
    spans, at = [], first
    for i, seg in enumerate(segments[1:]):
        at += first if i else 0  # documents after the first sit after their copy of S_0
        spans.append((at, at + len(seg)))
        at += len(seg)
    for i, (lo, hi) in enumerate(spans):
        m = min(last, hi - lo)
        seen[hi - m : hi] = False
        seen[hi - m : hi, :first] = True
        for a, b in spans[:i]:
            seen[hi - m : hi, a:b] = True
        seen[hi - m : hi, lo:hi] = torch.ones(m, hi - lo, dtype=torch.bool).tril(hi - m - lo)
    return r.tokens, r.positions, seen


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_relink_last_rows_after_the_shared_prefix_matches_transformers(checkpoint, name):
    """ape_prefix with relink_last_tokens = 5 (how few-shot demonstrations are read, docs/quality.md) against the
    independent construction above, a system segment of 6 tokens first."""
    last = 5
    llm = make_llm(checkpoint, name, "lazy", ape_prefix=True, relink_last_tokens=last)
    bos = token_bos(llm)
    system = ([] if bos is None else [bos]) + [5, 6, 7, 8, 9]
    model = checkpoint(name)[1]
    requests = [(["a", "b"], [40, 41, 42]), (["b", "a", "c"], [50, 51])]
    outs = llm.generate(
        prompt_token_ids=[p for _, p in requests],
        document_token_ids=[[system] + [DOCS[d] for d in docs] for docs, _ in requests],
        sampling_params=greedy(logprobs=20),
    )
    for out, (docs, prompt) in zip(outs, requests):
        segments = [system] + [DOCS[d] for d in docs]
        tail = list(prompt)
        for got in out.outputs[0].logprobs:
            lp = torch.log_softmax(
                hf_logits(model, *prefix_relinked_last_layout(segments, last, tail))[-1].double(), -1
            )
            ids = torch.tensor(list(got))
            assert torch.allclose(torch.tensor(list(got.values()), dtype=torch.float64), lp[ids], atol=2e-4)
            tail.append(int(lp.argmax()))
        assert out.token_ids == tail[len(prompt) :]


def test_the_reference_is_not_block_attention(checkpoint):
    """Sanity of the reference itself: relinking changes transformers' answer and k = 0 is block attention."""
    model = checkpoint("llama")[1]
    segments = from_token_ids(REQUESTS[1][1], [DOCS[d] for d in REQUESTS[1][0]], 1).segments
    prompt = REQUESTS[1][1]
    plain = hf_logits(model, *relinked_layout(segments, 0, prompt))[-1]
    relinked = hf_logits(model, *relinked_layout(segments, 8, prompt))[-1]
    assert (plain - relinked).abs().max() > 1e-3
    from lazyattn.kernels.reference import block_mask

    tokens = [t for s in segments for t in s] + prompt
    block = hf_logits(model, tokens, list(range(len(tokens))), block_mask([len(s) for s in segments], len(prompt)))
    assert torch.allclose(plain, block[-1], atol=1e-4)
    tail_relinked = hf_logits(model, *relinked_layout(segments, 0, prompt, last=4))[-1]
    assert (plain - tail_relinked).abs().max() > 1e-3
    assert (relinked - tail_relinked).abs().max() > 1e-3


def test_relink_zero_is_plain_lazy(checkpoint):
    plain = generate(make_llm(checkpoint, "qwen2", "lazy"))
    zero = generate(make_llm(checkpoint, "qwen2", "lazy", relink_tokens=0))
    per_request = make_llm(checkpoint, "qwen2", "lazy", relink_tokens=4).generate(
        prompt_token_ids=[p for _, p in REQUESTS],
        document_token_ids=[[DOCS[d] for d in docs] for docs, _ in REQUESTS],
        sampling_params=greedy(logprobs=20),
        relink_tokens=0,
    )
    for a, b, c in zip(plain, zero, per_request):
        assert a.token_ids == b.token_ids == c.token_ids
        assert a.outputs[0].logprobs == b.outputs[0].logprobs == c.outputs[0].logprobs


def test_shared_copy_is_untouched_by_a_relinked_request(checkpoint):
    """A relinked request writes only its private pages: another request without relink gets the same output
    before and after it, and the cached documents' pages hold the same bytes."""
    llm = make_llm(checkpoint, "llama", "lazy")
    generate(llm, REQUESTS[1:2])  # documents cached: later runs have the same batch shapes (same rounding)
    before = generate(llm, REQUESTS[1:2])
    kv = llm.engine.executor.runner.backend.kv
    cached = kv.clone()
    relinked = llm.generate(
        prompt_token_ids=[REQUESTS[1][1]],
        document_token_ids=[[DOCS[d] for d in REQUESTS[1][0]]],
        sampling_params=greedy(logprobs=20),
        relink_tokens=20,
    )
    segments = from_token_ids([40], [DOCS[d] for d in REQUESTS[1][0]], token_bos(llm)).segments
    shared = [p for s in segments for p in llm.engine.cache.lookup(llm.engine.keyer(s, None, None)).pages]
    assert torch.equal(kv[:, :, shared], cached[:, :, shared])
    after = generate(llm, REQUESTS[1:2])
    assert before[0].token_ids == after[0].token_ids
    assert before[0].outputs[0].logprobs == after[0].outputs[0].logprobs
    assert relinked[0].outputs[0].logprobs != before[0].outputs[0].logprobs


def test_private_pages_are_freed_after_finish_and_abort(checkpoint):
    llm = make_llm(checkpoint, "llama", "lazy", relink_tokens=20)
    generate(llm, params=SamplingParams(max_tokens=4, temperature=0.8, seed=1, n=2))
    engine = llm.engine
    assert engine.pool.num_used == engine.cache.stats().pages_in_use
    rendered = from_token_ids([40, 41], [DOCS["d"], DOCS["e"], DOCS["a"]], token_bos(llm))
    engine.add_request("abort-me", rendered, greedy())
    engine.step()  # documents encoded and relinked rows computed: private pages held
    seq = engine.requests["abort-me"].seqs[0]
    assert seq.mode_state.runs and all(r.pages for r in seq.mode_state.runs)
    assert engine.pool.num_used > engine.cache.stats().pages_in_use
    engine.abort("abort-me")
    assert engine.pool.num_used == engine.cache.stats().pages_in_use


def packed_request(checkpoint):
    """An engine that has run one step of a request whose three documents after the first recompute their last 3
    rows each, and that request's sequence."""
    llm = make_llm(checkpoint, "llama", "lazy")
    engine = llm.engine
    rendered = from_token_ids([40, 41], [DOCS["d"], DOCS["e"], DOCS["a"], DOCS["f"]], token_bos(llm))
    engine.add_request("packed", rendered, greedy(), options=RequestOptions(relink_last_tokens=3))
    engine.step()
    return engine, engine.requests["packed"].seqs[0]


def test_recomputed_rows_are_packed_into_shared_private_pages(checkpoint):
    """The last 3 rows of the three documents after the first (9 rows) take one private page, not one each: the
    pool holds the cached documents, the final segment's page and that one page, and the three runs sit one after
    another in it."""
    engine, seq = packed_request(checkpoint)
    runs = seq.mode_state.runs
    assert [len(r.tokens) for r in runs] == [3, 3, 3] and [r.first_slot for r in runs] == [0, 3, 6]
    assert len({p for r in runs for p in r.pages}) == 1 and seq.mode_state.private_pages() == [runs[0].pages]
    assert engine.pool.num_used == engine.cache.stats().pages_in_use + len(seq.run.pages) + 1
    engine.abort("packed")
    assert engine.pool.num_used == engine.cache.stats().pages_in_use


def test_the_invariant_check_finds_runs_that_share_slots_or_lack_a_page(checkpoint):
    """engine/invariants.py's check of placed recomputed runs: the scheduler's packing passes it; a run moved onto
    its neighbour's slots, or a page short, is named."""
    engine, seq = packed_request(checkpoint)
    check_runs(seq, 16)
    second = seq.mode_state.runs[1]
    second.first_slot = 1  # rows 1..3: the first run's slots 1 and 2
    with pytest.raises(CacheInvariantError, match="share slots"):
        check_runs(seq, 16)
    second.first_slot, pages = 3, second.pages
    second.pages = []  # not placed: not checked
    check_runs(seq, 16)
    second.first_slot = 15  # rows 15..17 need a second page
    second.pages = pages
    with pytest.raises(CacheInvariantError, match="holds 1 pages"):
        check_runs(seq, 16)
    second.first_slot = 3
    engine.abort("packed")


@pytest.mark.parametrize(("k", "last"), [(0, 0), (3, 0), (0, 4), (3, 20)])
def test_recomputed_rows_and_the_first_token_share_one_step(checkpoint, k, last):
    """With the documents cached and budget to spare, the recomputed rows of every document and the final segment
    go in one forward pass (each layer writes every row's K/V before any row attends): the first token comes from
    the first step, as without relink."""
    llm = make_llm(checkpoint, "llama", "lazy")
    generate(llm, REQUESTS[1:2])  # documents cached
    engine = llm.engine
    rendered = from_token_ids(REQUESTS[1][1], [DOCS[d] for d in REQUESTS[1][0]], token_bos(llm))
    options = RequestOptions(relink_tokens=k, relink_last_tokens=last)
    engine.add_request("one-step", rendered, greedy(), options=options)
    outs = [o for o in engine.step() if o.request_id == "one-step"]
    assert outs and len(outs[0].outputs[0].token_ids) == 1
    engine.abort("one-step")


def test_page_count_includes_the_private_rows(checkpoint):
    """pages_needed counts a sample's recomputed rows of every document packed into shared private pages
    (cdiv of their sum), per sample: validation refuses a request that fits without relink but not with it, and
    max_new_tokens shrinks by exactly those pages."""
    llm = make_llm(checkpoint, "llama", "lazy")
    engine = llm.engine
    docs = [DOCS[d] for d in "adefg"]
    rendered = from_token_ids([40], docs, token_bos(llm))
    lens = [len(s) for s in rendered.segments]
    plain = engine.mode.pages_needed(lens, 1 + 5, 2, 16)
    assert lens[1:] == [45, 30, 40, 40]  # so 20 first rows each: 80 rows, 5 pages of 16 a sample
    assert engine.mode.pages_needed(lens, 1 + 5, 2, 16, (20, 0)) - plain == 2 * 5
    # and up to 30 last rows of what is left: 25 + 10 + 20 + 20 = 75 more, 155 rows, 10 pages a sample
    assert engine.mode.pages_needed(lens, 1 + 5, 2, 16, (20, 30)) - plain == 2 * 10
    page_bytes = llm.stats().page_bytes
    tight = make_llm(checkpoint, "llama", "lazy", kv_cache_gb=plain * page_bytes / 2**30)
    params = SamplingParams(max_tokens=5, n=2, temperature=0.5, seed=0)
    assert plain >= 16  # the smallest pool an engine takes
    tight.generate(prompt_token_ids=[[40]], document_token_ids=[docs], sampling_params=params)
    with pytest.raises(ContextTooLongError):
        tight.generate(prompt_token_ids=[[40]], document_token_ids=[docs], sampling_params=params, relink_tokens=20)
    with pytest.raises(ContextTooLongError):
        tight.generate(
            prompt_token_ids=[[40]], document_token_ids=[docs], sampling_params=params, relink_last_tokens=20
        )
    assert tight.engine.max_new_tokens(rendered, 1, RequestOptions(relink_tokens=20)) < tight.engine.max_new_tokens(
        rendered, 1
    )
    assert tight.engine.max_new_tokens(
        rendered, 1, RequestOptions(relink_last_tokens=20)
    ) < tight.engine.max_new_tokens(rendered, 1)


def test_tiny_pool_preempts_relinked_requests_and_stays_correct(checkpoint):
    requests = (REQUESTS + [(["d", "e"], [80, 81, 82]), (["e", "b", "d"], [83])]) * 2

    def run(llm):
        return llm.generate(
            prompt_token_ids=[p for _, p in requests],
            document_token_ids=[[DOCS[d] for d in docs] for docs, _ in requests],
            sampling_params=greedy(),
            relink_tokens=20,
        )

    roomy = run(make_llm(checkpoint, "llama", "lazy"))
    page_bytes = make_llm(checkpoint, "llama", "lazy").stats().page_bytes
    tight = make_llm(checkpoint, "llama", "lazy", kv_cache_gb=20 * page_bytes / 2**30, max_num_batched_tokens=24)
    assert [o.token_ids for o in run(tight)] == [o.token_ids for o in roomy]
    stats = tight.stats()
    assert stats.cache.evictions + stats.preemptions > 0
    assert tight.engine.pool.num_used == stats.cache.pages_in_use


@pytest.mark.parametrize("mode", ["block", "prefix", "full"])
@pytest.mark.parametrize("option", ["relink_tokens", "relink_last_tokens"])
def test_relink_outside_lazy_mode_is_refused(checkpoint, mode, option):
    with pytest.raises(InvalidRequestError, match=option):
        make_llm(checkpoint, "llama", mode, **{option: 4})
    llm = make_llm(checkpoint, "llama", mode)
    with pytest.raises(InvalidRequestError, match=option):
        llm.generate(prompt_token_ids=[[40]], document_token_ids=[[DOCS["a"]]], sampling_params=greedy(), **{option: 4})
    assert not llm.engine.has_unfinished()
    assert len(generate(llm, REQUESTS[:1])[0].token_ids) == GEN  # relink 0 is fine in any mode


def test_bad_relink_values_are_refused(checkpoint):
    llm = make_llm(checkpoint, "llama", "lazy")
    for option in ("relink_tokens", "relink_last_tokens"):
        for bad in (-1, 2.5, True):
            with pytest.raises(InvalidRequestError, match=option):
                llm.generate(prompt_token_ids=[[40]], sampling_params=greedy(), **{option: bad})
    assert not llm.engine.has_unfinished()


# --- GPU: the Triton kernels end to end, fp32, against the same reference -----------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["llama31", "qwen3"])
@pytest.mark.parametrize(("k", "last"), [(20, 0), (3, 20)])
def test_gpu_relink_matches_transformers(checkpoint, name, k, last):
    directory, model = checkpoint(name)
    llm = LLM(
        model=str(directory),
        mode="lazy",
        device="cuda",
        dtype="float32",
        page_size=16,
        progress=False,
        kv_cache_gb=0.05,
        relink_tokens=k,
        relink_last_tokens=last,
    )
    outs = generate(llm)
    assert_relinked_matches(outs, model, REQUESTS, token_bos(llm), k, atol=1e-3, last=last)
    llm.shutdown()
