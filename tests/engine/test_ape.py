"""Attention temperature and scale on documents (docs/design.md, "APE"): lazy and block mode against an independent
transformers reference (one forward over the concatenation, with an attention function registered in transformers
that turns the final segment's scores against document keys into s / T + ln S), plus the option's checks."""

from __future__ import annotations

import math

import pytest
import torch

from lazyattn import LLM, RequestOptions, SamplingParams
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.graph_inputs import StepInputs, ape_views, fill_tables, has_ape, table_count, table_views
from lazyattn.engine.prefill_graphs import StepLayout
from lazyattn.engine.prompt import RenderedPrompt, from_token_ids
from lazyattn.errors import InvalidRequestError
from lazyattn.kernels import reference
from lazyattn.kernels.paged import EntryPages, PagedBatch
from lazyattn.kernels.reference import block_mask
from tests.engine.test_engine import DOCS, GEN, REQUESTS, generate, greedy, make_llm, token_bos
from tests.engine.test_engine_gpu import capture_logits, config_dir, hf_model_with_weights_of, random_docs, rel, run_all
from tests.model.checkpoints import hf_logits

# What the registered attention function applies to the forward in progress: visibility [T, T] and, per
# (query, key), the multiplier 1/T and the bias ln S of the score.
_LAYOUT: dict[str, torch.Tensor] = {}


