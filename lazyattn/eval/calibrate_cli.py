"""`lazyattn eval --calibrate` (lazyattn/eval/calibrate.py holds the measurement): the prompts and the grid from the
command line, the run, and calibrate.{json,md} under --out."""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

from lazyattn.errors import InvalidRequestError
from lazyattn.eval.inputs import describe_dataset, load_questions, prompt_layout

DEFAULT_PROMPTS = 150  # made prompts, about 50 per gold position


def cmd_calibrate(args: argparse.Namespace, engine_options: Callable[[argparse.Namespace], dict]) -> int:
    from lazyattn import LLM, SamplingParams
    from lazyattn.bench.report import write_json
    from lazyattn.eval import calibrate
    from lazyattn.eval.harness import parse_option

    prompts, source = _prompts(args)
    settings = calibrate.grid(
        args.calibrate_prefix,
        _numbers(args.temperatures),
        _numbers(args.scales),
        _numbers(args.tilts),
        _numbers(args.relink_last, int, "whole numbers"),
    )
    options = engine_options(args)
    options.pop("mode")
    options["random_weights"] = args.random_weights
    options.update(parse_option(o) for o in args.engine_option)
    if options["device"] == "cpu":
        import torch

        torch.set_num_threads(args.cpu_threads)
    layout = prompt_layout(args)

    def make(mode: str) -> Callable[[], LLM]:
        return lambda: LLM(**{**options, "mode": mode, "layout": layout, "progress": False})

    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, first_token_logprobs=True)
    print(
        f"lazyattn eval --calibrate: model {args.model} on {options['device']}, {len(prompts)} prompts ({source}), "
        f"layout {args.prompt_layout}{', plain text' if args.plain_prompt else ''}; {len(settings)} lazy-mode "
        "settings against full attention\n",
        flush=True,
    )
    start = time.monotonic()
    cal = calibrate.calibrate(
        make("full"), make("lazy"), prompts, settings, params, args.batch_size, progress=lambda s: print(s, flush=True)
    )
    wall = time.monotonic() - start
    table = calibrate.markdown(cal)
    chosen = cal.chosen
    flags = chosen.serve_flags or "(none: plain lazy mode)"
    print(f"\n{table}\n\nchosen: {chosen.label}\n  lazyattn serve ... {flags}\n  LLM(..., {_kwargs(chosen)})")
    close = calibrate.overlapping(cal)
    caveat = (
        f"{len(close)} of the other {len(settings) - 1} settings have mean-KL intervals that overlap the chosen one's: "
        f"these {len(prompts)} prompts do not tell them apart (more prompts: --limit)"
        if close
        else "the chosen setting's mean-KL interval overlaps no other's"
    )
    print(f"{caveat}\n{len(prompts)} prompts, {len(settings)} settings in {wall:.0f} s", flush=True)
    if args.out:
        out = Path(args.out)
        command = "lazyattn " + shlex.join(sys.argv[1:])
        meta = {
            "command": command,
            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "model": args.model,
            "engine_options": {k: v for k, v in options.items() if k != "env"},
            "layout": vars(layout),
            "prompts": source,
            "plain_prompt": bool(args.plain_prompt),
            "max_tokens": args.max_tokens,
            "wall_s": wall,
            "python": platform.python_version(),
            "host": platform.node(),
        }
        write_json(
            out / "calibrate.json",
            {
                "meta": meta,
                "chosen": {**chosen.options, "serve_flags": chosen.serve_flags},
                "overlapping": [s.label for s in close],
                "settings": [r.row() for r in cal.results],
            },
        )
        (out / "calibrate.md").write_text(
            f"# APE calibration: {Path(args.model).name}, {source}\n\n```bash\n{command}\n```\n\n{table}\n\n"
            f"Chosen (lowest mean KL at its worst gold position): {chosen.label}: `lazyattn serve ... {flags}`; "
            f"{caveat}.\n"
        )
        print(f"wrote {out / 'calibrate.json'}, {out / 'calibrate.md'}")
    return 0


def _prompts(args: argparse.Namespace) -> tuple[list, str]:
    """Made from --calibrate-documents, or the questions of --dataset (its cells, gold positions as they name)."""
    from lazyattn.eval.calibrate import CalibrationPrompt, position_of

    if args.calibrate_documents:
        from lazyattn.finetune.corpus import passages, read_documents
        from lazyattn.finetune.prompts import make_prompts

        k = _num_docs(args)
        docs = passages(read_documents(args.calibrate_documents), args.passage_chars)
        made = make_prompts(docs, args.limit or DEFAULT_PROMPTS, (k,), args.data_seed)
        prompts = [
            CalibrationPrompt(
                [{"role": "user", "content": p.question}],
                list(p.documents),
                position_of(p.gold, k),
                p.question if args.plain_prompt else None,
            )
            for p in made
        ]
        return prompts, f"made from {args.calibrate_documents}, {k} documents each"
    from lazyattn.eval.harness import messages_for, plan_cells

    args.dataset = args.dataset or "builtin"
    items, dataset_meta, num_docs, positions = load_questions(args)
    cells, _ = plan_cells(items, num_docs, positions)
    prompts = [  # a few-shot set's prompts as it is scored: plain text (load_questions sets args.plain_prompt)
        CalibrationPrompt(
            messages_for(item), list(item.documents), cell.position, item.question if args.plain_prompt else None
        )
        for cell, shown in cells
        for item in shown
    ]
    return prompts, describe_dataset(dataset_meta)


def _num_docs(args: argparse.Namespace) -> int:
    text = args.num_docs or "5"
    try:
        k = int(text)
    except ValueError as e:
        raise InvalidRequestError(
            f"--num-docs with --calibrate-documents takes one count, got {text!r}", param="num_docs"
        ) from e
    if k < 1:
        raise InvalidRequestError(f"--num-docs must be at least 1, got {k}", param="num_docs")
    return k


def _numbers(text: str, kind: type = float, what: str = "numbers") -> list:
    try:
        return [kind(t) for t in text.split(",") if t.strip()]
    except ValueError as e:
        raise InvalidRequestError(f"expected comma-separated {what}, got {text!r}", param="calibrate") from e


def _kwargs(setting) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in setting.options.items())
