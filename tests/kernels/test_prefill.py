"""Triton prefill kernel against the PyTorch reference and the dense ground truth (the block semantics).

CPU runs go through TRITON_INTERPRET (tests/conftest.py), so shapes stay small; `gpu` tests use real ones.
"""

import pytest
import torch

from lazyattn.kernels import reference
from lazyattn.kernels.paged import EntryPages, PagedBatch
from lazyattn.kernels.prefill import PrefillConfig, prefill_attention, prefill_config
from lazyattn.kernels.prefill_plan import PLAN_MAX_PIECES, PLAN_WIDTH, plan_runs, split_plan, with_plan
from lazyattn.kernels.rope import RopeConfig, RopeTables
from tests.kernels.rope_cases import ROPE_CASES, tables
from tests.kernels.scenario import make_scenario

DOCS = [37, 16, 5]  # partial last pages at page sizes 16 and 32
REQUESTS = [([2, 0, 1], 9), ([1, 2], 20), ([0], 1)]  # docs 0-2 shared at different deltas


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def run(s, q, batch, tables=None, **kw):
    """Kernel output, written into a NaN-poisoned `out` that must come back fully written."""
    out = torch.full_like(q, float("nan"))
    if kw.get("config") is not None:
        kw["config"] = PrefillConfig(*kw["config"])
    got = prefill_attention(
        q, s.k_cache, s.v_cache, batch, s.tables if tables is None else tables, s.scale, out=out, **kw
    )
    assert got.data_ptr() == out.data_ptr()
    assert not out.isnan().any(), "some output element was not written"
    return out


def ref(s, q, batch):
    return reference.paged_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale)


# (q heads, kv heads, head_dim, page size): GQA 4:1 and 1:1, both head dims and page sizes.
LAYOUTS = [(4, 1, 64, 16), (2, 2, 128, 32)]


@pytest.mark.parametrize("rope", list(ROPE_CASES))
@pytest.mark.parametrize("layout", LAYOUTS, ids=["gqa4-d64-p16", "mha-d128-p32"])
def test_final_prefill_matches_reference_and_dense(rope, layout):
    hq, hkv, d, ps = layout
    s = make_scenario(
        DOCS, REQUESTS, q_heads=hq, kv_heads=hkv, head_dim=d, page_size=ps, tables=tables(rope, d), seed=1
    )
    q, batch = s.final_prefill()
    out = run(s, q, batch)
    assert rel_err(out, ref(s, q, batch)) < 1e-5
    assert rel_err(out, torch.cat([s.dense_final(r) for r in s.requests])) < 1e-5


@pytest.mark.parametrize(
    "rope,dtype", [("default", torch.bfloat16), ("interleaved", torch.bfloat16), ("llama3", torch.float16)]
)
def test_16bit_within_rounding(rope, dtype):
    s = make_scenario(
        DOCS, REQUESTS, q_heads=4, kv_heads=1, head_dim=64, page_size=16, tables=tables(rope, 64), dtype=dtype, seed=2
    )
    q, batch = s.final_prefill()
    out = run(s, q, batch)
    assert out.dtype == dtype
    assert rel_err(out, ref(s, q, batch)) < 1e-2
    assert rel_err(out, torch.cat([s.dense_final(r) for r in s.requests])) < 1e-2


def test_chunked_final_prefill_and_empty_entry():
    """Chunks starting mid-final-segment, a whole one, and an entry with no query rows."""
    s = make_scenario(
        [40, 23], [([1, 0], 30), ([0], 12), ([1], 7)], head_dim=64, page_size=16, tables=tables("llama3", 64), seed=3
    )
    chunks = [(11, 27), (0, 12), (5, 5)]
    q, batch = s.final_prefill(chunks)
    out = run(s, q, batch)
    want = torch.cat([s.dense_final(r, lo, hi) for r, (lo, hi) in zip(s.requests, chunks)])
    assert rel_err(out, want) < 1e-5
    assert rel_err(out, ref(s, q, batch)) < 1e-5


