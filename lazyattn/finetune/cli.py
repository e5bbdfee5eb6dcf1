"""`lazyattn finetune`: the command line of train.py (docs/finetune.md)."""

from __future__ import annotations

import argparse
import math
import shlex
import sys

from lazyattn.errors import InvalidRequestError
from lazyattn.finetune.config import (
    ATTENTION,
    DEFAULT_KINDS,
    DEFAULT_TARGETS,
    QUESTION_KINDS,
    SPANS,
    TEACHERS,
    DistillConfig,
    FinetuneConfig,
)
from lazyattn.finetune.corpus import JARGON_FILE, STDLIB_DOCSTRINGS
from lazyattn.finetune.few_shot import SPHINX_LANGUAGES


def add_finetune_parser(sub) -> None:
    d = FinetuneConfig()
    p = sub.add_parser(
        "finetune",
        help="adapt a checkpoint to block attention (LoRA by default)",
        description="Train a checkpoint for block attention on RAG examples (docs/finetune.md).",
    )
    p.add_argument(
        "--model", default=d.model, help="base: a named model, a .gguf file, a checkpoint directory or 'tiny'"
    )
    p.add_argument("--out", required=True, help="output directory (adapter, or merged model with --merge)")
    p.add_argument(
        "--data",
        default=d.data,
        help="'builtin' (generated, training split) or a JSONL file in the `lazyattn eval` format",
    )
    p.add_argument("--examples", type=int, default=d.examples, help="items to draw (builtin) or read (file)")
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="examples per step (default: %(default)s)")
    p.add_argument("--lr", type=float, default=None, help="default: 5e-4 LoRA, 2e-5 full")
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=d.warmup_steps,
        help="linear learning-rate warm-up steps (default: %(default)s)",
    )
    p.add_argument(
        "--full-share", type=float, default=d.full_share, help="share of rows trained with ordinary causal attention"
    )
    p.add_argument("--lora-rank", type=int, default=d.lora_rank, help="LoRA rank (default: %(default)s)")
    p.add_argument("--lora-alpha", type=float, default=d.lora_alpha, help="LoRA scaling alpha (default: %(default)s)")
    p.add_argument(
        "--lora-dropout", type=float, default=d.lora_dropout, help="dropout on the LoRA inputs (default: %(default)s)"
    )
    p.add_argument("--lora-targets", default=",".join(DEFAULT_TARGETS), help="comma-separated module names")
    p.add_argument("--full", action="store_true", help="train every weight instead of LoRA adapters")
    p.add_argument(
        "--init-adapter",
        default=None,
        help="continue this LoRA adapter over --model (a directory or a named adapter, e.g. smollm2-block) instead of "
        "a fresh one; its rank, alpha and targets are kept",
    )
    p.add_argument(
        "--merge", action="store_true", help="fold the adapter into the weights (adapter kept in OUT/adapter)"
    )
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument(
        "--seed", type=int, default=d.seed, help="seed of the data order and the adapter's init (default: %(default)s)"
    )
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help="drop longer examples")
    p.add_argument(
        "--attention",
        default=d.attention,
        choices=ATTENTION,
        help="transformers' attention over the training rows: sdpa (PyTorch's fused kernels, memory linear in the "
        "row length) or eager (a score tensor of length² per row and head) (default: %(default)s)",
    )
    p.add_argument("--max-minutes", type=float, default=None, help="stop training after this long, then save")
    p.add_argument(
        "--save-dtype",
        default=d.save_dtype,
        choices=["bfloat16", "float16", "float32"],
        help="dtype of the saved adapter or merged weights (default: %(default)s)",
    )
    p.add_argument(
        "--ape-prefix",
        action="store_true",
        help="block rows as lazy mode with ape_prefix=True serves them: documents read the first segment "
        "(system prompt), encoded after it (docs/finetune.md)",
    )
    p.add_argument(
        "--prompt-layouts",
        default="block-attention",
        help="comma-separated prompt layouts (those of `lazyattn eval --prompt-layout`), taken in turn by the "
        "examples, labelled and distilled (default: %(default)s)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_distill_arguments(p)
    p.set_defaults(func=cmd_finetune)


def _add_distill_arguments(p: argparse.ArgumentParser) -> None:
    d = DistillConfig(documents="-")
    g = p.add_argument_group("distillation (docs/finetune.md, Distillation)")
    g.add_argument(
        "--distill",
        action="store_true",
        help="train block attention to match the checkpoint's own full attention (KL) on your documents",
    )
    g.add_argument(
        "--documents",
        default=None,
        help=f"a folder of .txt/.md files, a JSONL of {{'text', 'title'}} documents, '{JARGON_FILE}' (real prose, "
        f"public domain) or '{STDLIB_DOCSTRINGS}'",
    )
    g.add_argument(
        "--questions", default=None, help="a JSONL of {'question', 'documents', 'answers'?}; default: made from docs"
    )
    g.add_argument(
        "--few-shot",
        default=None,
        metavar="TEXTS",
        help=f"make plain few-shot prompts, the demonstrations as documents, from labelled texts: '{SPHINX_LANGUAGES}' "
        "(built in) or a JSONL of {'text', 'label'} (docs/finetune.md, Few-shot prompts)",
    )
    g.add_argument(
        "--prompts", type=int, default=d.prompts, help="prompts made from the documents or texts (%(default)s)"
    )
    g.add_argument(
        "--docs-per-prompt",
        default=",".join(map(str, d.docs_per_prompt)),
        help="documents per made prompt, drawn from this list (default: %(default)s)",
    )
    g.add_argument(
        "--passage-chars", type=int, default=d.passage_chars, help="cut longer documents (default: %(default)s)"
    )
    g.add_argument(
        "--question-kinds",
        default=",".join(DEFAULT_KINDS),
        help=f"kinds of made questions, drawn in equal shares: some of {','.join(QUESTION_KINDS)} "
        "(docs/finetune.md; default: %(default)s)",
    )
    g.add_argument(
        "--write-questions",
        default=None,
        metavar="FILE",
        help="write the made prompts that carry an answer (cloze) as a JSONL in the `lazyattn eval` format, then "
        "exit without training (for --data, or to evaluate on)",
    )
    g.add_argument(
        "--answer-tokens", type=int, default=d.answer_tokens, help="teacher's greedy answer length (%(default)s)"
    )
    g.add_argument("--kl-temperature", type=float, default=d.temperature, help="softens both distributions")
    g.add_argument(
        "--teacher",
        default=d.teacher,
        choices=TEACHERS,
        help="base: the frozen checkpoint (adapter off); start: the model as training starts (with --init-adapter, "
        "that adapter), frozen; self: the model being trained, full attention, no gradient",
    )
    g.add_argument(
        "--distill-full-share",
        type=float,
        default=d.full_share,
        help="share of distilled rows read with full attention, matched to a frozen teacher (default: %(default)s)",
    )
    g.add_argument("--distill-span", default=d.span, choices=SPANS, help="positions distilled (%(default)s)")
    g.add_argument("--held-out", type=int, default=d.held_out, help="prompts kept out to report the KL (%(default)s)")
    g.add_argument(
        "--labelled-share",
        type=float,
        default=None,
        help="with --distill: share of rows from --data, the labelled recipe (default: 0)",
    )
    g.add_argument(
        "--labelled-weight", type=float, default=1.0, help="weight of the labelled loss beside the KL (default: 1)"
    )


def _distill_config(args: argparse.Namespace) -> DistillConfig | None:
    if not args.distill:
        if args.documents or args.questions or args.few_shot:
            raise InvalidRequestError(
                "--documents, --questions and --few-shot are read only with --distill", param="distill"
            )
        return None
    if args.few_shot is not None:
        # these shape prompts made from documents: given with --few-shot they would be silently ignored
        d = DistillConfig(documents="-")
        defaults = {
            "docs_per_prompt": ",".join(map(str, d.docs_per_prompt)),
            "passage_chars": d.passage_chars,
            "question_kinds": ",".join(d.kinds),
        }
        given = [f"--{k.replace('_', '-')}" for k, v in defaults.items() if getattr(args, k) != v]
        if given:
            raise InvalidRequestError(
                f"{', '.join(given)} shape prompts made from --documents; few-shot prompts draw their own "
                "(docs/finetune.md, Few-shot prompts)",
                param="few_shot",
            )
    try:
        docs_per_prompt = tuple(int(k) for k in args.docs_per_prompt.split(",") if k)
    except ValueError as e:
        raise InvalidRequestError("--docs-per-prompt takes counts like 2,3,5", param="docs_per_prompt") from e
    return DistillConfig(
        documents=args.documents,
        questions=args.questions,
        few_shot=args.few_shot,
        prompts=args.prompts,
        docs_per_prompt=docs_per_prompt,
        passage_chars=args.passage_chars,
        answer_tokens=args.answer_tokens,
        temperature=args.kl_temperature,
        teacher=args.teacher,
        full_share=args.distill_full_share,
        span=args.distill_span,
        held_out=args.held_out,
        kinds=tuple(k for k in args.question_kinds.split(",") if k),
    )


def cmd_finetune(args: argparse.Namespace) -> int:
    from lazyattn.engine.prompt_layout import named_layouts

    if args.write_questions is not None:
        return _write_questions(args)
    from lazyattn.finetune.train import finetune

    cfg = FinetuneConfig(
        model=args.model,
        out=args.out,
        data=args.data,
        examples=args.examples,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        full_share=args.full_share,
        lora_rank=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        lora_targets=tuple(t for t in args.lora_targets.split(",") if t),
        full_finetune=args.full,
        init_adapter=args.init_adapter,
        merge=args.merge,
        device=args.device,
        seed=args.seed,
        max_tokens=args.max_tokens,
        attention=args.attention,
        save_dtype=args.save_dtype,
        max_seconds=None if args.max_minutes is None else 60 * args.max_minutes,
        progress=not args.no_progress,
        distill=_distill_config(args),
        labelled_share=args.labelled_share,
        labelled_weight=args.labelled_weight,
        layouts=named_layouts(args.prompt_layouts),
        ape_prefix=args.ape_prefix,
    )
    result = finetune(cfg, command="lazyattn finetune " + shlex.join(sys.argv[2:]))
    first, last = first_and_last_loss(result.losses)
    print(
        f"loss {first:.3f} -> {last:.3f} over {len(result.losses)} steps, "
        f"{result.tokens:,} tokens in {result.seconds:.0f} s ({result.tokens / result.seconds:,.0f} tok/s); "
        f"saved to {result.out}"
    )
    if result.held_out_kl_before is not None:
        print(f"distillation KL on held-out prompts {result.held_out_kl_before:.4f} -> {result.held_out_kl_after:.4f}")
    return 0


def _write_questions(args: argparse.Namespace) -> int:
    from lazyattn.finetune.distill import load_prompts
    from lazyattn.finetune.prompts import write_questions

    cfg = _distill_config(args)
    if cfg is None or cfg.documents is None:
        raise InvalidRequestError("--write-questions writes prompts made by --distill --documents", param="distill")
    prompts = load_prompts(cfg, args.seed)
    n = write_questions(prompts, args.write_questions)
    if n == 0:
        raise InvalidRequestError(
            "none of the made prompts carries an answer: add cloze to --question-kinds", param="question_kinds"
        )
    print(f"wrote {n} of {len(prompts)} made prompts (those with an answer) to {args.write_questions}")
    return 0


def first_and_last_loss(losses: list[float]) -> tuple[float, float]:
    """The mean loss of the first and of the last steps: 10 each, or with 20 steps or fewer each half (the two
    never share a step, so a short run shows where its loss went)."""
    if not losses:
        return math.nan, math.nan
    k = max(1, min(10, len(losses) // 2))
    return sum(losses[:k]) / k, sum(losses[-k:]) / k