def _ape_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention with per-(query, key) temperature and scale; query [B, H, T, D], key/value [B, Hkv, T, D].
    With ape_prefix, the final rows read document i's keys (rotated at their encoding positions L_0 + j) moved on to
    their logical positions s_i + j: rotated further by s_i - L_0 with transformers' own RoPE."""
    group = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if "shift" in _LAYOUT:
        from transformers.models.llama.modeling_llama import rotate_half

        cos, sin = _LAYOUT["rotary"](value, _LAYOUT["shift"][None])
        moved = key * cos[:, None] + rotate_half(key) * sin[:, None]
        final = _LAYOUT["final_rows"][:, None]
        scores = torch.where(final, torch.matmul(query, moved.transpose(2, 3)) * scaling, scores)
    scores = scores * _LAYOUT["inv_temp"] + _LAYOUT["log_scale"]
    scores = scores.masked_fill(~_LAYOUT["visible"], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def _register() -> str:
    from transformers import AttentionInterface

    AttentionInterface.register("ape_reference", _ape_attention)
    return "ape_reference"


def tilted(s: float, tilt: float, n: int) -> list[float]:
    """ln S_i of n documents under a tilt, written out: the first document ln S + tilt/2, the last ln S - tilt/2,
    evenly spaced between; one document ln S."""
    if n == 1:
        return [math.log(s)]
    step = tilt / (n - 1)
    return [math.log(s) + tilt / 2 - i * step for i in range(n)]


def ape_logits(
    model,
    segments: list[list[int]],
    tail: list[int],
    t: float,
    s: float,
    prefix: bool = False,
    tilt: float = 0.0,
    parallel: bool = False,
):
    """transformers' logits over the concatenation under block attention with (T, S) on the documents after the
    first segment, ln S tilted per document by `tilt`. prefix (ape_prefix): each document's rows see the first
    segment and sit at positions from its length (as encoded once for every slot); the final rows see each
    document's keys at their logical positions. parallel (ape_parallel): every document's rows sit at positions from
    the first segment's length, and the final rows after the longest document."""
    tokens = [x for seg in segments for x in seg] + tail
    n, n_ctx, first = len(tokens), len(tokens) - len(tail), len(segments[0])
    inv = torch.ones(n, n, dtype=torch.float32)
    log = torch.zeros(n, n, dtype=torch.float32)
    inv[n_ctx:, first:n_ctx] = 1.0 / t
    start = first
    for seg, bias in zip(segments[1:], tilted(s, tilt, len(segments) - 1)):
        log[n_ctx:, start : start + len(seg)] = bias
        start += len(seg)
    visible = block_mask([len(x) for x in segments], len(tail))
    positions = list(range(n))
    shift = torch.zeros(n, dtype=torch.long)
    if prefix or parallel:
        start = first
        for seg in segments[1:]:
            positions[start : start + len(seg)] = range(first, first + len(seg))
            if prefix and not parallel:
                shift[start : start + len(seg)] = start - first
            if prefix:
                visible[start : start + len(seg), :first] = True
            start += len(seg)
    if parallel and len(segments) > 1:
        top = first + max(len(seg) for seg in segments[1:])
        positions[n_ctx:] = range(top, top + len(tail))
    dev = next(model.parameters()).device
    _LAYOUT.update(inv_temp=inv.to(dev), log_scale=log.to(dev), visible=visible.to(dev))
    if prefix and not parallel:
        final_rows = torch.arange(n) >= n_ctx
        _LAYOUT.update(shift=shift.to(dev), final_rows=final_rows.to(dev), rotary=model.model.rotary_emb)
    model.set_attn_implementation(_register())
    try:
        if dev.type != "cpu":
            with torch.inference_mode():
                ids, pos = torch.tensor([tokens], device=dev), torch.tensor([positions], device=dev)
                return model(input_ids=ids, position_ids=pos, use_cache=False).logits[0].float().cpu()
        return hf_logits(model, tokens, positions)
    finally:
        model.set_attn_implementation("eager")
        _LAYOUT.clear()


def hf_ape_rollout(
    model, segments, prompt, t: float, s: float, prefix: bool = False, tilt: float = 0.0, parallel: bool = False
) -> list[torch.Tensor]:
    tail, out = list(prompt), []
    for _ in range(GEN):
        lp = torch.log_softmax(ape_logits(model, segments, tail, t, s, prefix, tilt, parallel)[-1].double(), -1)
        out.append(lp)
        tail.append(int(lp.argmax()))
    return out


def assert_ape_matches(outs, model, bos, t, s, requests=REQUESTS, atol=2e-4, prefix=False, tilt=0.0, parallel=False):
    for out, (docs, prompt) in zip(outs, requests):
        rendered = from_token_ids(prompt, [DOCS[d] for d in docs], bos)
        want = hf_ape_rollout(model, rendered.segments, rendered.final, t, s, prefix, tilt, parallel)
        assert out.token_ids == [int(lp.argmax()) for lp in want]
        for got, lp in zip(out.outputs[0].logprobs, want):
            ids = torch.tensor(list(got))
            assert torch.allclose(torch.tensor(list(got.values()), dtype=torch.float64), lp[ids], atol=atol)


@pytest.mark.parametrize("name", ["llama", "llama31", "qwen2", "qwen3"])
@pytest.mark.parametrize("mode", ["lazy", "block"])
def test_ape_matches_transformers(checkpoint, name, mode):
    """Engine default (T, S) in fp32 on the CPU == the transformers reference, greedy tokens and log-probs."""
    t, s = 0.6, 2.5
    llm = make_llm(checkpoint, name, mode, ape_temperature=t, ape_scale=s)
    outs = generate(llm, params=greedy(logprobs=20))
    assert_ape_matches(outs, checkpoint(name)[1], token_bos(llm), t, s)


def test_per_request_override(checkpoint):
    """A request's own (T, S) over the engine's default, and T = S = 1 on an engine with a default: plain lazy."""
    llm = make_llm(checkpoint, "llama", "lazy", ape_temperature=0.5, ape_scale=3.0)
    kw = dict(
        prompt_token_ids=[p for _, p in REQUESTS],
        document_token_ids=[[DOCS[d] for d in docs] for docs, _ in REQUESTS],
        sampling_params=greedy(logprobs=20),
    )
    outs = llm.generate(**kw, ape_temperature=1.4, ape_scale=0.7)
    assert_ape_matches(outs, checkpoint("llama")[1], token_bos(llm), 1.4, 0.7)
    off = llm.generate(**kw, ape_temperature=1.0, ape_scale=1.0)
    plain = generate(make_llm(checkpoint, "llama", "lazy"), params=greedy(logprobs=20))
    for a, b in zip(off, plain):
        assert a.token_ids == b.token_ids and a.outputs[0].logprobs == b.outputs[0].logprobs


def test_the_reference_is_block_attention_at_one_and_differs_elsewhere(checkpoint):
    model = checkpoint("qwen2")[1]
    docs, prompt = REQUESTS[1]
    segments = from_token_ids(prompt, [DOCS[d] for d in docs], 1).segments
    tokens = [x for seg in segments for x in seg] + prompt
    block = hf_logits(model, tokens, list(range(len(tokens))), block_mask([len(x) for x in segments], len(prompt)))
    assert torch.allclose(ape_logits(model, segments, prompt, 1.0, 1.0), block, atol=1e-5)
    ape = ape_logits(model, segments, prompt, 0.6, 2.5)
    assert (ape[-1] - block[-1]).abs().max() > 1e-3
    # rows of the documents themselves are untouched: only the final segment's scores change
    n_ctx = len(tokens) - len(prompt)
    assert torch.allclose(ape[:n_ctx], block[:n_ctx], atol=1e-5)


def test_documents_stay_shared(checkpoint):
    """APE requests read the one cached copy of each document: a plain request after them hits every document
    and gets plain lazy's answer (the shared pages were not changed)."""
    llm = make_llm(checkpoint, "qwen3", "lazy")
    generate(llm, params=greedy(), requests=REQUESTS)
    before = llm.stats().cache
    kw = dict(
        prompt_token_ids=[p for _, p in REQUESTS],
        document_token_ids=[[DOCS[d] for d in docs] for docs, _ in REQUESTS],
        sampling_params=greedy(logprobs=20),
    )
    llm.generate(**kw, ape_temperature=0.5, ape_scale=2.0)
    after = llm.stats().cache
    assert after.misses == before.misses  # every document of the APE requests was found in the cache
    plain = generate(make_llm(checkpoint, "qwen3", "lazy"), params=greedy(logprobs=20))
    again = llm.generate(**kw)
    for a, b in zip(again, plain):
        assert a.token_ids == b.token_ids and a.outputs[0].logprobs == b.outputs[0].logprobs


@pytest.mark.parametrize("mode", ["prefix", "full"])
def test_causal_modes_reject_it(checkpoint, mode):
    """Temperature, scale and tilt, as the engine's default or a request's own; off (T = S = 1, no tilt) is accepted
    everywhere."""
    with pytest.raises(InvalidRequestError, match="need mode 'lazy' or 'block'"):
        EngineConfig(mode=mode, ape_temperature=0.5)
    with pytest.raises(InvalidRequestError, match="ape_tilt=1.0 need mode 'lazy' or 'block'"):
        EngineConfig(mode=mode, ape_tilt=1.0)
    llm = make_llm(checkpoint, "llama", mode)
    for asked, named in ((dict(ape_scale=2.0), "ape_scale=2.0"), (dict(ape_tilt=2.0), "ape_tilt=2.0")):
        with pytest.raises(InvalidRequestError, match=named):
            llm.generate(prompt_token_ids=[[40, 41]], sampling_params=greedy(), **asked)
        assert not llm.engine.has_unfinished()
    llm.generate(prompt_token_ids=[[40, 41]], sampling_params=greedy(), ape_temperature=1.0, ape_scale=1.0, ape_tilt=0)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), True, "2"])
