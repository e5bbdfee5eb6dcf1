"""The warp-specialised Gluon short-question prefill (kernels/prefill_hopper.py) against the reference.

It runs only on a Hopper GPU (Gluon kernels have no interpreter): the `gpu` tests below, over bf16 pages and over FP8
e4m3 pages (widened to float16 in the kernel). On a CPU, `supports` turns every call away, so prefill.py's kernel is
the one that runs; tests/kernels/test_compile_check.py compiles this one for sm_90.
"""

import dataclasses

import pytest
import torch

from lazyattn.kernels import prefill_hopper
from lazyattn.kernels.kv_dtype import FP8, quantize
from lazyattn.kernels.paged import transposed_copy
from tests.kernels.scenario import Scenario
from tests.kernels.test_prefill import gpu_scenario, ref, rel_err


def fp8_pages(s: Scenario) -> Scenario:
    """The scenario with its pages doubled and rounded to e4m3, as tests/kernels/test_fp8_attention.py's."""
    return dataclasses.replace(s, k_cache=quantize(s.k_cache * 2, FP8), v_cache=quantize(s.v_cache * 2, FP8))


def with_pages(s: Scenario, pages: str) -> Scenario:
    """bf16 pages, FP8 pages, or FP8 pages with V stored transposed (as the pool stores them)."""
    if pages == "fp8, V transposed":
        return fp8_pages(s).with_transposed_v()
    return fp8_pages(s) if pages == "fp8" else s


def test_transposed_v_pages_are_taken_over_fp8_pages_only():
    """The copy engine reads V pages stored transposed as [head_dim, 64] boxes: the pool's FP8 layout
    (kernels/paged.py, v_transposed); 16-bit pages keep V as K is."""
    v = torch.zeros(3, 64, 8, 128, dtype=FP8)
    v_t = transposed_copy(v)
    assert prefill_hopper.takes_layout(v) and not prefill_hopper.takes_transposed_layout(v)
    assert prefill_hopper.takes_transposed_layout(v_t) and not prefill_hopper.takes_layout(v_t)
    assert not prefill_hopper.takes_transposed_layout(v_t[:, :32])  # half pages


def test_a_cpu_call_is_turned_away():
    s = make_small_cpu_scenario()
    q, batch = s.final_prefill()
    assert not prefill_hopper.supports(q, s.k_cache, s.v_cache, batch)


def make_small_cpu_scenario(requests=(([0], 5),)):
    from tests.kernels.rope_cases import tables
    from tests.kernels.scenario import make_scenario

    return make_scenario(
        [70],
        list(requests),
        q_heads=8,
        kv_heads=2,
        head_dim=128,
        page_size=64,
        tables=tables("llama3", 128, max_position=512),
        dtype=torch.bfloat16,
    )


def hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="needs a Hopper GPU")
@pytest.mark.parametrize("splits", [1, 5, 16])
def test_gpu_rag_case_matches_reference(splits):
    """Documents of partial last pages, shared at different deltas, questions of 32 and 7 tokens (a spare slot and
    masked rows), the question's own page causal; split counts that leave some splits without pages."""
    s = gpu_scenario([2048, 1000, 77], [([0, 1, 2], 32), ([2, 0], 7), ([1], 40)])
    q, batch = s.final_prefill()
    assert prefill_hopper.supports(q, s.k_cache, s.v_cache, batch)
    expected = ref(s, q, batch)
    out = prefill_hopper.short_prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, splits)
    assert rel_err(out, expected) < 1e-2
    # Without the deltas the result is another function: the rotation is really applied.
    plain = prefill_hopper.short_prefill_attention(
        q, s.k_cache, s.v_cache, batch, s.tables, s.scale, splits, apply_delta=False
    )
    assert rel_err(plain, expected) > 5e-2


@pytest.mark.parametrize(("rows", "splits"), [(32, 16), (40, 8), (128, 4), (256, 2), (33 * 32, 1)])
def test_split_rule_fills_the_sms_once(monkeypatch, rows, splits):
    """One program per SM: 132 SMs over (query blocks of 32 positions x 8 kv heads), at most 16 splits (hand-computed:
    32 rows are 1 block -> 132 // 8 = 16; 40 rows 2 blocks -> 8; 128 rows 4 -> 4; 256 rows 8 -> 2; 33 blocks -> 1)."""
    monkeypatch.setattr(prefill_hopper, "sm_count", lambda device: 132)
    assert prefill_hopper.num_splits(rows, 32, 8, torch.device("cuda")) == splits


