"""Tables, JSON and a plot of evaluation results (the benchmark's table helpers and colours)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lazyattn.bench.plots import MODE_STYLE, pyplot
from lazyattn.bench.report import markdown_table, text_table, write_json
from lazyattn.eval.harness import Cell, CellResult
from lazyattn.eval.metrics import CONFIDENCE, Difference, bootstrap_ci, paired_bootstrap_diff

__all__ = [
    "comparisons",
    "differences_markdown",
    "markdown_table",
    "pivot_markdown",
    "position_means",
    "position_means_markdown",
    "pivots",
    "plot_accuracy",
    "rows",
    "table_columns",
    "text_table",
    "write_json",
]


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


def _ci(ci: Sequence[float] | None) -> str | None:
    """A 95 % interval in percent, "[lo, hi]"."""
    return None if ci is None else f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def rows(results: Sequence[CellResult]) -> list[dict[str, Any]]:
    """One table row per (run, cell), scores in percent."""
    out = []
    for r in results:
        s = r.summary()
        row = {
            "run": s["run"],
            "docs": "all" if s["num_docs"] is None else s["num_docs"],
            "gold": s["position"],
            "n": s["n"],
            "acc": _pct(s["accuracy"]),
            "acc_ci": _ci(s["accuracy_ci"]),
            "em": _pct(s["exact_match"]),
            "f1": _pct(s["f1"]),
            "ttft": s["ttft_ms_mean"],
            "prompt": s["prompt_tokens_mean"],
            "cached": s["cached_tokens_mean"],
            "read_gold": _pct(s["read_gold"]),
        }
        for t, acc in s.get("accuracy_by_type", {}).items():
            row[f"acc:{t}"] = _pct(acc)
            row[f"ci:{t}"] = _ci(s["accuracy_ci_by_type"][t])
        out.append(row)
    return out


def table_columns(table_rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    types = list(dict.fromkeys(k for r in table_rows for k in r if k.startswith("acc:")))
    return (
        [
            ("run", "run", "{}"),
            ("docs", "docs", "{}"),
            ("gold", "gold", "{}"),
            ("n", "n", "{}"),
            ("accuracy %", "acc", "{:.1f}"),
            (f"{CONFIDENCE:.0%} CI", "acc_ci", "{}"),
        ]
        + [c for t in types for c in ((f"acc {t[4:]} %", t, "{:.1f}"), (f"{t[4:]} CI", f"ci:{t[4:]}", "{}"))]
        + [
            ("EM %", "em", "{:.1f}"),
            ("F1 %", "f1", "{:.1f}"),
            ("TTFT ms", "ttft", "{:.0f}"),
            ("prompt tok", "prompt", "{:.0f}"),
            ("cached tok", "cached", "{:.0f}"),
        ]
        + ([("read gold %", "read_gold", "{:.1f}")] if any(r.get("read_gold") is not None for r in table_rows) else [])
    )


def pivot_markdown(
    results: Sequence[CellResult], aliases: Mapping[Cell, Cell] | None = None, key: str = "accuracy"
) -> str:
    """Runs down, cells across ("5 docs / middle"), `key` of the summary in percent with its 95 % bootstrap
    interval where the summary has one. A cell left out as equal to another shows that one's value, marked "="
    (e.g. middle of two documents is first)."""
    aliases = dict(aliases or {})
    runs = list(dict.fromkeys(r.run.label for r in results))
    value = {(r.run.label, r.cell): r.summary() for r in results}
    cells = list(dict.fromkeys([r.cell for r in results] + list(aliases)))
    cells.sort(key=lambda c: (c.num_docs is None, c.num_docs or 0, _POSITION_ORDER.get(c.position, 9)))

    def cell_text(run: str, cell: Cell) -> str:
        s = value.get((run, aliases.get(cell, cell)))
        if s is None:
            return "-"
        if key in s:
            v, ci = s[key], s.get(f"{key}_ci")
        else:
            v, ci = s.get("accuracy_by_type", {}).get(key), s.get("accuracy_ci_by_type", {}).get(key)
        text = "-" if v is None else f"{100 * v:.1f}" + (f" {_ci(ci)}" if ci is not None else "")
        return f"= {text}" if cell in aliases else text

    return _grid(runs, cells, [_cell_head(c) for c in cells], cell_text)


_POSITION_ORDER = {"first": 0, "middle": 1, "last": 2, "original": 3}


def _cell_head(c: Cell) -> str:
    return f"{'all' if c.num_docs is None else c.num_docs} docs / {c.position}"


def _grid(runs: Sequence[str], columns: Sequence[Any], head: Sequence[str], text, title: str = "") -> str:
    """Runs down, `columns` across under `head`, each cell `text(run, column)`; a title line above where given."""
    lines = [title, ""] if title else []
    lines += ["| run | " + " | ".join(head) + " |", "|---|" + "---|" * len(columns)]
    lines += [f"| {run} | " + " | ".join(text(run, c) for c in columns) + " |" for run in runs]
    return "\n".join(lines)


def pivots(
    results: Sequence[CellResult],
    aliases: Mapping[Cell, Cell] | None = None,
    comps: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """The accuracy pivot, then one per question type when there are several, then the differences from the
    baseline run when there are several runs (markdown, titled), and the run closest to it. `comps`: the results'
    `comparisons`, where the caller has them already (each is a paired bootstrap)."""
    ci = f"{CONFIDENCE:.0%} bootstrap CI"
    text = f"Accuracy (%) [{ci}]\n\n{pivot_markdown(results, aliases)}"
    for t in dict.fromkeys(t for r in results for t in r.summary().get("accuracy_by_type", {})):
        text += f"\n\nAccuracy, {t} questions (%) [{ci}]\n\n{pivot_markdown(results, aliases, key=t)}"
    diffs = differences_markdown(results, aliases)
    text = f"{text}\n\n{diffs}" if diffs else text
    means = position_means_markdown(results)
    text = f"{text}\n\n{means}" if means else text
    best = closest(comparisons(results) if comps is None else comps)
    if best is not None:
        text += (
            f"\n\nClosest to {best['baseline']} in its worst cell: {best['run']} "
            f"({100 * best['worst']:+.1f} points there, {100 * best['mean']:+.1f} on average over the cells)"
        )
    return text


def closest(comps: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Of the runs compared with the baseline (`comparisons`), the one whose worst cell differs least for the worse:
    the highest smallest accuracy difference over its cells, ties to the higher mean, then the run listed first. How
    to pick a setting on labelled questions of your own (docs/quality.md, "In-context learning"): run the candidates
    on some of them, take this run, and check it on the others. None without comparisons."""
    by_run: dict[str, list[float]] = {}
    for c in comps:
        by_run.setdefault(c["run"], []).append(c["accuracy_diff"])
    if not by_run:
        return None
    order = list(by_run)
    run = max(order, key=lambda r: (min(by_run[r]), sum(by_run[r]) / len(by_run[r]), -order.index(r)))
    diffs = by_run[run]
    base = next(c["baseline"] for c in comps)
    return {"run": run, "baseline": base, "worst": min(diffs), "mean": sum(diffs) / len(diffs)}


