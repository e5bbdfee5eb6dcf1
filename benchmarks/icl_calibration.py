"""Contextual calibration of few-shot label choice (Zhao et al., 2021), per mode: does lazy mode's label choice,
once divided by what the same demonstrations make the model say about a content-free input, match full attention's?

    python -m benchmarks.icl_calibration --model smollm2 --dataset builtin:icl-language --num-docs 5,10,20 \\
        --modes full,lazy:ape_prefix=true --out OUT/icl_calibration

Each question is asked once as it is and once per content-free question (`--content-free`, by default `Text: N/A`,
an empty text and `Text: [MASK]`, each followed by the question's last line, `Language:` on the built-in language
sets), over the same demonstrations in the same order, one token each with the first token's whole log-softmax row
(`first_token_logprobs`). A label is scored by its first token, written as a plain prompt writes it (a leading
space): over labels whose first tokens differ that is the label guided choice answers with (`guided_choice`,
docs/design.md). Uncalibrated, the answer is the label whose first token is likeliest; calibrated, the one whose
probability most exceeds its probability after the content-free questions (their probabilities averaged), the
argmax of log p(label | question) - log p(label | content-free).

Per model, set and cell it prints, and writes as `calibration.md` and `calibration.json` under `--out`: each run's
accuracy uncalibrated and calibrated, and each run's calibrated answers against the first run's (full attention)
uncalibrated and calibrated answers, in points with the paired 95 % bootstrap interval over the questions.
Calibration is a scoring rule here, not an engine option.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from benchmarks.finetune_prefix_summary import diff

DEFAULT_CONTENT_FREE = ("Text: N/A", "Text: ", "Text: [MASK]")


def content_free(question: str, texts: Sequence[str]) -> list[str]:
    """The content-free questions of `question`: each text followed by the question's last line."""
    last = question.rsplit("\n", 1)[-1]
    return [f"{t}\n{last}" for t in texts]


def label_tokens(encode, labels: Sequence[str]) -> list[int]:
    """Each label's first token, written with a leading space as a plain prompt continues; SystemExit where two
    labels share it (their first tokens could not tell them apart)."""
    first = [encode(" " + label)[0] for label in labels]
    if len(set(first)) != len(first):
        raise SystemExit(f"labels {list(labels)} share a first token; calibration by first token needs them distinct")
    return first


def choose(rows, content_free_rows, calibrated: bool) -> list[int]:
    """The label index per question: rows [N, k] the labels' first-token log-probs, content_free_rows [C, N, k] the
    same after each content-free question; calibrated: the argmax of log p - log mean_c p_c, each renormalised over
    the k labels (which moves no argmax)."""
    log_p = rows.log_softmax(-1)
    if not calibrated:
        return log_p.argmax(-1).tolist()
    log_cf = content_free_rows.log_softmax(-1).exp().mean(0).log()
    return (log_p - log_cf).argmax(-1).tolist()


def _rows(llm, prompts: list[str], documents: list[list[dict]], tokens: list[int]):
    import torch

    from lazyattn import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, first_token_logprobs=True)
    outs = llm.generate(prompts, params, documents=documents, use_tqdm=False)
    return torch.stack([o.outputs[0].first_token_logprobs for o in outs])[:, tokens]


