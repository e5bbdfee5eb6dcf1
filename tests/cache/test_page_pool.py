import random

import pytest
import torch

from lazyattn.cache.page_pool import (
    GiB,
    MiB,
    PagePool,
    allocate_kv,
    bytes_per_page,
    pages_for_budget,
    pages_from_free_memory,
)
from lazyattn.envs import read_env
from lazyattn.errors import InvalidRequestError, OutOfPagesError


def test_bytes_per_page_llama_8b_shapes():
    # 32 layers x (K, V) x 16 slots x 8 kv heads x 128 dims x 2 bytes
    assert bytes_per_page(32, 8, 128, 16, torch.bfloat16) == 2 * MiB
    assert bytes_per_page(32, 8, 128, 16, torch.float32) == 4 * MiB


def test_pages_for_budget():
    assert pages_for_budget(1 * GiB, 2 * MiB) == 512
    assert pages_for_budget(1 * GiB + 2 * MiB - 1, 2 * MiB) == 512
    with pytest.raises(InvalidRequestError, match="at least 16 pages"):
        pages_for_budget(10 * MiB, 2 * MiB)
    assert pages_for_budget(10 * MiB, 2 * MiB, min_pages=1) == 5


def _fake_mem(monkeypatch, free: int, total: int) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))


def test_pages_from_free_memory_counts_used_memory_against_the_share(monkeypatch):
    _fake_mem(monkeypatch, free=60 * GiB, total=80 * GiB)  # 20 GiB already used (weights)
    # 0.9 * 80 = 72 GiB allowed, minus 20 used, minus 1 reserved = 51 GiB
    n = pages_from_free_memory(0.9, "cuda:0", 2 * MiB, reserve_bytes=1 * GiB)
    assert n == 51 * 512
    assert pages_from_free_memory(0.9, 0, 2 * MiB, reserve_bytes=0) == 52 * 512


def test_pages_from_free_memory_too_little(monkeypatch):
    _fake_mem(monkeypatch, free=8 * GiB, total=80 * GiB)
    with pytest.raises(InvalidRequestError) as e:
        pages_from_free_memory(0.9, "cuda", 2 * MiB)
    msg = str(e.value)
    assert "80.00 GiB" in msg and "72.00 GiB is already in use" in msg and "at least 16 pages" in msg
    assert isinstance(e.value, ValueError)


def test_pages_from_free_memory_bad_arguments(monkeypatch):
    _fake_mem(monkeypatch, free=80 * GiB, total=80 * GiB)
    for u in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="utilization"):
            pages_from_free_memory(u, "cuda", 2 * MiB)
    with pytest.raises(ValueError, match="CUDA"):
        pages_from_free_memory(0.9, "cpu", 2 * MiB)


def test_allocate_all_or_nothing():
    pool = PagePool(8)
    assert pool.allocate(3) == [0, 1, 2]
    assert pool.allocate(0) == []
    with pytest.raises(OutOfPagesError):
        pool.allocate(6)
    assert (pool.num_free, pool.num_used) == (5, 3)
    assert pool.allocate(5) == [3, 4, 5, 6, 7]
    assert pool.num_free == 0
    with pytest.raises(ValueError):
        pool.allocate(-1)


def test_free_validates_before_changing_anything():
    pool = PagePool(8)
    a = pool.allocate(4)
    pool.free([a[0]])
    for bad in ([a[1], a[0]], [a[1], 8], [a[1], -1], [a[1], a[1]]):
        with pytest.raises(ValueError):
            pool.free(bad)
        assert pool.num_used == 3 and pool.is_used(a[1])
    pool.free(a[1:])
    assert pool.num_free == 8


def test_freed_pages_are_reused():
    pool = PagePool(8)
    a = pool.allocate(3)
    pool.allocate(2)
    pool.free(a)
    assert sorted(pool.allocate(3)) == sorted(a)


def test_high_water():
    pool = PagePool(8)
    a = pool.allocate(5)
    pool.free(a[:3])
    pool.allocate(1)
    assert pool.high_water == 5
    pool.reset_high_water()
    assert pool.high_water == 3
    pool.allocate(2)
    assert pool.high_water == 5


