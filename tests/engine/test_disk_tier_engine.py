"""The disk tier end to end on the CPU: a fresh engine over the same directory (a restart) serves documents from disk
with the same greedy tokens as an engine without the tier; a torn, corrupt or foreign file is refused and the
document encoded again with the same tokens; two live engines share one directory; with the host tier too, under
eviction pressure, the tokens do not change."""

from __future__ import annotations

import dataclasses
import os
import threading

import pytest
import torch

from lazyattn import LLM, SamplingParams
from lazyattn.cache.disk_format import HEADER_BYTES, checksum, decode_header, write_atomic
from lazyattn.cache.disk_writer import as_bytes
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.prompt import from_token_ids
from lazyattn.errors import InvalidRequestError

PAGE = 16
DOCS = [[(7 * k * i + 3 * k) % 250 + 10 for i in range(26 + 7 * k)] for k in range(1, 5)]  # 2 to 4 pages each
REQUESTS = [([0, 1], [40, 41]), ([2, 0], [42, 43]), ([3, 2], [44])]
SEGMENTS = len(DOCS) + 1  # the documents and the first segment (BOS)
PARAMS = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


def engine(mode="lazy", disk=None, device="cpu", disk_always_read=True, **kw) -> LLM:
    """The guard aside unless a test asks for it: on the CPU, with files of a few pages, whether a read beats an
    encode depends on timing."""
    return LLM(
        model="tiny",
        mode=mode,
        device=device,
        page_size=PAGE,
        progress=False,
        kv_cache_gb=0.05,
        disk_cache_dir=disk,
        disk_always_read=disk_always_read,
        **kw,
    )


def run_all(llm: LLM) -> list[list[int]]:
    bos = llm.tokenizer.bos_token_id
    outs = []
    for docs, final in REQUESTS:
        outs += llm._run([from_token_ids(final, [DOCS[d] for d in docs], bos)], PARAMS, None, False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def expected():
    return {mode: run_all(engine(mode)) for mode in ("lazy", "block")}


def kv_files(d) -> list[str]:
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".kv"))


@pytest.mark.parametrize("mode", ["lazy", "block"])
def test_a_restarted_engine_serves_documents_from_disk_with_the_same_tokens(tmp_path, expected, mode):
    first = engine(mode, str(tmp_path))
    assert run_all(first) == expected[mode]
    first.engine.shutdown()  # its queued writes land
    assert len(kv_files(tmp_path)) == SEGMENTS
    second = engine(mode, str(tmp_path))
    assert run_all(second) == expected[mode]
    s = second.engine.stats()
    assert s.cache.misses == 0 and s.cache.disk_hits == SEGMENTS  # each document read once, then on the GPU
    assert s.disk.refused == 0 and s.disk.writes == 0


def test_torn_corrupt_and_foreign_files_are_refused_and_reencoded(tmp_path, expected):
    first = engine("lazy", str(tmp_path))
    run_all(first)
    first.engine.shutdown()
    torn, flipped, foreign = kv_files(tmp_path)[:3]
    os.truncate(torn, os.path.getsize(torn) // 2)  # a write torn by a crash that bypassed the rename, or bad media
    with open(flipped, "r+b") as f:
        f.seek(-100, os.SEEK_END)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x80]))
    other = engine("lazy", str(tmp_path / "other"), seed=1)  # another model (other random weights) ...
    run_all(other)
    other.engine.shutdown()
    os.replace(kv_files(tmp_path / "other")[0], foreign)  # ... its file under this model's name
    second = engine("lazy", str(tmp_path))
    assert run_all(second) == expected["lazy"]
    s = second.engine.stats()
    assert s.disk.refused == 3 and s.cache.misses == 3 and s.cache.disk_hits == SEGMENTS - 3
    second.engine.disk.flush()
    assert second.engine.stats().disk.writes == 3  # encoded again, written again
    third = engine("lazy", str(tmp_path))
    assert run_all(third) == expected["lazy"] and third.engine.stats().cache.misses == 0