def test_rejects_bad_values(bad):
    with pytest.raises(InvalidRequestError, match="must be a finite number > 0"):
        EngineConfig(ape_temperature=bad)
    with pytest.raises(InvalidRequestError, match="must be a finite number > 0"):
        EngineConfig(ape_scale=bad)


@pytest.mark.parametrize("tiny", [1e-4, 1e-40, 5e-324])
def test_rejects_a_temperature_whose_inverse_overflows(tiny):
    """1/T scales the scores in float32: T = 1e-40 made the logits NaN, so T below 0.001 is refused up front."""
    with pytest.raises(InvalidRequestError, match="ape_temperature must be at least 0.001"):
        EngineConfig(ape_temperature=tiny)
    EngineConfig(ape_temperature=1e-3)


# --- tilt (ape_tilt) ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama", "qwen2"])
@pytest.mark.parametrize("mode", ["lazy", "block"])
def test_tilt_matches_transformers(checkpoint, name, mode):
    """An engine default tilt, with a temperature and scale beside it: each document's keys get their own ln S_i
    (three documents in REQUESTS[1]: +tilt/2, 0, -tilt/2); the engine (CPU, fp32) == transformers."""
    t, s, tilt = 0.8, 1.5, 2.0
    llm = make_llm(checkpoint, name, mode, ape_temperature=t, ape_scale=s, ape_tilt=tilt)
    outs = generate(llm, params=greedy(logprobs=20))
    assert_ape_matches(outs, checkpoint(name)[1], token_bos(llm), t, s, tilt=tilt)


