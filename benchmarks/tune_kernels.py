"""Kernel tuning sweep for one device call: prefill tiles / splits / deferred-RoPE overhead, decode splits / tiles.

    python -m benchmarks.tune_kernels --out $OUT/tune            # on the GPU, about 3 minutes
    python -m benchmarks.tune_kernels --out /tmp/tune --quick    # CPU smoke test (Triton interpreter)

Phase 1 compiles every kernel variant once in parallel worker processes (they fill triton's disk cache) while
the GPU-marked kernel tests run beside them; phase 2 times every job one by one in this process
(triton.testing.do_bench medians, L2 flushed before each call, inputs rotated over copies when they would fit
in L2); the table comes last. Every job also records max |out - ref| against a reference output of the same
inputs (the kernels of `--baseline`, or SDPA where that is the job). The baseline modules are files beside
this script, e.g. the kernels before the tuning:

    git show 8f145b4:lazyattn/kernels/prefill.py > benchmarks/_old_prefill.py
    git show 8f145b4:lazyattn/kernels/decode.py > benchmarks/_old_decode.py
 Overhead pairs (apply_delta on / off on
the same inputs, splits and tiles) are timed alternately, median of rounds. Shapes: Llama-3.1-8B heads
(32 q, 8 kv, head_dim 128), bf16, pages of 64 unless a job says otherwise; same layouts as
benchmarks/kernels.py (whose helpers build the inputs).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import torch

if not torch.cuda.is_available():  # must precede the first triton import
    os.environ.setdefault("TRITON_INTERPRET", "1")

from benchmarks import kernels as kb  # noqa: E402  (layouts and measurement helpers)
from lazyattn.kernels import decode as new_decode  # noqa: E402
from lazyattn.kernels import prefill as new_prefill  # noqa: E402
from lazyattn.kernels.paged import cdiv  # noqa: E402

PREFILL_TILES = [(128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 3)]
DECODE_TILES = {"A": None, "B": (64, 4, 4), "E": (32, 4, 4), "F": (64, 8, 3)}  # (block_n, warps, stages)


# --- jobs ------------------------------------------------------------------------------------------------------
# A job is a plain dict: case (which inputs), impl, and the knobs of the call. Jobs of one case share inputs.
# "flush": "read" times with a read-only L2 flush instead of do_bench's zero fill (see time_read_flush).


def prefill_jobs(quick: bool) -> list[dict]:
    jobs = []
    t0, t1, t2 = PREFILL_TILES
    causal = (64,) if quick else (4096, 8192, 16384)
    for n in causal:
        case = {"case": "causal", "n": n, "page": 64, "runs": False}
        for tile in (t0, t1):
            jobs.append({**case, "impl": "new", "tile": tile, "splits": 1, "delta": True})
            jobs.append({**case, "impl": "new", "tile": tile, "splits": 1, "delta": False})
        jobs.append({**case, "impl": "new", "tile": None, "splits": None, "delta": True})
        jobs += [{**case, "impl": "sdpa_flash"}]
    for n in causal[-1:]:
        case = {"case": "causal", "n": n, "page": 128 if not quick else 32, "runs": False}
        for tile in (t0, t2):
            jobs.append({**case, "impl": "new", "tile": tile, "splits": 1, "delta": True})
    rag_batches = (1, 2) if quick else (1, 8, 32, 64)
    split_sweep = {1: (8, 12, 16, 20, 24, 32), 8: (2, 3, 4), 32: (1, 2), 64: (1,), 2: (1, 3)}
    for bs in rag_batches:
        case = {"case": "rag", "batch": bs, "page": 64}
        for s in split_sweep[bs]:
            jobs.append({**case, "impl": "new", "tile": t0, "splits": s, "delta": True})
            if bs != 1:
                jobs.append({**case, "impl": "new", "tile": t1, "splits": s, "delta": True})
        jobs.append({**case, "impl": "new", "tile": None, "splits": None, "delta": True})  # defaults: autotune
        jobs.append({**case, "impl": "baseline", "delta": True})
        if bs == 1 or quick:
            jobs.append({**case, "impl": "sdpa_flash"})
            jobs.append({**case, "impl": "new", "tile": t0, "splits": 16, "delta": True, "flush": "read"})
            jobs.append({**case, "impl": "sdpa_flash", "flush": "read"})
    return jobs


def overhead_jobs(quick: bool) -> list[dict]:
    """Pairs: apply_delta True vs False, same inputs, splits and tiles."""
    t0, t1, _ = PREFILL_TILES
    rag = {"case": "rag", "batch": 2 if quick else 8, "page": 64}
    causal = {"case": "causal", "n": 64 if quick else 8192, "page": 64, "runs": True}
    jobs = []
    for s in (2, 3, 4, 6, 8):
        for tile in (t0, t1):
            jobs.append({**rag, "impl": "new", "tile": tile, "splits": s, "pair": True})
    for s in (1, 2, 4):
        jobs.append({**causal, "impl": "new", "tile": t0, "splits": s, "pair": True})
    jobs.append({**causal, "impl": "new", "tile": t1, "splits": 1, "pair": True})
    batches = (2,) if quick else (8, 32)
    for bs in batches:
        dec = {"case": "decode", "batch": bs, "ctx": 64 if quick else 8192}
        jobs.append({**dec, "impl": "new", "dtile": "A", "splits": None, "pair": True})
    return jobs


def decode_jobs(quick: bool) -> list[dict]:
    cases = (
        [(1, 96), (2, 48)]
        if quick
        else [(1, 4096), (1, 32768), (8, 4096), (8, 8192), (32, 4096), (32, 8192), (64, 4096), (64, 8192)]
    )
    sweep = {1: (12, 16, 24, 32, 40), 8: (3, 4, 5, 6), 32: (1,), 64: (1,), 2: (1, 2)}
    jobs = []
    for bs, ctx in cases:
        case = {"case": "decode", "batch": bs, "ctx": ctx}
        jobs.append({**case, "impl": "new", "dtile": "A", "splits": None, "delta": True})
        for s in sweep[bs]:
            jobs.append({**case, "impl": "new", "dtile": "A", "splits": s, "delta": True})
        for name in ("B", "E", "F"):
            jobs.append({**case, "impl": "new", "dtile": name, "splits": None, "delta": True})
            if bs == 8:
                jobs.append({**case, "impl": "new", "dtile": name, "splits": 4, "delta": True})
        jobs.append({**case, "impl": "baseline", "delta": True})
        if bs in (1, 8):
            jobs.append({**case, "impl": "new", "dtile": "A", "splits": None, "delta": True, "flush": "read"})
            jobs.append({**case, "impl": "baseline", "delta": True, "flush": "read"})
    return jobs


def all_jobs(only: set[str], quick: bool) -> list[dict]:
    jobs = []
    if "prefill" in only:
        jobs += prefill_jobs(quick)
    if "overhead" in only:
        jobs += overhead_jobs(quick)
    if "decode" in only:
        jobs += decode_jobs(quick)
    for i, j in enumerate(jobs):
        j["id"] = i
    return jobs


def case_key(job: dict) -> tuple:
    return tuple((k, job[k]) for k in ("case", "n", "page", "runs", "batch", "ctx") if k in job)


# --- inputs ------------------------------------------------------------------------------------------------------


def make_bench(args: argparse.Namespace, page: int) -> kb.Bench:
    s = kb.QUICK if args.quick else kb.Shapes()
    s = replace(s, page_size=16 if args.quick and page == 64 else page)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    max_position = 4 * max(s.decode_contexts + s.causal_lens + (s.n_docs * s.doc_len + s.question,))
    if not args.quick:
        max_position = 4 * 32768
    ns = SimpleNamespace(warmup=args.warmup, rep=args.rep, seed=0)
    return kb.Bench(ns, s, device, kb.llama31_tables(s.head_dim, max_position, device))


def build_case(args: argparse.Namespace, job: dict) -> dict:
    """Inputs of a case: a list of (q, k_cache, v_cache, batch) copies, dense q/k/v for SDPA, and a FLOP or
    byte count for the rate column."""
    b = make_bench(args, job.get("page", 64))
    s = b.s
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    if job["case"] == "causal":
        inputs, dense = kb.causal_case(b, job["n"], job["runs"], gen)
        n = job["n"]
        return {
            "b": b,
            "inputs": [inputs],
            "dense": dense,
            "flops": 2.0 * n * n * s.head_dim * s.q_heads,
            "sdpa_mask": "square",
        }
    if job["case"] == "rag":
        ctx = s.n_docs * s.doc_len
        kv_bytes = job["batch"] * (ctx + s.question) * s.kv_heads * s.head_dim * 2 * kb.DTYPE.itemsize
        inputs, dense = kb.rag_case(b, job["batch"], True, copies=kb.copies_for(kv_bytes, b.l2_bytes()))
        visible = sum(ctx + i + 1 for i in range(s.question))
        return {
            "b": b,
            "inputs": inputs,
            "dense": dense,
            "sdpa_mask": "lower_right",
            "flops": 4.0 * visible * s.head_dim * s.q_heads * job["batch"],
        }
    inputs, nbytes = kb.decode_case(b, job["batch"], job["ctx"], gen)
    return {"b": b, "inputs": inputs, "bytes": nbytes}


def baseline_module(name: str, decode: bool):
    return importlib.import_module(f"{name}_decode" if decode else f"{name}_prefill")


def call_for(args: argparse.Namespace, job: dict, case: dict, delta: bool | None = None) -> list[Callable]:
    """One zero-argument call per input copy."""
    b = case["b"]
    delta = job.get("delta", True) if delta is None else delta
    if job["case"] == "decode":
        if job["impl"] == "baseline":
            fn = baseline_module(args.baseline, True).decode_attention
            return [lambda i=i: fn(*i, b.tables, b.scale, apply_delta=delta) for i in case["inputs"]]
        tile = DECODE_TILES[job["dtile"]]
        config = None
        if tile is not None:  # the register cap depends only on head_dim and dtype: keep the default's
            cap = new_decode.decode_config(b.s.head_dim, kb.DTYPE, b.s.page_size).maxnreg
            config = new_decode.DecodeConfig(tile[0], tile[1], tile[2], cap)
        counters = case.setdefault("counters", new_decode.ArrivalCounters())
        return [
            lambda i=i: new_decode.decode_attention(
                *i, b.tables, b.scale, apply_delta=delta, num_splits=job["splits"], config=config, counters=counters
            )
            for i in case["inputs"]
        ]
    if job["impl"] == "baseline":
        fn = baseline_module(args.baseline, False).prefill_attention
        return [lambda i=i: fn(*i, b.tables, b.scale, apply_delta=delta) for i in case["inputs"]]
    if job["impl"].startswith("sdpa"):
        return []
    if job["tile"] is None:
        return [
            lambda i=i: new_prefill.prefill_attention(*i, b.tables, b.scale, apply_delta=delta) for i in case["inputs"]
        ]
    tile = job["tile"]
    if args.quick:
        tile = (max(16, tile[0] // 4), max(16, tile[1] // 4), 4, 2)
    config = new_prefill.PrefillConfig(*tile)
    return [
        lambda i=i: new_prefill.prefill_attention(
            *i, b.tables, b.scale, apply_delta=delta, num_splits=job["splits"], config=config
        )
        for i in case["inputs"]
    ]


# --- phase 1: compile in parallel -------------------------------------------------------------------------------


def compile_key(job: dict) -> tuple | None:
    """Jobs that may compile something of their own (triton specialises integer arguments on == 1 and
    % 16, so split counts and sizes matter): every kernel job but exact duplicates."""
    if job["impl"].startswith("sdpa"):
        return None
    return case_key(job) + tuple((k, str(job.get(k))) for k in ("impl", "tile", "dtile", "delta", "pair", "splits"))


def _compile_worker(payload: tuple) -> list[str]:
    args, jobs = payload
    errors = []
    cases = {}
    for job in jobs:
        try:
            key = case_key(job)
            if key not in cases:
                cases.clear()
                torch.cuda.empty_cache()
                cases[key] = build_case(args, job)
            flags = (True, False) if job.get("pair") else (None,)
            for flag in flags:
                for call in call_for(args, job, cases[key], flag)[:1]:
                    call()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - reported, the timing phase shows it again
            errors.append(f"job {job['id']}: {type(e).__name__}: {str(e)[:300]}")
    return errors


def compile_all(args: argparse.Namespace, jobs: list[dict]) -> list[str]:
    import multiprocessing as mp

    seen, todo = set(), []
    for job in jobs:
        key = compile_key(job)
        if key is not None and key not in seen:
            seen.add(key)
            todo.append(job)
    todo.sort(key=case_key)  # contiguous slices: a worker builds few cases
    size = cdiv(len(todo), args.workers)
    parts = [todo[i : i + size] for i in range(0, len(todo), size)]
    with mp.get_context("spawn").Pool(args.workers) as pool:
        results = pool.map(_compile_worker, [(args, p) for p in parts if p])
    return [e for r in results for e in r]


# --- phase 2: time ----------------------------------------------------------------------------------------------


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def time_graph(b: kb.Bench, fn: Callable) -> float:
    """Median ms of a CUDA graph replay of fn (launch overhead removed)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return b.time_ms(graph.replay)


