"""Relink's cost on the GPU (docs/quality.md, "Relink"): TTFT and throughput per relink_tokens k beside block and
full, at Llama-3.1-8B shapes (random bf16 weights), the serving benchmark's request shape, warm document cache.
With --ape T,S also the attention temperature and scale on documents (docs/design.md, "APE"), zero-copy.

    python -m benchmarks.relink OUT_DIR [--ks 0,4,16,32] [--requests 16] [--ape 0.7,1.5 [--ape-prefix]] [--smoke]

Workload: a pool of 8 documents x 2048 tokens, 5 per request in seeded random order after a BOS segment, a
32-token question, 16 output tokens (EOS ignored). Every document is encoded before timing (warm cache), so
lazy computes only the question (+ k rows per placed document), block its private copies + the question, full
the whole 10K-token prompt. Two points per configuration:

- idle TTFT: one request at a time, 5 requests, mean of the last 4;
- saturation: `--requests` requests at once; wall time -> requests/s and output tokens/s, mean TTFT.

One engine (weights and KV pool loaded once); the mode is switched between configurations by pointing the
engine at a new mode with an empty cache (LLMEngine.reset_cache rebuilds the scheduler for it), which is what a
fresh engine of that mode would be, without reloading 16 GB of weights. Per-request relink_tokens picks k.

--ape: a second engine (the first one shut down) whose requests default to (T, S), so that its CUDA graphs carry
the temperature tables (engine/cuda_graphs.py), measured twice: "lazy ape" with (T, S), and "lazy ape-graphs
T=S=1" (per-request 1, 1: the same graphs and kernels over tables of 1 and 0, which isolates the cost of reading
the tables from the cost of the values); compare both with "lazy k=0" of the first engine (graphs without tables).
--ape-prefix: that engine also encodes documents after the first segment (here BOS alone), which changes what a
document's encode attends to, not the request's work.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from lazyattn.engine.config import EngineConfig  # noqa: E402
from lazyattn.engine.llm_engine import LLMEngine  # noqa: E402
from lazyattn.engine.modes import make_mode  # noqa: E402
from lazyattn.engine.prompt import RenderedPrompt  # noqa: E402
from lazyattn.engine.request_options import RequestOptions  # noqa: E402
from lazyattn.engine.sampling import SamplingParams  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def random_tokens(n: int, length: int, seed: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(min(1000, vocab // 2), vocab - 1, (length,), generator=g).tolist() for _ in range(n)]


def prompts(
    pool: list[list[int]], n: int, per_request: int, question_len: int, seed: int, bos: int, vocab: int
) -> list[RenderedPrompt]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        order = torch.randperm(len(pool), generator=g)[:per_request].tolist()
        question = random_tokens(1, question_len, seed * 1000 + i, vocab)[0]
        out.append(RenderedPrompt(segments=[[bos]] + [pool[j] for j in order], final=question))
    return out


def run_all(
    engine: LLMEngine,
    batch: list[RenderedPrompt],
    params: SamplingParams | None,
    relink: int,
    tag: str,
    ape: tuple[float, float] | None = None,
) -> tuple[float, list]:
    """Submit every prompt at once and step until all finish: (wall seconds, finished outputs). ape: the requests'
    (T, S); None: the engine's."""
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    start = time.perf_counter()
    t, s = ape if ape is not None and params is not None else (None, None)
    for i, p in enumerate(batch):
        options = RequestOptions(relink_tokens=relink if params is not None else None, ape_temperature=t, ape_scale=s)
        engine.add_request(f"{tag}-{i}", p, params, options=options)
    done = []
    while engine.has_unfinished():
        done += [o for o in engine.step() if o.finished]
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    return time.perf_counter() - start, done


def switch_mode(engine: LLMEngine, mode: str) -> None:
    engine.mode = make_mode(mode)
    engine.reset_cache()


