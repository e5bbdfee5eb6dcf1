"""`lazyattn eval`: RAG question-answering accuracy per attention mode (docs/quality.md).

    lazyattn eval --model tiny --num-docs 2 --limit 8    # offline smoke run (random weights)
    lazyattn eval --model /models/SmolLM2-135M-Instruct --modes full,prefix,block,lazy \\
        --num-docs 2,5,10 --gold-position first,middle,last --limit 48 --out results/quality
    lazyattn eval --model M --dataset my_hotpotqa.jsonl --num-docs 10 --gold-position original
    lazyattn eval --modes lazy,lazy:relink_tokens=16 ...  # a mode plus engine options, compared side by side
    lazyattn eval --dataset builtin:medium --num-docs 10 --write-dataset eval.jsonl   # just write the set
    lazyattn eval --model smollm2 --dataset builtin:icl --num-docs 5,10,20 --modes full,lazy --max-tokens 8
        # in-context learning: demonstrations as documents, shuffled per question, label accuracy
    lazyattn eval --model smollm2 --dataset builtin:icl-language --num-docs 5,20 --modes full,lazy --max-tokens 3
        # the same for language identification, in a plain-text prompt (--plain-prompt)
    lazyattn eval --fidelity --model smollm2 --dataset builtin:real --num-docs 5 --gold-position first --limit 40 \\
        --max-tokens 16 --out results/fidelity       # numerics: dtypes, batch sizes, modes (docs/quality.md)
    lazyattn eval --calibrate --model smollm2-block --calibrate-documents my-docs/ --prompt-layout short-answer \\
        --out results/calibrate      # the APE setting closest to full attention on your documents

Prints one row per run and cell (accuracy, exact match, token F1, TTFT) and an accuracy pivot; with --out,
writes eval.json (every answer), eval.md (the tables) and accuracy.png (with the `plots` extra, matplotlib;
without it the plot is skipped with a note). With --fidelity: one row per comparison (identical answers, first
differing position, KL at the first token); --out writes fidelity.json and fidelity.md.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lazyattn.engine.config import DTYPES, MODES
from lazyattn.errors import InvalidRequestError
from lazyattn.eval.inputs import describe_dataset, load_questions, prompt_layout

# --prompt-layout names: the keys of lazyattn.engine.prompt_layout.NAMED_LAYOUTS, written out so that `-h` does not
# import the engine (tests/eval checks that they agree), and the few-shot layouts of builtin:icl, builtin:icl-language,
# builtin:icl-language-more and the two builtin:icl-language-heldout sets (lazyattn/eval/icl.py, SETS).
LAYOUTS = (
    "block-attention",
    "tulu3-block-ft",
    "short-answer",
    "icl",
    "icl-language",
    "icl-language-more",
    "icl-language-heldout",
    "icl-language-heldout-wagtail",
)


def add_eval_parser(
    sub, engine_args: Callable[[argparse.ArgumentParser], None], engine_options: Callable[[argparse.Namespace], dict]
) -> None:
    p = sub.add_parser(
        "eval",
        help="RAG question-answering accuracy per attention mode",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    engine_args(p, mode=False)
    p.set_defaults(mode=None)  # --modes picks the runs; a lone --mode X means just X
    p.add_argument(
        "--modes",
        default=None,
        help="comma-separated runs, each a mode with optional ':key=value' engine options "
        "(e.g. lazy:relink_tokens=16) and ':answer=STRATEGY' (best-document, best-document-or-joint, "
        "confidence-order, confidence-order-or-joint, each-last, both-orders, both-placements: "
        "engine/best_document.py), with any "
        "of them ':confidence_tokens=K' (a confidence-order strategy's one-document answers stop after K tokens; "
        "the others rank their candidates by the first K tokens and stop all but the surest there; "
        "docs/quality.md); "
        f"default {','.join(reversed(MODES))}",
    )
    p.add_argument(
        "--random-weights",
        action="store_true",
        help="read only the checkpoint's config.json and draw the weights (a fidelity probe at a model's shapes)",
    )
    p.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra LLM(...) option for every run (repeatable)",
    )
    d = p.add_argument_group("questions")
    d.add_argument(
        "--dataset",
        default=None,
        help="'builtin' or 'builtin:SIZE' (synthetic: small 60, medium 300, large 1500 questions; "
        "real: Python reference passages with hand-written questions; real-heldout: NumPy docstrings, "
        "real-heldout-readme: package READMEs, real-heldout-man: Unix manual pages and real-heldout-cmake: CMake's "
        "manuals and release notes, all four for final reporting only (real-heldout-cmake was built after every "
        "setting was chosen and no model has been run on it); icl: few-shot topic "
        "classification, demonstrations as documents in a shuffled order per question; icl-language: the same "
        "for language identification; icl-language-more: five other languages; icl-language-heldout and "
        "icl-language-heldout-wagtail: five more each, from two other packages' messages, for final reporting only), "
        "or a JSONL file of "
        "{question, answers, documents, gold} (default: builtin; with --fidelity builtin:real, gold first)",
    )
    d.add_argument("--limit", type=int, default=None, help="use the first N questions (after --skip)")
    d.add_argument(
        "--skip",
        type=int,
        default=0,
        help="leave out the first N questions: pick a setting with --limit N, check it with --skip N (default: 0)",
    )
    d.add_argument(
        "--pick-on",
        type=int,
        default=None,
        metavar="N",
        help="pick a setting on labelled questions of your own: every run on the first N questions, the one closest "
        "to the baseline (full) in its worst cell picked, then the baseline and the pick on the others, and the "
        'pick\'s `lazyattn serve` flags printed (docs/quality.md, "In-context learning")',
    )
    d.add_argument(
        "--num-docs",
        default=None,
        help="documents per question, comma-separated (gold + first distractors); 'all' keeps every "
        "document (default: 5 for builtin, all for the few-shot sets and a file)",
    )
    d.add_argument(
        "--gold-position",
        default=None,
        help="first, middle, last or original, comma-separated (default: first,middle,last for "
        "builtin, original for the few-shot sets and a file)",
    )
    d.add_argument("--data-seed", type=int, default=0, help="seed of the built-in set")
    d.add_argument("--hops", default="1,1,2", help="built-in question mix, cycled: 1 single-hop, 2 two-hop")
    d.add_argument(
        "--write-dataset",
        default=None,
        metavar="PATH",
        help="write the questions as JSONL (as the first cell shows them) and exit",
    )
    g = p.add_argument_group("prompt and decoding")
    g.add_argument(
        "--prompt-layout",
        choices=LAYOUTS,
        default=None,
        help="how documents and the question are framed (default: a builtin few-shot set's own, else "
        "block-attention; "
        "short-answer asks for a short answer, see docs/quality.md)",
    )
    g.add_argument("--system-prompt", default=None, help="override the layout's system prompt")
    g.add_argument("--question-format", default=None, help="override the layout's question wrapper ({question})")
    g.add_argument("--documents-in-user-turn", action="store_true", help="documents open the user turn")
    g.add_argument(
        "--plain-prompt",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="no chat template: the layout's completion_system_prompt, the documents and the question as plain "
        "text, as /v1/completions renders them (--question-format applies to chat prompts only; default: on for "
        "the builtin:icl-language sets, else off)",
    )
    g.add_argument("--max-tokens", type=int, default=32, help="answer tokens to generate, at most (default: 32)")
    g.add_argument(
        "--batch-size",
        type=int,
        default=1,
        help="questions per generate call (1: each TTFT is the request's own, nothing queued)",
    )
    g.add_argument(
        "--confidence",
        action="store_true",
        help="record each answer's mean token log-probability (eval.json `confidence`, what the choosing answer "
        "strategies rank candidates by): benchmarks/quality_surer_of.py keeps, per question, the surest of several "
        "runs' answers",
    )
    g.add_argument(
        "--guided-choice",
        action="store_true",
        help="answer a labelled question (one with `labels`, as the in-context-learning sets have) with one of its "
        "labels in every run: guided choice over the labels (SamplingParams.guided_choice), each with a leading "
        "space in a plain-text prompt that does not end in one",
    )
    f = p.add_argument_group("fidelity (lazyattn/eval/fidelity.py)")
    f.add_argument(
        "--fidelity",
        action="store_true",
        help="compare greedy answers and first-token distributions across dtypes (against each mode's float32 "
        "reference), batch sizes and modes, instead of scoring accuracy",
    )
    f.add_argument(
        "--dtypes",
        default=",".join(DTYPES),
        help=f"dtypes compared with the float32 reference (default: {','.join(DTYPES)})",
    )
    f.add_argument(
        "--batch-sizes",
        default="1,8,all",
        help="prompts per generate call, compared with the first (alone); the largest also serves the dtype and "
        "mode comparisons (default: 1,8,all)",
    )
    f.add_argument(
        "--batch-dtypes",
        default=None,
        help="dtypes also run at every batch size (default: the engine's, bfloat16 on CUDA, float32 on the CPU)",
    )
    c = p.add_argument_group("calibration (lazyattn/eval/calibrate.py)")
    c.add_argument(
        "--calibrate",
        action="store_true",
        help="pick the setting (ape_prefix, ape_temperature, ape_scale, ape_tilt, relink_last_tokens) that brings lazy "
        "mode closest to full attention, by first-token KL, instead of scoring accuracy; prompts are made from "
        "--calibrate-documents (--limit of them, --num-docs documents each), or taken from --dataset (a few-shot "
        "set's as plain text)",
    )
    c.add_argument(
        "--calibrate-documents",
        default=None,
        metavar="SOURCE",
        help="your documents: a folder of .txt/.md files, a JSONL of {'text', 'title'}, or 'jargon-file'",
    )
    c.add_argument(
        "--passage-chars", type=int, default=1000, help="longer documents are cut into passages (default: 1000)"
    )
    c.add_argument(
        "--temperatures", default="0.8,0.9,1,1.1", help="ape_temperature values tried (default: 0.8,0.9,1,1.1)"
    )
    c.add_argument("--scales", default="1", help="ape_scale values tried (default: 1)")
    c.add_argument("--tilts", default="0", help="ape_tilt values tried (default: 0)")
    c.add_argument(
        "--relink-last",
        default="0",
        help="relink_last_tokens values tried, each document's last rows recomputed in context (default: 0; few-shot "
        "demonstrations: e.g. 0,2,3,4,6)",
    )
    c.add_argument(
        "--calibrate-prefix",
        choices=("on", "off", "both"),
        default="both",
        help="ape_prefix values tried (default: both)",
    )
    o = p.add_argument_group("output")
    o.add_argument("--out", default=None, help="directory for eval.json, eval.md and accuracy.png")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    o.add_argument("--cpu-threads", type=int, default=1, help="torch intra-op threads when the device is the CPU")
    p.set_defaults(func=lambda args: cmd_eval(args, engine_options))


def cmd_eval(args: argparse.Namespace, engine_options: Callable[[argparse.Namespace], dict]) -> int:
    from lazyattn.eval import picks
    from lazyattn.eval.harness import GuidedLabels, RunSpec, evaluate, parse_option, plan_cells

    if args.fidelity and args.calibrate:
        raise InvalidRequestError("--fidelity and --calibrate are two different runs: give one", param="calibrate")
    if args.pick_on is not None and (args.fidelity or args.calibrate or args.write_dataset):
        other = "--fidelity" if args.fidelity else "--calibrate" if args.calibrate else "--write-dataset"
        raise InvalidRequestError(f"--pick-on is for accuracy runs, not with {other}", param="pick_on")
    if args.guided_choice and (args.fidelity or args.calibrate):
        other = "--fidelity" if args.fidelity else "--calibrate"
        raise InvalidRequestError(f"--guided-choice is for accuracy runs, not with {other}", param="guided_choice")
    if args.fidelity:
        if args.plain_prompt:
            raise InvalidRequestError("--plain-prompt is for accuracy and calibration runs only", param="plain_prompt")
        args.plain_prompt = False  # it compares chat prompts, a few-shot set's too
    if args.fidelity:
        from lazyattn.eval.fidelity_cli import cmd_fidelity

        return cmd_fidelity(args, engine_options)
    if args.calibrate:
        from lazyattn.eval.calibrate_cli import cmd_calibrate

        return cmd_calibrate(args, engine_options)
    if args.calibrate_documents:
        raise InvalidRequestError("--calibrate-documents is read only with --calibrate", param="calibrate_documents")
    args.dataset = args.dataset or "builtin"
    items, dataset_meta, num_docs, positions = load_questions(args)
    if args.write_dataset:
        cells, _ = plan_cells(items, num_docs, positions)
        from lazyattn.qa.dataset import write_jsonl

        write_jsonl(args.write_dataset, cells[0][1])
        print(f"wrote {len(cells[0][1])} questions ({cells[0][0].label}) to {args.write_dataset}")
        return 0
    runs = [
        RunSpec.parse(t)
        for t in (args.modes.split(",") if args.modes else [args.mode] if args.mode else list(reversed(MODES)))
    ]
    options = engine_options(args)
    options.pop("mode")
    options["random_weights"] = args.random_weights
    options.update(parse_option(o) for o in args.engine_option)
    if options["device"] == "cpu":
        import torch

        torch.set_num_threads(args.cpu_threads)  # see lazyattn bench: a shared CPU stalls intra-op threads
    layout = prompt_layout(args)

    from lazyattn import LLM, SamplingParams

    def make_llm(run: RunSpec) -> Any:
        return LLM(**{**options, "mode": run.mode, "layout": layout, "progress": False, **run.options})

    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, logprobs=0 if args.confidence else None)
    if args.guided_choice:
        params = GuidedLabels(params, args.plain_prompt)
    picking = args.pick_on is not None
    if picking:
        picks.check(args.pick_on, len(items), runs)
    shown = items[: args.pick_on] if picking else items
    cells, aliases = plan_cells(shown, num_docs, positions)
    print(
        f"lazyattn eval: model {args.model} on {options['device']}, runs {', '.join(r.label for r in runs)}\n"
        f"questions: {len(items)} ({describe_dataset(dataset_meta)}); cells: {'; '.join(c.label for c, _ in cells)}"
        + (f" (same as another, not re-run: {'; '.join(c.label for c in aliases)})" if aliases else "")
        + f"\nlayout: {args.prompt_layout}{', plain text' if args.plain_prompt else ''}; greedy, max "
        f"{args.max_tokens} tokens, batch {args.batch_size}\n"
        + (
            f"picking on the first {args.pick_on} questions, checking on the other {len(items) - args.pick_on}\n"
            if picking
            else ""
        ),
        flush=True,
    )

    def run(chosen: list[RunSpec], cells: list, aliases: dict) -> tuple[list, list, str, float]:
        """Every run of `chosen` over `cells`, printed; (results, comparisons, the tables in markdown, seconds)."""
        start = time.monotonic()
        results = evaluate(
            chosen, cells, make_llm, params, args.batch_size, progress=not args.no_progress, plain=args.plain_prompt
        )
        wall = time.monotonic() - start
        table_rows = report.rows(results)
        print(report.text_table(table_rows, report.table_columns(table_rows)))
        comparisons = report.comparisons(results)
        pivot = report.pivots(results, aliases, comparisons)
        print(f"\n{pivot}\n\n{len(results)} cells in {wall:.0f} s", flush=True)
        return (
            results,
            comparisons,
            f"{report.markdown_table(table_rows, report.table_columns(table_rows))}\n\n{pivot}",
            wall,
        )

    from lazyattn.eval import report

    results, comparisons, md, wall = run(runs, cells, aliases)
    pick = None
    if picking:
        chosen, baseline, best = picks.choose(comparisons, runs)
        rest, rest_aliases = plan_cells(items[args.pick_on :], num_docs, positions)
        print(f"\npicked {chosen.label}; checking it on the other {len(items) - args.pick_on} questions\n", flush=True)
        checked, check_comparisons, check_md, check_wall = run([baseline, chosen], rest, rest_aliases)
        wall += check_wall
        others = len(items) - args.pick_on
        pick = picks.record(args.pick_on, others, best, chosen, checked, check_comparisons, picks.chance(items))
        summary = picks.summary(pick)
        print(f"\n{summary}", flush=True)
        md = f"## Picked on the first {args.pick_on} questions\n\n{md}\n\n## Checked on the other " + (
            f"{len(items) - args.pick_on}\n\n{check_md}\n\n{summary}"
        )
    if args.out:
        out = Path(args.out)
        meta = {
            "command": " ".join(sys.argv),
            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "model": args.model,
            "engine_options": options,
            "layout": vars(layout),
            "plain_prompt": args.plain_prompt,
            "guided_choice": args.guided_choice,
            "max_tokens": args.max_tokens,
            "batch_size": args.batch_size,
            "wall_s": wall,
            "python": platform.python_version(),
            "host": platform.node(),
        }
        report.write_json(
            out / "eval.json",
            {
                "meta": meta,
                "dataset": dataset_meta,
                "runs": [
                    {
                        "label": r.label,
                        "mode": r.mode,
                        "options": r.options,
                        "answer": r.answer,
                        "confidence_tokens": r.confidence_tokens,
                    }
                    for r in runs
                ],
                "aliases": {c.label: a.label for c, a in aliases.items()},
                "comparisons": comparisons,
                "closest": report.closest(comparisons),
                "position_means": report.position_means(results),
                "cells": [r.to_dict() for r in results],
                **({"pick": pick} if pick else {}),
            },
        )
        (out / "eval.md").write_text(f"{md}\n")
        written = [out / "eval.json", out / "eval.md"]
        if report.plot_accuracy(
            results,
            out / "accuracy.png",
            aliases=aliases,
            title=f"{Path(args.model).name}: {describe_dataset(dataset_meta)}",
        ):
            written.append(out / "accuracy.png")
        print("wrote " + ", ".join(map(str, written)))
    return 0
