"""The comparison table of benchmarks/finetune_prefix.sh: `python -m benchmarks.finetune_prefix_summary OUT_DIR`.

Reads OUT_DIR/eval/<model>-<set>-<layout>/eval.json (runs `full` and `lazy:ape_prefix=true` of `lazyattn eval`) and
prints, per set, layout and document count, each model's full-attention accuracy and its lazy + shared prefix accuracy
(means over the gold positions that ran), the lazy - full gap per gold position, and the paired differences between
each trained adapter's runs and the shipped one's (`block`) on the same questions: what the training changed.
Differences carry their paired 95 % bootstrap interval; "n.s." where it holds 0.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lazyattn.eval.metrics import paired_bootstrap_diff

FULL, LAZY = "full", "lazy:ape_prefix=true"
OLD = "block"  # the shipped smollm2-block; every other model is an adapter the script trained
POSITIONS = ("first", "middle", "last")


def per_question(cells: list[dict], run: str, docs: int) -> dict[str, float]:
    """Each question's accuracy averaged over the gold positions of (run, docs)."""
    chosen = [c for c in cells if c["run"] == run and c["num_docs"] == docs]
    scores = [{i["id"]: i["accuracy"] for i in c["items"]} for c in chosen]
    if not scores:
        return {}
    common = [q for q in scores[0] if all(q in s for s in scores[1:])]
    return {q: sum(s[q] for s in scores) / len(scores) for q in common}


def diff(a: dict[str, float], b: dict[str, float]) -> str:
    """b - a in points over the questions both answered."""
    common = [q for q in a if q in b]
    d = paired_bootstrap_diff([a[q] for q in common], [b[q] for q in common])
    if d is None:
        return "-"
    return f"{100 * d.mean:+.1f} [{100 * d.low:+.1f}, {100 * d.high:+.1f}]" + ("" if d.significant else " n.s.")


def gap_at(cells: list[dict], docs: int, position: str) -> str:
    full, lazy = (
        {i["id"]: i["accuracy"] for c in cells if (c["run"], c["num_docs"], c["position"]) == (r, docs, position)
         for i in c["items"]}
        for r in (FULL, LAZY)
    )  # fmt: skip
    return diff(full, lazy) if full and lazy else "-"


def main(out: Path) -> str:
    found: dict[tuple[str, str, str], list[dict]] = {}
    for path in sorted(out.glob("eval/*/eval.json")):
        model, _, rest = path.parent.name.partition("-")
        layout = next(name for name in ("block-attention", "short-answer", "tulu3-block-ft") if rest.endswith(name))
        found[(model, rest[: -len(layout) - 1], layout)] = json.loads(path.read_text())["cells"]
    lines = [
        "| set | layout | docs | model | full % | lazy+prefix % | lazy+prefix - full | first | middle | last |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    versus = [
        "| set | layout | docs | adapter | full: adapter - block | lazy+prefix: adapter - block |",
        "|---|---|---|---|---|---|",
    ]
    keys = sorted({(s, lay) for _, s, lay in found})
    models = [OLD, *sorted({m for m, _, _ in found} - {OLD})]
    for dataset, layout in keys:
        docs_seen = sorted({c["num_docs"] for (m, s, lay), cells in found.items() if (s, lay) == (dataset, layout)
                            for c in cells})  # fmt: skip
        for docs in docs_seen:
            means = {}
            for model in models:
                cells = found.get((model, dataset, layout))
                if cells is None:
                    continue
                full, lazy = per_question(cells, FULL, docs), per_question(cells, LAZY, docs)
                means[model] = (full, lazy)
                acc = [f"{100 * sum(v.values()) / len(v):.1f}" if v else "-" for v in (full, lazy)]
                gaps = [gap_at(cells, docs, p) for p in POSITIONS]
                lines.append(f"| {dataset} | {layout} | {docs} | {model} | {acc[0]} | {acc[1]} | "
                             f"{diff(full, lazy)} | {' | '.join(gaps)} |")  # fmt: skip
            for model in [m for m in models if m != OLD and m in means and OLD in means]:
                (new_full, new_lazy), (old_full, old_lazy) = means[model], means[OLD]
                versus.append(f"| {dataset} | {layout} | {docs} | {model} | {diff(old_full, new_full)} | "
                              f"{diff(old_lazy, new_lazy)} |")  # fmt: skip
    return "\n".join(
        [
            "Accuracy averaged over the gold positions; differences in points [paired 95 % bootstrap CI].",
            "",
            *lines,
            "",
            "Each trained adapter against the shipped one (`block`), same questions:",
            "",
            *versus,
        ]
    )


if __name__ == "__main__":
    print(main(Path(sys.argv[1])))
