"""What `lazyattn eval` (eval/cli.py) and `lazyattn eval --fidelity` (eval/fidelity_cli.py) read from their
command line alike: the questions, the prompt layout, lists of names."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def prompt_layout(args: argparse.Namespace) -> Any:
    """The layout --prompt-layout names (a builtin few-shot set's own when not given), with the overrides applied;
    sets `args.plain_prompt` when not given (true for a set whose prompt is plain text)."""
    from dataclasses import replace

    from lazyattn.engine.prompt import PromptLayout
    from lazyattn.engine.prompt_layout import NAMED_LAYOUTS

    few_shot = icl_set(args.dataset)
    if args.prompt_layout is None:
        args.prompt_layout = few_shot.name if few_shot else "block-attention"
    if args.plain_prompt is None:
        args.plain_prompt = bool(few_shot and few_shot.plain)
    layouts = icl_layouts()
    base = (
        PromptLayout(**layouts[args.prompt_layout])
        if args.prompt_layout in layouts
        else NAMED_LAYOUTS[args.prompt_layout]
    )
    changes: dict[str, Any] = {}
    if args.system_prompt is not None:
        # a plain prompt has no system turn: the instruction is the text before the documents
        changes["completion_system_prompt" if args.plain_prompt else "system_prompt"] = args.system_prompt
    if args.question_format is not None:
        changes["question_format"] = args.question_format
    if args.documents_in_user_turn:
        changes["documents_in_user_turn"] = True
    return replace(base, **changes) if changes else base


def icl_set(dataset: str | None) -> Any:
    """The built-in few-shot set `dataset` names (`builtin:icl`, `builtin:icl-language`, `builtin:icl-language-more`,
    `builtin:icl-language-heldout`, `builtin:icl-language-heldout-wagtail`), or None."""
    from lazyattn.eval import icl

    prefix, _, name = (dataset or "").partition(":")
    return icl.SETS.get(name) if prefix == "builtin" else None


def icl_layouts() -> dict[str, dict[str, str]]:
    """--prompt-layout names of the few-shot sets' layouts (PromptLayout fields)."""
    from lazyattn.eval import icl

    return {name: s.layout for name, s in icl.SETS.items()}


def _ints_or_all(text: str, name: str) -> list[int | None]:
    from lazyattn.qa.dataset import DatasetError

    out: list[int | None] = []
    for t in text.split(","):
        t = t.strip()
        if t == "all":
            out.append(None)
        elif t.isdigit() and int(t) > 0:
            out.append(int(t))
        else:
            raise DatasetError(f"--{name}: expected positive integers or 'all', got {t!r}")
    return out


def load_questions(args: argparse.Namespace) -> tuple[list, dict[str, Any], list[int | None], list[str]]:
    """The items, a description of where they came from, the document counts and the gold positions: the questions
    after the first `--skip`, at most `--limit` of them (pick a setting on some questions, check it on the others)."""
    from lazyattn.qa.dataset import DatasetError

    skip = getattr(args, "skip", 0) or 0
    if skip < 0:
        raise DatasetError(f"--skip must be >= 0, got {skip}")
    if args.limit is not None and args.limit < 1:
        raise DatasetError(f"--limit must be >= 1, got {args.limit}")
    # read the first skip + limit, then drop the first `skip`
    items, meta, num_docs, positions = _load(args, None if args.limit is None else skip + args.limit)
    if skip:
        items = items[skip:]
        if not items:
            raise DatasetError(f"--skip {skip} leaves no question ({meta['questions']} read)")
        meta = {**meta, "questions": len(items), "skipped": skip}
    return items, meta, num_docs, positions


def _load(args: argparse.Namespace, limit: int | None) -> tuple[list, dict[str, Any], list[int | None], list[str]]:
    """What `load_questions` returns, of the first `limit` questions (None: all)."""
    from lazyattn.eval import icl, real
    from lazyattn.qa import synthetic
    from lazyattn.qa.dataset import POSITIONS, DatasetError, read_jsonl

    few_shot = icl_set(args.dataset)
    builtin = (args.dataset == "builtin" or args.dataset.startswith("builtin:")) and not few_shot
    num_docs = _ints_or_all(args.num_docs or ("5" if builtin else "all"), "num-docs")
    positions = [s.strip() for s in (args.gold_position or ("first,middle,last" if builtin else "original")).split(",")]
    bad = [s for s in positions if s not in POSITIONS]
    if bad:
        raise DatasetError(f"--gold-position: unknown {', '.join(bad)}; choose from {', '.join(POSITIONS)}")
    if few_shot:
        # No document holds the answer: the demonstrations come in each question's own shuffled order.
        if positions != ["original"]:
            raise DatasetError(f"--gold-position: builtin:{few_shot.name} has no gold documents; use original")
        header, items = icl.load(limit, few_shot)
        if any(n is not None and n > header["demonstrations"] for n in num_docs):
            raise DatasetError(f"--num-docs: builtin:{few_shot.name} has {header['demonstrations']} demonstrations")
        meta = {"builtin": few_shot.name, "questions": len(items), "of": header["questions"]}
        meta |= real.source_meta(header)
        return items, meta, num_docs, positions
    if not builtin:
        items = read_jsonl(args.dataset, limit)
        return items, {"file": str(Path(args.dataset).resolve()), "questions": len(items)}, num_docs, positions
    size = args.dataset.partition(":")[2] or "small"
    if size in real.SETS:
        header, items = real.load(size, limit)
        too_many = [n for n in num_docs if n is not None and n > real.MAX_DISTRACTORS + 1]
        if too_many:
            raise DatasetError(f"--num-docs: builtin:{size} has {real.MAX_DISTRACTORS + 1} documents per question")
        meta = {"builtin": size, "questions": len(items), "of": header["questions"], **real.source_meta(header)}
        return items, meta, num_docs, positions
    if size not in synthetic.SIZES:
        choices = ", ".join([*synthetic.SIZES, *real.SETS, *icl.SETS])
        raise DatasetError(f"unknown built-in size {size!r}; choose from {choices}")
    if None in num_docs:
        raise DatasetError("--num-docs all needs a dataset file; the built-in set is generated per count")
    n = min(limit, synthetic.SIZES[size]) if limit else synthetic.SIZES[size]
    try:
        hops = tuple(int(h) for h in args.hops.split(","))
    except ValueError:
        raise DatasetError(f"--hops: expected 1s and 2s, comma-separated, got {args.hops!r}") from None
    # Generated once with the most documents asked for: smaller counts show a prefix of its distractors.
    items = synthetic.generate(n, max(num_docs), "first", seed=args.data_seed, split="eval", hops=hops)
    meta = {"builtin": size, "questions": n, "seed": args.data_seed, "split": "eval", "hops": list(hops)}
    return items, meta, num_docs, positions


def describe_dataset(meta: dict[str, Any]) -> str:
    """One line on where the questions came from (`load_questions`' meta)."""
    if "source" in meta:
        return f"built-in {meta['builtin']} ({meta['source']}, {meta['license']}), {meta['questions']} questions"
    if "builtin" in meta:
        return f"built-in {meta['builtin']}, seed {meta['seed']}, {meta['questions']} questions"
    return f"{meta['file']}, {meta['questions']} questions"


def parse_names(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    """Comma-separated names of `allowed` (each once, in the order given), given with --`flag`."""
    from lazyattn.errors import InvalidRequestError

    names = list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise InvalidRequestError(
            f"--{flag}: unknown {', '.join(bad) or 'empty list'}; choose from {', '.join(allowed)}"
        )
    return names