def test_random_sequence_conserves_pages():
    rng = random.Random(0)
    pool = PagePool(64)
    held: list[list[int]] = []
    for _ in range(2000):
        if held and rng.random() < 0.5:
            pool.free(held.pop(rng.randrange(len(held))))
        else:
            n = rng.randint(0, 12)
            if n > pool.num_free:
                with pytest.raises(OutOfPagesError):
                    pool.allocate(n)
            else:
                held.append(pool.allocate(n))
        flat = [p for h in held for p in h]
        assert len(flat) == len(set(flat)) == pool.num_used
        assert pool.num_used + pool.num_free == 64
        assert all(pool.is_used(p) for p in flat)
        assert pool.high_water >= pool.num_used


# -- the KV tensor's layout -------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["token", "head"])
def test_allocate_kv_gives_the_logical_shape_zeroed_in_either_order(layout):
    kv = allocate_kv(3, 5, 16, 4, 8, torch.float16, "cpu", layout)
    assert kv.shape == (3, 2, 5, 16, 4, 8) and kv.dtype == torch.float16 and not kv.any()
    assert kv.stride(-1) == 1
    tile = kv[2, 1, 3, :, 1, :]  # one (page, kv head) tile: what an attention program reads
    # head: the tile is one contiguous run of 16 x 8 values; token: its rows are 4 heads' rows apart
    assert tile.is_contiguous() == (layout == "head")
    assert kv[0, 0, 0].is_contiguous() == (layout == "token")
    assert kv.untyped_storage().nbytes() == 3 * 2 * 5 * 16 * 4 * 8 * 2  # no padding either way


def test_both_layouts_hold_the_same_values_at_the_same_logical_places():
    values = torch.randn(2, 2, 3, 4, 2, 3)  # [layers, 2, pages, slots, heads, dim]
    token, head = (
        allocate_kv(2, 3, 4, 2, 3, torch.float32, "cpu", layout).copy_(values) for layout in ("token", "head")
    )
    assert torch.equal(token, values) and torch.equal(head, values)
    # what lies in memory: token's storage is the logical order, head's [layers, 2, pages, heads, slots, dim]
    stored = {
        name: torch.frombuffer(bytearray(kv.untyped_storage()), dtype=torch.float32)
        for name, kv in (("token", token), ("head", head))
    }
    assert torch.equal(stored["token"], values.flatten())
    assert torch.equal(stored["head"], values.transpose(3, 4).contiguous().flatten())


def test_kv_layout_is_read_once_and_unknown_names_refused():
    assert read_env({}).kv_layout == "token"
    layout = read_env({"LAZYATTN_KV_LAYOUT": " Head "}).kv_layout
    assert layout == "head" and allocate_kv(1, 1, 2, 2, 2, torch.float32, "cpu", layout)[0, 0, 0].stride(0) == 2
    wanted = "LAZYATTN_KV_LAYOUT='nhd': expected one of token, head"
    with pytest.raises(InvalidRequestError, match=wanted) as error:
        read_env({"LAZYATTN_KV_LAYOUT": "nhd"})
    assert error.value.param == "LAZYATTN_KV_LAYOUT"
    with pytest.raises(ValueError, match="unknown KV layout 'hnd'"):
        allocate_kv(1, 1, 2, 2, 2, torch.float32, "cpu", "hnd")


def test_a_budget_withholds_the_pages_beyond_it_until_lifted():
    pool = PagePool(10)
    held = pool.allocate(3)
    pool.set_budget(6)  # 4 withheld: 3 free pages left
    assert (pool.num_withheld, pool.num_free, pool.num_used) == (4, 3, 7)
    with pytest.raises(OutOfPagesError):
        pool.allocate(4)
    pool.set_budget(8)  # the cut moves: 2 withheld
    assert (pool.num_withheld, pool.num_free) == (2, 5)
    pool.set_budget(None)
    assert (pool.num_withheld, pool.num_free) == (0, 7)
    pool.free(held)
    assert pool.num_free == 10
    pool.set_budget(12)  # a budget above the pool withholds nothing
    assert pool.num_withheld == 0