def test_tilt_per_request_and_its_reference_moves_the_answer(checkpoint):
    """A request's own tilt over an engine without one; the reference with a tilt differs from plain block
    attention only in the final rows, and a tilt on one document is no tilt."""
    llm = make_llm(checkpoint, "llama31", "lazy")
    kw = dict(
        prompt_token_ids=[p for _, p in REQUESTS],
        document_token_ids=[[DOCS[d] for d in docs] for docs, _ in REQUESTS],
        sampling_params=greedy(logprobs=20),
    )
    outs = llm.generate(**kw, options=RequestOptions(ape_tilt=-3.0))
    assert_ape_matches(outs, checkpoint("llama31")[1], token_bos(llm), 1.0, 1.0, tilt=-3.0)
    model = checkpoint("qwen2")[1]
    docs, prompt = REQUESTS[1]
    segments = from_token_ids(prompt, [DOCS[d] for d in docs], 1).segments
    plain, tilt = ape_logits(model, segments, prompt, 1.0, 1.0), ape_logits(model, segments, prompt, 1.0, 1.0, tilt=3.0)
    n_ctx = sum(len(x) for x in segments)
    assert torch.allclose(tilt[:n_ctx], plain[:n_ctx], atol=1e-5) and (tilt[-1] - plain[-1]).abs().max() > 1e-3
    one = from_token_ids(prompt, [DOCS["a"]], 1).segments
    assert torch.allclose(ape_logits(model, one, prompt, 1.0, 1.0, tilt=3.0), ape_logits(model, one, prompt, 1.0, 1.0))


def test_tilt_on_relinked_documents_matches_transformers(checkpoint):
    """Relink k = 3 with a tilt: a document's recomputed rows and its shared rest carry the same ln S_i. The
    reference is the relink layout (tests/engine/test_relink.py) with ln S_i added to the final rows' scores of
    each document's keys."""
    from tests.engine.test_relink import relinked_layout

    k, tilt = 3, 2.5
    llm = make_llm(checkpoint, "llama", "lazy", relink_tokens=k, ape_tilt=tilt)
    model = checkpoint("llama")[1]
    for out, (docs, prompt) in zip(generate(llm, params=greedy(logprobs=20)), REQUESTS):
        segments = from_token_ids(prompt, [DOCS[d] for d in docs], token_bos(llm)).segments
        ks = [min(k, len(seg)) for seg in segments[1:]]
        biases = tilted(1.0, tilt, len(segments) - 1)
        tail = list(prompt)
        for got in out.outputs[0].logprobs:
            tokens, positions, visible = relinked_layout(segments, k, tail)
            bias = torch.zeros(visible.shape)
            final = len(tokens) - len(tail)
            standalone = len(segments[0])  # the rows of each document encoded alone come after the first segment's
            recomputed = sum(len(seg) for seg in segments)  # then each document's recomputed first rows
            for seg, n, b in zip(segments[1:], ks, biases):
                bias[final:, standalone + n : standalone + len(seg)] = b
                bias[final:, recomputed : recomputed + n] = b
                standalone += len(seg)
                recomputed += n
            lp = torch.log_softmax(hf_logits(model, tokens, positions, visible, bias)[-1].double(), -1)
            ids = torch.tensor(list(got))
            assert torch.allclose(torch.tensor(list(got.values()), dtype=torch.float64), lp[ids], atol=2e-4)
            tail.append(int(lp.argmax()))
        assert out.token_ids == tail[len(prompt) :]


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 20.5, -21.0, True, "1"])
def test_rejects_bad_tilts(bad):
    with pytest.raises(InvalidRequestError, match=r"ape_tilt must be a number in \[-20.0, 20.0\]"):
        EngineConfig(ape_tilt=bad)


