"""TritonBackend against ReferenceBackend on a small two-layer pool: encode documents, a RAG prefill of a
final segment that places them at deltas, a decode step, and block mode's copy_rotate.

On the CPU it runs the kernels under TRITON_INTERPRET=1 (tests/conftest.py).
"""

import pytest
import torch

from lazyattn.cache.page_pool import allocate_kv
from lazyattn.kernels.backend import ForwardBatch, ReferenceBackend
from lazyattn.kernels.paged import EntryPages, PagedBatch, layer_caches
from lazyattn.kernels.selector import make_backend
from lazyattn.kernels.triton_backend import TritonBackend
from tests.kernels.rope_cases import tables

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PAGE = 16
HQ, HKV, DIM, LAYERS = 4, 2, 32, 2


def forward_batch(runs: list[tuple[EntryPages, int, int, list[int]]]) -> ForwardBatch:
    """runs: (entry's pages, first query position, query rows, slots of the new tokens) per entry."""
    entries, q_lens, q_starts, positions, slots = [], [], [], [], []
    for entry, first, rows, new_slots in runs:
        entries.append(entry)
        q_lens.append(rows)
        q_starts.append(first)
        positions += range(first, first + rows)
        slots += new_slots
    return ForwardBatch(
        positions=torch.tensor(positions, dtype=torch.int32, device=DEVICE),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
        attn=PagedBatch.build(entries, q_lens, q_starts, DEVICE),
        is_decode=all(n == 1 for n in q_lens),
        logits_indices=torch.tensor([sum(q_lens) - 1], device=DEVICE),
    )


def slots_of(pages: list[int], lo: int, hi: int) -> list[int]:
    """Cache slots of a segment's local token indices [lo, hi) laid over its pages."""
    return [pages[i // PAGE] * PAGE + i % PAGE for i in range(lo, hi)]


def run_both(backends, fb: ForwardBatch, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    t = fb.positions.shape[0]
    for layer in range(LAYERS):
        q, k, v = (torch.randn(t, h, DIM, generator=gen).to(DEVICE) for h in (HQ, HKV, HKV))
        got, want = (b.attend(layer, q, k, v, fb) for b in backends)
        assert got.dtype == q.dtype and got.shape == q.shape
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert_same_pool(*backends)


def assert_same_pool(a, b) -> None:
    """fp32 pools: tight; FP8 pools: the same values (both round an fp32 key the same way). Compared as each
    backend's layers see K and V (`layer_caches`): over FP8 pools V's pages are stored transposed, the same bytes in
    another order, whose places in the pool's own view differ between its two layouts."""
    for layer in range(LAYERS):
        for got, want in zip(layer_caches(a.kv, layer), layer_caches(b.kv, layer), strict=True):
            if a.kv.dtype == torch.float8_e4m3fn:
                assert torch.equal(got.float(), want.float())
            else:
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize(("rope", "layout"), [("llama3", "token"), ("interleaved", "token"), ("llama3", "head")])
def test_triton_backend_matches_reference(rope, layout, deterministic):
    check_backends(rope, layout, deterministic)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize(("rope", "layout"), [("llama3", "token"), ("interleaved", "head")])
def test_triton_backend_matches_reference_over_fp8_pages(rope, layout, deterministic):
    """kv_cache_dtype=fp8_e4m3 (docs/design.md, "FP8 KV cache"): writes, prefill, decode and block copies."""
    check_backends(rope, layout, deterministic, torch.float8_e4m3fn)


def check_backends(rope, layout, deterministic, kv_dtype=torch.float32):
    """layout: the Triton backend's pool in that memory order (cache/page_pool.py), the reference's in the default
    one: every kernel (RoPE/KV write, prefill over per-run Q copies, decode, copy_rotate) goes by strides.
    deterministic: both backends' batch-invariant paths (kernels/invariant.py, the reference's per-row one)."""
    tab = tables(rope, DIM, max_position=256, device=DEVICE)
    gen = torch.Generator().manual_seed(0)
    kv = torch.randn(LAYERS, 2, 12, PAGE, HKV, DIM, generator=gen).to(kv_dtype).to(DEVICE)
    triton_kv = allocate_kv(LAYERS, 12, PAGE, HKV, DIM, kv.dtype, DEVICE, layout)
    for layer in range(LAYERS):  # the same K and V as each backend's layers see them (assert_same_pool)
        for dst, src in zip(layer_caches(triton_kv, layer), layer_caches(kv, layer), strict=True):
            dst.copy_(src)
    backends = (
        TritonBackend(triton_kv, tab, DIM**-0.5, deterministic),
        ReferenceBackend(kv.clone(), tab, DIM**-0.5, deterministic),
    )
    doc_a, doc_b, final, copies = [7, 2], [10], [4], [0, 11]  # doc A: 21 tokens, doc B: 11, final: 5 + 1
    a_alone = EntryPages(doc_a, [0, 0], [16, 5])

    # Encode both documents alone, at local positions.
    run_both(
        backends,
        forward_batch(
            [
                (a_alone, 0, 21, slots_of(doc_a, 0, 21)),
                (EntryPages(doc_b, [0], [11]), 0, 11, slots_of(doc_b, 0, 11)),
            ]
        ),
        seed=1,
    )
    # Final segment after [B, A] (A at delta 11, final from position 32): 5 rows, then one decode step.
    pages, deltas = doc_b + doc_a + final, [0, 11, 11, 0]
    run_both(
        backends, forward_batch([(EntryPages(pages, deltas, [11, 16, 5, 5]), 32, 5, slots_of(final, 0, 5))]), seed=2
    )
    run_both(
        backends,
        forward_batch(
            [
                (EntryPages(pages, deltas, [11, 16, 5, 6]), 37, 1, slots_of(final, 5, 6)),
                (a_alone, 20, 1, [-1]),  # a second decode entry whose key is already cached
            ]
        ),
        seed=3,
    )
    # Block mode: A's private copy rotated by its delta, for every layer.
    src = torch.tensor(doc_a, device=DEVICE)
    dst = torch.tensor(copies, device=DEVICE)
    for b in backends:
        b.copy_rotate(src, dst, torch.tensor([11, 11], device=DEVICE))
    assert_same_pool(*backends)


def test_make_backend_follows_the_pool_device():
    kv = torch.zeros(LAYERS, 2, 3, PAGE, HKV, DIM, device=DEVICE)
    backend = make_backend(kv, tables("default", DIM, max_position=64, device=DEVICE), DIM**-0.5)
    assert type(backend) is (TritonBackend if kv.is_cuda else ReferenceBackend)
    assert backend.kv is kv and backend.page_size == PAGE
