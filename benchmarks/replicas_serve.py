"""Replicas through Ray Serve itself: `lazyattn serve --replicas N` on N GPUs, driven over HTTP with the paper
workload (docs/design.md, Benchmark protocol) at saturation, against one replica; and the hit ratio against one
engine with the same total KV (`lazyattn serve` without Ray, N times the KV budget).

    python -m benchmarks.replicas_serve --replicas 1,2,4 --budget-s 420 --out OUT/replicas_serve   # 4 GPUs
    python -m benchmarks.replicas_serve --quick --out /tmp/replicas_serve    # tiny on the CPU: a smoke test only

Each configuration is the real command in a process of its own (Ray started and stopped by it, one engine replica
per GPU, document-affinity routing by default), sent N x --requests-per-replica requests at once: so each replica
carries what the one replica did, and the ratio measures capacity, not a fixed burst split N ways. The requests are
the seeded trace of `bench/workload.py` (its first requests are the one replica's), documents as text: random-weight
checkpoints read with the byte tokenizer, one token a character, so a 2048-character document is 2048 tokens. Every
configuration starts from a cold document cache for this trace (its own `cache_salt`) after a short warm-up on other
documents. Hit ratio: cached prompt tokens over prompt tokens, from each response's usage.

`benchmarks/replicas.py` measures the same routing without Ray (engine processes fed by the policy code); this one
adds Serve's proxy, ingress and actor calls. Writes replicas_serve.json after every configuration and
replicas_serve.md at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from lazyattn.bench.workload import Load, Trace, WorkloadSpec, make_trace

ROOT = Path(__file__).resolve().parents[1]
LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8)  # spaces: word-like text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def text_of(tokens: list[int]) -> str:
    """A document's text: one character per token id of the trace (the byte tokenizer reads it back as as many
    tokens), so the trace's distinct documents stay distinct."""
    return LETTERS[np.asarray(tokens) % len(LETTERS)].tobytes().decode()