@pytest.mark.parametrize(
    ("rows", "entries", "max_q", "splits"),
    [
        (64, 4, 16, 4),  # 4 entries of 16 positions: a block of 32 each -> 132 // 32 (counting rows alone: 2 -> 8)
        (48, 2, 40, 5),  # entries of 40 and 8: min(cdiv(48, 32) + 1, 2 * cdiv(40, 32)) = 3 blocks -> 132 // 24
        (96, 3, 32, 5),  # 3 entries of 32: 3 blocks, as the rows alone count
    ],
)
def test_split_rule_counts_each_entrys_blocks(monkeypatch, rows, entries, max_q, splits):
    """Blocks are counted per entry (an entry's positions round up to whole blocks of 32 under 4-head groups),
    hand-computed for 132 SMs and 8 kv heads."""
    monkeypatch.setattr(prefill_hopper, "sm_count", lambda device: 132)
    assert prefill_hopper.num_splits(rows, 32, 8, torch.device("cuda"), entries, max_q) == splits


def test_the_prefill_graphs_calls_are_taken(monkeypatch):
    """A CUDA graph bucket the kernel takes by its shapes (`shape_supported`, which is what the prefill graphs decide
    their split count and plan by) gives calls `supports` accepts: the graphs pass first-slot offsets (zeros where
    nothing is relinked) and views of one input buffer, and the pages of the pool. A `supports` that turned such
    calls away for their offsets would leave the graphs on prefill.py's kernel with no plan."""
    from lazyattn.engine.prefill_graphs import StepLayout

    monkeypatch.setattr(prefill_hopper, "shape_supported", lambda *args: True)
    layout = StepLayout(64, 4, 8, 64)
    _, fb = layout.views(layout.buffers("cpu"), 32, 2, num_splits=16)
    kv = torch.zeros(2, 2, 10, 64, 8, 128, dtype=torch.bfloat16)  # the pool: [layers, k/v, pages, slots, heads, dim]
    q = torch.zeros(32, 32, 128, dtype=torch.bfloat16)
    assert fb.attn.firsts is not None
    assert prefill_hopper.supports(q, kv[1, 0], kv[1, 1], fb.attn)


def test_the_switch_and_the_cpu_turn_the_kernel_away(kernel_settings):
    args = (32, 32, 8, 128, torch.bfloat16, 64)
    assert not prefill_hopper.shape_supported(*args, torch.device("cpu"))
    kernel_settings(LAZYATTN_GLUON_PREFILL="0")
    assert not prefill_hopper.enabled()
    assert not prefill_hopper.shape_supported(*args, torch.device("cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="needs a Hopper GPU")
@pytest.mark.parametrize("rope", ["llama3", "interleaved"])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("pages", ["bf16", "fp8", "fp8, V transposed"])
def test_gpu_every_tile_a_new_document(rope, splits, pages):
    """Documents of one page each (and a partial one), so that a program's Q is rotated again at nearly every tile,
    from the copy of q the kernel keeps in shared memory: half-split pairs (Llama) and interleaved pairs, whose
    partners the kernel finds by different register permutations."""
    from tests.kernels.rope_cases import tables
    from tests.kernels.scenario import make_scenario

    s = make_scenario(
        [64] * 9 + [40],
        [(list(range(10)), 32), ([9, 3, 1, 7], 20)],
        q_heads=32,
        kv_heads=8,
        head_dim=128,
        page_size=64,
        tables=tables(rope, 128, max_position=32768, device="cuda"),
        dtype=torch.bfloat16,
        device="cuda",
        seed=11,
    )
    s = with_pages(s, pages)
    q, batch = s.final_prefill()
    assert prefill_hopper.supports(q, s.k_cache, s.v_cache, batch)
    expected = ref(s, q, batch)
    s.poison_unlisted(batch)
    out = prefill_hopper.short_prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, splits)
    assert rel_err(out, expected) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="needs a Hopper GPU")