# --- shared prefix (ape_prefix) ----------------------------------------------------------------------------------

PREFIX_REQUESTS = [(["a", "b"], [40, 41, 42]), (["b", "a", "c"], [50, 51]), (["c"], [60, 61, 62, 63])]


@pytest.mark.parametrize("name", ["llama", "llama31", "qwen3"])
@pytest.mark.parametrize("ape", [(1.0, 1.0, 0.0), (0.6, 2.5, 0.0), (1.0, 1.0, 1.5)])
def test_prefix_matches_transformers(checkpoint, name, ape):
    """Documents encoded after the first segment (a system segment here, so that the prefix is more than BOS),
    with and without the temperature, scale and tilt: the engine (CPU, fp32) == transformers."""
    llm = make_llm(checkpoint, name, "lazy", ape_prefix=True, ape_temperature=ape[0], ape_scale=ape[1], ape_tilt=ape[2])
    bos = token_bos(llm)
    system = ([] if bos is None else [bos]) + [5, 6, 7, 8, 9]  # starts with BOS: the first segment as given
    requests = [(["sys"] + docs, prompt) for docs, prompt in PREFIX_REQUESTS]
    DOCS["sys"] = system
    try:
        outs = generate(llm, requests, greedy(logprobs=20))
        assert_ape_matches(outs, checkpoint(name)[1], bos, *ape[:2], requests=requests, prefix=True, tilt=ape[2])
    finally:
        del DOCS["sys"]


def _generate_with(llm, requests, options):
    return llm.generate(
        prompt_token_ids=[p for _, p in requests],
        document_token_ids=[[DOCS[d] for d in docs] for docs, _ in requests],
        sampling_params=greedy(logprobs=20),
        options=options,
    )


@pytest.mark.parametrize("name", ["llama", "qwen3"])
@pytest.mark.parametrize("prefix", [False, True])
def test_parallel_matches_transformers(checkpoint, name, prefix):
    """Every document read from the first segment's end, the final segment after the longest (ape_parallel), with
    and without the shared prefix, with a temperature and scale: the engine (CPU, fp32) == transformers, whose
    forward gives the documents' rows and the final rows those positions."""
    llm = make_llm(checkpoint, name, "lazy", ape_prefix=prefix, ape_parallel=True, ape_temperature=0.7, ape_scale=1.5)
    bos = token_bos(llm)
    requests = [(["sys"] + docs, prompt) for docs, prompt in PREFIX_REQUESTS]
    DOCS["sys"] = ([] if bos is None else [bos]) + [5, 6, 7, 8, 9]
    try:
        outs = generate(llm, requests, greedy(logprobs=20))
        assert_ape_matches(outs, checkpoint(name)[1], bos, 0.7, 1.5, requests=requests, prefix=prefix, parallel=True)
    finally:
        del DOCS["sys"]