def measure(
    engine: LLMEngine,
    mode: str,
    k: int,
    ape: tuple[float, float] | None,
    pool: list[list[int]],
    params: SamplingParams,
    requests: int,
    n_idle: int,
    question_len: int,
    bos: int,
    label: str | None = None,
) -> dict:
    """One configuration's idle TTFT and saturation throughput (module docstring), warm document cache."""
    vocab = engine.model_config.vocab_size
    output_len = params.max_tokens
    if engine.mode.name != mode:
        switch_mode(engine, mode)
    label = label or (mode if mode != "lazy" else f"lazy k={k}")
    if mode != "full":  # warm cache: every document encoded ahead (a prefill-only request)
        run_all(engine, [RenderedPrompt([[bos]] + pool, [])], None, 0, f"{label}-docs")
    warm = prompts(pool, 2, 5, question_len, 99, bos, vocab)  # compiles any shape left, untimed
    run_all(engine, warm, params, k, f"{label}-warm", ape)
    idle = []
    for i, p in enumerate(prompts(pool, n_idle, 5, question_len, 7, bos, vocab)):
        _, done = run_all(engine, [p], params, k, f"{label}-idle{i}", ape)
        idle.append(done[0].metrics.ttft)
    batch = prompts(pool, requests, 5, question_len, 11, bos, vocab)
    before = engine.stats().prefilled_tokens
    wall, done = run_all(engine, batch, params, k, f"{label}-sat", ape)
    prefilled = engine.stats().prefilled_tokens - before
    row = dict(
        config=label,
        mode=mode,
        relink_tokens=k,
        ape=ape,
        idle_ttft_ms=1e3 * sum(idle[1:]) / max(1, len(idle) - 1),
        sat_requests_per_s=len(batch) / wall,
        sat_output_tok_per_s=len(batch) * output_len / wall,
        sat_mean_ttft_ms=1e3 * sum(o.metrics.ttft for o in done) / len(done),
        prefill_rows_per_request=prefilled / len(batch),
    )  # the counter excludes decode rows
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--ks", default="0,4,16,32")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--ape", default=None, help="T,S: also measure APE's temperature and scale (module docstring)")
    ap.add_argument("--ape-prefix", action="store_true", help="with --ape: documents encoded after the first segment")
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU: the script's structure")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        cfg = EngineConfig(model="tiny", device="cpu", page_size=16, progress=False)
        doc_len, question_len, output_len, n_idle = 64, 8, 4, 2
    else:
        cfg = EngineConfig(
            model=str(ROOT / "benchmarks/models/llama-3.1-8b"),
            device="cuda",
            random_weights=True,
            kv_cache_gb=24,
            progress=False,
            max_model_len=32768,
        )
        doc_len, question_len, output_len, n_idle = 2048, 32, 16, 5
    t0 = time.perf_counter()
    engine = LLMEngine(cfg)
    print(f"engine ready in {time.perf_counter() - t0:.1f} s", flush=True)
    vocab = engine.model_config.vocab_size
    bos = engine.tokenizer.bos_token_id or 1
    pool = random_tokens(8, doc_len, 1, vocab)
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    configs = [("lazy", int(k), None) for k in args.ks.split(",")] + [("block", 0, None), ("full", 0, None)]
    results = [
        measure(engine, mode, k, ape, pool, params, args.requests, n_idle, question_len, bos)
        for mode, k, ape in configs
    ]
    if args.ape:
        t, s = (float(x) for x in args.ape.split(","))
        engine.shutdown()
        del engine
        engine = LLMEngine(dataclasses.replace(cfg, ape_temperature=t, ape_scale=s, ape_prefix=args.ape_prefix))
        for ape, label in (((t, s), f"lazy ape T={t} S={s}"), ((1.0, 1.0), "lazy ape-graphs T=S=1")):
            row = measure(engine, "lazy", 0, ape, pool, params, args.requests, n_idle, question_len, bos, label)
            results.append(row)
    full = next(r for r in results if r["mode"] == "full")
    lines = [
        "| config | idle TTFT ms | vs full | saturation req/s | output tok/s | sat. mean TTFT ms | "
        "prefill rows/request |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['config']} | {r['idle_ttft_ms']:.1f} | {r['idle_ttft_ms'] / full['idle_ttft_ms']:.1%} | "
            f"{r['sat_requests_per_s']:.2f} | {r['sat_output_tok_per_s']:.0f} | {r['sat_mean_ttft_ms']:.0f} | "
            f"{r['prefill_rows_per_request']:.0f} |"
        )
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    table = "\n".join(lines)
    print(f"\n{device}, {args.requests} requests at saturation\n{table}")
    (out / "relink.json").write_text(json.dumps(dict(device=device, argv=sys.argv, results=results), indent=1))
    (out / "relink.md").write_text(f"{device}, {args.requests} requests at saturation\n\n{table}\n")


if __name__ == "__main__":
    main()