def test_doc_prefill_chunks_and_no_delta_path():
    """Encoding documents alone (delta 0 everywhere), from their start and from mid-document."""
    s = make_scenario(
        [40, 23, 70], [([0], 4)], q_heads=4, kv_heads=2, head_dim=64, page_size=32, tables=tables("default", 64), seed=4
    )
    chunks = [(0, 17, 40), (1, 0, 23), (2, 33, 70)]
    q, batch = s.doc_prefill(chunks)
    out = run(s, q, batch)
    assert rel_err(out, torch.cat([s.dense_doc(d, lo, hi) for d, lo, hi in chunks])) < 1e-5
    # With every delta 0, compiling the rotation out (or passing no tables) changes nothing.
    assert torch.equal(run(s, q, batch, apply_delta=False), out)
    no_tables = prefill_attention(q, s.k_cache, s.v_cache, batch, None, s.scale)
    assert torch.equal(no_tables, out)


def test_dropping_deltas_changes_the_result():
    s = make_scenario([40, 23], [([1, 0], 8)], head_dim=64, page_size=16, tables=tables("default", 64), seed=5)
    q, batch = s.final_prefill()
    assert rel_err(run(s, q, batch, apply_delta=False), s.dense_final(s.requests[0])) > 1e-2


@pytest.mark.parametrize("splits,config", [(2, None), (3, None), (9, None), (3, (64, 32)), (5, (16, 32))])
def test_split_kv_matches_reference(splits, config):
    """Split-KV (fewer splits than runs: balanced page ranges; more: one chunk per split; more splits than
    some entries have pages: empty splits) and the merge, also with tiles of two pages (splits and runs
    starting at odd pages)."""
    s = make_scenario(
        DOCS, REQUESTS, q_heads=4, kv_heads=1, head_dim=64, page_size=16, tables=tables("ntk", 64), seed=6
    )
    q, batch = s.final_prefill()
    out = run(s, q, batch, num_splits=splits, config=config)
    assert rel_err(out, ref(s, q, batch)) < 1e-5


@pytest.mark.parametrize("splits", [2, 4, 7, 16])
@pytest.mark.parametrize("rotated", [0, 8])
def test_splits_found_by_the_kernel(splits, rotated):
    """Splits that find their chunks by scanning the deltas (no host plan), Q rotated up front or in the kernel:
    fewer splits than some entry's runs, as many, and more than the pieces (splits left without pages); partial
    pages, several entries, GQA 4:1, deltas per document."""
    s = make_scenario(
        DOCS, REQUESTS, q_heads=4, kv_heads=1, head_dim=64, page_size=16, tables=tables("llama3", 64), seed=14
    )
    q, batch = s.final_prefill()
    assert rel_err(run(s, q, batch, num_splits=splits, rotated_runs=rotated), ref(s, q, batch)) < 1e-5


@pytest.mark.parametrize("splits,switch", [(2, 0), (4, 2), (7, 0), (7, 100), (16, 4)])
@pytest.mark.parametrize("rotated", [0, 8])
def test_host_plan_matches_reference(splits, switch, rotated):
    """Splits that take the host's plan (split_plan): programs of one piece and of several (a Q tile per run, up
    front or rotated in the kernel), splits without pages, partial pages, three entries of other runs."""
    s = make_scenario(
        DOCS, REQUESTS, q_heads=4, kv_heads=1, head_dim=64, page_size=16, tables=tables("llama3", 64), seed=16
    )
    q, batch = s.final_prefill()
    planned = with_plan(batch, splits, switch)
    assert planned.plan.shape == (3, splits, PLAN_WIDTH) and (planned.plan[:, :, 0] >= 0).all()
    assert rel_err(run(s, q, planned, rotated_runs=rotated), ref(s, q, batch)) < 1e-5


def test_host_plan_of_minus_one_falls_back_to_the_kernels_chunks():
    """An entry whose records say -1 (more runs than a record holds) finds its chunks itself, beside entries that
    follow their plan; chunked rows see only their causal pages of a planned entry."""
    s = make_scenario(
        [40, 23], [([1, 0], 30), ([0], 12), ([1], 7)], head_dim=64, page_size=16, tables=tables("llama3", 64), seed=17
    )
    chunks = [(11, 27), (0, 12), (5, 5)]
    q, batch = s.final_prefill(chunks)
    planned = with_plan(batch, 3)
    planned.plan[1] = torch.tensor([-1] + [0] * (PLAN_WIDTH - 1))
    want = torch.cat([s.dense_final(r, lo, hi) for r, (lo, hi) in zip(s.requests, chunks)])
    assert rel_err(run(s, q, planned), want) < 1e-5


def pieces_of(plan):
    """[(first page, end page, run)] per split of one entry's flat plan."""
    records = [plan[i : i + PLAN_WIDTH] for i in range(0, len(plan), PLAN_WIDTH)]
    return [[tuple(r[1 + 3 * j : 4 + 3 * j]) for j in range(r[0])] for r in records]


