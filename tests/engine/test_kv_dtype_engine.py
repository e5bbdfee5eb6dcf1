"""The engine with a narrower KV cache (`kv_cache_dtype`, docs/design.md "FP8 KV cache") against an independent
transformers reference that stores K and V as the cache does: one forward over the concatenation, each row at its
encoding position (a document's at its local positions, as encoded once for every slot; the final segment's at
its logical ones), with a registered attention function that rounds every key and value to the cache's dtype and,
for the final segment's rows, moves each document's rounded keys on to their logical positions with transformers'
own RoPE (block mode's private copy rounds the moved key again, as `copy_rotate` stores it)."""

from __future__ import annotations

import pytest
import torch

from lazyattn import LLM
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.prefill_graphs import PrefillGraphs
from lazyattn.engine.prompt import from_token_ids
from lazyattn.errors import InvalidRequestError
from lazyattn.kernels.reference import block_mask
from tests.engine.test_engine import DOCS, GEN, REQUESTS, generate, greedy, make_llm, token_bos
from tests.model.checkpoints import hf_logits

_LAYOUT: dict = {}
DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "bfloat16": torch.bfloat16}


def stored(x: torch.Tensor, scales: torch.Tensor | None = None) -> torch.Tensor:
    """x [batch, kv heads, tokens, D] as the cache holds it, read back (FP8 saturates at ±448, as the GPU's conversion
    does); with `scales` [kv heads], each head stored as x / s and read back times s."""
    if scales is not None:
        s = scales.to(x.dtype)[None, :, None, None]
        return stored(x / s) * s
    dtype = _LAYOUT["dtype"]
    y = x.float().clamp(-448.0, 448.0) if dtype == torch.float8_e4m3fn else x
    return y.to(dtype).to(x.dtype)