def test_parallel_per_request_and_its_reference_differs_from_sequential(checkpoint):
    """A request may ask for the parallel placement on an engine without it (and one engine serves both), and the
    placement changes the answer's distribution: the reference of one is not the other's."""
    llm = make_llm(checkpoint, "llama", "lazy", ape_prefix=True)
    bos = token_bos(llm)
    requests = [(["sys", "a", "b", "c"], [50, 51])]
    DOCS["sys"] = ([] if bos is None else [bos]) + [5, 6, 7]
    try:
        rendered = from_token_ids([50, 51], [DOCS[d] for d in requests[0][0]], bos)
        model = checkpoint("llama")[1]
        placed = ape_logits(model, rendered.segments, rendered.final, 1.0, 1.0, prefix=True, parallel=True)
        in_order = ape_logits(model, rendered.segments, rendered.final, 1.0, 1.0, prefix=True)
        assert (placed[-1] - in_order[-1]).abs().max() > 1e-3
        for parallel in (True, False):
            outs = _generate_with(llm, requests, RequestOptions(ape_parallel=parallel))
            assert_ape_matches(outs, model, bos, 1.0, 1.0, requests=requests, prefix=True, parallel=parallel)
    finally:
        del DOCS["sys"]


@pytest.mark.parametrize(
    "mode, kw, word",
    [("block", {}, "block"), ("prefix", {}, "prefix"), ("lazy", {"relink_tokens": 4}, "relink")],
)
def test_parallel_is_lazy_only_and_not_with_relink(checkpoint, mode, kw, word):
    with pytest.raises(InvalidRequestError, match=word) as err:
        EngineConfig(mode=mode, ape_parallel=True, **kw)
    assert err.value.param == "ape_parallel"
    llm = make_llm(checkpoint, "llama", mode, **kw)
    with pytest.raises(InvalidRequestError, match="ape_parallel"):
        _generate_with(llm, [(["a", "b"], [40, 41])], RequestOptions(ape_parallel=True))


def test_prefix_reference_differs_from_plain_block(checkpoint):
    model = checkpoint("llama")[1]
    segments = from_token_ids([50, 51], [[5, 6, 7], DOCS["b"], DOCS["a"]], 1).segments
    plain = ape_logits(model, segments, [50, 51], 1.0, 1.0)
    assert (ape_logits(model, segments, [50, 51], 1.0, 1.0, prefix=True)[-1] - plain[-1]).abs().max() > 1e-3
    # the first segment's rows are the same either way
    n0 = len(segments[0])
    assert torch.allclose(ape_logits(model, segments, [50, 51], 1.0, 1.0, prefix=True)[:n0], plain[:n0], atol=1e-5)


def test_prefix_documents_are_shared_per_first_segment(checkpoint):
    """A document encoded after a first segment is one cached copy read at any slot by requests with that first
    segment (hits), a separate one under another first segment (a miss), and apart from plain lazy's copy."""
    llm = make_llm(checkpoint, "llama", "lazy")
    bos = [] if token_bos(llm) is None else [token_bos(llm)]
    sys_a, sys_b = bos + [5, 6, 7], bos + [8, 9]  # the first segment as given (README, token-level input)
    kw = dict(sampling_params=greedy())

    def run(system, docs, **extra):
        documents = [[system] + [DOCS[d] for d in docs]]
        llm.generate(prompt_token_ids=[[40, 41]], document_token_ids=documents, **kw, **extra)
        return llm.stats().cache

    base = run(sys_a, ["a", "b"], ape_prefix=True)
    hits = run(sys_a, ["b", "a", "c"], ape_prefix=True)
    assert hits.misses == base.misses + 1  # only "c" is new: "a" and "b" are read at other slots
    other = run(sys_b, ["a"], ape_prefix=True)
    assert other.misses == hits.misses + 2  # sys_b itself, and "a" after sys_b
    plain = run(sys_a, ["a"])
    assert plain.misses == other.misses + 1  # "a" encoded alone is another copy


@pytest.mark.parametrize("mode", ["block", "prefix", "full"])
def test_prefix_is_lazy_only(checkpoint, mode):
    with pytest.raises(InvalidRequestError, match="ape_prefix needs mode 'lazy'"):
        EngineConfig(mode=mode, ape_prefix=True)
    llm = make_llm(checkpoint, "llama", mode)
    with pytest.raises(InvalidRequestError, match="ape_prefix needs mode 'lazy'"):
        llm.generate(prompt_token_ids=[[40, 41]], sampling_params=greedy(), ape_prefix=True)