@pytest.mark.parametrize(
    "lengths,splits",
    [((1, 32, 32, 32, 32, 32, 1), 16), ((7,), 4), ((3, 1, 1, 9, 2), 2), ((5,) * 12, 4), ((40, 1), 3), ((2,), 16)],
)
@pytest.mark.parametrize("switch", [0, 2, 100])
def test_plan_runs_deals_every_page_once_in_one_run_per_piece(lengths, splits, switch):
    bounds = [sum(lengths[:i]) for i in range(len(lengths) + 1)]
    plan = plan_runs(lengths, splits, switch)
    assert len(plan) == splits * PLAN_WIDTH
    pieces = pieces_of(plan)
    flat = [p for split in pieces for p in split]
    assert [p[0] for p in flat] == [0] + [p[1] for p in flat[:-1]] and flat[-1][1] == bounds[-1]  # in order, once
    for lo, hi, r in flat:
        assert bounds[r] <= lo < hi <= bounds[r + 1]
    assert all(len(split) <= PLAN_MAX_PIECES for split in pieces)
    # never worse than a balanced range plus a switch per run it would cross, nor than whole runs cut evenly
    cost = max(sum(hi - lo for lo, hi, _ in split) + switch * max(0, len(split) - 1) for split in pieces)
    balanced = -(-bounds[-1] // splits)
    assert cost <= balanced + switch * len(lengths) or cost <= max(lengths)
    assert split_plan([d for d, n in enumerate(lengths) for _ in range(n)], splits, switch) == plan


def test_plan_runs_gives_up_past_what_records_hold():
    assert plan_runs((1,) * (2 * PLAN_MAX_PIECES + 1), 2) == ((-1,) + (0,) * (PLAN_WIDTH - 1)) * 2


@pytest.mark.parametrize("rotated", [0, 2, 8])
@pytest.mark.parametrize("splits", [1, 3])
def test_runs_rotated_up_front_in_the_kernel_or_both(rotated, splits):
    """Q rotated per run before the attention kernel (8: every run), in it (0), or both in one call (2: the first
    request's delta-5 run comes rotated, its delta-42 run is rotated in the kernel)."""
    s = make_scenario(
        DOCS, REQUESTS, q_heads=4, kv_heads=1, head_dim=64, page_size=16, tables=tables("llama3", 64), seed=12
    )
    q, batch = s.final_prefill()
    assert rel_err(run(s, q, batch, num_splits=splits, rotated_runs=rotated), ref(s, q, batch)) < 1e-5


@pytest.mark.parametrize("rope", ["default", "interleaved"])
def test_rotated_runs_are_the_query_at_its_position_minus_delta(rope):
    """Copy r of a row is the raw query rotated at (its position - delta of its entry's run r), as
    R_-delta R_m = R_(m - delta). Runs of delta 0 are read from q itself and are left unwritten."""
    from lazyattn.kernels.prefill import _rotate_runs
    from lazyattn.kernels.rope import apply_rope

    s = make_scenario(
        DOCS, REQUESTS, q_heads=4, kv_heads=1, head_dim=64, page_size=16, tables=tables(rope, 64), seed=13
    )
    q, batch = s.final_prefill()
    copies = _rotate_runs(q, batch, s.tables, 4)
    cu = batch.cu_seqlens_q.tolist()
    checked = 0
    for e, r in enumerate(s.requests):
        deltas = batch.deltas[e, : int(batch.num_pages[e])].tolist()
        runs = [d for i, d in enumerate(deltas) if i == 0 or d != deltas[i - 1]]
        pos = torch.arange(cu[e + 1] - cu[e]) + s.context_len(r)
        for i, delta in enumerate(runs[:4]):
            if delta:
                want = apply_rope(r.final.q, pos - delta, s.tables)
                assert rel_err(copies[i, cu[e] : cu[e + 1]], want) < 1e-6
                checked += 1
    assert checked == 3  # deltas 5 and 42 of the first request, 16 of the second


@pytest.mark.parametrize("config", [(16, 16), (32, 32), (64, 16), (32, 64), (16, 64)])
def test_block_shapes_and_uneven_head_group(config):
    """Tiles smaller than a page or of two pages, a head group of 3 (rows of the M tile left over),
    several q blocks."""
    s = make_scenario(
        [45, 20],
        [([0, 1], 50), ([1], 33)],
        q_heads=6,
        kv_heads=2,
        head_dim=64,
        page_size=32,
        tables=tables("yarn", 64),
        seed=7,
    )
    q, batch = s.final_prefill()
    out = run(s, q, batch, config=config)
    assert rel_err(out, ref(s, q, batch)) < 1e-5


def test_scans_longer_than_one_block(monkeypatch):
    """Entry lookup, causal page count, run count and chunk bounds that need several vector steps (tiny
    scan blocks)."""
    from lazyattn.kernels import prefill

    monkeypatch.setattr(prefill, "BLOCK_B", 2)
    monkeypatch.setattr(prefill, "BLOCK_P", 4)
    s = make_scenario([150, 70, 37], REQUESTS, head_dim=64, page_size=16, tables=tables("default", 64), seed=10)
    q, batch = s.final_prefill()
    assert rel_err(run(s, q, batch), ref(s, q, batch)) < 1e-5
    assert rel_err(run(s, q, batch, num_splits=3), ref(s, q, batch)) < 1e-5


@pytest.mark.parametrize("config", [(64, 16), (64, 32)])
def test_page_padding_is_never_read(config):
    """NaN in every slot past a page's valid keys (and in unlisted pages) must not reach the output."""
    s = make_scenario(
        DOCS, REQUESTS, q_heads=4, kv_heads=1, head_dim=64, page_size=16, tables=tables("llama3", 64), seed=11
    )
    q, batch = s.final_prefill()
    want = ref(s, q, batch)
    s.poison_unlisted(batch)
    assert rel_err(run(s, q, batch, config=config), want) < 1e-5
    assert rel_err(run(s, q, batch, config=config, num_splits=4), want) < 1e-5


def test_strided_pool_view():
    """k/v caches as views of a [layers, 2, pages, page_size, Hkv, D] pool."""
    s = make_scenario(
        DOCS, REQUESTS, q_heads=4, kv_heads=2, head_dim=64, page_size=16, tables=tables("linear", 64), seed=8
    )
    q, batch = s.final_prefill()
    pool = torch.randn(3, 2, *s.k_cache.shape)
    pool[1, 0], pool[1, 1] = s.k_cache, s.v_cache
    out = torch.full_like(q, float("nan"))
    prefill_attention(q, pool[1, 0], pool[1, 1], batch, s.tables, s.scale, out=out)
    assert rel_err(out, ref(s, q, batch)) < 1e-5


@pytest.mark.parametrize("splits", [None, 4])
@pytest.mark.parametrize("config", [(64, 16), (32, 32)])
def test_transposed_v_pages(config, splits):
    """V pages stored transposed (a page's slots contiguous for each kv head and channel) give the reference's result,
    with NaN in every slot past a page's keys, split and not, chunked prefill included."""
    s = make_scenario(
        DOCS, REQUESTS, q_heads=4, kv_heads=2, head_dim=64, page_size=16, tables=tables("llama3", 64), seed=4
    )
    for chunks in (None, [(0, 4), (3, 20), (0, 1)]):
        q, batch = s.final_prefill(chunks)
        want = ref(s, q, batch)
        s.poison_unlisted(batch)
        got = run(s.with_transposed_v(), q, batch, config=config, num_splits=splits)
        assert rel_err(got, want) < 1e-5


def test_large_deltas():
    """Deltas past 2^20 gather far rows of the cos/sin tables (the reference rotates by the same ones)."""
    big = (1 << 20) + 3000
    t = RopeTables.build(RopeConfig(head_dim=32, base=500000.0), big + 64)
    s = make_scenario([40, 23], [([1, 0], 9)], head_dim=32, page_size=16, tables=t, seed=9)
    q, batch = s.final_prefill()
    batch.deltas[batch.deltas != 0] += big - 40
    out = run(s, q, batch)
    assert rel_err(out, ref(s, q, batch)) < 1e-5


def test_prefill_config_fits_the_call():
    for fp32, head_dim, group, page_size in [
        (False, 128, 4, 64),
        (False, 128, 4, 16),
        (False, 256, 8, 32),
        (True, 64, 1, 16),
        (False, 64, 32, 128),
        (False, 128, 4, 256),
    ]:
        cfg = prefill_config(fp32, head_dim, group, page_size)
        m, n, warps, stages = cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages
        # A tile is part of one page or two whole pages.
        assert (page_size % n == 0 or n == 2 * page_size) and n >= 16 and m >= max(group, 16)
        assert warps in (4, 8) and stages >= 2


def test_rejects_unsupported_shapes():
    s = make_scenario([20], [([0], 4)], head_dim=64, page_size=16, tables=tables("default", 64))
    q, batch = s.final_prefill()
    with pytest.raises(ValueError, match="out must not be q"):
        prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, out=q)
    with pytest.raises(ValueError, match="page_size"):
        prefill_attention(q, s.k_cache[:, :8], s.v_cache[:, :8], batch, s.tables, s.scale)
    with pytest.raises(ValueError, match="head_dim"):
        prefill_attention(q[..., :48], s.k_cache[..., :48], s.v_cache[..., :48], batch, None, s.scale)