_FLUSH: list[torch.Tensor] = []


def time_read_flush(b: kb.Bench, fn: Callable) -> float:
    """Median ms like do_bench, but L2 is flushed by *reading* 256 MiB (clean lines) instead of writing
    zeros: after a zero fill, ~L2-size of dirty lines is written back to HBM during the timed call, which
    a short memory-bound kernel pays for (tens of MB against its own reads)."""
    if not b.gpu:
        return b.time_ms(fn)
    if not _FLUSH:
        _FLUSH.append(torch.ones(64 << 20, dtype=torch.float32, device=b.device))
    flush = _FLUSH[0]
    fn()
    torch.cuda.synchronize()
    times = []
    for i in range(12 + 400):
        flush.sum()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        if i >= 12:
            times.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in times)


def run_job(args: argparse.Namespace, job: dict, case: dict, ref: torch.Tensor | None) -> dict:
    b = case["b"]
    row = {}
    if job["impl"].startswith("sdpa"):
        if not b.gpu:
            return {"skipped": "no GPU"}
        from torch.nn.attention import SDPBackend

        backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}[job["impl"]]
        if job.get("flush") == "read":
            import torch.nn.functional as F
            from torch.nn.attention import sdpa_kernel
            from torch.nn.attention.bias import causal_lower_right

            q, k, v = case["dense"]
            mask = causal_lower_right(q.shape[2], k.shape[2])
            with sdpa_kernel(backend):
                return {
                    "ms": time_read_flush(
                        b, lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
                    )
                }
        r = kb.time_sdpa(b, backend, case["dense"], case["sdpa_mask"], ref)
        return {k: r[k] for k in ("ms", "variant", "max_abs_diff_vs_ours", "error") if k in r}
    calls = call_for(args, job, case)
    out = calls[0]()
    if ref is not None:
        row["diff"] = max_diff(out, ref)
    if job.get("pair"):
        on_calls, off_calls = calls, call_for(args, job, case, False)
        times = {True: [], False: []}
        for _ in range(args.rounds):
            for flag, cs in ((True, on_calls), (False, off_calls)):
                times[flag].append(b.time_ms(kb.cycle(cs)))
        on, off = statistics.median(times[True]), statistics.median(times[False])
        row.update(ms=on, ms_off=off, overhead_pct=100 * (on / off - 1))
    elif job.get("graph"):
        row["ms"] = time_graph(b, calls[0]) if b.gpu else b.time_ms(calls[0])
    elif job.get("flush") == "read":
        row["ms"] = time_read_flush(b, kb.cycle(calls))
    else:
        row["ms"] = b.time_ms(kb.cycle(calls))
    if "flops" in case:
        row["TFLOPs"] = case["flops"] / row["ms"] / 1e9
    if "bytes" in case:
        row["GBps"] = case["bytes"] / row["ms"] / 1e6
    return row


