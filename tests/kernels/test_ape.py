"""Attention temperature and scale on document pages (kernels/paged.py; docs/design.md, "APE").

The PyTorch reference against a dense computation written here from the definition (fp64, per-key s / T + ln S on
the keys of documents placed after the first), then the Triton decode and prefill kernels against the reference.
On a CPU the kernels run under TRITON_INTERPRET (tests/conftest.py); gpu-marked tests take Llama-3.1-8B shapes.
"""

import math

import pytest
import torch

from lazyattn.kernels import reference
from lazyattn.kernels.decode import decode_attention
from lazyattn.kernels.paged import EntryPages, PagedBatch
from lazyattn.kernels.prefill import PrefillConfig, prefill_attention
from lazyattn.kernels.prefill_plan import with_plan
from lazyattn.kernels.rope import apply_rope
from tests.kernels.rope_cases import tables
from tests.kernels.scenario import Scenario, make_scenario

DOCS = [37, 16, 5, 21]
# The first placed document plays S_0 (unscaled); the others get each request's temperature and scale.
REQUESTS = [([3, 0, 1], 9), ([1, 2, 0], 20), ([0], 3), ([2, 3], 5)]
APE = [(0.6, 1.8), (1.5, 0.5), (0.8, 2.0), (1.0, 3.0)]  # (T, S) per request


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def scenario(page_size=16, heads=(4, 1), head_dim=64, seed=0, docs=DOCS, reqs=REQUESTS):
    return make_scenario(
        docs,
        reqs,
        q_heads=heads[0],
        kv_heads=heads[1],
        head_dim=head_dim,
        page_size=page_size,
        tables=tables("llama3", head_dim),
        seed=seed,
    )


def with_ape(s: Scenario, entry: EntryPages, request: int, ape=APE) -> EntryPages:
    """The entry with request's (T, S) on the pages of its documents after the first (the scenario's placed
    documents after the first are exactly the pages of delta > 0)."""
    t, scale = ape[request]
    inv = [1.0 / t if d > 0 else 1.0 for d in entry.deltas]
    log = [math.log(scale) if d > 0 else 0.0 for d in entry.deltas]
    return EntryPages(entry.pages, entry.deltas, entry.valid, entry.firsts, inv, log)


def final_batch(s: Scenario, chunks=None, ape=APE) -> tuple[torch.Tensor, PagedBatch]:
    """Like Scenario.final_prefill, with the temperature and scale on the documents' pages."""
    chunks = chunks or [(0, r.final.length) for r in s.requests]
    qs, entries, lens, starts = [], [], [], []
    for i, (r, (lo, hi)) in enumerate(zip(s.requests, chunks)):
        ctx = s.context_len(r)
        qs.append(apply_rope(r.final.q[lo:hi], torch.arange(ctx + lo, ctx + hi, device=s.k_cache.device), s.tables))
        entries.append(with_ape(s, s.final_entry(r, hi), i, ape))
        lens.append(hi - lo)
        starts.append(ctx + lo)
    return torch.cat(qs), PagedBatch.build(entries, lens, starts, s.k_cache.device)


def dense_ape(s: Scenario, r_index: int, lo: int, hi: int, ape=APE) -> torch.Tensor:
    """Rows [lo, hi) of the final segment over the concatenation at logical positions (fp64), the scores of a key
    of a document placed after the first turned into s / T + ln S."""
    r = s.requests[r_index]
    t, scale = ape[r_index]
    parts = [s.docs[d] for d in r.docs] + [r.final]
    scaled = [0 < j < len(r.docs) for j in range(len(parts))]
    inv = torch.cat([torch.full((p.length,), 1.0 / t if x else 1.0) for p, x in zip(parts, scaled)]).double()
    log = torch.cat([torch.full((p.length,), math.log(scale) if x else 0.0) for p, x in zip(parts, scaled)]).double()
    ctx = s.context_len(r)
    q = torch.cat([p.q for p in parts])[ctx + lo : ctx + hi].double()
    k = torch.cat([p.k for p in parts]).double()
    v = torch.cat([p.v for p in parts]).double()
    dev = q.device
    q = apply_rope(q, torch.arange(ctx + lo, ctx + hi, device=dev), s.tables)
    k = apply_rope(k, torch.arange(k.shape[0], device=dev), s.tables)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("mhd,nhd->hmn", q, k) * s.scale * inv.to(dev) + log.to(dev)
    causal = torch.arange(k.shape[0], device=dev)[None, :] <= torch.arange(ctx + lo, ctx + hi, device=dev)[:, None]
    probs = torch.softmax(scores.masked_fill(~causal[None], float("-inf")), dim=-1)
    return torch.einsum("hmn,nhd->mhd", probs, v)


def ref(s, q, batch):
    return reference.paged_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale)


def test_reference_equals_the_definition_and_differs_from_plain():
    s = scenario(seed=1)
    q, batch = final_batch(s)
    want = torch.cat([dense_ape(s, i, 0, r.final.length) for i, r in enumerate(s.requests)])
    got = ref(s, q, batch)
    assert rel_err(got, want) < 1e-6
    plain_q, plain = s.final_prefill()
    assert rel_err(ref(s, plain_q, plain), want) > 1e-2  # the temperature and scale change the output
    # T = S = 1 everywhere is the plain contract
    q1, ones = final_batch(s, ape=[(1.0, 1.0)] * len(APE))
    assert ones.inv_temps is None and torch.equal(ref(s, q1, ones), ref(s, plain_q, plain))


