"""Decode linears against the weight-read limit: lazyattn's skinny kernel (kernels/gemv.py) vs F.linear (cuBLAS) and
what else torch offers for the same product, per weight shape and batch size M. On the GPU (~1 minute on an H100):

    python -m benchmarks.gemv --out OUT/gemv --table lazyattn/kernels/gemv_table.json

writes OUT.json and OUT.md and prints the table; `--table` also writes the dispatch table kernels/gemv.py reads:
for each (N, K, M) the tuned config where the kernel beat F.linear by at least --margin, else F.linear.

Shapes: Llama-3.1-8B (qkv, o, gate_up, down, lm_head) and their tensor-parallel halves, Llama-3.1-70B likewise;
bf16 weights, random (never zeros). M = 1, 2, 4, 8, 16, 32, 64.

Method (benchmarks count bytes, not flops: a step reads each weight once): every variant runs inside a captured CUDA
graph (as in the engine's decode step; outside one, Python launch overhead would be timed), over enough copies of
the weight that they do not fit in L2 together, each call reading the next copy; time per call = median over graph
replays / calls. GB/s = (weight + x + y bytes) / time, beside the read+write bandwidth of a large device copy
measured in the same run. Tuning: at M = 1, 32 and 64 (one compiled kernel serves each block of M: 1–16, 17–32,
33–64) every tile config x split count of a small grid; the best per (shape, M block) is then timed at every M.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.engine import copy_bandwidth  # noqa: E402  (the same measurement in every table)
from lazyattn.kernels.gemv import GemvConfig, gemv, table_entry  # noqa: E402

MS = (1, 2, 4, 8, 16, 32, 64)
L2_BYTES = 50 * 2**20


def model_shapes(name: str, hidden: int, inter: int, q_heads: int, kv_heads: int, vocab: int, head_dim: int = 128):
    qkv = (q_heads + 2 * kv_heads) * head_dim
    full = [
        ("qkv", qkv, hidden),
        ("o", hidden, q_heads * head_dim),
        ("gate_up", 2 * inter, hidden),
        ("down", hidden, inter),
        ("lm_head", vocab, hidden),
    ]
    halves = [
        ("qkv/2", qkv // 2, hidden),
        ("o/2", hidden, q_heads * head_dim // 2),
        ("gate_up/2", inter, hidden),
        ("down/2", hidden, inter // 2),
    ]
    return [(name, label, n, k) for label, n, k in full + halves]


SHAPES = model_shapes("8B", 4096, 14336, 32, 8, 128256) + model_shapes("70B", 8192, 28672, 64, 8, 128256)

# Tile configs tried per M block (block_n, block_k, num_warps, num_stages); the split count is searched per shape.
TILES = {
    16: [
        (64, 128, 4, 4),
        (64, 128, 4, 6),
        (64, 256, 4, 3),
        (64, 256, 4, 4),
        (128, 128, 4, 4),
        (128, 128, 8, 4),
        (128, 256, 8, 3),
        (32, 256, 4, 4),
    ],
    # Nine more at M = 32 (deeper pipelines, 8 warps, 32- to 256-wide tiles) made each shape 0-12 % faster alone,
    # but the engine's fused prefill step slower (TTFT +0.1-0.5 ms, decode at batch 32 +0.2-0.7 ms on an H100), so
    # the list stays as measured in the engine.
    32: [(64, 128, 4, 4), (128, 128, 4, 4), (64, 256, 4, 3)],
    64: [(64, 128, 4, 4), (128, 128, 8, 4), (64, 128, 4, 3)],
}
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def candidates(n: int, k: int, block: int, sms: int) -> list[GemvConfig]:
    out = []
    for bn, bk, warps, stages in TILES[block]:
        n_blocks = -(-n // bn)
        for s in SPLITS:
            # Each split at least two tiles long; a grid between a quarter wave and 8 programs per SM.
            if k // s >= 2 * bk and (s == 1 or n_blocks * s <= 8 * sms) and (s == 1 or n_blocks < 4 * sms):
                out.append(GemvConfig(bn, bk, s, warps, stages))
    return out


def graph_time(call, copies: int, calls: int, replays: int = 7) -> float:
    """Seconds per call: `calls` calls captured in one graph (call(i) reads weight copy i % copies)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(min(copies, 2)):  # compile / pick kernels outside the capture
            call(i)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i % copies)
    graph.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del graph
    return statistics.median(times) / calls