def test_gpu_lone_question_matches_reference():
    """Batch 1, as the cached RAG request's first token: the grid has no spare slot (prefill.query_slots)."""
    s = gpu_scenario([2048, 2048, 130], [([0, 1, 2], 32)])
    q, batch = s.final_prefill()
    assert prefill_hopper.supports(q, s.k_cache, s.v_cache, batch)
    expected = ref(s, q, batch)
    splits = prefill_hopper.num_splits(q.shape[0], q.shape[1], s.k_cache.shape[2], q.device)
    out = prefill_hopper.short_prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, splits)
    assert rel_err(out, expected) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="needs a Hopper GPU")
@pytest.mark.parametrize("k", [3, 64, 80])
@pytest.mark.parametrize("pages", ["bf16", "fp8", "fp8, V transposed"])
def test_gpu_relinked_documents_match_reference(k, pages):
    """Relinked requests (kernels/paged.py): each shared document is listed from row k, its first k rows replaced by
    private pages, so its first listed page starts at slot k % 64 (k = 64 skips a whole page). Slots before the offset
    hold NaN: reading one would show."""
    from tests.kernels.rope_cases import tables
    from tests.kernels.scenario import make_scenario

    s = make_scenario(
        [2048, 700, 130],
        [([0, 1, 2], 32), ([2, 0], 20)],
        q_heads=32,
        kv_heads=8,
        head_dim=128,
        page_size=64,
        tables=tables("llama3", 128, max_position=32768, device="cuda"),
        dtype=torch.bfloat16,
        device="cuda",
        seed=5,
        relink=k,
    )
    s = with_pages(s, pages)
    for q, batch in (s.final_prefill(), s.relink_prefill()):
        assert prefill_hopper.supports(q, s.k_cache, s.v_cache, batch)
        expected = ref(s, q, batch)
        s.poison_unlisted(batch)
        for splits in (1, 7):
            out = prefill_hopper.short_prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, splits)
            assert rel_err(out, expected) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="needs a Hopper GPU")
def test_gpu_without_tables_is_attention_without_rotation():
    """tables=None: no rotation at all (a launcher that read cos and sin from the uninitialised partials fails)."""
    s = gpu_scenario([2048, 300], [([0, 1], 32), ([1], 9)])
    q, batch = s.final_prefill()
    from lazyattn.kernels import reference

    expected = reference.paged_attention(q, s.k_cache, s.v_cache, batch, None, s.scale)
    out = prefill_hopper.short_prefill_attention(q, s.k_cache, s.v_cache, batch, None, s.scale, 7)
    assert rel_err(out, expected) < 1e-2


def test_the_longest_question_decides_not_the_total(monkeypatch):
    """A call of many short questions is taken at any total (the entries' longest, `max_q`, is what counts); one
    question or prompt longer than MAX_QUESTION positions is not. As on a Hopper GPU: the CPU's own answer is no."""
    monkeypatch.setattr(prefill_hopper, "interpreting", lambda: False)
    monkeypatch.setattr(prefill_hopper, "_capability_of", lambda index: (9, 0))
    cuda = torch.device("cuda", 0)
    shape = (32, 8, 128, torch.bfloat16, 64, cuda)
    assert prefill_hopper.MAX_QUESTION == 256
    assert prefill_hopper.shape_supported(256, *shape)
    assert not prefill_hopper.shape_supported(257, *shape)
    assert not prefill_hopper.shape_supported(0, *shape)
    seen = []
    monkeypatch.setattr(prefill_hopper, "shape_supported", lambda max_q, *rest: seen.append(max_q) or True)
    s = make_small_cpu_scenario(requests=[([0], 5), ([0], 3), ([0], 4)])
    q, batch = s.final_prefill()
    assert q.shape[0] == 12
    assert prefill_hopper.supports(q, s.k_cache, s.v_cache, batch) and seen == [batch.max_q] == [5]