# --- GPU: real shapes (Llama-3.1-8B heads), run by the lead on the device ----------------------------


def gpu_scenario(doc_lens, requests, dtype=torch.bfloat16, page_size=64, seed=0):
    t = tables("llama3", 128, max_position=32768, device="cuda")
    return make_scenario(
        doc_lens,
        requests,
        q_heads=32,
        kv_heads=8,
        head_dim=128,
        page_size=page_size,
        tables=t,
        dtype=dtype,
        device="cuda",
        seed=seed,
    )


@pytest.mark.gpu
def test_gpu_long_causal_prefill():
    s = gpu_scenario([], [([], 3000), ([], 1500)])
    q, batch = s.final_prefill()
    out = run(s, q, batch)
    assert rel_err(out, ref(s, q, batch)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("batch_size", [1, 4])
def test_gpu_rag_case(batch_size):
    """5 cached documents x 2048 in different orders + a 32-token question (split-KV at batch 1)."""
    orders = [[(i + j) % 5 for j in range(5)] for i in range(batch_size)]
    s = gpu_scenario([2048] * 5, [(o, 32) for o in orders])
    q, batch = s.final_prefill()
    out = run(s, q, batch)
    assert rel_err(out, ref(s, q, batch)) < 1e-2
    assert rel_err(out, torch.cat([s.dense_final(r) for r in s.requests])) < 1e-2
    for splits in (1, 7):
        assert rel_err(run(s, q, batch, num_splits=splits), out) < 1e-2
    for splits, switch in ((16, 4), (16, 0), (5, 100)):  # the host's plan (one piece per split, or several)
        assert rel_err(run(s, q, with_plan(batch, splits, switch)), out) < 1e-2
    # Q rotated in the kernel, not up front (other chunks at 1 split, hence other roundings of the partials)
    assert rel_err(run(s, q, batch, rotated_runs=0), out) < 1e-2


@pytest.mark.gpu
def test_gpu_chunked_and_doc_prefill():
    s = gpu_scenario([2048, 1000], [([1, 0], 1200)], page_size=16)
    q, batch = s.final_prefill([(517, 1200)])
    assert rel_err(run(s, q, batch), ref(s, q, batch)) < 1e-2
    q, batch = s.doc_prefill([(0, 700, 2048), (1, 0, 1000)])
    out = run(s, q, batch)
    assert rel_err(out, ref(s, q, batch)) < 1e-2
    assert torch.equal(run(s, q, batch, apply_delta=False), out)


@pytest.mark.gpu
def test_gpu_fp32_is_tight():
    s = gpu_scenario([700, 300], [([0, 1], 200), ([1], 90)], dtype=torch.float32, seed=1)
    q, batch = s.final_prefill()
    assert rel_err(run(s, q, batch), ref(s, q, batch)) < 2e-5


@pytest.mark.gpu
def test_gpu_pool_of_many_pages_uses_int64_offsets():
    """A page id whose offset (page * page stride) passes 2^31 elements."""
    page_stride = 64 * 8 * 128
    n_pages = (1 << 31) // page_stride + 2
    k_pool = torch.zeros(n_pages, 64, 8, 128, dtype=torch.bfloat16, device="cuda")
    v_pool = torch.zeros_like(k_pool)
    k_pool[-1].normal_()
    v_pool[-1].normal_()
    batch = PagedBatch.build([EntryPages([n_pages - 1], [0], [40])], [40], [0], "cuda")
    q = torch.randn(40, 32, 128, dtype=torch.bfloat16, device="cuda")
    out = prefill_attention(q, k_pool, v_pool, batch, None, 128**-0.5)
    want = reference.paged_attention(q, k_pool, v_pool, batch, None, 128**-0.5)
    assert rel_err(out, want) < 1e-2
