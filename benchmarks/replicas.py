"""Replicas on real GPUs: 1 vs 2 engine replicas, round-robin vs document-affinity routing, the paper workload.

**Two engine processes, not Ray Serve.** The device machine has no package index and Ray Serve with its
dependencies is not installed there, so this runs the same routing policy objects the Ray
Serve router runs (`lazyattn.cluster.policy`, fed `cluster.keys.route_key`s and in-flight counts exactly as
`cluster/router.py` feeds them) in a driver process, over one engine process per GPU (`CUDA_VISIBLE_DEVICES`),
talking through pipes. What it measures is routing and the engines; Serve's own per-request overhead (an actor
call, a few hundred microseconds) is not in it.

    python -m benchmarks.replicas --out $OUT/replicas            # two GPUs (e.g. two H200s), ~2-3 minutes
    python -m benchmarks.replicas --quick --out /tmp/replicas    # tiny model on the CPU: a smoke test only

Configurations, one seeded trace replayed through each, every one from an empty document cache after the same
warm-up (bench/replay.warm_up):
- 1 replica, the per-replica KV budget (the throughput baseline);
- 1 replica, twice that budget (one engine with the cluster's total KV: the hit-ratio reference);
- 2 replicas, round-robin; 2 replicas, document-affinity.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sys
import time
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from pathlib import Path

from lazyattn.bench.metrics import EngineCounters, RequestRecord, summarize
from lazyattn.bench.workload import Load, Trace, WorkloadSpec, make_trace, token_space, warmup_trace
from lazyattn.cluster.keys import route_key
from lazyattn.cluster.policy import make_policy
from lazyattn.engine.modes import make_mode


def engine_worker(conn: Connection, options: dict, warm: Trace) -> None:
    """One replica: an engine, stepped whenever it has work, fed and read through `conn`."""
    from lazyattn.bench.replay import make_engine, warm_up
    from lazyattn.engine.sampling import SamplingParams

    engine = make_engine(options, "lazy")
    warm_up(engine, warm)
    device = engine.device
    name = __import__("torch").cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    conn.send(("ready", name, __import__("torch").__version__))
    params = SamplingParams(max_tokens=warm.spec.output_len, temperature=0.0, ignore_eos=True)
    while True:
        while conn.poll(0 if engine.has_unfinished() else None):
            cmd = conn.recv()
            if cmd[0] == "add":
                _, rid, prompt = cmd
                engine.add_request(rid, prompt, params)
            elif cmd[0] == "budget":  # the KV pool this configuration runs with, from an empty cache
                engine.reset_cache()
                engine.set_kv_budget(cmd[1])
                conn.send(("budget", engine.stats()))
            elif cmd[0] == "stats":
                conn.send(("stats", engine.stats()))
            elif cmd[0] == "stop":
                engine.shutdown()
                return
        outs = engine.step()
        now = time.time()  # wall clock: the driver's and the workers' monotonic clocks need not agree
        if outs:
            conn.send(
                (
                    "outs",
                    now,
                    [
                        (
                            o.request_id,
                            len(o.outputs[0].token_ids),
                            o.finished,
                            o.metrics.cached_tokens if o.metrics else 0,
                            o.metrics.prefilled_tokens if o.metrics else 0,
                        )
                        for o in outs
                    ],
                )
            )


def run_config(name: str, conns: list[Connection], policy_name: str, trace: Trace, pages: int, page_size: int) -> dict:
    for c in conns:
        c.send(("budget", pages))
    before = [c.recv()[1] for c in conns]
    replicas = [f"replica-{i}" for i in range(len(conns))]
    policy = make_policy(policy_name)
    for r in replicas:
        policy.set_capacity(r, pages * page_size)  # as the router learns it from record_routing_stats
    spec, mode = trace.spec, make_mode("lazy")
    records = {
        req.index: RequestRecord(
            req.index,
            req.arrival,
            num_docs=len(req.doc_ids),
            context_tokens=trace.system_len + len(req.doc_ids) * spec.doc_len + len(req.question),
        )
        for req in trace.requests
    }
    pending = sorted(trace.requests, key=lambda r: r.arrival)
    in_flight = dict.fromkeys(replicas, 0)
    where: dict[str, tuple[int, str]] = {}
    served = dict.fromkeys(replicas, 0)
    t0 = time.time()
    while pending or where:
        now = time.time() - t0
        while pending and pending[0].arrival <= now:
            req = pending.pop(0)
            prompt = trace.prompt(req)
            key = route_key(prompt, None)
            decision = policy.choose(key, in_flight)
            policy.routed(key, decision.replica)
            i = replicas.index(decision.replica)
            rid = f"r{req.index}"
            conns[i].send(("add", rid, prompt))
            in_flight[decision.replica] += 1
            served[decision.replica] += 1
            where[rid] = (req.index, decision.replica)
        timeout = max(0.0, pending[0].arrival - (time.time() - t0)) if pending else None
        for c in wait(conns, timeout):
            kind, t, outs = c.recv()
            for rid, n_tokens, finished, cached, prefilled in outs:
                index, replica = where[rid]
                rec = records[index]
                rec.token_times += [t - t0] * (n_tokens - len(rec.token_times))
                if finished:
                    rec.finished = True
                    rec.cached_tokens, rec.prefilled_tokens = cached, prefilled
                    rec.doc_hits = mode.reused_documents(cached, trace.system_len, spec.doc_len, rec.num_docs)
                    in_flight[replica] -= 1
                    del where[rid]
    for c in conns:
        c.send(("stats",))
    after = [c.recv()[1] for c in conns]
    counters = EngineCounters(
        rows_computed=sum(
            a.prefilled_tokens + a.decoded_tokens - b.prefilled_tokens - b.decoded_tokens for a, b in zip(after, before)
        ),
        preemptions=sum(a.preemptions - b.preemptions for a, b in zip(after, before)),
        evictions=sum(a.cache.evictions - b.cache.evictions for a, b in zip(after, before)),
        peak_kv_bytes=sum(a.pages_high_water * a.page_bytes for a in after),
        pool_bytes=sum(a.num_pages * a.page_bytes for a in after),
    )
    summary = summarize(list(records.values()), counters)
    return {
        "config": name,
        "replicas": len(conns),
        "policy": policy_name,
        "kv_pages_per_replica": pages,
        "requests_per_replica": list(served.values()),
        "summary": summary.to_dict(),
    }


def _write(out: str | None, meta: dict, results: list, ratios: dict) -> None:
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "replicas.json").write_text(
            json.dumps({"meta": meta, "results": results, "ratios": ratios}, indent=2)
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="benchmarks/models/llama-3.1-8b")
    p.add_argument("--quick", action="store_true", help="tiny model, small trace, CPU")
    p.add_argument("--kv-gb", type=float, default=12.0, help="KV budget of one replica, GiB (12: 48 documents)")
    p.add_argument("--num-requests", type=int, default=240)
    p.add_argument(
        "--rates", default="inf,32", help="loads, comma-separated: Poisson req/s, inf = all at t=0 (default: inf,32)"
    )
    p.add_argument(
        "--same-trace",
        action="store_true",
        help="give 2 replicas the same trace as 1 (default: twice the requests at twice the rate, so each "
        "replica carries what the one replica did: capacity, not a fixed burst split in two)",
    )
    p.add_argument("--out", default=None)
    args = p.parse_args()

    from lazyattn.bench.hitratio import page_accounting
    from lazyattn.engine.config import EngineConfig
    from lazyattn.model.config import ModelConfig

    if args.quick:
        spec = WorkloadSpec(num_docs=20, doc_len=128, num_requests=24)
        options = dict(model="tiny", device="cpu", kv_cache_gb=0.05, page_size=16, progress=False)
        mc = ModelConfig.tiny()
        kv_bytes = 12 * 128 * page_accounting(mc, 16, EngineConfig(**options).torch_dtype).token_bytes  # 12 docs
    else:
        spec = WorkloadSpec(num_requests=args.num_requests)  # docs/design.md, Benchmark protocol
        options = dict(
            model=args.model,
            random_weights=True,
            device="cuda",
            dtype="bfloat16",
            page_size=64,
            kv_cache_gb=2 * args.kv_gb + 4,
            progress=False,
        )  # room for the 2x-budget configuration
        mc = ModelConfig.from_dir(args.model)
        kv_bytes = int(args.kv_gb * 2**30)
    pages = kv_bytes // page_accounting(mc, options["page_size"], EngineConfig(**options).torch_dtype).page_bytes
    vocab_high, bos = token_space(mc)
    rates = [float(r) for r in args.rates.split(",")]
    warm = warmup_trace(spec, 3, vocab_high, bos)

    ctx = mp.get_context("spawn")
    conns, procs = [], []
    start = time.monotonic()
    for gpu in range(2):
        parent, child = ctx.Pipe()
        env_before = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)  # the child's CUDA sees one GPU (read at its CUDA init)
        proc = ctx.Process(target=engine_worker, args=(child, options, warm), daemon=True)
        proc.start()
        if env_before is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = env_before
        conns.append(parent)
        procs.append(proc)
    ready = [c.recv() for c in conns]
    startup_s = time.monotonic() - start
    print(f"two engines ready in {startup_s:.1f} s on {[r[1] for r in ready]}", flush=True)

    configs = [
        ("1 replica", conns[:1], "round-robin", pages),
        ("1 replica, 2x KV (cluster's total)", conns[:1], "round-robin", 2 * pages),
        ("2 replicas, round-robin", conns, "round-robin", pages),
        ("2 replicas, document-affinity", conns, "document-affinity", pages),
    ]
    meta = {
        "command": " ".join(sys.argv),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "python": platform.python_version(),
        "transport": "two engine processes (no Ray), same routing policy code",
        "workload": spec.to_dict(),
        "kv_gb_per_replica": args.kv_gb,
        "kv_pages_per_replica": pages,
        "devices": [r[1] for r in ready],
        "torch": ready[0][2],
        "startup_s": startup_s,
    }
    results, ratios = [], {}
    meta["same_trace"] = args.same_trace
    for rate in rates:
        trace = make_trace(spec, Load(rate=rate), vocab_high, bos)
        # The cluster's trace: the same seeded requests (the first N are the one replica's), twice as many, twice as
        # fast; one engine with the cluster's KV replays it too, as the hit-ratio reference.
        cluster_trace = (
            trace
            if args.same_trace
            else make_trace(replace(spec, num_requests=2 * spec.num_requests), Load(rate=2 * rate), vocab_high, bos)
        )
        load = trace.load.label
        print(
            f"-- {load}"
            + ("" if args.same_trace else f" per replica ({cluster_trace.load.label} for the cluster configurations)"),
            flush=True,
        )
        mine = []
        for name, cs, policy, n_pages in configs:
            t = trace if name == "1 replica" else cluster_trace
            r = {
                "load": load,
                "requests": len(t.requests),
                **run_config(name, cs, policy, t, n_pages, options["page_size"]),
            }
            s = r["summary"]
            print(
                f"{name:38s} {s['request_throughput']:7.2f} req/s  TTFT mean {s['ttft']['mean']:8.1f} ms "
                f"p50 {s['ttft']['median']:8.1f} p99 {s['ttft']['p99']:8.1f}  hit "
                f"{100 * s['doc_hit_ratio']:5.1f} %  per replica {r['requests_per_replica']}",
                flush=True,
            )
            mine.append(r)
            results.append(r)
            _write(args.out, meta, results, ratios)  # after every configuration: a cut-off run keeps what it did
        base, ref = mine[0]["summary"], mine[1]["summary"]
        for r in mine:
            v = ratios[f"{load}: {r['config']}"] = {
                "throughput_vs_1": r["summary"]["request_throughput"] / base["request_throughput"],
                "ttft_mean_vs_1": r["summary"]["ttft"]["mean"] / base["ttft"]["mean"],
                "hit_points_vs_2x_kv": 100 * (r["summary"]["doc_hit_ratio"] - ref["doc_hit_ratio"]),
            }
            print(
                f"{r['config']:38s} throughput {v['throughput_vs_1']:.2f}x, mean TTFT {v['ttft_mean_vs_1']:.2f}x "
                f"of 1 replica; hit ratio {v['hit_points_vs_2x_kv']:+.1f} points vs one engine with the "
                "cluster's KV",
                flush=True,
            )
        _write(args.out, meta, results, ratios)
    for c in conns:
        c.send(("stop",))
    for proc in procs:
        proc.join(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
