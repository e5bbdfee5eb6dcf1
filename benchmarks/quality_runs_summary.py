"""Every run of a folder of `lazyattn eval` outputs against full attention, in one table per run:
`python -m benchmarks.quality_runs_summary OUT_DIR` (the folder benchmarks/quality_best_document.sh writes).

Reads OUT_DIR/<model>-<set>-<layout>/eval.json. Per model, set, layout and document count: full attention's accuracy
averaged over the gold positions, then each other run's difference from it on the mean over positions and per gold
position, in points with the paired 95 % bootstrap interval over the same questions ("n.s." where it holds 0).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.finetune_prefix_summary import diff, per_question

LAYOUTS = ("block-attention", "short-answer")


def _by_position(cells: list[dict], run: str, docs: int, position: str) -> dict[str, float]:
    return {
        i["id"]: i["accuracy"]
        for c in cells
        if (c["run"], c["num_docs"], c["position"]) == (run, docs, position)
        for i in c["items"]
    }


def main(out: Path) -> str:
    found = []
    for path in sorted(out.glob("*/eval.json")):
        model, _, rest = path.parent.name.partition("-")
        layout = next(name for name in LAYOUTS if rest.endswith(name))
        found.append((model, rest[: -len(layout) - 1], layout, json.loads(path.read_text())))
    runs = [r["label"] for r in found[0][3]["runs"] if r["label"] != "full"] if found else []
    lines = []
    for run in runs:
        lines += [
            f"### `{run}` − full",
            "",
            "| model | set | layout | docs | full % | − full | gold first | middle | last |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for model, dataset, layout, ev in found:
            cells = ev["cells"]
            positions = sorted({c["position"] for c in cells}, key=("first", "middle", "last").index)
            for docs in sorted({c["num_docs"] for c in cells}):
                full = per_question(cells, "full", docs)
                mean = 100 * sum(full.values()) / max(len(full), 1)
                at = [diff(_by_position(cells, "full", docs, p), _by_position(cells, run, docs, p)) for p in positions]
                row = [model, dataset, layout, str(docs), f"{mean:.1f}", diff(full, per_question(cells, run, docs))]
                lines.append("| " + " | ".join(row + at) + " |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(main(Path(sys.argv[1])))