def _cached_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    from transformers.models.llama.modeling_llama import rotate_half

    group = query.shape[1] // key.shape[1]
    k_scale, v_scale = (_LAYOUT[n] and _LAYOUT[n][module.layer_idx] for n in ("k_scales", "v_scales"))
    key, value = stored(key, k_scale), stored(value, v_scale)
    key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if "shift" in _LAYOUT:
        cos, sin = _LAYOUT["rotary"](value, _LAYOUT["shift"][None])
        moved = key * cos[:, None] + rotate_half(key) * sin[:, None]
        if _LAYOUT["copies"]:
            moved = stored(moved, k_scale)
        final = _LAYOUT["final_rows"][:, None]
        scores = torch.where(final, torch.matmul(query, moved.transpose(2, 3)) * scaling, scores)
    scores = scores.masked_fill(~_LAYOUT["visible"], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def cached_logits(
    model, segments: list[list[int]], tail: list[int], mode: str, dtype: torch.dtype, v_scales=None, k_scales=None
) -> torch.Tensor:
    """The reference's logits; v_scales, k_scales: per layer, the [kv heads] powers of two V and K are stored at (FP8
    pages)."""
    from transformers import AttentionInterface

    tokens = [x for seg in segments for x in seg] + tail
    n, n_ctx = len(tokens), len(tokens) - len(tail)
    _LAYOUT["dtype"] = dtype
    _LAYOUT["v_scales"], _LAYOUT["k_scales"] = v_scales, k_scales
    if mode in ("lazy", "block"):
        visible = block_mask([len(x) for x in segments], len(tail))
        positions, shift, start = list(range(n)), torch.zeros(n, dtype=torch.long), 0
        for seg in segments:
            positions[start : start + len(seg)] = range(len(seg))  # encoded alone, at local positions
            shift[start : start + len(seg)] = start
            start += len(seg)
        final_rows = torch.arange(n) >= n_ctx
        _LAYOUT.update(shift=shift, final_rows=final_rows, rotary=model.model.rotary_emb, copies=mode == "block")
    else:
        visible = torch.ones(n, n, dtype=torch.bool).tril()
        positions = list(range(n))
    _LAYOUT["visible"] = visible
    AttentionInterface.register("kv_cache_reference", _cached_attention)
    model.set_attn_implementation("kv_cache_reference")
    try:
        return hf_logits(model, tokens, positions)
    finally:
        model.set_attn_implementation("eager")
        _LAYOUT.clear()


def assert_matches_cached_reference(outs, model, bos, mode, dtype, atol=2e-4, v_scales=None, k_scales=None):
    for out, (docs, prompt) in zip(outs, REQUESTS):
        rendered = from_token_ids(prompt, [DOCS[d] for d in docs], bos)
        tail, want = list(rendered.final), []
        for _ in range(GEN):
            logits = cached_logits(model, rendered.segments, tail, mode, dtype, v_scales, k_scales)
            lp = torch.log_softmax(logits[-1].double(), -1)
            want.append(lp)
            tail.append(int(lp.argmax()))
        assert out.token_ids == [int(lp.argmax()) for lp in want]
        for got, lp in zip(out.outputs[0].logprobs, want):
            ids = torch.tensor(list(got))
            torch.testing.assert_close(
                torch.tensor(list(got.values()), dtype=torch.float64), lp[ids], atol=atol, rtol=0
            )


@pytest.mark.parametrize(
    "name, mode",
    [("llama", "lazy"), ("qwen2", "lazy"), ("qwen3", "block"), ("llama31", "prefix"), ("mistral", "full")],
)
def test_fp8_cache_matches_transformers_with_fp8_kv(checkpoint, name, mode):
    """fp32 model, FP8 pages: greedy tokens and log-probs equal the reference that rounds K/V to e4m3."""
    llm = make_llm(checkpoint, name, mode, kv_cache_dtype="fp8_e4m3")
    assert llm.engine.executor.local_kv.dtype == torch.float8_e4m3fn
    scales = llm.engine.executor.model.v_scales
    assert scales is not None and any((s != 1).any() for s in scales)  # the test models' V is scaled
    outs = generate(llm)
    model, bos = checkpoint(name)[1], token_bos(llm)
    assert_matches_cached_reference(outs, model, bos, mode, torch.float8_e4m3fn, v_scales=scales)


def test_bfloat16_cache_under_a_float32_model_matches_its_reference(checkpoint):
    llm = make_llm(checkpoint, "llama", "lazy", kv_cache_dtype="bfloat16")
    assert llm.engine.executor.local_kv.dtype == torch.bfloat16
    outs = generate(llm)
    assert_matches_cached_reference(outs, checkpoint("llama")[1], token_bos(llm), "lazy", torch.bfloat16)


def test_the_fp8_reference_differs_from_the_unrounded_one(checkpoint):
    """The reference really rounds: its logits move away from plain block attention's, by less than the signal."""
    model = checkpoint("llama")[1]
    docs, prompt = REQUESTS[0]
    segments = from_token_ids(prompt, [DOCS[d] for d in docs], 1).segments
    tokens = [x for seg in segments for x in seg] + prompt
    block = hf_logits(model, tokens, list(range(len(tokens))), block_mask([len(x) for x in segments], len(prompt)))
    fp8 = cached_logits(model, segments, prompt, "lazy", torch.float8_e4m3fn)
    diff = (fp8[-1] - block[-1]).abs().max()
    assert 1e-5 < diff < 0.1 * block[-1].abs().max()


def test_fp8_documents_hit_from_the_host_tier_with_the_same_tokens(checkpoint):
    """Documents evicted to the host tier and promoted back give the tokens of an engine that never evicted."""
    plain = generate(make_llm(checkpoint, "llama", "lazy", kv_cache_dtype="fp8_e4m3"), params=greedy())
    llm = make_llm(checkpoint, "llama", "lazy", kv_cache_dtype="fp8_e4m3", host_cache_gb=0.01)
    generate(llm, params=greedy())
    llm.engine.cache.evict(10**6)  # every document to the host tier
    again = generate(llm, params=greedy())
    assert llm.stats().cache.host_hits > 0
    assert [o.token_ids for o in again] == [o.token_ids for o in plain]


def test_v_scales_leave_the_models_function_as_it_is(checkpoint):
    """Folding V's powers of two into qkv_proj and o_proj (CausalLM.fold_v_scales) is exact: an fp32 model over fp32
    pages gives the same tokens and the same log-probs, to the bit, with and without them."""
    plain = generate(make_llm(checkpoint, "llama", "lazy"))
    llm = make_llm(checkpoint, "llama", "lazy")
    scales = llm.engine.executor.model.fold_v_scales()  # before any request: no page holds the unscaled V
    assert any((s != 1).any() for s in scales)
    folded = generate(llm)
    for a, b in zip(plain, folded):
        assert a.token_ids == b.token_ids
        assert [dict(x) for x in a.outputs[0].logprobs] == [dict(x) for x in b.outputs[0].logprobs]


def test_v_scales_are_the_powers_of_two_nearest_the_rms_of_v():
    """Each (layer, kv head)'s s is 2^round(log2 RMS) of its V rows of qkv_proj (times the input norm's weights), V's
    rows divided by it and the o_proj columns of its query heads multiplied by it; a head the scaling would not keep
    exactly (a weight that would underflow) keeps 1. Hand-set weights of tiny, in fp32."""
    from lazyattn.model.loader import load_model

    lm, cfg = load_model("tiny", dtype=torch.float32)
    attn = lm.layers[0].self_attn
    d, group, hidden = attn.head_dim, attn.num_heads // attn.num_kv_heads, cfg.hidden_size
    v0 = attn.q_size + attn.kv_size
    qkv, out = attn.qkv_proj.weight, attn.o_proj.weight
    with torch.no_grad():
        lm.layers[0].input_layernorm.weight.fill_(2.0)
        qkv[v0 : v0 + d] = 0.03 / 2 / hidden**0.5  # rows of norm 0.015, 0.03 with the norm's 2: s = 2^-5
        qkv[v0 + d : v0 + 2 * d] = 0.03 / 2 / hidden**0.5  # head 1 alike, but one of its o_proj weights is
        out[0, group * d] = 2.0**-149  # fp32's smallest subnormal, which 2^-5 times would flush to 0
        before_qkv, before_out = qkv.clone(), out.clone()
        scales = lm.fold_v_scales()
    assert scales[0][0] == 2.0**-5 and scales[0][1] == 1.0
    assert torch.equal(qkv[v0 : v0 + d], before_qkv[v0 : v0 + d] * 32)
    assert torch.equal(out[:, : group * d], before_out[:, : group * d] / 32)
    assert torch.equal(qkv[v0 + d : v0 + 2 * d], before_qkv[v0 + d : v0 + 2 * d])
    assert torch.equal(out[:, group * d : 2 * group * d], before_out[:, group * d : 2 * group * d])
    assert torch.equal(qkv[:v0], before_qkv[:v0])  # q and k untouched
    assert lm.v_scales is scales and len(scales) == cfg.num_layers


@pytest.mark.parametrize("bound, scale", [(100.0, 1.0), (223.0, 1.0), (225.0, 2.0), (1000.0, 8.0), (1e5, 512.0)])
def test_k_scales_keep_every_key_within_half_of_e4m3s_range(bound, scale):
    """K's rows of a head whose largest key, over every input, is `bound` are divided by the smallest power of two
    of at least 1 that brings it to 224 or less, its query heads' rows multiplied by it; other heads keep 1, and a
    head whose query weights would overflow keeps 1. The bound by hand: a row of n equal weights c under a norm of
    weights 1 gives c x n at most (the normed input of ones), and that input reaches it."""
    from lazyattn.model.loader import load_model

    lm, cfg = load_model("tiny", dtype=torch.float32)
    layer, attn = lm.layers[0], lm.layers[0].self_attn
    d, group, n = attn.head_dim, attn.num_heads // attn.num_kv_heads, cfg.hidden_size
    k0, qkv = attn.q_size, attn.qkv_proj.weight
    other = lm.layers[1].self_attn.qkv_proj.weight
    with torch.no_grad():
        qkv[k0 : k0 + d] = bound / n
        other[k0 : k0 + d] = 1e5 / n  # would take 512, but one of its queries' weights cannot be multiplied by it
        other[0, 0] = 3e38
        before, other_before = qkv.clone(), other.clone()
        scales = lm.fold_k_scales()
    assert scales[0][0] == scale and scales[0][1] == 1 and (scales[1] == 1).all()
    assert torch.equal(qkv[k0 : k0 + d], before[k0 : k0 + d] / scale)
    assert torch.equal(qkv[: group * d], before[: group * d] * scale)
    assert torch.equal(qkv[group * d : k0], before[group * d : k0])  # the other head's queries
    assert torch.equal(qkv[k0 + d :], before[k0 + d :])  # the other head's keys, and V
    assert torch.equal(other, other_before)
    key = attn.qkv_proj(layer.input_layernorm(torch.ones(1, n)))[0, k0]
    torch.testing.assert_close(key, torch.tensor(bound / scale), rtol=1e-5, atol=0)
    assert key <= 224 and (scale == 1 or key > 112)
    assert lm.k_scales is scales and lm.fold_k_scales() is scales


def test_k_scales_under_qwen3s_norms_fold_into_the_norms_weights(checkpoint):
    """Qwen3 normalises each head of k before RoPE, so |k| <= sqrt(head_dim) x k_norm's largest weight: a weight of
    100 at head_dim 32 bounds k at 565.7, which takes 4 (k_norm's weights divided, q_norm's multiplied); the other
    layer, k_norm weights near 1, keeps 1."""
    from lazyattn.model.loader import load_model

    lm, _ = load_model(str(checkpoint("qwen3")[0]), dtype=torch.float32)
    k_norm, q_norm = lm.layers[0].self_attn.k_norm.weight, lm.layers[0].self_attn.q_norm.weight
    with torch.no_grad():
        k_norm[3] = 100.0
        k_before, q_before = k_norm.clone(), q_norm.clone()
        scales = lm.fold_k_scales()
    assert (scales[0] == 4).all() and (scales[1] == 1).all()
    assert torch.equal(k_norm, k_before / 4) and torch.equal(q_norm, q_before * 4)


def big_keys_checkpoint(directory, power: int = 12):
    """The `qwen2` test model with its keys 2^power times larger and its queries 2^power times smaller (weights and
    biases): the same function to the bit, but keys far past e4m3's 448, which a page at scale 1 would saturate."""
    from tests.engine.conftest import write_tokenizer
    from tests.model.checkpoints import hf_model

    model = hf_model("qwen2")
    with torch.no_grad():
        for layer in model.model.layers:
            for linear, factor in ((layer.self_attn.k_proj, 2.0**power), (layer.self_attn.q_proj, 2.0**-power)):
                linear.weight.mul_(factor)
                linear.bias.mul_(factor)
    model.save_pretrained(directory)
    write_tokenizer(directory)
    return directory, model


def test_k_scales_leave_the_models_function_as_it_is(tmp_path):
    """Folding K's powers of two into qkv_proj is exact: an fp32 model over fp32 pages gives the same tokens and the
    same log-probs, to the bit, with and without them."""
    directory, _ = big_keys_checkpoint(tmp_path)
    make = lambda: LLM(model=str(directory), mode="lazy", device="cpu", page_size=16, progress=False)  # noqa: E731
    plain = generate(make())
    llm = make()
    scales = llm.engine.executor.model.fold_k_scales()  # before any request: no page holds the unscaled K
    assert any((s > 1).any() for s in scales)
    for a, b in zip(plain, generate(llm)):
        assert a.token_ids == b.token_ids
        assert [dict(x) for x in a.outputs[0].logprobs] == [dict(x) for x in b.outputs[0].logprobs]


def test_fp8_pages_of_keys_past_e4m3s_range_match_the_reference(tmp_path, monkeypatch):
    """Keys of about 2^12 (as large biases make them): over FP8 pages the engine scales them (K at 128 here), its
    tokens and log-probs equal the reference that stores K / s, and its first tokens' log-probs stay near those over
    fp32 pages. Without the K scales the pages saturate and the log-probs move far away."""
    from lazyattn.model.llama import CausalLM

    directory, model = big_keys_checkpoint(tmp_path)
    make = lambda **kw: LLM(model=str(directory), mode="lazy", device="cpu", page_size=16, progress=False, **kw)  # noqa: E731
    exact = generate(make())
    llm = make(kv_cache_dtype="fp8_e4m3")
    k_scales, v_scales = llm.engine.executor.model.k_scales, llm.engine.executor.model.v_scales
    assert max(s.max() for s in k_scales) >= 16
    assert llm.engine.executor.model_config.weights_id.endswith("|fp8 v, k scales")
    outs = generate(llm)
    assert_matches_cached_reference(outs, model, token_bos(llm), "lazy", torch.float8_e4m3fn, 2e-4, v_scales, k_scales)

    monkeypatch.setattr(CausalLM, "fold_k_scales", lambda self: [torch.ones(2)] * len(self.layers))
    saturated = generate(make(kv_cache_dtype="fp8_e4m3"))

    def first_gap(outs):  # the largest |log-prob - exact| over the first token's top 20
        return max(
            abs(o.outputs[0].logprobs[0][t] - e.outputs[0].logprobs[0][t])
            for o, e in zip(outs, exact)
            for t in e.outputs[0].logprobs[0]
            if t in o.outputs[0].logprobs[0]
        )

    assert first_gap(outs) < 0.1 and first_gap(saturated) > 5 * first_gap(outs)


def test_a_kv_cache_dtype_outside_the_list_is_refused():
    with pytest.raises(InvalidRequestError, match="kv_cache_dtype must be one of auto, bfloat16, fp8_e4m3"):
        EngineConfig(kv_cache_dtype="fp8")


def test_an_fp8_pool_holds_twice_the_pages_of_a_bfloat16_one():
    pages = {}
    for kv in ("bfloat16", "fp8_e4m3"):
        llm = LLM(model="tiny", device="cpu", kv_cache_gb=0.05, progress=False, kv_cache_dtype=kv)
        pages[kv] = llm.engine.executor.num_pages
    assert pages["fp8_e4m3"] == 2 * pages["bfloat16"]


# --- GPU: the Triton kernels over FP8 pages, run on the device ---------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["lazy", "block"])
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_gpu_fp8_engine_matches_transformers_with_fp8_kv(checkpoint, mode, cuda_graphs):
    """fp32 on the GPU: the Triton kernels (writes, prefill, decode, shared decode, block copies, graphs or eager)
    over FP8 pages give the CPU reference's greedy tokens."""
    directory, model = checkpoint("llama")
    llm = LLM(
        model=str(directory),
        mode=mode,
        device="cuda",
        dtype="float32",
        page_size=16,
        kv_cache_gb=0.05,
        progress=False,
        kv_cache_dtype="fp8_e4m3",
        cuda_graphs=cuda_graphs,
    )
    outs = generate(llm)
    scales = llm.engine.executor.model.v_scales
    assert_matches_cached_reference(outs, model, token_bos(llm), mode, torch.float8_e4m3fn, 2e-3, scales)
    llm.shutdown()


@pytest.mark.gpu
def test_gpu_fp8_kernels_give_the_reference_backends_tokens_at_8b_shapes(tmp_path_factory):
    """4 layers of Llama-3.1-8B's shapes, random fp32 weights, three requests over three 700-token documents in
    rotated orders: the Triton engine and the PyTorch reference backend (reference_attention) over FP8 pages agree."""
    from lazyattn import SamplingParams
    from lazyattn.engine.prompt import RenderedPrompt
    from tests.engine.test_engine_gpu import config_dir, random_docs, run_once

    directory = config_dir(tmp_path_factory, 4)
    docs = random_docs(3, 700, seed=3)
    prompts = [
        RenderedPrompt(segments=[[128000]] + docs[i:] + docs[:i], final=random_docs(1, 16 + i, seed=40 + i)[0])
        for i in range(3)
    ]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    tokens = {}
    for name, kw in (("triton", {}), ("reference", dict(reference_attention=True, cuda_graphs=False))):
        llm = LLM(
            model=str(directory),
            device="cuda",
            dtype="float32",
            random_weights=True,
            kv_cache_gb=2,
            max_model_len=4096,
            progress=False,
            kv_cache_dtype="fp8_e4m3",
            **kw,
        )
        tokens[name] = run_once(llm, prompts, params)
        if name == "triton":  # an fp32 q is not the Hopper kernel's: every bucket plans prefill.py's splits
            assert all(llm.engine.executor.runner.prefill_graphs.planned.values())
        llm.shutdown()
    assert tokens["triton"] == tokens["reference"]


@pytest.mark.gpu
def test_gpu_fp8_pages_under_a_bfloat16_model_match_the_reference_backend_through_graphs(tmp_path_factory, monkeypatch):
    """bf16, 2 layers of Llama-3.1-8B's shapes (random weights), FP8 pages of 64, CUDA graphs on: the documents'
    prefill runs prefill.py's kernel over FP8 pages (float16 tiles), the questions' replays prefill graphs whose
    attention is the Hopper kernel over FP8 pages (kernels/prefill_hopper.py, on an H100/H200), and the greedy tokens
    equal the PyTorch reference backend's over the same FP8 pages (reference_attention, eager)."""
    from lazyattn import SamplingParams
    from lazyattn.engine.prompt import RenderedPrompt
    from lazyattn.kernels import prefill_hopper
    from tests.engine.test_engine_gpu import capture_logits, config_dir, random_docs, rel, run_once

    short_prefill = prefill_hopper.short_prefill_attention
    hopper_pages = []

    def recording(q, k_cache, *args, **kwargs):
        hopper_pages.append(k_cache.dtype)
        return short_prefill(q, k_cache, *args, **kwargs)

    monkeypatch.setattr(prefill_hopper, "short_prefill_attention", recording)
    buckets = []
    bucket_of = PrefillGraphs.bucket
    monkeypatch.setattr(
        PrefillGraphs, "bucket", lambda self, step: buckets.append(bucket_of(self, step)) or buckets[-1]
    )
    directory = config_dir(tmp_path_factory, 2)
    docs = random_docs(3, 300, seed=8)
    segments = [[128000]] + docs
    finals = [random_docs(1, n, seed=400 + n)[0] for n in (5, 32, 100)]
    prompts = [RenderedPrompt(segments=segments[:1] + docs[i:] + docs[:i], final=finals[i]) for i in range(3)]
    # Twelve questions of 32 tokens at once: a step of 384 rows, the 512-token bucket's graph for short questions.
    questions = [random_docs(1, 32, seed=500 + i)[0] for i in range(12)]
    many = [
        RenderedPrompt(segments=segments[:1] + docs[i % 3 :] + docs[: i % 3], final=q) for i, q in enumerate(questions)
    ]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    tokens, logits, replays = {}, {}, 0
    for name, kw in (
        ("triton", dict(cuda_graphs=True)),
        ("reference", dict(reference_attention=True, cuda_graphs=False)),
    ):
        llm = LLM(
            model=str(directory),
            device="cuda",
            dtype="bfloat16",
            random_weights=True,
            kv_cache_gb=2,
            max_model_len=4096,
            progress=False,
            kv_cache_dtype="fp8_e4m3",
            **kw,
        )
        assert llm.engine.executor.local_kv.dtype == torch.float8_e4m3fn
        llm.engine.add_request("documents", RenderedPrompt(segments=segments, final=[]), None)  # cache them
        while llm.engine.has_unfinished():
            llm.engine.step()
        seen = capture_logits(llm)
        tokens[name] = run_once(llm, prompts, params)
        logits[name] = seen[0]  # the questions' prefill step
        first = len(seen)
        tokens[name, "twelve"] = run_once(llm, many, params)
        logits[name, "twelve"] = seen[first]  # their prefill step: one graph replay, 384 rows
        if name == "triton":
            replays = llm.engine.executor.runner.prefill_graphs.replays
            planned = llm.engine.executor.runner.prefill_graphs.planned
        llm.shutdown()
    print(
        f"\nbf16 over FP8 pages, question logits |triton-reference|/|reference| = "
        f"{rel(logits['triton'], logits['reference']):.2e}"
    )
    assert replays > 0
    if torch.cuda.get_device_capability()[0] == 9:
        assert torch.float8_e4m3fn in hopper_pages
        assert not all(planned.values())  # a bf16 q over FP8 pages: the Hopper kernel's buckets
        assert (512, 16, 256) in buckets and not planned[512, 16, 256] and planned[512, 16, 512]
    assert tokens["triton"] == tokens["reference"]
    # Their first tokens come from that step; later ones from decode steps, where bf16 rounding over random weights
    # may tip a near tie either way.
    twelve = logits["triton", "twelve"], logits["reference", "twelve"]
    assert twelve[0].shape[0] == 12 and rel(*twelve) < 2e-2
    assert torch.equal(twelve[0].argmax(-1), twelve[1].argmax(-1))
    assert [t[0] for t in tokens["triton", "twelve"].values()] == [t[0] for t in tokens["reference", "twelve"].values()]
