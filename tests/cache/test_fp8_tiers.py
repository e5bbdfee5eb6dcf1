"""FP8 pages through the host and disk tiers (docs/design.md, "FP8 KV cache"): every byte comes back as it was
written (NaN and negative-zero codes included), a file holds half the bytes of a bfloat16 one, and a file of an
older format version or of another KV dtype is refused with a message that says which."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lazyattn.cache import disk_format
from lazyattn.cache.disk_format import HEADER_BYTES, Header, RefusedFile, read_verified, write_atomic
from lazyattn.cache.disk_tier import DiskTier, layout_id
from lazyattn.cache.document_cache import DocumentCache
from lazyattn.cache.kv_transfer import PageMover
from lazyattn.cache.page_pool import PagePool, allocate_kv

FP8 = torch.float8_e4m3fn
LAYERS, PAGES, PAGE, HEADS, DIM = 2, 12, 4, 2, 8


def pool(layout: str = "token", dtype=FP8) -> torch.Tensor:
    return allocate_kv(LAYERS, PAGES, PAGE, HEADS, DIM, dtype, "cpu", layout)


def fill_random_bytes(kv: torch.Tensor, pages: list[int], seed: int) -> None:
    """Every byte value an FP8 element can hold, NaN (0x7f, 0xff) and -0 (0x80) included."""
    g = torch.Generator().manual_seed(seed)
    raw = kv.view(torch.uint8)
    for p in pages:
        raw[:, :, p] = torch.randint(0, 256, raw[:, :, p].shape, generator=g, dtype=torch.uint8)
    raw[0, 0, pages[0], 0, 0, :4] = torch.tensor([0x7F, 0xFF, 0x80, 0x00], dtype=torch.uint8)


def page_bytes(kv: torch.Tensor, pages: list[int]) -> torch.Tensor:
    return torch.stack([kv.view(torch.uint8)[:, :, p].clone() for p in pages])


@settings(max_examples=25, deadline=None)
@given(
    layout=st.sampled_from(["token", "head"]),
    src=st.lists(st.integers(0, PAGES - 1), min_size=1, max_size=6, unique=True),
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
)
def test_host_tier_copies_fp8_pages_byte_exact(layout, src, seed, data):
    kv = pool(layout)
    fill_random_bytes(kv, src, seed)
    before = page_bytes(kv, src)
    mover = PageMover(kv, 8)
    assert mover.page_bytes == LAYERS * 2 * PAGE * HEADS * DIM  # one byte an element
    host = data.draw(st.permutations(range(8)))[: len(src)]
    mover.to_host(src, host)
    dst = data.draw(st.permutations([p for p in range(PAGES) if p not in src]))[: len(src)]
    mover.to_device(host, dst)
    assert torch.equal(page_bytes(kv, dst), before)
    assert torch.equal(page_bytes(kv, src), before)  # the source pages were only read


def disk_cache(directory: str, kv: torch.Tensor) -> tuple[DocumentCache, DiskTier]:
    disk = DiskTier(directory, 1 << 30, kv, layout_id("m", kv))
    return DocumentCache(PagePool(PAGES), PAGE, disk), disk


def encode(cache: DocumentCache, kv: torch.Tensor, key: str, n_tokens: int, seed: int) -> torch.Tensor:
    seg, is_new = cache.acquire(key, n_tokens)
    assert is_new
    fill_random_bytes(kv, list(seg.pages), seed)
    cache.mark_ready(seg)
    cache.release(seg)
    return page_bytes(kv, list(seg.pages))


def read_back(cache: DocumentCache, kv: torch.Tensor, key: str, n_tokens: int) -> torch.Tensor:
    seg, is_new = cache.acquire(key, n_tokens)
    assert not is_new
    cache.poll(wait=True)
    assert seg.ready
    out = page_bytes(kv, list(seg.pages))
    cache.release(seg)
    return out


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    layout=st.sampled_from(["token", "head"]),
    docs=st.lists(st.integers(1, 3 * PAGE), min_size=1, max_size=3),
    seed=st.integers(0, 2**31 - 1),
)
def test_disk_tier_reads_fp8_documents_back_byte_exact(layout, docs, seed):
    with tempfile.TemporaryDirectory() as directory:
        kv = pool(layout)
        cache, disk = disk_cache(directory, kv)
        written = {f"d{i}": encode(cache, kv, f"d{i}", n, seed + i) for i, n in enumerate(docs)}
        disk.flush()
        disk.close()
        kv2 = pool(layout)  # a restart: an empty pool over the same directory
        cache2, disk2 = disk_cache(directory, kv2)
        for i, n in reversed(list(enumerate(docs))):
            assert torch.equal(read_back(cache2, kv2, f"d{i}", n), written[f"d{i}"])
        assert disk2.stats().hits == len(docs) and disk2.stats().refused == 0
        disk2.close()


def test_files_of_either_v_order_never_meet(tmp_path):
    """V's pages stored transposed (the engine's FP8 pools, kernels/paged.py) are the same bytes in another order: a
    tier that stores V as K is finds no file written with V transposed, and the other way round."""
    kv = pool()
    written = DiskTier(str(tmp_path), 1 << 30, kv, layout_id("m", kv, v_transposed=True))
    cache = DocumentCache(PagePool(PAGES), PAGE, written)
    pages = encode(cache, kv, "doc", 2 * PAGE, seed=3)
    written.flush()
    written.close()
    assert layout_id("m", kv, v_transposed=True) != layout_id("m", kv)
    kv2 = pool()
    other = DiskTier(str(tmp_path), 1 << 30, kv2, layout_id("m", kv2))
    assert DocumentCache(PagePool(PAGES), PAGE, other).acquire("doc", 2 * PAGE)[1]  # new: no file of its order
    assert other.stats().hits == 0 and other.stats().refused == 0
    other.close()
    same = DiskTier(str(tmp_path), 1 << 30, kv2, layout_id("m", kv2, v_transposed=True))
    assert torch.equal(read_back(DocumentCache(PagePool(PAGES), PAGE, same), kv2, "doc", 2 * PAGE), pages)
    assert same.stats().hits == 1
    same.close()


def test_an_fp8_file_holds_half_the_bytes_of_a_bfloat16_one_and_says_its_dtype(tmp_path):
    sizes = {}
    for dtype in (FP8, torch.bfloat16):
        kv = pool(dtype=dtype)
        cache, disk = disk_cache(str(tmp_path / str(dtype)), kv)
        seg, _ = cache.acquire("A", 2 * PAGE)
        kv[:, :, list(seg.pages)] = torch.ones(()).to(dtype)
        cache.mark_ready(seg)
        cache.release(seg)
        disk.flush()
        path = disk.path("A")
        sizes[dtype] = os.path.getsize(path) - HEADER_BYTES
        with open(path, "rb") as f:
            header = disk_format.decode_header(f.read(HEADER_BYTES))
        assert header.kv_dtype == str(dtype).removeprefix("torch.") and header.kv_scale == 1.0
        disk.close()
    assert sizes[FP8] * 2 == sizes[torch.bfloat16] == 2 * LAYERS * 2 * 2 * PAGE * HEADS * DIM


def written_file(path: str, version: int, kv_dtype: str = "float8_e4m3fn") -> memoryview:
    payload = memoryview(bytes(range(256)) * 2)
    header = Header("k", "layout", 3, 1, len(payload), disk_format.checksum(payload), kv_dtype)
    raw = bytearray(disk_format.encode_header(header))
    raw[len(disk_format.MAGIC) : len(disk_format.MAGIC) + 4] = version.to_bytes(4, "little")
    with open(path, "wb") as f:
        f.write(bytes(raw) + payload.tobytes())
    return payload


def test_an_older_format_version_is_refused_with_what_changed(tmp_path):
    path = str(tmp_path / "old.kv")
    payload = written_file(path, 2)
    into = memoryview(bytearray(len(payload)))
    with pytest.raises(RefusedFile, match=r"format version 2 \(written before the header named the KV dtype"):
        read_verified(path, "k", "layout", 3, len(payload), into, "float8_e4m3fn")
    written_file(path, 3)
    read_verified(path, "k", "layout", 3, len(payload), into, "float8_e4m3fn")
    assert bytes(into) == payload.tobytes()


def test_a_file_of_another_kv_dtype_is_refused(tmp_path):
    path = str(tmp_path / "other.kv")
    payload = written_file(path, disk_format.FORMAT_VERSION, kv_dtype="bfloat16")
    into = memoryview(bytearray(len(payload)))
    with pytest.raises(RefusedFile, match="KV pages of bfloat16 at scale 1.0, this engine reads float8_e4m3fn"):
        read_verified(path, "k", "layout", 3, len(payload), into, "float8_e4m3fn")


def test_write_atomic_round_trips_the_kv_fields(tmp_path):
    payload = memoryview(bytes(64))
    header = Header("k", "l", 1, 1, 64, disk_format.checksum(payload), "float8_e4m3fn")
    write_atomic(str(tmp_path / "x.kv"), header, payload)
    with open(tmp_path / "x.kv", "rb") as f:
        assert disk_format.decode_header(f.read(HEADER_BYTES)) == header


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_engine_restart_with_fp8_host_and_disk_tiers_gives_the_same_tokens(tmp_path, device):
    """An engine with FP8 pages restarted over its disk tier reads every document back and answers as one that
    never left the GPU."""
    from tests.engine.test_disk_tier_engine import engine, run_all

    plain = run_all(engine("lazy", None, device, kv_cache_dtype="fp8_e4m3"))
    first = engine("lazy", str(tmp_path), device, host_cache_gb=0.001, kv_cache_dtype="fp8_e4m3")
    assert first.engine.disk.layout.endswith(" v=[kv_heads,head_dim,tokens]")  # its V pages stored transposed
    assert run_all(first) == plain
    first.engine.shutdown()
    second = engine("lazy", str(tmp_path), device, host_cache_gb=0.001, kv_cache_dtype="fp8_e4m3")
    assert run_all(second) == plain
    s = second.engine.stats()
    assert s.cache.misses == 0 and s.cache.disk_hits > 0 and s.disk.refused == 0


# --- GPU: the same through pinned memory and the copy streams, run on the device --------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["token", "head"])
def test_gpu_fp8_pages_through_the_host_and_disk_tiers_byte_exact(tmp_path, layout):
    kv = allocate_kv(LAYERS, PAGES, PAGE, HEADS, DIM, FP8, "cuda", layout)
    src = [9, 3, 4]
    fill_random_bytes(kv, src, 5)
    before = page_bytes(kv, src)
    mover = PageMover(kv, 8, chunk_pages=4)
    mover.lock(8)
    mover.wait(mover.to_host(src, [5, 6, 7]))
    mover.wait(mover.to_device([5, 6, 7], [0, 1, 2]))
    torch.cuda.synchronize()
    assert torch.equal(page_bytes(kv, [0, 1, 2]), before)
    cache, disk = disk_cache(str(tmp_path), kv)
    written = encode(cache, kv, "A", 2 * PAGE + 1, 6)
    disk.flush()
    cache.evict(PAGES)
    cache2 = DocumentCache(PagePool(PAGES), PAGE, disk)
    seg, _ = cache2.acquire("A", 2 * PAGE + 1)
    cache2.poll(wait=True)
    torch.cuda.synchronize()
    assert torch.equal(page_bytes(kv, list(seg.pages)), written)
    disk.close()