def test_a_long_question_over_placed_documents_is_taken_a_long_prompt_is_not(monkeypatch):
    """Past MAX_QUESTION rows the rule reads the batch's prompts (PagedBatch.max_prompt_q, hand-built here): a
    question of 300 rows over 384 keys at nonzero deltas is taken beside short ones, a prompt of 300 rows over its own
    earlier rows is not, and a batch that did not count its prompts is judged by its longest entry."""
    from lazyattn.kernels.paged import EntryPages, PagedBatch

    # shape_supported's length rule as on an H200 (test_the_longest_question_decides_not_the_total has the rest)
    monkeypatch.setattr(prefill_hopper, "shape_supported", lambda max_q, *rest: 0 < max_q <= 256)
    cache = torch.zeros(20, 64, 8, 128, dtype=torch.bfloat16)
    question = EntryPages([0, 1, 2, 3, 4, 5], [9] * 6, [64] * 6).then([6, 7, 8, 9, 10], [64] * 5)
    prompt = EntryPages([0, 1, 2, 3], [0] * 4, [64] * 4).then([6, 7, 8, 9, 10], [64] * 5)

    def taken(entries, q_lens, counted=True):
        batch = PagedBatch.build(entries, q_lens, [256] * len(entries))
        batch = batch if counted else dataclasses.replace(batch, max_prompt_q=None)
        q = torch.zeros(sum(q_lens), 32, 128, dtype=torch.bfloat16)
        return prefill_hopper.supports(q, cache, cache, batch)

    assert taken([question], [300]) and taken([question, prompt], [300, 32])
    assert prefill_hopper.longest_prompt(PagedBatch.build([question, prompt], [300, 32], [0, 0])) == 256
    assert not taken([prompt], [300]) and not taken([question, prompt], [300, 257])
    assert not taken([question], [300], counted=False)
    assert taken([question, prompt], [200, 32], counted=False)


