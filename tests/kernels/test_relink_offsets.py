"""The per-page first-slot offset of the attention contract (kernels/paged.py), which relinked requests use
to skip a shared document's first k rows: the reference, the prefill and the decode kernels against the dense
ground truth of the relinked concatenation, and offsets of 0 against the contract without them."""

import pytest
import torch

from lazyattn.kernels import reference
from lazyattn.kernels.decode import DecodeConfig, decode_attention
from lazyattn.kernels.paged import EntryPages, PagedBatch
from lazyattn.kernels.prefill import PrefillConfig, prefill_attention
from tests.kernels.rope_cases import tables
from tests.kernels.scenario import make_scenario

# Documents of 37, 16, 5 and 40 tokens (page size 16): k = 3 and 20 cut a page, 16 and 32 skip whole pages,
# and document 2 (5 tokens) is replaced whole.
DOCS = [37, 16, 5, 40]
REQUESTS = [([2, 0, 1], 9), ([1, 2, 3], 20), ([0], 1), ([3, 0], 4)]


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def scenario(k, rope="llama3", seed=0, heads=(4, 1), page_size=16):
    return make_scenario(
        DOCS,
        REQUESTS,
        q_heads=heads[0],
        kv_heads=heads[1],
        head_dim=64,
        page_size=page_size,
        tables=tables(rope, 64),
        seed=seed,
        relink=k,
    )


def prefill(s, q, batch, **kw):
    if kw.get("config") is not None:
        kw["config"] = PrefillConfig(*kw["config"])
    return prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, **kw)


def ref(s, q, batch):
    return reference.paged_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale)


def dense_final(s):
    return torch.cat([s.dense_final(r) for r in s.requests])


@pytest.mark.parametrize("k", [3, 16, 20, 32])
def test_reference_follows_the_relinked_concatenation(k):
    s = scenario(k, seed=1)
    q, batch = s.final_prefill()
    assert batch.firsts is not None or k % 16 == 0
    assert rel_err(ref(s, q, batch), dense_final(s)) < 1e-6
    q, batch = s.relink_prefill()
    assert rel_err(ref(s, q, batch), s.dense_relinks()) < 1e-6


@pytest.mark.parametrize("k", [3, 20])
@pytest.mark.parametrize(
    "config,splits",
    [(None, None), ((64, 32), None), ((16, 16), 3), (None, 5)],
    ids=["default", "two-page-tiles", "small-tiles-split", "split"],
)
def test_prefill_kernel_with_offsets(k, config, splits):
    """Final segments and the recomputed rows themselves, over tiles of part of a page and of two pages, with
    and without split-KV; skipped slots hold NaN, so reading one shows."""
    s = scenario(k, seed=2)
    for q, batch, want in (s.final_prefill() + (dense_final(s),), s.relink_prefill() + (s.dense_relinks(),)):
        expected = ref(s, q, batch)
        s.poison_unlisted(batch)
        out = prefill(s, q, batch, config=config, num_splits=splits)
        assert rel_err(out, expected) < 1e-5
        assert rel_err(out, want) < 1e-5


@pytest.mark.parametrize("k", [3, 20])
@pytest.mark.parametrize("splits,tma", [(1, 0), (3, 0), (3, 2)])
def test_decode_kernel_with_offsets(k, splits, tma):
    """Skipped slots hold NaN; with tma=2 the copy engine reads them and the kernel must zero them in V."""
    s = scenario(k, rope="interleaved", seed=3, heads=(8, 2))
    q, batch = s.decode()
    expected = ref(s, q, batch)
    s.poison_unlisted(batch)
    config = DecodeConfig(block_n=16, num_warps=4, num_stages=2, tma=tma)
    out = decode_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, num_splits=splits, config=config)
    assert rel_err(out, expected) < 1e-5
    want = torch.cat([s.dense_final(r, r.final.length - 1, r.final.length) for r in s.requests])
    assert rel_err(out, want) < 1e-5


def test_skipping_the_first_rows_changes_the_result():
    """The offset is really applied: reading the shared copy's first rows instead is another answer."""
    s = scenario(3, seed=4)
    q, batch = s.final_prefill()
    shifted = torch.zeros_like(batch.firsts)
    plain = PagedBatch(
        batch.cu_seqlens_q,
        batch.q_start,
        batch.pages,
        batch.deltas,
        batch.valid,
        batch.starts,
        batch.num_pages,
        batch.max_q,
        batch.max_kv,
        shifted,
    )
    assert rel_err(prefill(s, q, plain), dense_final(s)) > 1e-2


def test_zero_offsets_are_the_contract_without_them_bit_for_bit():
    """firsts all 0 (given explicitly) == firsts None == today's kernels, exactly, in the reference, prefill
    (tiles of part of a page and of two pages) and decode."""
    s = scenario(0, seed=5)

    def with_zero_offsets(batch):
        assert batch.firsts is None
        return PagedBatch(
            batch.cu_seqlens_q,
            batch.q_start,
            batch.pages,
            batch.deltas,
            batch.valid,
            batch.starts,
            batch.num_pages,
            batch.max_q,
            batch.max_kv,
            torch.zeros_like(batch.pages),
        )

    q, batch = s.final_prefill()
    zeros = with_zero_offsets(batch)
    assert torch.equal(ref(s, q, zeros), ref(s, q, batch))
    for config in (None, (64, 32)):
        assert torch.equal(prefill(s, q, zeros, config=config), prefill(s, q, batch, config=config))
    q, batch = s.decode()
    zeros = with_zero_offsets(batch)
    assert torch.equal(
        decode_attention(q, s.k_cache, s.v_cache, zeros, s.tables, s.scale, num_splits=2),
        decode_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, num_splits=2),
    )


def test_build_rejects_bad_offsets():
    with pytest.raises(ValueError, match="firsts"):
        PagedBatch.build([EntryPages([0, 1], [0, 0], [4, 4], [1])], [1], [0])


# --- GPU: 8B heads, bf16 -------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("k", [4, 32])
def test_gpu_relinked_rag_case(k):
    """5 documents x 2048 relinked (the serving shape) in prefill, split-KV prefill and decode."""
    t = tables("llama3", 128, max_position=32768, device="cuda")
    orders = [[(i + j) % 5 for j in range(5)] for i in range(3)]
    s = make_scenario(
        [2048] * 5,
        [(o, 32) for o in orders],
        q_heads=32,
        kv_heads=8,
        head_dim=128,
        page_size=64,
        tables=t,
        dtype=torch.bfloat16,
        device="cuda",
        seed=7,
        relink=k,
    )
    for q, batch in (s.final_prefill(), s.relink_prefill()):
        want = ref(s, q, batch)
        for splits in (None, 1, 7):
            assert rel_err(prefill(s, q, batch, num_splits=splits), want) < 1e-2
    q, batch = s.decode()
    assert rel_err(decode_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale), ref(s, q, batch)) < 1e-2
