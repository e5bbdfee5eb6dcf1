"""How long a tensor-parallel step's message takes from the driver's send to a worker holding the step as
StepInputs (engine/executor/channel.py), for decode batches of 1, 16 and 64 rows over 2K-token contexts: the way before
(`Connection.send(StepInputs)`, a blocking `recv`) and now (plain lists pickled once, the worker spinning on its pipe).
Host work only: runs on any machine (the device's CPUs are what matter).

    python benchmarks/tp_dispatch.py [--out OUT.json] [--steps 200] [--gap-ms 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lazyattn.engine.executor.channel import SPIN_S, encode, pack_step, receive, unpack_step  # noqa: E402
from lazyattn.engine.graph_inputs import StepInputs  # noqa: E402
from lazyattn.kernels.paged import EntryPages  # noqa: E402

PAGE = 16


def decode_step(batch: int, context: int) -> StepInputs:
    """A decode step of `batch` rows, each over `context` tokens of its own pages."""
    pages = -(-context // PAGE)
    entries = [
        EntryPages(list(range(r * pages, (r + 1) * pages)), [0] * pages, [PAGE] * (pages - 1) + [1])
        for r in range(batch)
    ]
    return StepInputs(
        list(range(batch)),
        [context] * batch,
        [r * pages * PAGE for r in range(batch)],
        entries,
        [1] * batch,
        [context] * batch,
        list(range(batch)),
        True,
    )


def _worker(conn, how: str) -> None:
    conn.send("ready")
    lags: dict[int, list[float]] = {}
    while True:
        message = conn.recv() if how == "before" else receive(conn, SPIN_S)
        if message[0] == "stop":
            break
        step = message[1] if how == "before" else unpack_step(message[1])
        lags.setdefault(len(step.tokens), []).append(time.perf_counter() - message[2])
    conn.send(lags)


def measure(how: str, steps: list[StepInputs], repeats: int, gap_s: float) -> dict:
    """{batch: {median_us, p90_us}} of one worker process receiving each step `repeats` times."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_worker, args=(child, how))
    proc.start()
    assert parent.recv() == "ready"  # its imports done
    for step in steps:
        for _ in range(repeats):
            sent = time.perf_counter()
            if how == "before":
                parent.send(("step", step, sent))
            else:
                parent.send_bytes(encode(("step", pack_step(step), sent)))
            time.sleep(gap_s)  # the driver's own step
    parent.send(("stop", None))
    results = {}
    for batch, lags in parent.recv().items():
        lags = sorted(lags[repeats // 10 :])  # the first steps warm the child up
        results[batch] = {"median_us": 1e6 * statistics.median(lags), "p90_us": 1e6 * lags[int(0.9 * len(lags))]}
    proc.join()
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--gap-ms", type=float, default=3.0)
    args = p.parse_args()
    steps = [decode_step(batch, 2048) for batch in (1, 16, 64)]
    results = {how: measure(how, steps, args.steps, args.gap_ms / 1e3) for how in ("before", "now")}
    for batch in (1, 16, 64):
        for how in ("before", "now"):
            r = results[how][batch]
            print(
                f"batch {batch:2d} {how:6s}: send -> StepInputs on the worker {r['median_us']:7.1f} µs median, "
                f"{r['p90_us']:7.1f} µs p90",
                flush=True,
            )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
