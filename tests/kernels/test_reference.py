"""The PyTorch reference against dense attention over the concatenation (the block semantics, docs/design.md)."""

import pytest
import torch

from lazyattn.kernels import reference
from lazyattn.kernels.rope import RopeConfig, RopeTables, apply_rope
from tests.kernels.rope_cases import ROPE_CASES, tables
from tests.kernels.scenario import make_scenario


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("rope", list(ROPE_CASES))
@pytest.mark.parametrize("heads", [(4, 1), (2, 2)])
def test_paged_lazy_equals_dense_block_mask(rope, heads):
    s = make_scenario(
        [37, 16, 5],
        [([2, 0, 1], 9), ([1, 2], 20), ([0], 1)],
        q_heads=heads[0],
        kv_heads=heads[1],
        head_dim=32,
        page_size=16,
        tables=tables(rope, 32),
        seed=1,
    )
    q, batch = s.final_prefill()
    out = reference.paged_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale)
    want = torch.cat([s.dense_final(r) for r in s.requests])
    assert rel_err(out, want) < 1e-5


def test_chunked_and_doc_encoding_match_dense():
    s = make_scenario([40, 23], [([1, 0], 30)], head_dim=32, tables=tables("llama3", 32), seed=2)
    q, batch = s.final_prefill([(11, 27)])
    out = reference.paged_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale)
    assert rel_err(out, s.dense_final(s.requests[0], 11, 27)) < 1e-5
    q, batch = s.doc_prefill([(0, 17, 40), (1, 0, 23)])
    out = reference.paged_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale)
    want = torch.cat([s.dense_doc(0, 17, 40), s.dense_doc(1, 0, 23)])
    assert rel_err(out, want) < 1e-5


def test_delta_is_what_makes_it_right():
    """Dropping the deltas (treating cached keys as if at logical positions) must break equality."""
    s = make_scenario([40, 23], [([1, 0], 8)], head_dim=32, tables=tables("default", 32), seed=3)
    q, batch = s.final_prefill()
    batch.deltas.zero_()
    out = reference.paged_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale)
    assert rel_err(out, s.dense_final(s.requests[0])) > 1e-2


def test_copy_rotate_equals_lazy():
    """Block-Attention's re-rotated private copy, attended with delta 0, equals the lazy result."""
    t = tables("default", 32)
    s = make_scenario([40, 23], [([1, 0], 8)], head_dim=32, tables=t, seed=4, spare_pages=8)
    q, batch = s.final_prefill()
    want = reference.paged_attention(q, s.k_cache, s.v_cache, batch, t, s.scale)
    kv = torch.stack([s.k_cache, s.v_cache])[None].clone()  # [1 layer, 2, pages, ...]
    used = set(batch.pages[0, : int(batch.num_pages[0])].tolist())
    free = [p for p in range(kv.shape[2]) if p not in used]
    n_doc_pages = len(s.docs[1].pages) + len(s.docs[0].pages)
    src = batch.pages[0, :n_doc_pages].clone()
    dst = torch.tensor(free[:n_doc_pages], dtype=torch.int32)
    reference.copy_rotate(kv, src, dst, batch.deltas[0, :n_doc_pages].clone(), t)
    batch.pages[0, :n_doc_pages] = dst
    batch.deltas.zero_()
    got = reference.paged_attention(q, kv[0, 0], kv[0, 1], batch, t, s.scale)
    assert rel_err(got, want) < 1e-5


def test_write_kv_places_tokens_and_skips_negative_slots():
    k_cache = torch.zeros(4, 8, 2, 16)
    v_cache = torch.zeros(4, 8, 2, 16)
    k, v = torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    reference.write_kv(k, v, torch.tensor([9, -1, 31]), k_cache, v_cache)
    assert torch.equal(k_cache[1, 1], k[0]) and torch.equal(v_cache[3, 7], v[2])
    assert int((k_cache != 0).any(-1).any(-1).sum()) == 2


def test_rope_matches_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    hf_cfg = LlamaConfig(
        hidden_size=128, num_attention_heads=2, max_position_embeddings=512, rope_theta=500000.0, rope_scaling=scaling
    )
    ours = RopeConfig.from_hf(hf_cfg.to_dict(), head_dim=64)
    assert ours.rope_type == "llama3" and ours.base == 500000.0
    rot = LlamaRotaryEmbedding(hf_cfg)
    pos = torch.arange(300)[None]
    x = torch.randn(1, 2, 300, 64)
    cos, sin = rot(x, pos)
    want, _ = apply_rotary_pos_emb(x, x, cos, sin)
    got = apply_rope(x[0].transpose(0, 1), pos[0], RopeTables.build(ours, 512)).transpose(0, 1)
    assert transformers is not None and rel_err(got, want[0]) < 1e-5


def test_yarn_mscale_and_dynamic_rejected():
    cfg = RopeConfig.from_hf(
        {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}, "max_position_embeddings": 128}, head_dim=32
    )
    t = RopeTables.build(cfg, 256)
    assert abs(t.mscale - (0.1 * torch.log(torch.tensor(4.0)).item() + 1)) < 1e-6
    with pytest.raises(ValueError, match="dynamic"):
        RopeConfig.from_hf({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, head_dim=32)
