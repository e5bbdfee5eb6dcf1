"""Per question, the surest of several runs' answers, against a baseline run: what answering with two or more
settings in one round and keeping the answer the model is surest of would score, from `lazyattn eval --confidence`
outputs, without running it.

    p=lazy:ape_prefix=true
    python -m benchmarks.quality_surer_of OUT/*/eval.json --runs $p,$p:relink_last_tokens=3

Each eval.json must hold the runs named (`--runs`, two or more) and the baseline (`--baseline`, default full), all
made with `--confidence`, which records each answer's mean token log-probability: the score the choosing answer
strategies rank candidates by (engine/best_document.py, `confidence`). Per file (named by its folder) and cell
(documents, gold position): the baseline's accuracy, each named run's difference from it, and the difference of
the surest answer (the highest confidence; a tie, or an answer without tokens, goes to the run named first), in
points with the paired 95 % bootstrap interval over the questions ("n.s." where it holds 0), and how many answers
each run gave to it.

`--first-tokens 1,2,4` adds what choosing after the first k tokens would give (`confidence_tokens=k` of the choosing
answer strategies, which stop every other candidate after k tokens; the runs need the tokens' log-probabilities,
which `--confidence` records as `token_logprobs`): the answer tokens generated with every candidate in full against
the first run's alone (the ratio of `usage.completion_tokens`, decode work), and per k the surest by the mean
log-probability of the first k tokens, its difference from the surest by the whole answer (paired over the same
questions), on how many questions it keeps another run's answer, and the answer tokens generated (the answer kept in
full, every other candidate's first k) against the first run's alone.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

from benchmarks.finetune_prefix_summary import diff
from lazyattn.engine.choice import mean_logprob


def _cells(ev: dict, run: str) -> dict[tuple[int, str], dict[str, dict]]:
    """{(documents, position): {question id: item}} of one run."""
    return {(c["num_docs"], c["position"]): {i["id"]: i for i in c["items"]} for c in ev["cells"] if c["run"] == run}


def surest(items: Sequence[dict], tokens: int | None = None) -> int:
    """Index of the item with the highest confidence, of the mean log-probability of its first `tokens` tokens where
    given; the first on a tie, a missing confidence counting as -inf."""
    if tokens is None:
        scores = [-math.inf if i.get("confidence") is None else i["confidence"] for i in items]
    else:
        scores = [mean_logprob(i.get("token_logprobs") or [], tokens) for i in items]
    return max(range(len(items)), key=lambda k: (scores[k], -k))


def questions(path: Path, runs: Sequence[str], baseline: str, first: Sequence[int] = ()) -> dict:
    """{(documents, position): {question id: (the baseline's item, [each named run's item])}} of one eval.json, over
    the questions every run answered."""
    ev = json.loads(path.read_text())
    base = _cells(ev, baseline)
    named = [_cells(ev, r) for r in runs]
    missing = [r for r, cells in zip([baseline, *runs], [base, *named]) if not cells]
    if missing:
        raise SystemExit(f"{path}: no cells of run(s) {', '.join(missing)}")
    if not any(i.get("confidence") is not None for c in named for cell in c.values() for i in cell.values()):
        raise SystemExit(f"{path}: no answer has a confidence: run lazyattn eval with --confidence")
    if first and not any(i.get("token_logprobs") for c in named for cell in c.values() for i in cell.values()):
        raise SystemExit(f"{path}: no answer has token log-probabilities: rerun lazyattn eval with --confidence")
    return {
        cell: {
            q: (item, [c[cell][q] for c in named])
            for q, item in base[cell].items()
            if all(q in c.get(cell, {}) for c in named)
        }
        for cell in sorted(base, key=lambda c: (c[0], c[1]))
    }


def row(label: Sequence[str], asked: dict, runs: int, first: Sequence[int] = ()) -> str:
    """One markdown row (module docstring) over `asked`: {question: (the baseline's item, [each run's item])}."""
    reference = {q: base["accuracy"] for q, (base, _) in asked.items()}
    picks = {q: surest(items) for q, (_, items) in asked.items()}
    kept = {q: items[picks[q]]["accuracy"] for q, (_, items) in asked.items()}
    each = [diff(reference, {q: items[j]["accuracy"] for q, (_, items) in asked.items()}) for j in range(runs)]
    counts = " / ".join(str(sum(1 for k in picks.values() if k == j)) for j in range(runs))
    mean = 100 * sum(reference.values()) / max(len(reference), 1)
    early = []
    if first:
        lengths = {q: [len(i.get("token_logprobs") or []) for i in items] for q, (_, items) in asked.items()}
        alone = max(sum(n[0] for n in lengths.values()), 1)
        early.append(f"{sum(sum(n) for n in lengths.values()) / alone:.2f}")
    for tokens in first:
        at = {q: surest(items, tokens) for q, (_, items) in asked.items()}
        kept_at = {q: items[at[q]]["accuracy"] for q, (_, items) in asked.items()}
        made = sum(n if j == at[q] else min(n, tokens) for q in asked for j, n in enumerate(lengths[q]))
        early += [diff(kept, kept_at), str(sum(1 for q in asked if at[q] != picks[q])), f"{made / alone:.2f}"]
    cells = [*label, f"{mean:.1f}", *each, diff(reference, kept), counts, *early]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("evals", nargs="+", type=Path, help="eval.json files of lazyattn eval --confidence")
    p.add_argument("--runs", required=True, help="two or more run labels, comma-separated, in tie order")
    p.add_argument("--baseline", default="full", help="the run every other is compared with (default: full)")
    p.add_argument(
        "--first-tokens",
        default="",
        help="comma-separated k: also the surest by the first k tokens' mean log-probability (module docstring)",
    )
    args = p.parse_args(argv)
    runs = [r for r in args.runs.split(",") if r]
    if len(runs) < 2:
        p.error("--runs needs two or more run labels")
    try:
        first = [int(k) for k in args.first_tokens.split(",") if k]
    except ValueError:
        p.error(f"--first-tokens takes positive integers, got {args.first_tokens!r}")
    if any(k < 1 for k in first):
        p.error(f"--first-tokens takes positive integers, got {args.first_tokens!r}")
    head = [f"`{r}` − {args.baseline}" for r in runs]
    if first:
        head.append(f"answer tokens ÷ `{runs[0]}`'s, every candidate in full")
    for k in first:
        head += [f"surest of the first {k} − surest", f"kept otherwise at {k}", f"answer tokens ÷ `{runs[0]}`'s at {k}"]
    lines = [
        f"| eval | docs | position | {args.baseline} % | " + " | ".join(head[: len(runs)]) + f" | surest − "
        f"{args.baseline} | answers kept from each |" + "".join(f" {h} |" for h in head[len(runs) :]),
        "|" + "---|" * (len(runs) + 6 + 3 * len(first) + bool(first)),
    ]
    pooled = {}
    for path in args.evals:
        found = questions(path, runs, args.baseline, first)
        lines += [row([path.parent.name, str(d), pos], asked, len(runs), first) for (d, pos), asked in found.items()]
        pooled.update({(str(path), cell, q): v for cell, asked in found.items() for q, v in asked.items()})
    if len(lines) > 3:  # more than one cell: all of them pooled, each question and position once
        lines.append(row(["all", "", ""], pooled, len(runs), first))
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
