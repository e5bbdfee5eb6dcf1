"""Q rotated per run of equal delta inside the RoPE launch (cache_ops.rope_write_kv_runs) against the separate
rotation launch (prefill._rotate_runs), the rotation written out (apply_rope at position - delta), and the
attention the copies feed (prefill_attention with rotated_q) against the reference.

CPU runs go through TRITON_INTERPRET (tests/conftest.py); there the two launches must agree bit for bit.
"""

import pytest
import torch

from lazyattn.kernels import reference
from lazyattn.kernels.cache_ops import rope_write_kv, rope_write_kv_runs
from lazyattn.kernels.prefill import _rotate_runs, prefill_attention
from lazyattn.kernels.rope import apply_rope
from tests.kernels.rope_cases import tables
from tests.kernels.scenario import make_scenario

# Ragged runs: request 0 places three docs (runs: delta 0, 37, 53, then its own pages at 0), request 1 one doc
# (delta 0 only: nothing to rotate), request 2 four docs (runs: 0, 21, 37, 74, 0: more than 2 or 4 copies take).
DOCS = [37, 16, 5, 21]
REQUESTS = [([0, 1, 2], 9), ([2], 3), ([3, 1, 0, 2], 6)]


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def fold(s, runs):
    """(raw q, positions, batch, q, q_rot) of every request's final segment, q_rot from the RoPE launch."""
    q_raw = torch.cat([r.final.q for r in s.requests])
    k = torch.cat([r.final.k for r in s.requests])
    v = torch.cat([r.final.v for r in s.requests])
    device = s.k_cache.device
    positions = torch.cat([torch.arange(r.final.length, device=device) + s.context_len(r) for r in s.requests])
    slots = torch.full_like(positions, -1)  # the final keys are cached already: the pool stays as it is
    _, batch = s.final_prefill()
    q, q_rot = rope_write_kv_runs(q_raw, k, v, positions, slots, s.k_cache, s.v_cache, s.tables, batch, runs)
    return q_raw, positions, batch, q, q_rot


def run_deltas(batch, e, runs):
    deltas = batch.deltas[e, : int(batch.num_pages[e])].tolist()
    return [d for i, d in enumerate(deltas) if i == 0 or d != deltas[i - 1]][:runs]


@pytest.mark.parametrize("rope", ["default", "interleaved", "yarn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("runs", [2, 4, 8])
@pytest.mark.parametrize("copy_programs", [True, False], ids=["program-per-copy", "program-per-token"])
def test_folded_copies_are_the_separate_launch_bit_for_bit(rope, dtype, runs, copy_programs, monkeypatch):
    """Copy r of each row equals the separate launch's (same rounded q, same expression) and the raw query
    rotated at (its position - delta of its entry's run r) with the magnitude factor (yarn); delta-0 runs and
    runs an entry lacks are not copied. q itself is what rope_write_kv returns. Both launch shapes: a program per
    (token, copy) (few tokens) and a program per token writing every copy."""
    from lazyattn.kernels import cache_ops

    monkeypatch.setattr(cache_ops, "_COPY_PROGRAMS_MAX_TOKENS", 1 << 20 if copy_programs else 0)
    s = make_scenario(
        DOCS, REQUESTS, q_heads=4, kv_heads=2, head_dim=64, page_size=16, tables=tables(rope, 64), dtype=dtype, seed=21
    )
    q_raw, positions, batch, q, q_rot = fold(s, runs)
    k = torch.cat([r.final.k for r in s.requests])
    v = torch.cat([r.final.v for r in s.requests])
    slots = torch.full_like(positions, -1)
    assert torch.equal(q, rope_write_kv(q_raw, k, v, positions, slots, s.k_cache, s.v_cache, s.tables))
    separate = _rotate_runs(q, batch, s.tables, runs)
    cu = batch.cu_seqlens_q.tolist()
    copied = 0
    for e in range(batch.batch_size):
        rows = slice(cu[e], cu[e + 1])
        for r, delta in enumerate(run_deltas(batch, e, runs)):
            if delta:
                assert torch.equal(q_rot[r, rows], separate[r, rows])
                want = apply_rope(q_raw[rows], positions[rows] - delta, s.tables)
                assert rel_err(q_rot[r, rows], want) < (1e-6 if dtype == torch.float32 else 1e-2)
                copied += 1
    assert copied == {2: 2, 4: 5, 8: 5}[runs]  # request 0: deltas 37, 53; request 2: 21, 37, 74


@pytest.mark.parametrize("runs", [1, 2, 8])
@pytest.mark.parametrize("splits", [1, 3])
def test_attention_over_folded_copies_matches_reference(runs, splits):
    """prefill_attention fed the folded copies equals the call that rotates them itself, bit for bit, and the
    reference; runs past the last copy are rotated in the attention kernel."""
    s = make_scenario(
        DOCS, REQUESTS, q_heads=4, kv_heads=1, head_dim=64, page_size=16, tables=tables("llama3", 64), seed=22
    )
    _, _, batch, q, q_rot = fold(s, runs)
    got = prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, num_splits=splits, rotated_q=q_rot)
    alone = prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, num_splits=splits, rotated_runs=runs)
    assert torch.equal(got, alone)
    want = reference.paged_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale)
    assert rel_err(got, want) < 1e-5
    assert rel_err(got, torch.cat([s.dense_final(r) for r in s.requests])) < 1e-5