def test_a_file_of_nan_with_valid_checksums_fails_the_requests_that_read_it_alone(tmp_path, expected):
    """A file written bad (NaN in its payload, its checksums made over them): it is served, and the requests that
    read it end with a clear error rather than a token 0; a request beside them with other documents goes on."""
    first = engine("lazy", str(tmp_path))
    run_all(first)
    path = first.engine.disk.path(first.engine.keyer(DOCS[0], None, None))
    dtype = first.engine.executor.local_kv.dtype
    first.engine.shutdown()
    with open(path, "rb") as f:
        header = decode_header(f.read(HEADER_BYTES))
    payload = as_bytes(torch.full((header.payload_bytes // dtype.itemsize,), float("nan"), dtype=dtype))
    write_atomic(path, dataclasses.replace(header, checksum=checksum(payload)), payload)

    second = engine("lazy", str(tmp_path))
    bos = second.tokenizer.bos_token_id
    prompts = [from_token_ids(final, [DOCS[d] for d in docs], bos) for docs, final in (REQUESTS[0], REQUESTS[2])]
    bad, good = second._run(prompts, PARAMS, None, False)  # REQUESTS[0] reads DOCS[0], REQUESTS[2] does not
    assert bad.finished and bad.outputs[0].finish_reason == "abort" and bad.outputs[0].token_ids == []
    assert "non-finite logits" in bad.error
    assert good.error is None and good.outputs[0].token_ids == expected["lazy"][2]
    assert second.engine.stats().disk.refused == 0  # the file checked out: served, not re-encoded


def test_two_live_engines_share_a_directory(tmp_path, expected):
    a, b = engine("lazy", str(tmp_path)), engine("lazy", str(tmp_path))
    assert run_all(a) == expected["lazy"]
    a.engine.disk.flush()
    assert run_all(b) == expected["lazy"]
    assert b.engine.stats().cache.misses == 0 and b.engine.stats().disk.writes == 0


def test_with_the_host_tier_under_eviction_the_tokens_do_not_change(tmp_path, expected):
    llm = engine("lazy", str(tmp_path), host_cache_gb=0.0002)  # ~4 pages
    e = llm.engine
    need = max(e.mode.pages_needed([1] + [len(DOCS[d]) for d in docs], 2 + 3, 1, PAGE) for docs, _ in REQUESTS)
    e.set_kv_budget(need + 2)  # most documents leave the GPU, few fit the host
    assert run_all(llm) == expected["lazy"]
    e.disk.flush()
    e.cache.evict(10**6)
    assert run_all(llm) == expected["lazy"]
    s = e.stats()
    assert s.cache.disk_hits > 0 and s.cache.host_hits > 0 and s.host.demotions > 0
    assert s.cache.misses == SEGMENTS  # every document encoded once, whatever tier it came back from


def test_prefix_mode_and_tensor_parallelism_have_no_disk_tier(tmp_path):
    assert engine("prefix", str(tmp_path)).engine.disk is None
    with pytest.raises(InvalidRequestError, match="disk_cache_dir"):
        EngineConfig(model="tiny", disk_cache_dir=str(tmp_path), tensor_parallel_size=2)
    with pytest.raises(InvalidRequestError, match="disk_cache_gb"):
        EngineConfig(model="tiny", disk_cache_gb=0)


LONG = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
FRESH_DOC = [(11 * i + 5) % 240 + 12 for i in range(40)]  # on no disk: encoded


@pytest.fixture
def gate(monkeypatch):
    """Disk reads wait on the reader thread while the gate is closed (it starts open)."""
    import lazyattn.cache.disk_tier as disk_tier

    opened = threading.Event()
    opened.set()
    real = disk_tier.read_verified

    def held(*args, **kw):
        assert opened.wait(20), "the test never let the read go"
        return real(*args, **kw)

    monkeypatch.setattr(disk_tier, "read_verified", held)
    yield opened
    opened.set()


def test_a_disk_read_in_flight_does_not_stall_another_request(tmp_path, expected, gate):
    first = engine("lazy", str(tmp_path))
    run_all(first)
    first.engine.shutdown()
    alone = engine("lazy")
    bos = alone.tokenizer.bos_token_id
    busy = from_token_ids([50, 51], [FRESH_DOC], bos)
    busy_tokens = alone._run([busy], LONG, None, False)[0].outputs[0].token_ids

    e = engine("lazy", str(tmp_path)).engine
    e.add_request("busy", busy, LONG)
    tokens: dict[str, list[int]] = {}

    def step():
        for out in e.step():
            tokens[out.request_id] = out.outputs[0].token_ids

    while not tokens.get("busy"):  # its BOS segment read from disk, its document encoded
        step()
    gate.clear()  # from now on reads wait
    docs, final = REQUESTS[0]
    e.add_request("disk", from_token_ids(final, [DOCS[d] for d in docs], bos), PARAMS)
    before = len(tokens["busy"])
    for _ in range(4):
        step()
    assert e.cache.promoting == 2  # the documents' reads wait on the reader thread ...
    assert len(tokens["busy"]) == before + 4  # ... while the other request decodes a token each step
    assert not tokens.get("disk")
    gate.set()
    while e.has_unfinished():
        step()
    assert tokens["busy"] == busy_tokens and tokens["disk"] == expected["lazy"][0]
    s = e.stats()
    assert s.cache.disk_hits == 3 and s.cache.misses == 1 and s.disk.staging_bytes == 0


def test_aborting_a_request_while_its_documents_load_leaks_nothing(tmp_path, expected, gate):
    first = engine("lazy", str(tmp_path))
    run_all(first)
    first.engine.shutdown()
    llm = engine("lazy", str(tmp_path))
    e, bos = llm.engine, llm.tokenizer.bos_token_id
    free = e.pool.num_free
    e.add_request("busy", from_token_ids([50, 51], [FRESH_DOC], bos), LONG)  # keeps steps from waiting on reads
    # Close the gate only once busy decodes: its own BOS segment comes from disk, and a read of it still in flight
    # behind the closed gate would leave a step with nothing to run but that read to wait for.
    while not any(out.outputs[0].token_ids for out in e.step()):
        pass
    gate.clear()
    docs, final = REQUESTS[1]
    e.add_request("r", from_token_ids(final, [DOCS[d] for d in docs], bos), PARAMS)
    e.step()
    assert e.cache.promoting == 2
    e.abort("r")
    gate.set()
    while e.has_unfinished():
        e.step()
    e.cache.poll(wait=True)
    assert e.cache.promoting == 0 and e.stats().disk.staging_bytes == 0
    assert e.pool.num_free + e.cache.evictable_pages() == free  # what landed is cached, nothing is held
    assert run_all(llm) == expected["lazy"]


def test_the_guard_skips_a_slow_disk_and_always_read_overrides_it(tmp_path, expected):
    first = engine("lazy", str(tmp_path))
    run_all(first)
    first.engine.shutdown()
    for always, hits in [(False, 0), (True, SEGMENTS)]:
        llm = engine("lazy", str(tmp_path), disk_read_gbps=1e-6, disk_always_read=always)
        llm.engine.disk.observe_encode(1000, 1.0)  # any encode beats a disk at 1 kB/s
        assert run_all(llm) == expected["lazy"]
        s = llm.engine.stats()
        assert s.cache.disk_hits == hits and s.disk.skipped_slow == SEGMENTS - hits
        assert s.cache.misses == SEGMENTS - hits