class Server:
    """One `lazyattn serve` process (Ray and its replicas are its children); ready when it answers /v1/models."""

    def __init__(self, args: list[str], port: int, log: Path) -> None:
        self.port = port
        self.log = log.open("w")
        command = [sys.executable, "-m", "lazyattn", "serve", "--port", str(port), "--log-level", "warning", *args]
        self.log.write(" ".join(command) + "\n")
        self.log.flush()
        self.proc = subprocess.Popen(
            command, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    async def wait_ready(self, session, timeout_s: float) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}) while starting; see {self.log.name}")
            try:
                async with session.get(f"http://127.0.0.1:{self.port}/v1/models") as r:
                    if r.status == 200:
                        return time.monotonic() - start
            except OSError:
                pass
            await asyncio.sleep(1.0)
        raise TimeoutError(f"the server was not ready after {timeout_s:.0f} s; see {self.log.name}")

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM (the command shuts Serve and Ray down); if it lingers, the whole process group and whatever Ray
        left running (`ray stop --force`), so that the next configuration finds the GPUs free."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
                stop = [sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"]
                subprocess.run(stop, stdout=self.log, stderr=subprocess.STDOUT, timeout=60, check=False)
        self.log.close()


async def one_request(session, url: str, body: dict, t0: float) -> dict:
    rec = {"start": time.monotonic() - t0, "ttft": None, "end": None, "tokens": 0, "error": None}
    try:
        async with session.post(url, json=body) as r:
            if r.status != 200:
                rec["error"] = f"HTTP {r.status}: {(await r.text())[:200]}"
                return rec
            rec["replica"] = r.headers.get("x-lazyattn-replica")  # cluster/ingress.py's route header
            async for raw in r.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    rec["error"] = event["error"].get("type", "error")
                    continue
                if event.get("choices") and event["choices"][0].get("text"):
                    rec["tokens"] += 1
                    if rec["ttft"] is None:
                        rec["ttft"] = time.monotonic() - t0 - rec["start"]
                if event.get("usage"):
                    rec["usage"] = event["usage"]
    except Exception as e:  # noqa: BLE001 (recorded; the point goes on)
        rec["error"] = f"{type(e).__name__}: {e}"[:200]
    rec["end"] = time.monotonic() - t0
    return rec


def request_body(trace: Trace, index: int, salt: str, docs: dict[int, str]) -> dict:
    req = trace.requests[index]
    return {
        "prompt": text_of(req.question),
        "documents": [docs[d] for d in req.doc_ids],
        "max_tokens": trace.spec.output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "cache_salt": salt,
    }


async def drive(port: int, trace: Trace, salt: str, docs: dict[int, str], limit_s: float) -> dict:
    """Every request of the trace at once (saturation); the summary of what came back within `limit_s`."""
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/completions"
    timeout = aiohttp.ClientTimeout(total=limit_s)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        t0 = time.monotonic()
        records = await asyncio.gather(
            *(one_request(session, url, request_body(trace, i, salt, docs), t0) for i in range(len(trace.requests)))
        )
    return summarize(records)


def summarize(records: list[dict]) -> dict:
    ok = [r for r in records if r["error"] is None and r["end"] is not None and r["tokens"]]
    errors = [r["error"] for r in records if r["error"] is not None]
    if not ok:
        return {"requests": len(records), "completed": 0, "errors": len(errors), "first_errors": errors[:3]}
    span = max(r["end"] for r in ok) - min(r["start"] for r in ok)
    ttft = np.array([r["ttft"] for r in ok]) * 1e3
    prompt = sum(r.get("usage", {}).get("prompt_tokens", 0) for r in ok)
    cached = sum(r.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens", 0) for r in ok)
    return {
        "requests": len(records),
        "completed": len(ok),
        "errors": len(errors),
        "first_errors": errors[:3],
        "span_s": span,
        "request_throughput": len(ok) / span,
        "output_token_throughput": sum(r["tokens"] for r in ok) / span,
        "ttft_ms": {"mean": float(ttft.mean()), "p50": float(np.median(ttft)), "p99": float(np.percentile(ttft, 99))},
        "hit_ratio": cached / prompt if prompt else 0.0,
        "requests_per_replica": sorted(Counter(r.get("replica") or "-" for r in ok).values(), reverse=True),
    }


def documents(trace: Trace) -> dict[int, str]:
    return {d: text_of(tokens) for d, tokens in enumerate(trace.documents)}


async def run_config(
    name: str, server_args: list[str], trace: Trace, warm: Trace, out: Path, limit_s: float, start_s: float
) -> dict:
    import aiohttp

    port = free_port()
    print(f"[{name}] starting: lazyattn serve {' '.join(server_args)}", flush=True)
    slug = "".join(c if c.isalnum() else "_" for c in name).strip("_")
    server = Server(server_args, port, out / f"{slug}.log")
    try:
        async with aiohttp.ClientSession() as session:
            startup = await server.wait_ready(session, start_s)
        print(f"[{name}] ready in {startup:.1f} s", flush=True)
        await drive(port, warm, f"warm-{name}", documents(warm), limit_s)  # kernels, graphs, Serve's paths
        result = await drive(port, trace, f"run-{name}", documents(trace), limit_s)
        result["startup_s"] = startup
    finally:
        server.stop()
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="benchmarks/models/llama-3.1-8b", help="a config directory (random weights)")
    p.add_argument("--replicas", default="1,2,4", help="replica counts, comma-separated; 1 is the baseline")
    p.add_argument("--router", default="document-affinity")
    p.add_argument("--kv-gb", type=float, default=12.0, help="KV budget of one replica, GiB (12: 48 documents)")
    p.add_argument("--requests-per-replica", type=int, default=200)
    p.add_argument("--no-reference", action="store_true", help="skip one engine with the cluster's total KV")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting configurations after this long")
    p.add_argument("--point-s", type=float, default=60.0, help="time limit of one configuration's requests")
    p.add_argument("--start-s", type=float, default=180.0, help="time limit of one server start")
    p.add_argument("--quick", action="store_true", help="tiny model on the CPU, replicas 1,2, a small trace")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    # SIGTERM (e.g. from `timeout`) unwinds like an error, so that the running server and its Ray are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    began = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    counts = [int(n) for n in args.replicas.split(",")]
    if args.quick:
        spec = WorkloadSpec(num_docs=20, doc_len=128, num_requests=8)
        kv_gb = 0.05
        engine = ["--model", "tiny", "--device", "cpu", "--page-size", "16"]
        counts = [n for n in counts if n <= 2]
    else:
        spec = WorkloadSpec(num_requests=args.requests_per_replica)
        kv_gb = args.kv_gb
        model = str(Path(args.model).resolve())
        engine = ["--model", model, "--random-weights", "--device", "cuda", "--page-size", "64"]
    if 1 not in counts:
        counts.insert(0, 1)
    engine += ["--max-waiting", "100000"]
    high = 256 if not args.quick else 1000  # token ids only pick characters here

    meta = {
        "command": " ".join(sys.argv),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "python": platform.python_version(),
        "workload": spec.to_dict(),
        "router": args.router,
        "kv_gb_per_replica": kv_gb,
        "transport": "lazyattn serve --replicas N (Ray Serve: HTTP proxy, ingress, engine replicas), over HTTP",
    }
    try:
        import ray
        import torch

        meta.update(ray=ray.__version__, torch=torch.__version__, gpus=torch.cuda.device_count())
        if torch.cuda.is_available():
            meta["device"] = torch.cuda.get_device_name(0)
    except ImportError as e:
        print(f"error: {e}: Ray Serve is needed (pip install 'lazyattn[cluster]')", file=sys.stderr)
        return 2
    results: dict[str, dict] = {}

    def write() -> None:
        (out / "replicas_serve.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))

    plan = [
        (
            f"{n} replica{'s' * (n > 1)}",
            n,
            engine + ["--kv-cache-gb", str(kv_gb), "--replicas", str(n), "--router", args.router],
        )
        for n in counts
    ]
    top = max(counts)
    if not args.no_reference and top > 1:  # the hit-ratio reference: one engine holding the cluster's KV
        plan.append((f"1 engine, {top}x KV (no Ray)", top, engine + ["--kv-cache-gb", str(kv_gb * top)]))
    took: list[float] = []  # seconds each configuration took, start to stop
    for name, n, server_args in plan:
        left = args.budget_s - (time.monotonic() - began)
        # no time to start a server and run the point: as long as the slowest configuration so far, and a margin
        if left < max([args.point_s, *took]) + 30:
            print(f"[{name}] skipped: {left:.0f} s of the budget left", flush=True)
            results[name] = {"skipped": f"{left:.0f} s of the budget left"}
            write()
            continue
        trace = make_trace(replace(spec, num_requests=n * spec.num_requests), Load(rate=float("inf")), high, None)
        # a few requests per replica on other documents first (Serve's paths, the router's first decisions)
        warm = make_trace(replace(spec, num_requests=4 * n, seed=spec.seed + 1), Load(rate=float("inf")), high, None)
        config_start = time.monotonic()
        try:
            r = asyncio.run(
                run_config(name, server_args, trace, warm, out, args.point_s, min(args.start_s, left - args.point_s))
            )
        except Exception as e:  # noqa: BLE001 (recorded; the next configuration runs)
            r = {"error": f"{type(e).__name__}: {e}"}
        took.append(time.monotonic() - config_start)
        r["replicas"] = n if not name.startswith("1 engine") else 1
        r["trace_requests"] = n * spec.num_requests
        results[name] = r
        print(f"[{name}] {json.dumps(r)}", flush=True)
        write()
    base = results.get(plan[0][0], {})
    ref = results.get(plan[-1][0], {}) if len(plan) > len(counts) else {}
    lines = [
        f"Ray Serve replicas, {meta.get('device', 'cpu')} ({meta.get('gpus', 0)} GPUs), ray {meta['ray']}, "
        f"torch {meta['torch']}; {args.router}; {spec.num_requests} requests per replica at once; "
        f"KV {meta['kv_gb_per_replica']} GiB a replica",
        "",
        "| configuration | requests | req/s | vs 1 replica | TTFT mean / p50 / p99 ms | hit ratio | vs one engine "
        "with the total KV | requests per replica | start s | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        if "request_throughput" not in r:
            lines.append(f"| {name} | — | — | — | — | — | — | — | — | {r.get('skipped') or r.get('error') or r} |")
            continue
        vs = r["request_throughput"] / base["request_throughput"] if base.get("request_throughput") else float("nan")
        hit = "—"  # the reference replays the largest configuration's trace: compared with that one only
        if ref.get("hit_ratio") is not None and r["trace_requests"] == ref["trace_requests"]:
            hit = "reference" if r is ref else f"{100 * (r['hit_ratio'] - ref['hit_ratio']):+.1f} points"
        t = r["ttft_ms"]
        r["throughput_vs_1"] = vs
        lines.append(
            f"| {name} | {r['completed']}/{r['requests']} | {r['request_throughput']:.2f} | {vs:.2f}x | "
            f"{t['mean']:.0f} / {t['p50']:.0f} / {t['p99']:.0f} | {100 * r['hit_ratio']:.1f} % | {hit} | "
            f"{', '.join(map(str, r['requests_per_replica']))} | {r['startup_s']:.0f} | {r['errors']} |"
        )
    write()
    (out / "replicas_serve.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