def test_relinked_entries_with_delta_zero_runs_between_documents():
    """Relinked documents put private rows (delta 0) between shared pages: runs of delta 0 in the middle."""
    s = make_scenario(
        [40, 23, 30], [([0, 1, 2], 7)], head_dim=64, page_size=16, tables=tables("default", 64), seed=23, relink=5
    )
    _, _, batch, q, q_rot = fold(s, 8)
    assert 0 in run_deltas(batch, 0, 8)[1:]
    got = prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, rotated_q=q_rot)
    assert rel_err(got, reference.paged_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale)) < 1e-5


def test_rejects_bad_copies():
    s = make_scenario([20], [([0], 4)], head_dim=64, page_size=16, tables=tables("default", 64), seed=24)
    _, _, batch, q, q_rot = fold(s, 2)
    with pytest.raises(ValueError, match="rotated_q must be contiguous"):
        prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, rotated_q=q_rot[:, :2])
    with pytest.raises(ValueError, match="rotated_q must be contiguous"):
        prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, rotated_q=q_rot.double())
    with pytest.raises(ValueError, match="runs must be >= 1"):
        rope_write_kv_runs(
            q,
            q[:, :1],
            q[:, :1],
            torch.zeros(4, dtype=torch.int64),
            torch.full((4,), -1),
            s.k_cache,
            s.v_cache,
            s.tables,
            batch,
            0,
        )


@pytest.mark.gpu
def test_gpu_folded_copies_llama8b_rag():
    """8B heads, 5 x 2048 cached documents + a 32-token question: the folded copies against the separate launch
    (FMA contraction may move a last bit on the GPU) and the attention against the reference."""
    t = tables("llama3", 128, max_position=32768, device="cuda")
    s = make_scenario(
        [2048] * 5,
        [([0, 1, 2, 3, 4], 32), ([4, 2, 0, 1, 3], 32)],
        q_heads=32,
        kv_heads=8,
        head_dim=128,
        page_size=64,
        tables=t,
        dtype=torch.bfloat16,
        device="cuda",
        seed=25,
    )
    _, positions, batch, q, q_rot = fold(s, 8)
    separate = _rotate_runs(q, batch, s.tables, 8)
    for r in range(1, 5):  # runs 1-4 (deltas 2048 ... 8192) of both entries; run 0 is at delta 0
        assert rel_err(q_rot[r], separate[r]) < 1e-3
    got = prefill_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale, rotated_q=q_rot)
    want = reference.paged_attention(q, s.k_cache, s.v_cache, batch, s.tables, s.scale)
    assert rel_err(got, want) < 1e-2