def _per_question_mean(cells: Sequence[CellResult]) -> dict[str, float]:
    """Each question's accuracy averaged over `cells` (the same questions at several gold positions); only the
    questions every cell answered."""
    scores = [{i.id: i.scores.accuracy for i in c.items} for c in cells]
    common = [q for q in scores[0] if all(q in s for s in scores[1:])]
    return {q: sum(s[q] for s in scores) / len(scores) for q in common}


def position_means(results: Sequence[CellResult]) -> list[dict[str, Any]]:
    """Per run and document count, accuracy averaged over the gold positions that ran (where more than one did):
    the mean with its bootstrap interval, resampling questions (each question's mean over the positions is one
    sample), and the paired difference from the baseline run. Reported targets are stated this way."""
    base = baseline_run(results)
    groups: dict[tuple[str, int | None], list[CellResult]] = {}
    for r in results:
        groups.setdefault((r.run.label, r.cell.num_docs), []).append(r)
    out = []
    for (run, docs), cells in groups.items():
        if len(cells) < 2:
            continue
        mine = _per_question_mean(cells)
        low, high = bootstrap_ci(list(mine.values())) or (None, None)
        row: dict[str, Any] = {
            "run": run,
            "num_docs": docs,
            "positions": [c.cell.position for c in cells],
            "n": len(mine),
            "accuracy": sum(mine.values()) / len(mine) if mine else None,
            "accuracy_ci": None if low is None else [low, high],
        }
        theirs = groups.get((base, docs))
        if run != base and theirs is not None and len(theirs) == len(cells):
            ref = _per_question_mean(theirs)
            common = [q for q in mine if q in ref]
            d = paired_bootstrap_diff([ref[q] for q in common], [mine[q] for q in common])
            if d is not None:
                row["baseline"] = base
                row["diff"] = {"mean": d.mean, "ci": [d.low, d.high], "significant": d.significant}
        out.append(row)
    return out


def position_means_markdown(results: Sequence[CellResult]) -> str:
    """`position_means` as a table: runs down, document counts across; empty where no count ran at several gold
    positions."""
    means = position_means(results)
    if not means:
        return ""
    docs = list(dict.fromkeys(m["num_docs"] for m in means))
    runs = list(dict.fromkeys(m["run"] for m in means))
    by_key = {(m["run"], m["num_docs"]): m for m in means}

    def text(run: str, n: int | None) -> str:
        m = by_key.get((run, n))
        if m is None or m["accuracy"] is None:
            return "-"
        out = f"{100 * m['accuracy']:.1f} [{100 * m['accuracy_ci'][0]:.1f}, {100 * m['accuracy_ci'][1]:.1f}]"
        if "diff" in m:
            d = m["diff"]
            out += "; " + Difference(d["mean"], d["ci"][0], d["ci"][1], m["n"]).describe()
        return out

    title = (
        f"Accuracy (%) averaged over gold positions [{CONFIDENCE:.0%} bootstrap CI]; difference from "
        f"{baseline_run(results)} in points [paired CI]"
    )
    return _grid(runs, docs, [f"{'all' if n is None else n} docs" for n in docs], text, title)


