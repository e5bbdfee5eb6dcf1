"""The table of `benchmarks/icl_pick.sh`'s runs, from their eval.json files: per model and set, full attention's
accuracy on the first N and on the others at each demonstration count, the pick and its worst difference on the
first N, and on the others its difference from full attention with the paired 95 % interval (bold: it excludes 0).

    python -m benchmarks.icl_pick_table OUT_DIR [OUT_DIR ...]     # one table per directory, as markdown
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

MODELS = ("smollm2", "smollm2-block")
SETS = ("icl-language", "icl-language-more", "icl-language-heldout", "icl-language-heldout-wagtail")
COLUMNS = "| model | set | full, first N | pick | its worst there | full, others | − full, others (5 / 10 / 20) |"


def short(run: str) -> str:
    """`lazy:ape_prefix=true:relink_last_tokens=3` as `last 3`; the shared prefix alone as `prefix`."""
    options = dict(o.split("=", 1) for o in run.split(":")[1:])
    last = options.get("relink_last_tokens")
    return f"last {last}" if last else "prefix" if options.get("ape_prefix") == "true" else run


def accuracies(cells: list[dict], run: str) -> str:
    rows = sorted((c["num_docs"], c["accuracy"]) for c in cells if c["run"] == run)
    return " / ".join(f"{100 * a:.1f}" for _, a in rows)


def differences(comparisons: list[dict]) -> str:
    out = []
    for c in sorted(comparisons, key=lambda c: c["num_docs"]):
        lo, hi = c["ci"]
        text = f"{100 * c['accuracy_diff']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
        out.append(f"**{text}**" if c["significant"] else text)
    return " / ".join(out)


def row(model: str, name: str, result: dict) -> str:
    pick = result["pick"]
    check = pick["check"]
    return (
        f"| `{model}` | `{name}` | {accuracies(result['cells'], 'full')} | {short(pick['run'])} "
        f"| {100 * pick['worst']:+.1f} | {accuracies(check['cells'], 'full')} | {differences(check['comparisons'])} |"
    )


def table(out: Path) -> str:
    lines = [COLUMNS, "|---|---|---|---|---|---|---|"]
    for model in MODELS:
        for name in SETS:
            path = out / f"{model}-{name}" / "eval.json"
            if path.exists():
                lines.append(row(model, name, json.loads(path.read_text())))
            else:
                lines.append(f"| `{model}` | `{name}` | (no eval.json) | | | | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    for out in parser.parse_args().dirs:
        print(f"## {out.name}\n\n{table(out)}\n")


if __name__ == "__main__":
    main()
