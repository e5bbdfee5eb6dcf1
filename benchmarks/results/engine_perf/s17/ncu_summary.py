"""Session 17: summarise an Nsight Compute SASS source page (`ncu --import R --page source --csv --print-source sass`):
stall samples and warp instructions by region (code run once per program, in the tile loop, by the merging program
only), the loop's instructions per warp by opcode, and the stall reasons.

    python benchmarks/results/engine_perf/s17/ncu_summary.py SASS.log [PROGRAMS_WARPS]

A region is told by how often its instructions ran: at most as often as there are warps (PROGRAMS_WARPS, default
512: 128 programs of 4 warps) is once per program, far fewer (at most an eighth) is the merge, more is the loop.
"""

from __future__ import annotations

import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def main() -> None:
    with open(sys.argv[1], newline="") as f:
        rows = list(csv.reader(f))
    warps = int(sys.argv[2]) if len(sys.argv) > 2 else 512
    header = rows[1]
    col = {h: i for i, h in enumerate(header)}
    data = [r for r in rows[2:] if len(r) >= len(header)]
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(float(r[col[SAMPLES]] or 0) for r in data)

    def region(executed: int) -> str:
        if executed == 0:
            return "never"
        if executed <= warps // 8:
            return "merge"
        return "once per program" if executed <= warps else "loop"

    regions: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0])
    ops, op_samples, reasons = collections.Counter(), collections.Counter(), collections.Counter()
    for r in data:
        executed, samples = int(r[col[EXECUTED]] or 0), float(r[col[SAMPLES]] or 0)
        part = regions[region(executed)]
        part[0] += 1
        part[1] += samples
        part[2] += executed
        for h in stalls:
            reasons[h[len("stall_"):]] += float(r[col[h]] or 0)
        if region(executed) == "loop":
            text = r[1].strip()
            op = (text.split(None, 1)[1] if text.startswith("@") else text).split()[0].split(".")[0]
            ops[op] += executed / warps
            op_samples[op] += samples
    print(f"stall samples: {total:.0f}")
    print("| region | instructions | stall samples | warp instructions executed |\n|---|---|---|---|")
    for name, (n, samples, executed) in regions.items():
        print(f"| {name} | {n} | {samples:.0f} ({100 * samples / total:.1f} %) | {executed} |")
    print(f"\nloop: {sum(ops.values()):.0f} instructions per warp; by opcode (per warp, stall samples):")
    print(", ".join(f"{op} {n:.0f} ({op_samples[op]:.0f})" for op, n in ops.most_common(16)))
    print("\nstall reasons: " + ", ".join(f"{k} {100 * v / total:.1f} %" for k, v in reasons.most_common(8)))


if __name__ == "__main__":
    main()