def baseline_run(results: Sequence[CellResult]) -> str | None:
    """The run others are compared with: "full" when it ran, else the first run."""
    runs = list(dict.fromkeys(r.run.label for r in results))
    return None if not runs else "full" if "full" in runs else runs[0]


def comparisons(results: Sequence[CellResult]) -> list[dict[str, Any]]:
    """Each run against the baseline run in each cell: accuracy difference (run - baseline, in [-1, 1]) over the
    questions both answered, with its paired-bootstrap 95 % interval; `significant` is False where the interval
    holds 0 ("no significant difference")."""
    base = baseline_run(results)
    by_key = {(r.run.label, r.cell): r for r in results}
    out = []
    for r in results:
        other = by_key.get((base, r.cell))
        if r.run.label == base or other is None:
            continue
        d = _paired(other, r)
        if d is None:
            continue
        out.append(
            {
                "run": r.run.label,
                "baseline": base,
                "num_docs": r.cell.num_docs,
                "position": r.cell.position,
                "n": d.n,
                "accuracy_diff": d.mean,
                "ci": [d.low, d.high],
                "significant": d.significant,
            }
        )
    return out


def _paired(a: CellResult, b: CellResult) -> Difference | None:
    """b - a over the questions (by id) both cells answered."""
    scores_a = {i.id: i.scores.accuracy for i in a.items}
    common = [i for i in b.items if i.id in scores_a]
    return paired_bootstrap_diff([scores_a[i.id] for i in common], [i.scores.accuracy for i in common])


def differences_markdown(results: Sequence[CellResult], aliases: Mapping[Cell, Cell] | None = None) -> str:
    """Runs down, cells across: accuracy of each run minus the baseline's, in points, with the paired-bootstrap
    95 % interval; an interval holding 0 reads "no significant difference". Empty with a single run."""
    base = baseline_run(results)
    runs = [label for label in dict.fromkeys(r.run.label for r in results) if label != base]
    if not runs:
        return ""
    by_key = {(r.run.label, r.cell): r for r in results}
    cells = sorted(
        {r.cell for r in results},
        key=lambda c: (c.num_docs is None, c.num_docs or 0, _POSITION_ORDER.get(c.position, 9)),
    )

    def cell_text(run: str, cell: Cell) -> str:
        a, b = by_key.get((base, cell)), by_key.get((run, cell))
        d = _paired(a, b) if a is not None and b is not None else None
        return "-" if d is None else d.describe()

    title = f"Accuracy difference from {base} (points) [paired {CONFIDENCE:.0%} bootstrap CI]"
    return _grid(runs, cells, [_cell_head(c) for c in cells], cell_text, title)


def plot_accuracy(
    results: Sequence[CellResult], path: str | Path, title: str = "", aliases: Mapping[Cell, Cell] | None = None
) -> bool:
    """Accuracy (top) and mean TTFT (bottom) against documents per question, one column per gold position,
    one line per run. A cell left out as equal to another is drawn with that one's values. False, with a note,
    without matplotlib (the `plots` extra)."""
    plt = pyplot(path)
    if plt is None:
        return False

    by_cell = {(r.run.label, r.cell): r for r in results}
    for cell, same in (aliases or {}).items():
        for label in dict.fromkeys(r.run.label for r in results):
            if (label, same) in by_cell:
                by_cell[(label, cell)] = by_cell[(label, same)]
    positions = sorted({c.position for _, c in by_cell}, key=lambda p: _POSITION_ORDER.get(p, 9))
    runs = list(dict.fromkeys(r.run.label for r in results))
    doc_counts = sorted({c.num_docs or 0 for _, c in by_cell})
    fig, axes = plt.subplots(2, len(positions), figsize=(4.6 * len(positions), 7), squeeze=False)
    for col, position in enumerate(positions):
        for i, label in enumerate(runs):
            cells = sorted(
                ((c.num_docs or 0, r) for (run, c), r in by_cell.items() if run == label and c.position == position),
                key=lambda t: t[0],
            )
            if not cells:
                continue
            color, marker = MODE_STYLE.get(cells[0][1].run.mode, ("black", "x"))
            xs = [n for n, _ in cells]
            summaries = [r.summary() for _, r in cells]
            # Runs with equal answers (lazy and block) overlap: dashes keep both visible.
            style = dict(color=color, marker=marker, ls=["-", "--", ":", "-."][i % 4], label=label)
            axes[0][col].plot(xs, [100 * (s["accuracy"] or 0) for s in summaries], **style)
            axes[1][col].plot(xs, [(s["ttft_ms_mean"] or 0) / 1e3 for s in summaries], **style)
        axes[0][col].set_title(f"gold document {position}")
        axes[0][col].set_ylim(-3, 103)
        for row, ylabel in ((0, "accuracy (%)"), (1, "TTFT mean (s)")):
            ax = axes[row][col]
            ax.set_xticks(doc_counts)
            ax.set_xlabel("documents per question")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        if axes[0][col].get_legend_handles_labels()[0]:
            axes[0][col].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
