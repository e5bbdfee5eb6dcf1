"""Every run of a folder of `lazyattn eval` outputs against full attention (or another run), in one table per run:
`python -m benchmarks.quality_runs_summary OUT_DIR [BASELINE]` (the folder benchmarks/quality_best_document.sh
writes; BASELINE a run's label, default full).

Reads OUT_DIR/<model>-<set>-<layout>/eval.json. Per model, set, layout and document count: the baseline's accuracy
averaged over the gold positions, then each other run's difference from it on the mean over positions and per gold
position, in points with the paired 95 % bootstrap interval over the same questions ("n.s." where it holds 0).
For each run that read some answers with the documents in parallel (`answer="both-placements"`) or in another
order than given (`answer="both-orders"`, `"each-last"`), the share of its answers that did, per gold position.
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


def main(out: Path, baseline: str = "full") -> str:
    found = []
    for path in sorted(out.glob("*/eval.json")):
        model, _, rest = path.parent.name.partition("-")
        layout = next(name for name in LAYOUTS if rest.endswith(name))
        found.append((model, rest[: -len(layout) - 1], layout, json.loads(path.read_text())))
    runs = [r["label"] for r in found[0][3]["runs"] if r["label"] != baseline] if found else []
    lines = []
    for run in runs:
        lines += [
            f"### `{run}` − {baseline}",
            "",
            f"| model | set | layout | docs | {baseline} % | − {baseline} | gold first | middle | last |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for model, dataset, layout, ev in found:
            cells = ev["cells"]
            positions = sorted({c["position"] for c in cells}, key=("first", "middle", "last").index)
            for docs in sorted({c["num_docs"] for c in cells}):
                base = per_question(cells, baseline, docs)
                mean = 100 * sum(base.values()) / max(len(base), 1)
                at = [
                    diff(_by_position(cells, baseline, docs, p), _by_position(cells, run, docs, p)) for p in positions
                ]
                row = [model, dataset, layout, str(docs), f"{mean:.1f}", diff(base, per_question(cells, run, docs))]
                lines.append("| " + " | ".join(row + at) + " |")
        lines.append("")
    for run in runs:
        lines += _kept_otherwise(found, run, "read in parallel", lambda i: bool(i.get("read_in_parallel")))
        lines += _kept_otherwise(found, run, "read in another order", lambda i: i.get("document_order") is not None)
    return "\n".join(lines)


def _kept_otherwise(found: list, run: str, what: str, otherwise) -> list[str]:
    """The share of `run`'s answers that were not read as given but as `what` says (`otherwise(item)`: with the
    documents in parallel, or reordered), per cell and gold position; nothing where the run never read them so."""
    rows, any_kept = [], False
    for model, dataset, layout, ev in found:
        cells = {(c["num_docs"], c["position"]): c["items"] for c in ev["cells"] if c["run"] == run}
        for docs in sorted({d for d, _ in cells}):
            shares = []
            for position in ("first", "middle", "last"):
                items = cells.get((docs, position), [])
                kept = sum(otherwise(i) for i in items)
                any_kept |= kept > 0
                shares.append(f"{100 * kept / len(items):.0f}" if items else "")
            rows.append("| " + " | ".join([model, dataset, layout, str(docs), *shares]) + " |")
    if not any_kept:
        return []
    head = f"### `{run}`: answers {what} (%)"
    return [head, "", "| model | set | layout | docs | gold first | middle | last |", "|" + "---|" * 7, *rows, ""]


if __name__ == "__main__":
    print(main(Path(sys.argv[1]), *sys.argv[2:3]))