def test_the_backend_offers_every_prefill_call_of_any_total(monkeypatch):
    """TritonBackend asks the Hopper kernel about prefill calls past 256 rows too (their questions may be short),
    never about decode steps; where it declines, prefill.py's kernel answers as the reference does."""
    from tests.kernels import test_triton_backend as tb

    asked = []
    monkeypatch.setattr(prefill_hopper, "supports", lambda q, k, v, batch: asked.append(q.shape[0]) or False)
    tab = tb.tables("llama3", tb.DIM, max_position=512, device=tb.DEVICE)
    kv = torch.randn(tb.LAYERS, 2, 40, tb.PAGE, tb.HKV, tb.DIM, generator=torch.Generator().manual_seed(0))
    backends = (
        tb.TritonBackend(kv.clone().to(tb.DEVICE), tab, tb.DIM**-0.5),
        tb.ReferenceBackend(kv.clone().to(tb.DEVICE), tab, tb.DIM**-0.5),
    )
    a, b = list(range(0, 10)), list(range(10, 20))  # two prompts of 150 tokens: 300 rows in one call
    fb = tb.forward_batch(
        [
            (tb.EntryPages(a, [0] * 10, [16] * 9 + [6]), 0, 150, tb.slots_of(a, 0, 150)),
            (tb.EntryPages(b, [0] * 10, [16] * 9 + [6]), 0, 150, tb.slots_of(b, 0, 150)),
        ]
    )
    tb.run_both(backends, fb, seed=1)
    assert asked == [300] * tb.LAYERS
    step = tb.forward_batch([(tb.EntryPages(a, [0] * 10, [16] * 9 + [7]), 150, 1, tb.slots_of(a, 150, 151))])
    tb.run_both(backends, step, seed=2)
    assert asked == [300] * tb.LAYERS


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="needs a Hopper GPU")
@pytest.mark.parametrize("pages", ["bf16", "fp8", "fp8, V transposed"])
def test_gpu_many_questions_past_256_rows_match_reference(pages):
    """Twelve questions of 32 tokens and one of 7 over shared documents: 391 rows in one call, taken by this kernel
    (the longest question decides); a lone prompt of 300 tokens is left to prefill.py's."""
    requests = [([i % 3, (i + 1) % 3], 32) for i in range(12)] + [([2], 7)]
    s = with_pages(gpu_scenario([2048, 1000, 77], requests), pages)
    q, batch = s.final_prefill()
    assert q.shape[0] == 391 and prefill_hopper.supports(q, s.k_cache, s.v_cache, batch)
    splits = prefill_hopper.num_splits(q.shape[0], q.shape[1], s.k_cache.shape[2], q.device, 13, batch.max_q)
    out = prefill_hopper.short_prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, splits)
    assert rel_err(out, ref(s, q, batch)) < 1e-2
    long = gpu_scenario([], [([], 300)])
    q, batch = long.final_prefill()
    assert not prefill_hopper.supports(q, long.k_cache, long.v_cache, batch)


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="needs a Hopper GPU")
@pytest.mark.parametrize("pages", ["bf16", "fp8", "fp8, V transposed"])
def test_gpu_long_questions_over_placed_documents_match_reference(pages):
    """Questions of 384 and 600 rows over documents placed at other positions than they were encoded at (1,077 and
    2,048 keys at nonzero deltas), beside one of 32: taken by this kernel past MAX_QUESTION rows; the same 600 rows
    as a prompt over its own earlier rows alone are not."""
    s = with_pages(gpu_scenario([2048, 1000, 77], [([0, 1, 2], 384), ([1, 0], 600), ([2], 32)]), pages)
    q, batch = s.final_prefill()
    assert batch.max_q == 600 and batch.max_prompt_q == 32
    assert prefill_hopper.supports(q, s.k_cache, s.v_cache, batch)
    splits = prefill_hopper.num_splits(q.shape[0], q.shape[1], s.k_cache.shape[2], q.device, 3, batch.max_q)
    out = prefill_hopper.short_prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, splits)
    assert rel_err(out, ref(s, q, batch)) < 1e-2
    prompt = gpu_scenario([], [([], 600)])
    q, batch = prompt.final_prefill()
    assert batch.max_prompt_q == 600 and not prefill_hopper.supports(q, prompt.k_cache, prompt.v_cache, batch)


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="needs a Hopper GPU")
@pytest.mark.parametrize("splits", [1, 5, 16])
def test_gpu_fp8_pages_match_reference(splits):
    """FP8 pages (kv_cache_dtype=fp8_e4m3) through this kernel, not prefill.py's: the RAG case of
    test_gpu_rag_case_matches_reference, page padding of real NaN bytes. The tiles are widened to float16 exactly and
    q and P rounded to float16 for the dots, so over the same values the result is closer to the reference than the
    16-bit path's over bf16 pages (every e4m3 value is a bf16 value), whose q and P round to bf16."""
    s = fp8_pages(gpu_scenario([2048, 1000, 77], [([0, 1, 2], 32), ([2, 0], 7), ([1], 40)]))
    q, batch = s.final_prefill()
    assert prefill_hopper.supports(q, s.k_cache, s.v_cache, batch)
    expected = ref(s, q, batch)
    k16, v16 = s.k_cache.bfloat16(), s.v_cache.bfloat16()
    as_bf16 = prefill_hopper.short_prefill_attention(q, k16, v16, batch, s.tables, s.scale, splits)
    s.poison_unlisted(batch)
    out = prefill_hopper.short_prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, splits)
    assert rel_err(out, expected) < 1e-2
    assert rel_err(out, expected) < rel_err(as_bf16, expected)


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="needs a Hopper GPU")
def test_gpu_fp8_pages_under_fp16_queries_and_without_tables():
    """A float16 q over FP8 pages (its own dtype is the tiles'), and tables=None (no rotation: Q is q as it is)."""
    from lazyattn.kernels import reference

    s = fp8_pages(gpu_scenario([2048, 300], [([0, 1], 32), ([1], 9)], dtype=torch.float16))
    q, batch = s.final_prefill()
    assert q.dtype == torch.float16 and prefill_hopper.supports(q, s.k_cache, s.v_cache, batch)
    splits = prefill_hopper.num_splits(q.shape[0], q.shape[1], s.k_cache.shape[2], q.device, batch.batch_size)
    out = prefill_hopper.short_prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, splits)
    assert out.dtype == torch.float16 and rel_err(out, ref(s, q, batch)) < 1e-2
    plain = reference.paged_attention(q, s.k_cache, s.v_cache, batch, None, s.scale)
    out = prefill_hopper.short_prefill_attention(q, s.k_cache, s.v_cache, batch, None, s.scale, 3)
    assert rel_err(out, plain) < 1e-2