def check(ours: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    ref = F.linear(x.double(), w.double())
    return ((ours.double() - ref).norm() / ref.norm()).item()


def sweep_shape(
    model: str,
    label: str,
    n: int,
    k: int,
    device,
    dtype,
    margin: float,
    sms: int,
    bandwidth: float,
    log,
    blocks: tuple[int, ...] = (16, 32, 64),
) -> tuple[list[dict], list[dict]]:
    elt = torch.tensor([], dtype=dtype).element_size()
    w_bytes = n * k * elt
    copies = max(2, min(16, -(-3 * L2_BYTES // w_bytes)))
    calls = max(copies, 4 * copies if w_bytes < 64 * 2**20 else copies)
    g = torch.Generator(device=device).manual_seed(n * 31 + k)
    weights = [(torch.randn(n, k, device=device, generator=g) * 0.02).to(dtype) for _ in range(copies)]
    xs = {m: torch.randn(m, k, device=device, generator=g).to(dtype) for m in MS}
    best: dict[int, tuple[float, GemvConfig]] = {}
    for block in blocks:
        m = {16: 1, 32: 32, 64: 64}[block]
        for cfg in candidates(n, k, block, sms):
            try:
                t = graph_time(lambda i, x=xs[m], cfg=cfg: gemv(x, weights[i], config=cfg), copies, calls)
            except Exception as error:  # a config that does not compile or launch is skipped, with the reason
                log(f"  {label} M={m} {cfg}: {type(error).__name__}: {str(error)[:200]}")
                continue
            if block not in best or t < best[block][0]:
                best[block] = (t, cfg)
    rows, entries = [], []
    device_name = torch.cuda.get_device_name(device)
    for m in MS:
        block = 16 if m <= 16 else (32 if m <= 32 else 64)
        if block not in blocks:
            continue
        x = xs[m]
        row = {"model": model, "shape": label, "n": n, "k": k, "m": m}
        moved = w_bytes + (m * k + m * n) * elt
        timings = {
            "F.linear": lambda i, x=x: F.linear(x, weights[i]),
            "matmul(W, x.T)": lambda i, x=x: torch.matmul(weights[i], x.t()),
        }
        if m == 1:
            timings["mv(W, x)"] = lambda i, x=x: torch.mv(weights[i], x[0])
        cfg = best.get(block, (None, None))[1]
        if cfg is not None:
            timings["lazyattn"] = lambda i, x=x, cfg=cfg: gemv(x, weights[i], config=cfg)
            out = gemv(x, weights[0], config=cfg)
            row["rel_err"] = check(out, x, weights[0])
            row["deterministic"] = all(torch.equal(out, gemv(x, weights[0], config=cfg)) for _ in range(3))
            row["config"] = cfg.__dict__
        for name, call in timings.items():
            t = graph_time(call, copies, calls)
            row[f"{name}_us"] = t * 1e6
            row[f"{name}_gbs"] = moved / t / 1e9
            row[f"{name}_of_copy"] = moved / t / bandwidth
        wins = cfg is not None and row["lazyattn_us"] < margin * row["F.linear_us"] and row["rel_err"] < 1e-2
        row["dispatch"] = "lazyattn" if wins else "F.linear"
        entries.append(row_entry(device_name, dtype, row))
        rows.append(row)
        log(
            f"{model} {label:10s} M={m:2d}: ours {row.get('lazyattn_us', float('nan')):8.1f} us "
            f"({row.get('lazyattn_of_copy', 0):.0%}) F.linear {row['F.linear_us']:8.1f} us "
            f"({row['F.linear_of_copy']:.0%}) matmul(W,x.T) {row['matmul(W, x.T)_us']:8.1f} us "
            + (f"mv {row['mv(W, x)_us']:8.1f} us " if m == 1 else "")
            + f"-> {row['dispatch']}"
        )
    weights.clear()
    torch.cuda.empty_cache()
    return rows, entries


def row_entry(device_name: str, dtype: torch.dtype, row: dict) -> dict:
    """The dispatch-table entry of one result row: the tuned config even where F.linear won (the fused decode path
    may still take it, kernels/gemv.py FUSED_SLOWDOWN), its time over F.linear's, and the plain dispatch."""
    cfg = GemvConfig(**row["config"]) if row.get("config") else None
    ratio = row["lazyattn_us"] / row["F.linear_us"] if cfg is not None else None
    return table_entry(device_name, dtype, row["n"], row["k"], row["m"], cfg, ratio, row["dispatch"] == "lazyattn")


def write_table(table: Path, device_name: str, command: str, entries: list[dict], partial: bool = False) -> None:
    """This GPU's entries replace its old ones in the dispatch table; other GPUs' entries stay. `partial`: only the
    entries of the (dtype, N, K, M) measured now are replaced, the GPU's others stay (a sweep of some shapes or M
    blocks), and the command is added to the GPU's."""
    kept, commands = [], {}
    new = {(e["dtype"], e["n"], e["k"], e["m"]) for e in entries}
    if table.exists():
        old = json.loads(table.read_text())
        kept = [
            e
            for e in old["entries"]
            if e["device"] != device_name or (partial and (e["dtype"], e["n"], e["k"], e["m"]) not in new)
        ]
        commands = old.get("commands", {})
    if partial and device_name in commands:
        command = f"{commands[device_name]}; then {command}"
    commands[device_name] = command
    table.write_text(json.dumps({"commands": commands, "entries": kept + entries}, indent=0) + "\n")


def markdown(result: dict) -> str:
    lines = [
        f"`{result['command']}` on {result['device']}, torch {result['torch']}",
        "",
        f"Copy bandwidth (read + write, same run): **{result['bandwidth_gbs']:.0f} GB/s**. Per call: median time "
        "inside a CUDA graph over rotating weight copies (no L2 reuse); % = (W + x + y bytes) / time / copy "
        "bandwidth.",
        "",
        "| model | shape | N x K | M | lazyattn µs (%) | F.linear µs (%) | matmul(W, x.T) µs | mv µs | "
        "ours / F.linear | dispatch | config (bn, bk, split, warps, stages) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        cfg = r.get("config")
        cfg_s = (
            ""
            if cfg is None
            else ", ".join(str(cfg[f]) for f in ("block_n", "block_k", "split_k", "num_warps", "num_stages"))
        )
        ours = f"{r['lazyattn_us']:.1f} ({r['lazyattn_of_copy']:.0%})" if "lazyattn_us" in r else "–"
        ratio = f"{r['lazyattn_us'] / r['F.linear_us']:.2f}" if "lazyattn_us" in r else "–"
        mv = f"{r['mv(W, x)_us']:.1f}" if "mv(W, x)_us" in r else ""
        lines.append(
            f"| {r['model']} | {r['shape']} | {r['n']} x {r['k']} | {r['m']} | {ours} | "
            f"{r['F.linear_us']:.1f} ({r['F.linear_of_copy']:.0%}) | {r['matmul(W, x.T)_us']:.1f} | {mv} | "
            f"{ratio} | {r['dispatch']} | {cfg_s} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="write OUT.json and OUT.md")
    parser.add_argument("--table", type=Path, help="write the dispatch table here")
    parser.add_argument("--margin", type=float, default=0.97, help="dispatch when ours < margin x F.linear")
    parser.add_argument("--shapes", default=None, help="comma-separated labels to keep, e.g. 8B:o,8B:down")
    parser.add_argument(
        "--blocks",
        default="16,32,64",
        help="M blocks to tune and time (16: M 1-16, 32: 17-32, 64: 33-64); with --shapes or fewer "
        "blocks, --table replaces only the entries measured",
    )
    parser.add_argument(
        "--table-from",
        type=Path,
        default=None,
        help="no GPU: rewrite --table's entries for the GPU of an earlier run's OUT.json",
    )
    args = parser.parse_args()
    if args.table_from is not None:
        old = json.loads(args.table_from.read_text())
        entries = [row_entry(old["device"], torch.bfloat16, row) for row in old["rows"]]
        write_table(args.table, old["device"], old["command"], entries)
        return
    device = torch.device("cuda")
    dtype = torch.bfloat16
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    log_path = args.out.with_suffix(".log")
    log_path.write_text("")

    def log(msg: str) -> None:
        print(msg, flush=True)
        with log_path.open("a") as f:
            f.write(msg + "\n")

    bandwidth = copy_bandwidth(device, 2048, 20)
    log(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s, {sms} SMs, {torch.cuda.get_device_name(device)}")
    blocks = tuple(int(b) for b in args.blocks.split(","))
    shapes = SHAPES
    if args.shapes:
        keep = set(args.shapes.split(","))
        shapes = [s for s in SHAPES if f"{s[0]}:{s[1]}" in keep]
    rows, entries = [], []
    t0 = time.perf_counter()
    for model, label, n, k in shapes:
        r, e = sweep_shape(model, label, n, k, device, dtype, args.margin, sms, bandwidth, log, blocks)
        rows += r
        entries += e
        log(f"  [{time.perf_counter() - t0:.0f} s]")
    command = "python -m benchmarks.gemv " + " ".join(sys.argv[1:])
    result = {
        "command": command,
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "host": platform.node(),
        "bandwidth_gbs": bandwidth / 1e9,
        "margin": args.margin,
        "rows": rows,
    }
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    md = markdown(result)
    args.out.with_suffix(".md").write_text(md)
    if args.table:
        write_table(
            args.table, result["device"], command, entries, partial=bool(args.shapes) or set(blocks) != {16, 32, 64}
        )
    print(md)


if __name__ == "__main__":
    main()