def test_build_keeps_the_tables_in_one_buffer():
    s = scenario()
    _, batch = final_batch(s)
    assert batch.inv_temps.stride() == batch.pages.stride() == batch.log_scales.stride()
    assert batch.log_scales.data_ptr() == batch.inv_temps.data_ptr() + 4 * batch.ape_gap
    with pytest.raises(ValueError, match="inv_temps must be > 0"):
        PagedBatch.build([EntryPages([0], [0], [4], None, [0.0], [0.0])], [1], [3])


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("page_size", [16, 32])
def test_decode_matches_reference(splits, page_size):
    s = scenario(page_size=page_size, seed=2)
    q, batch = final_batch(s, [(r.final.length - 1, r.final.length) for r in s.requests])
    out = decode_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, num_splits=splits)
    assert rel_err(out, ref(s, q, batch)) < 1e-5
    want = torch.cat([dense_ape(s, i, r.final.length - 1, r.final.length) for i, r in enumerate(s.requests)])
    assert rel_err(out, want) < 1e-5


def test_decode_with_relinked_offsets():
    """firsts and the temperature tables together (a relinked request's page table shape)."""
    s = make_scenario(DOCS, REQUESTS[:2], tables=tables("default", 64), relink=5, seed=3)
    entries, starts = [], []
    for i, r in enumerate(s.requests):
        e = s.final_entry(r, r.final.length)
        n = len(e.pages)
        inv = [1.0 / APE[i][0] if d > 0 else 1.0 for d in e.deltas]
        entries.append(EntryPages(e.pages, e.deltas, e.valid, e.firsts, inv, [0.3] * n))
        starts.append(s.context_len(r) + r.final.length - 1)
    qs = [apply_rope(r.final.q[-1:], torch.tensor([st]), s.tables) for r, st in zip(s.requests, starts, strict=True)]
    q, batch = torch.cat(qs), PagedBatch.build(entries, [1] * len(entries), starts)
    assert batch.firsts is not None
    out = decode_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, num_splits=2)
    assert rel_err(out, ref(s, q, batch)) < 1e-5


@pytest.mark.parametrize(
    "splits,config,rotated",
    [(1, None, None), (3, None, None), (1, (16, 32), 0), (4, (32, 64), None), (2, (64, 16), 0)],
)
def test_prefill_matches_reference(splits, config, rotated):
    """Split-KV or not, tiles of part of a page and of two pages (block_n 2 x page_size), Q rotated up front or in
    the kernel."""
    s = scenario(page_size=16 if config is None else 32 if config[1] == 64 else 16, seed=4)
    q, batch = final_batch(s, [(0, 9), (7, 20), (0, 3), (2, 5)])
    kw = {"num_splits": splits, "rotated_runs": rotated}
    if config is not None:
        kw["config"] = PrefillConfig(*config)
    out = prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, **kw)
    assert rel_err(out, ref(s, q, batch)) < 1e-5
    chunks = [(0, 9), (7, 20), (0, 3), (2, 5)]
    want = torch.cat([dense_ape(s, i, lo, hi) for i, (lo, hi) in enumerate(chunks)])
    assert rel_err(out, want) < 1e-5


def test_prefill_two_page_tiles_across_a_scaled_boundary():
    """block_n = 2 x page_size: tiles whose two pages belong to documents of different scale."""
    s = scenario(page_size=16, seed=5, docs=[16, 16, 48], reqs=[([0, 1, 2], 12)])
    q, batch = final_batch(s, ape=[(0.5, 4.0)])
    out = prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, config=PrefillConfig(16, 32))
    assert rel_err(out, dense_ape(s, 0, 0, 12, ape=[(0.5, 4.0)])) < 1e-5


def test_prefill_host_plan():
    s = scenario(seed=6)
    q, batch = final_batch(s)
    out = prefill_attention(q, s.k_cache, s.v_cache, with_plan(batch, 5, 1), s.tables, s.scale)
    assert rel_err(out, ref(s, q, batch)) < 1e-5


# --- GPU: Llama-3.1-8B heads, run by the lead on the device ----------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("batch_size", [1, 4])
def test_gpu_rag_case(batch_size):
    """5 documents x 2048 (the first is S_0) + a 32-token question: prefill and decode, bf16."""
    orders = [[(i + j) % 5 for j in range(5)] for i in range(batch_size)]
    s = make_scenario(
        [2048] * 5,
        [(o, 32) for o in orders],
        q_heads=32,
        kv_heads=8,
        head_dim=128,
        page_size=64,
        tables=tables("llama3", 128, max_position=32768, device="cuda"),
        dtype=torch.bfloat16,
        device="cuda",
    )
    ape = [(0.7, 1.5)] * batch_size
    q, batch = final_batch(s, ape=ape)
    want = ref(s, q, batch)
    for splits in (1, 7):
        out = prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, num_splits=splits)
        assert rel_err(out, want) < 1e-2
    q, batch = final_batch(s, [(31, 32)] * batch_size, ape=ape)
    out = decode_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale)
    assert rel_err(out, ref(s, q, batch)) < 1e-2