def run(args: argparse.Namespace) -> dict:
    import torch

    from lazyattn import LLM
    from lazyattn.cli import build_parser, engine_options
    from lazyattn.eval.harness import RunSpec, plan_cells
    from lazyattn.eval.inputs import load_questions, prompt_layout

    eval_args = [
        "eval", "--model", args.model, "--dataset", args.dataset, "--num-docs", args.num_docs,
        *(["--device", args.device] if args.device else []), *(["--limit", str(args.limit)] if args.limit else []),
        *args.engine_args,
    ]  # fmt: skip
    ev = build_parser().parse_args(eval_args)
    items, _, num_docs, positions = load_questions(ev)
    cells, _ = plan_cells(items, num_docs, positions)
    layout, base = prompt_layout(ev), engine_options(ev)
    base.pop("mode")
    texts = args.content_free or list(DEFAULT_CONTENT_FREE)
    runs = [RunSpec.parse(m) for m in args.modes.split(",")]
    result: dict = {"model": args.model, "dataset": args.dataset, "content_free": texts, "cells": []}
    answers: dict[tuple[str, int | None, str], dict[str, list[int]]] = {}
    for spec in runs:
        # No warm-up: the answers are scored, not timed.
        llm = LLM(**{**base, **spec.options, "mode": spec.mode, "layout": layout, "progress": False, "warm_up": False})
        for cell, shown in cells:
            tokens = label_tokens(llm.tokenizer.encode_plain, shown[0].labels)
            questions = [it.question for it in shown]
            documents = [list(it.documents) for it in shown]
            free = [q for it in shown for q in content_free(it.question, texts)]
            rows = _rows(llm, questions, documents, tokens)
            cf = _rows(llm, free, [d for d in documents for _ in texts], tokens)
            cf = cf.view(len(shown), len(texts), len(tokens)).transpose(0, 1)
            gold = [it.labels.index(it.answers[0]) for it in shown]
            answers[(spec.label, cell.num_docs, cell.position)] = {
                how: [int(c == g) for c, g in zip(choose(rows, cf, how == "calibrated"), gold)]
                for how in ("plain", "calibrated")
            }
            print(f"{spec.label} {cell.label}: done", flush=True)
            if args.out is not None:  # every cell's answers as it finishes, should a later one not
                args.out.mkdir(parents=True, exist_ok=True)
                done = {f"{k[0]}|{k[1]}|{k[2]}": v for k, v in answers.items()}
                (args.out / "answers.json").write_text(json.dumps(done))
        del llm
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    first = runs[0].label
    for cell, shown in cells:
        ids = [it.id for it in shown]
        ref = {k: dict(zip(ids, v)) for k, v in answers[(first, cell.num_docs, cell.position)].items()}
        row = {"num_docs": cell.num_docs, "position": cell.position, "questions": len(ids), "runs": {}}
        for spec in runs:
            got = answers[(spec.label, cell.num_docs, cell.position)]
            calibrated = dict(zip(ids, got["calibrated"]))
            row["runs"][spec.label] = {
                "plain": 100 * sum(got["plain"]) / len(ids),
                "calibrated": 100 * sum(got["calibrated"]) / len(ids),
                "calibrated_minus_first_plain": diff(ref["plain"], calibrated),
                "calibrated_minus_first_calibrated": diff(ref["calibrated"], calibrated),
                "correct": got,
            }
        result["cells"].append(row)
    return result


def table(result: dict) -> str:
    """The markdown table of one result: a row per run and cell."""
    runs = list(result["cells"][0]["runs"]) if result["cells"] else []
    first = runs[0] if runs else "-"
    lines = [
        f"{result['model']}, {result['dataset']}; content-free: {', '.join(repr(t) for t in result['content_free'])}",
        "",
        f"| demonstrations | run | plain % | calibrated % | calibrated − {first} plain "
        f"| calibrated − {first} calibrated |",
        "|---|---|---|---|---|---|",
    ]
    for c in result["cells"]:
        for r in runs:
            x = c["runs"][r]
            lines.append(
                f"| {c['num_docs']} | {r} | {x['plain']:.1f} | {x['calibrated']:.1f} | "
                f"{x['calibrated_minus_first_plain']} | {x['calibrated_minus_first_calibrated']} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.icl_calibration", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dataset", default="builtin:icl-language")
    p.add_argument("--num-docs", default="5,10,20")
    p.add_argument("--modes", default="full,lazy:ape_prefix=true", help="runs as `lazyattn eval --modes`; full first")
    p.add_argument("--device", default=None, help="as `lazyattn eval --device` (default: its default)")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument(
        "--content-free", action="append", help="a content-free text (repeatable); default: N/A, empty, [MASK]"
    )
    p.add_argument("--out", type=Path, default=None)
    args, rest = p.parse_known_args(argv)
    args.engine_args = rest  # any other `lazyattn eval` engine flags (--kv-cache-gb, --cpu-threads, ...)
    result = run(args)
    text = table(result)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "calibration.md").write_text(text)
        (args.out / "calibration.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