def reference(args: argparse.Namespace, job: dict, case: dict) -> torch.Tensor | None:
    """The baseline kernel's output on the case's first input copy (SDPA jobs compare against it too)."""
    try:
        probe = {**job, "impl": "baseline", "delta": True}
        return call_for(args, probe, case)[0]()
    except Exception:  # noqa: BLE001
        return None


def label(job: dict) -> tuple[str, str]:
    c = job["case"]
    if c == "causal":
        case = f"causal {job['n']} p{job['page']}" + (" runs" if job["runs"] else "")
    elif c == "rag":
        case = f"RAG bs {job['batch']}"
    else:
        case = f"decode {job['batch']}x{job['ctx']}"
    impl = job["impl"]
    if impl == "new":
        knobs = [f"tile {job['tile']}" if "tile" in job else f"cfg {job['dtile']}", f"S {job['splits']}"]
        if job.get("delta") is False:
            knobs.append("no delta")
        if job.get("graph"):
            knobs.append("graph")
        impl = "new " + " ".join(knobs)
    if job.get("flush"):
        impl += " (read flush)"
    return case, impl + (" [on/off]" if job.get("pair") else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="path prefix: writes <out>.json and <out>.md")
    p.add_argument("--only", default="prefill,overhead,decode")
    p.add_argument("--baseline", default="_old", help="module prefix of the reference kernels (<prefix>_prefill)")
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--tests", action="store_true", help="run the gpu-marked kernel tests beside phase 1")
    p.add_argument("--compile-only", action="store_true", help="stop after phase 1 (warms triton's cache)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--warmup", type=int, default=25)
    p.add_argument("--rep", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    jobs = all_jobs(set(args.only.split(",")), args.quick)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    tests = None
    if args.tests and torch.cuda.is_available():
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-m",
            "gpu",
            "tests/kernels/test_prefill.py",
            "tests/kernels/test_decode.py",
        ]
        try:
            import xdist  # noqa: F401

            cmd += ["-n", "4"]
        except ImportError:
            pass
        tests = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    errors = compile_all(args, jobs) if torch.cuda.is_available() and args.workers > 0 else []
    print(f"[compile] {time.time() - t0:.0f} s, {len(errors)} errors", flush=True)
    for e in errors:
        print("  ", e, flush=True)
    if tests is not None:
        log = tests.communicate()[0]
        (out.parent / "tests.log").write_text(log)
        print("[tests]", (log.strip().splitlines() or ["no output"])[-1], f"({time.time() - t0:.0f} s)", flush=True)
    if args.compile_only:
        return

    rows, case, ref, key = [], None, None, None
    order = {"rag": 0, "causal": 1, "decode": 2}
    for job in sorted(jobs, key=lambda j: (order[j["case"]], case_key(j), j["id"])):
        if case_key(job) != key:
            case = ref = None
            kb.free_memory()
            key = case_key(job)
            try:
                case = build_case(args, job)
                ref = reference(args, job, case)
            except Exception as e:  # noqa: BLE001
                case = e
        name, impl = label(job)
        try:
            if isinstance(case, Exception):
                raise case
            r = run_job(args, job, case, ref)
        except Exception as e:  # noqa: BLE001
            r = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
            traceback.print_exc()
        rows.append({"id": job["id"], "case": name, "impl": impl, **r})
        print(json.dumps(rows[-1]), flush=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    env = kb.environment(SimpleNamespace(argv=sys.argv[1:]), device)
    env["command"] = "python -m benchmarks.tune_kernels " + " ".join(sys.argv[1:])
    out.with_suffix(".json").write_text(json.dumps({"env": env, "rows": rows}, indent=1, default=str))
    table = ["| case | impl | ms | ms_off | overhead % | TFLOP/s | GB/s | diff |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["case"], r["impl"]] + [kb._fmt(r.get(k)) for k in ("ms", "ms_off", "overhead_pct", "TFLOPs", "GBps")]
        cells.append(kb._fmt(r.get("diff", r.get("max_abs_diff_vs_ours"))) + (f" {r['error']}" if "error" in r else ""))
        table.append("| " + " | ".join(cells) + " |")
    out.with_suffix(".md").write_text(f"# Tuning sweep ({env['device']})\n\n" + "\n".join(table) + "\n")
    print("\n".join(table))
    print(f"[done] {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
