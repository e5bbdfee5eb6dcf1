"""The disk tier (docs/benchmarks.md, "Disk tier"), one command:

    python -m benchmarks.disk_tier --out OUT/disk_tier/                 # on the GPU: Llama-3.1-8B shapes, ~1-2 min
    python -m benchmarks.disk_tier --plan cpu --out /tmp/disk_tier/     # tiny model, a smoke run

One engine (lazy mode, random bf16 weights) with a host tier and a disk tier in `--disk-dir` (default: under
--out; emptied first, removed at the end unless --keep). Each request is the §6 shape: 5 documents of 2048 tokens
and a 32-token question, one output token, so its time is its TTFT. Per state, `--repeats` fresh sets of documents,
median reported:

- encode: documents seen nowhere (their encode also queues their disk writes);
- gpu: the same request again, its documents on the GPU;
- host: the documents evicted from the GPU to the host tier (and on disk), then requested;
- disk: the documents only on disk (evicted from the GPU, the host copies dropped), their files dropped from the
  page cache first (posix_fadvise DONTNEED after the writes were fsynced), so the read comes from the device;
- disk_warm: the same, without dropping the page cache (files just written are usually still in memory).

The disk's own read bandwidth, in the same run and directory: a 4 GiB file written and fsynced, dropped from the
page cache and read back by the tier's own read path (16 MiB chunks on several threads, each chunk checked as it
lands), then as plain threaded reads without the check, and once more with O_DIRECT (aligned buffers, no check)
where the filesystem allows it; all are reported, with the method.

Restart: the engine is shut down (its writes land), a new one is built on the same directory, and the time from
the start of its construction to the end of a request whose documents are on disk is reported, split into
construction and that first request.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from lazyattn.bench.workload import token_space  # noqa: E402
from lazyattn.cache.disk_format import (  # noqa: E402
    CHUNK_BYTES,
    HEADER_BYTES,
    Header,
    checksum,
    read_verified,
    write_atomic,
)
from lazyattn.engine.config import EngineConfig  # noqa: E402
from lazyattn.engine.llm_engine import LLMEngine  # noqa: E402
from lazyattn.engine.prompt import from_token_ids  # noqa: E402
from lazyattn.engine.sampling import SamplingParams  # noqa: E402

GiB = 2**30
STATES = ("encode", "gpu", "host", "disk", "disk_warm")


@dataclass(frozen=True)
class Plan:
    model: str
    device: str
    kv_gb: float
    host_gb: float
    doc_len: int = 2048
    docs_per_request: int = 5
    question_len: int = 32
    page_size: int = 64
    bandwidth_bytes: int = 4 * GiB
    options: dict = field(default_factory=dict)


PLANS = {
    "h100": Plan(
        str(ROOT / "benchmarks/models/llama-3.1-8b"), "cuda", kv_gb=16.0, host_gb=8.0, options={"random_weights": True}
    ),
    "cpu": Plan(
        "tiny",
        "cpu",
        kv_gb=0.05,
        host_gb=0.02,
        doc_len=64,
        docs_per_request=2,
        question_len=8,
        page_size=16,
        bandwidth_bytes=32 << 20,
        options={"dtype": "float32"},
    ),
}


def sync(engine: LLMEngine) -> None:
    if engine.device.type == "cuda":
        import torch

        torch.cuda.synchronize(engine.device)


def run_request(engine: LLMEngine, prompt, request_id: str) -> float:
    """Seconds from add_request to the request's first (and only) token."""
    sync(engine)
    start = time.perf_counter()
    engine.add_request(request_id, prompt, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - start


def drop_page_cache(directory: str) -> int:
    """Ask the kernel to drop the directory's files from the page cache (they were fsynced: their pages are clean).
    Returns how many files."""
    names = os.listdir(directory)
    for name in names:
        drop_file_cache(os.path.join(directory, name))
    return len(names)


def to_disk_only(engine: LLMEngine, drop: bool) -> None:
    """Every cached document leaves the GPU (to the host tier) and the host; what is left of them is on disk."""
    engine.disk.flush()
    engine.cache.poll(wait=True)
    engine.cache.evict(engine.pool.num_pages)
    if engine.tier is not None:
        sync(engine)  # the demotions land before their host pages are dropped
        engine.tier.clear()
    if drop:
        drop_page_cache(engine.disk.directory)


def ttfts(engine: LLMEngine, plan: Plan, repeats: int, rng) -> dict:
    high, bos = token_space(engine.model_config)
    out: dict[str, list[float]] = {s: [] for s in STATES}
    hits: dict[str, list] = {s: [] for s in STATES}

    def fresh():
        docs = rng.integers(0, high, size=(plan.docs_per_request, plan.doc_len)).tolist()
        return from_token_ids(rng.integers(0, high, size=plan.question_len).tolist(), docs, bos)

    def measure(state: str, prompt, i: int) -> None:
        before = engine.stats().cache
        out[state].append(run_request(engine, prompt, f"{state}-{i}"))
        after = engine.stats().cache
        hits[state].append(
            {
                "misses": after.misses - before.misses,
                "gpu": after.gpu_hits - before.gpu_hits,
                "host": after.host_hits - before.host_hits,
                "disk": after.disk_hits - before.disk_hits,
            }
        )

    for i in range(-1, repeats):  # the first round pays one-off costs (pinned buffers, kernels): not reported
        if i == 0:
            for v in (*out.values(), *hits.values()):
                v.clear()
        prompt = fresh()
        measure("encode", prompt, i)
        measure("gpu", prompt, i)
        engine.disk.flush()
        engine.cache.evict(engine.pool.num_pages)
        engine.cache.poll(wait=True)
        measure("host", prompt, i)
        for state, drop in (("disk", True), ("disk_warm", False)):
            to_disk_only(engine, drop)
            measure(state, prompt, i)
    return {
        s: {"ttft_ms_median": 1e3 * statistics.median(v), "ttft_ms": [1e3 * t for t in v], "lookups": hits[s]}
        for s, v in out.items()
    }


def read_bandwidth(directory: str, nbytes: int) -> dict:
    """GB/s (1e9) reading a fresh file after dropping it from the page cache: through the tier's own read path
    (disk_format.read_verified: threads, chunks, each chunk checked as it lands), as plain threaded reads without the
    check, and with O_DIRECT (one thread, 16 MiB aligned reads, no check) where supported."""
    import numpy as np

    n = (nbytes // CHUNK_BYTES) * CHUNK_BYTES
    block = np.random.default_rng(0).integers(0, 255, size=CHUNK_BYTES, dtype=np.uint8)
    payload = memoryview(np.tile(block, n // CHUNK_BYTES).data).cast("B")
    header = Header("bandwidth-probe", "probe", n // 4096, n // 4096, 4096, checksum(payload), "uint8")
    path = os.path.join(directory, "bandwidth.probe")
    start = time.perf_counter()
    write_atomic(path, header, payload)
    out = {"bytes": n, "write_gbps": n / (time.perf_counter() - start) / 1e9}
    into = payload  # read back over the bytes written: one buffer of the file's size, not two
    drop_file_cache(path)
    start = time.perf_counter()
    read_verified(path, header.key, header.layout, header.n_tokens, header.page_bytes, into, header.kv_dtype)
    out["tier_read_gbps"] = n / (time.perf_counter() - start) / 1e9
    drop_file_cache(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        from concurrent.futures import ThreadPoolExecutor

        def read(a: int) -> None:
            chunk = into[a : a + CHUNK_BYTES]
            while chunk:
                got = os.preadv(fd, [chunk], HEADER_BYTES + a + CHUNK_BYTES - len(chunk))
                chunk = chunk[got:]

        start = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(read, range(0, n, CHUNK_BYTES)))
        out["read_only_gbps"] = n / (time.perf_counter() - start) / 1e9
    finally:
        os.close(fd)
    out["method"] = "posix_fadvise(POSIX_FADV_DONTNEED) after fsync, then the tier's threaded reads"
    out["o_direct_gbps"] = _o_direct(path, n)
    os.unlink(path)
    return out


def drop_file_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _o_direct(path: str, n: int) -> float | None:
    if not hasattr(os, "O_DIRECT"):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return None
    buf = mmap.mmap(-1, CHUNK_BYTES)  # page-aligned, as O_DIRECT needs
    try:
        start = time.perf_counter()
        for a in range(0, n, CHUNK_BYTES):
            if os.preadv(fd, [buf], a) <= 0:
                return None
        return n / (time.perf_counter() - start) / 1e9
    except OSError:
        return None
    finally:
        os.close(fd)
        buf.close()


def markdown(result: dict) -> str:
    rows = result["ttft"]
    enc = rows["encode"]["ttft_ms_median"]
    lines = [
        f"# Disk tier, {result['meta']['device_name']}",
        "",
        f"Command: `{result['meta']['command']}`",
        "",
        "| state | TTFT median ms | vs encode |",
        "|---|---|---|",
    ]
    lines += [f"| {s} | {r['ttft_ms_median']:.1f} | {enc / r['ttft_ms_median']:.2f}x |" for s, r in rows.items()]
    bw = result["bandwidth"]
    o_direct = f"{bw['o_direct_gbps']:.2f} GB/s" if bw.get("o_direct_gbps") else "not supported here"
    lines += [
        "",
        f"Disk read ({bw['bytes'] / 2**20:.0f} MiB file, {bw['method']}): {bw['read_only_gbps']:.2f} GB/s plain reads, "
        f"{bw['tier_read_gbps']:.2f} GB/s the tier's reads (checked); O_DIRECT one thread: {o_direct}; "
        f"write + fsync {bw['write_gbps']:.2f} GB/s.",
        "",
        f"Restart to first cached hit: {result['restart']['total_s']:.1f} s (engine construction "
        f"{result['restart']['construct_s']:.1f} s, first request {1e3 * result['restart']['first_request_s']:.0f} ms,"
        f" {result['restart']['disk_hits']} documents from disk).",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    import sys

    import numpy as np

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", choices=sorted(PLANS), default="h100")
    p.add_argument("--out", default=str(ROOT / "out/disk_tier"))
    p.add_argument("--disk-dir", default=None, help="the disk tier's directory (default: OUT/kv); emptied first")
    p.add_argument("--repeats", type=int, default=3, help="fresh document sets per state")
    p.add_argument("--keep", action="store_true", help="keep the disk tier's files")
    args = p.parse_args()
    plan = PLANS[args.plan]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    disk_dir = args.disk_dir or str(out / "kv")
    shutil.rmtree(disk_dir, ignore_errors=True)
    os.makedirs(disk_dir)
    config = EngineConfig(
        model=plan.model,
        device=plan.device,
        mode="lazy",
        page_size=plan.page_size,
        kv_cache_gb=plan.kv_gb,
        host_cache_gb=plan.host_gb,
        disk_cache_dir=disk_dir,
        disk_always_read=True,  # measures the read path; the guard's estimates are in disk_stats (read_bps, encode_tps)
        max_model_len=plan.docs_per_request * plan.doc_len + plan.question_len + 64,
        progress=False,
        **plan.options,
    )
    clock = time.monotonic()
    result: dict = {"meta": {"command": " ".join(["python -m benchmarks.disk_tier", *sys.argv[1:]]), "plan": args.plan}}
    result["bandwidth"] = read_bandwidth(disk_dir, plan.bandwidth_bytes)
    print(json.dumps(result["bandwidth"]), flush=True)
    engine = LLMEngine(config)
    result["meta"]["device_name"] = _device_name(engine)
    result["meta"]["construct_s"] = time.monotonic() - clock
    rng = np.random.default_rng(0)
    result["ttft"] = ttfts(engine, plan, args.repeats, rng)
    for s, r in result["ttft"].items():
        print(f"{s:10s} TTFT {r['ttft_ms_median']:8.1f} ms  {r['lookups'][-1]}", flush=True)
    # The restart: a request whose documents this engine wrote, served by a fresh engine.
    high, bos = token_space(engine.model_config)
    docs = rng.integers(0, high, size=(plan.docs_per_request, plan.doc_len)).tolist()
    run_request(engine, from_token_ids([1, 2, 3], docs, bos), "before-restart")
    result["disk_stats"] = engine.stats().disk.__dict__
    engine.shutdown()  # its queued writes land
    del engine
    drop_page_cache(disk_dir)
    start = time.perf_counter()
    engine = LLMEngine(config)
    construct = time.perf_counter() - start
    first = run_request(engine, from_token_ids([4, 5, 6], docs, bos), "after-restart")
    result["restart"] = {
        "construct_s": construct,
        "first_request_s": first,
        "total_s": time.perf_counter() - start,
        "disk_hits": engine.stats().cache.disk_hits,
        "misses": engine.stats().cache.misses,
    }
    print(json.dumps(result["restart"]), flush=True)
    engine.shutdown()
    result["meta"]["wall_s"] = time.monotonic() - clock
    (out / "disk_tier.json").write_text(json.dumps(result, indent=1))
    (out / "disk_tier.md").write_text(markdown(result))
    print(markdown(result))
    if not args.keep:
        shutil.rmtree(disk_dir, ignore_errors=True)
    return 0


def _device_name(engine: LLMEngine) -> str:
    if engine.device.type == "cuda":
        import torch

        return torch.cuda.get_device_name(engine.device)
    return "CPU"


if __name__ == "__main__":
    raise SystemExit(main())
