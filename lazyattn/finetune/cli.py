"""`lazyattn finetune`: the command line of train.py (docs/finetune.md)."""

from __future__ import annotations

import argparse
import math
import shlex
import sys

from lazyattn.finetune.train import DEFAULT_TARGETS, FinetuneConfig


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
        "--merge", action="store_true", help="fold the adapter into the weights (adapter kept in OUT/adapter)"
    )
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument(
        "--seed", type=int, default=d.seed, help="seed of the data order and the adapter's init (default: %(default)s)"
    )
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help="drop longer examples")
    p.add_argument("--max-minutes", type=float, default=None, help="stop training after this long, then save")
    p.add_argument(
        "--save-dtype",
        default=d.save_dtype,
        choices=["bfloat16", "float16", "float32"],
        help="dtype of the saved adapter or merged weights (default: %(default)s)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_finetune)


def cmd_finetune(args: argparse.Namespace) -> int:
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
        merge=args.merge,
        device=args.device,
        seed=args.seed,
        max_tokens=args.max_tokens,
        save_dtype=args.save_dtype,
        max_seconds=None if args.max_minutes is None else 60 * args.max_minutes,
        progress=not args.no_progress,
    )
    result = finetune(cfg, command="lazyattn finetune " + shlex.join(sys.argv[2:]))
    first, last = first_and_last_loss(result.losses)
    print(
        f"loss {first:.3f} -> {last:.3f} over {len(result.losses)} steps, "
        f"{result.tokens:,} tokens in {result.seconds:.0f} s ({result.tokens / result.seconds:,.0f} tok/s); "
        f"saved to {result.out}"
    )
    return 0


def first_and_last_loss(losses: list[float]) -> tuple[float, float]:
    """The mean loss of the first and of the last steps: 10 each, or with 20 steps or fewer each half (the two
    never share a step, so a short run shows where its loss went)."""
    if not losses:
        return math.nan, math.nan
    k = max(1, min(10, len(losses) // 2))
    return sum(losses[:k]) / k, sum(losses[-k:]) / k