# --- CUDA-graph inputs (engine/graph_inputs.py), on the CPU -----------------------------------------------------


def _ape_entries() -> list[EntryPages]:
    return [
        EntryPages([3, 1, 4, 7], [0, 7, 7, 0], [16, 16, 5, 3], None, [1.0, 0.5, 0.5, 1.0], [0.0, 0.7, 0.7, 0.0]),
        EntryPages([9], [0], [12]),  # no temperature: 1 and 0 in the tables
        EntryPages([2, 6, 5], [5, 0, 0], [16, 1, 2], [0, 3, 0], [2.0, 1.0, 1.0], [-0.3, 0.0, 0.0]),
    ]


def test_graph_tables_hold_what_paged_batch_builds():
    """The 7-table records' float views hold PagedBatch.build's inv_temps and log_scales (an independent
    construction), over a buffer a longer step left other values in; the kernels' gap is one table's width."""
    width = 6
    tables = torch.full((4, table_count(True), width), 99, dtype=torch.int32)
    stale = EntryPages([0] * width, [1] * width, [16] * width, None, [3.0] * width, [9.0] * width)
    fill_tables(tables.numpy(), [stale] * 4)
    entries = _ape_entries()
    fill_tables(tables.numpy(), entries)
    built = PagedBatch.build(entries, [1, 1, 1], [0, 0, 0])
    inv_temps, log_scales = ape_views(tables[:3])
    n = built.max_pages
    for b, e in enumerate(entries):
        m = len(e.pages)
        assert torch.equal(inv_temps[b, :m], built.inv_temps[b, :m])
        assert torch.equal(log_scales[b, :m], built.log_scales[b, :m])
    assert torch.equal(table_views(tables[:3])[0][:, :n], built.pages)
    view = PagedBatch(
        built.cu_seqlens_q, built.q_start, *table_views(tables[:3])[:4], built.num_pages, 1, 64,
        firsts=table_views(tables[:3])[4], inv_temps=inv_temps, log_scales=log_scales,
    )  # fmt: skip
    assert view.ape_gap == width
    assert ape_views(torch.zeros(2, table_count(False), width, dtype=torch.int32)) == (None, None)
    assert has_ape(entries) and not has_ape(entries[1:2])


def test_prefill_graph_layout_gives_the_eager_attention():
    """A step with temperatures padded to a bucket of the 7-table layout: the reference attention over the views
    equals the one over PagedBatch.build (the eager path) on the real rows."""
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache = torch.randn(2, 10, 16, 2, 32, generator=gen).unbind(0)
    entries = [e.then([8], [4]) for e in _ape_entries()]
    q_lens, q_starts = [2, 3, 1], [38, 10, 19]
    n = sum(q_lens)
    step = StepInputs(list(range(n)), [0] * n, [-1] * n, entries, q_lens, q_starts, [1, 4, 5], False)
    layout = StepLayout(16, 8, 6, 16, ape=True)
    buffers = layout.buffers("cpu")
    layout.fill(buffers, step, 16, 4)
    _, fb = layout.views(buffers, 16, 4)
    q = torch.randn(16, 4, 32, generator=gen)
    padded = reference.paged_attention(q, k_cache, v_cache, fb.attn, None, 0.2)
    eager = reference.paged_attention(q[:n], k_cache, v_cache, PagedBatch.build(entries, q_lens, q_starts), None, 0.2)
    assert torch.allclose(padded[:n], eager, atol=1e-6)
    plain = [EntryPages(e.pages, e.deltas, e.valid, e.firsts) for e in entries]
    assert not torch.allclose(
        eager, reference.paged_attention(q[:n], k_cache, v_cache, PagedBatch.build(plain, q_lens, q_starts), None, 0.2)
    )


# --- GPU: Llama-3.1-8B shapes (random weights), run by the lead on the device ----------------------------------


def _gpu_llm(directory, **kw):
    return LLM(
        model=str(directory),
        mode="lazy",
        device="cuda",
        dtype="float32",
        random_weights=True,
        kv_cache_gb=2,
        progress=False,
        max_model_len=4096,
        **kw,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("prefix", [False, True])
def test_gpu_ape_matches_transformers_and_graphs_equal_eager(tmp_path_factory, prefix):
    """fp32, 4 layers of the 8B shapes: the Triton kernels with (T, S) and a tilt (each of the three documents its
    own ln S_i) == the transformers reference (first token);
    decode and prefill CUDA graphs that carry the tables give the eager tokens and logits; a request's own (T, S)
    on an engine without a default (graphs without the tables: its steps run eagerly) gives the same tokens. prefix:
    the documents encoded after the first segment (here BOS and a 40-token system prompt)."""
    directory = config_dir(tmp_path_factory, 4)
    docs = random_docs(3, 300, seed=11)
    system = [128000] + random_docs(1, 40, seed=12)[0]
    prompts = [
        RenderedPrompt(segments=[system] + docs[i:] + docs[:i], final=random_docs(1, 8 + 9 * i, seed=500 + i)[0])
        for i in range(3)
    ]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    t, s, tilt = 0.7, 1.6, 1.2
    results = {}
    for name, kw in (("eager", dict(cuda_graphs=False)), ("graphs", {}), ("per_request", {})):
        default = (
            {} if name == "per_request" else dict(ape_temperature=t, ape_scale=s, ape_prefix=prefix, ape_tilt=tilt)
        )
        llm = _gpu_llm(directory, **kw, **default)
        seen = capture_logits(llm)
        if name == "eager":  # prompt 0 alone first: its one sampled row against the transformers reference
            run_all(llm, prompts[:1], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
            hf = hf_model_with_weights_of(llm, directory, torch.float32)
            want = ape_logits(hf, prompts[0].segments, prompts[0].final, t, s, prefix, tilt)[-1]
            print(f"\nAPE, 8B shapes, 4 layers, fp32: |engine-hf|/|hf| = {rel(seen[-1][0], want):.2e}")
            assert rel(seen[-1][0], want) < 1e-4
            del hf
            seen.clear()
        if name == "per_request":
            for i, p in enumerate(prompts):
                llm.engine.add_request(f"r{i}", p, params, options=RequestOptions(None, t, s, prefix, tilt))
            outs = {}
            while llm.engine.has_unfinished():
                outs.update({o.request_id: o.token_ids for o in llm.engine.step() if o.finished})
        else:
            outs = {rid: o.token_ids for rid, o in run_all(llm, prompts, params).items()}
        results[name] = (outs, torch.cat(seen))
        if name == "graphs":
            assert llm.engine.executor.runner.prefill_graphs.replays > 0
        llm.shutdown()
    assert results["eager"][0] == results["graphs"][0] == results["per_request"][0]
    assert rel(results["graphs"][1], results["eager"][1]) < 1e-5


def test_dropping_a_document_drops_its_copies_after_every_first_segment(checkpoint):
    """A document dropped from the cache (the server's deletion) takes with it the copies encoded after each first
    segment it was read after: the next request with it misses them, and a document not dropped still hits."""
    llm = make_llm(checkpoint, "llama", "lazy")
    bos = [] if token_bos(llm) is None else [token_bos(llm)]
    systems = (bos + [5, 6, 7], bos + [8, 9])

    def run(system, docs):
        documents = [[system] + [DOCS[d] for d in docs]]
        llm.generate(
            prompt_token_ids=[[40, 41]], document_token_ids=documents, sampling_params=greedy(), ape_prefix=True
        )
        return llm.stats().cache.misses

    for system in systems:
        run(system, ["a", "b"])
    before = run(systems[0], ["a", "b"])
    assert llm.engine.drop_documents([DOCS["a"]]) == 1  # with its copies after either first segment
    assert run(systems[0], ["a", "b"]) == before + 1  # "a" again; "b" and the first segment hit
    assert run(systems[1], ["a"]) == before + 2
