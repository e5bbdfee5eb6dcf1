"""`lazyattn demo | generate | serve | bench | eval | finetune` (also `python -m lazyattn ...`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from lazyattn import __version__
from lazyattn.bench.cli import add_bench_parser
from lazyattn.engine.config import EngineConfig
from lazyattn.eval.cli import add_eval_parser
from lazyattn.finetune.cli import add_finetune_parser
from lazyattn.server.cli import add_serve_parser


def _engine_fields() -> dict[str, dataclasses.Field]:
    """EngineConfig's fields the CLI offers (those with `cli` metadata), by name."""
    return {f.name: f for f in dataclasses.fields(EngineConfig) if "cli" in f.metadata}


def _add_engine_option(p: argparse.ArgumentParser, f: dataclasses.Field) -> None:
    """The option of one EngineConfig field: its flag, type, default and help from the field (engine/config.py)."""
    cli = f.metadata["cli"]
    kind = str(f.type).replace(" | None", "")
    shown = cli["shown"] if cli["shown"] is not None else "%(default)s"
    default = cli.get("default", f.default)
    kw: dict = {"default": default, "help": f"{cli['help']} (default: {shown})"}
    if kind == "bool":
        kw["action"] = argparse.BooleanOptionalAction
    else:
        kw["type"] = {"int": int, "float": float, "str": str}[kind]
    if cli["choices"]:
        kw["choices"] = list(cli["choices"])
    p.add_argument("--" + f.name.replace("_", "-"), *cli["flags"], **kw)


def _engine_args(p: argparse.ArgumentParser, mode: bool = True) -> None:
    """The engine's options, shared by generate, serve, bench and eval (bench and eval pick their modes: mode=False),
    one per EngineConfig field with `cli` metadata."""
    for name, f in _engine_fields().items():
        if name != "mode" or mode:
            _add_engine_option(p, f)


def add_tensor_parallel_arg(p: argparse.ArgumentParser) -> None:
    _add_engine_option(p, _engine_fields()["tensor_parallel_size"])


def engine_options(args: argparse.Namespace) -> dict:
    """EngineConfig's keyword arguments from parsed engine options; a field the parser did not offer keeps its
    default. The device is the GPU where one is present unless --device says otherwise."""
    options = {
        name: getattr(args, name, f.metadata["cli"].get("default", f.default)) for name, f in _engine_fields().items()
    }
    if options["device"] is None:
        import torch

        options["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    return options


def cmd_demo(args: argparse.Namespace) -> int:
    from lazyattn.demo import main

    return main(args.model, args.device or "cpu", tensor_parallel_size=args.tensor_parallel_size)


def cmd_generate(args: argparse.Namespace) -> int:
    from lazyattn.engine.llm import LLM
    from lazyattn.engine.prompt import PromptLayout
    from lazyattn.engine.sampling import SamplingParams

    documents = list(args.document)
    for path in args.document_file:
        try:
            with open(path, encoding="utf-8") as f:
                documents.append({"title": path, "text": f.read()})
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            print(f"error: --document-file {path}: {reason}", file=sys.stderr)
            return 2
    layout = PromptLayout(parse_special_tokens=args.parse_special_tokens)
    llm = LLM(**engine_options(args), layout=layout)
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.sampling_seed,
    )
    out = llm.generate([args.prompt], params, documents=[documents])[0]
    if args.json:
        m = out.metrics
        print(
            json.dumps(
                {
                    "text": out.text,
                    "token_ids": out.token_ids,
                    "finish_reason": out.finish_reason,
                    "prompt_tokens": out.num_document_tokens + len(out.prompt_token_ids),
                    "ttft_s": m.ttft,
                    "cached_tokens": m.cached_tokens,
                }
            )
        )
    else:
        print(out.text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lazyattn", description="RAG inference with deferred RoPE")
    parser.add_argument("--version", action="version", version=f"lazyattn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="a small RAG workload through every mode, side by side")
    p.add_argument(
        "--model",
        default="smollm2",
        help="smollm2 (fetched once, then cached), tiny (offline, random "
        "weights), a checkpoint directory or a .gguf file",
    )
    p.add_argument("--device", default=None, help="cuda or cpu (default: cpu)")
    add_tensor_parallel_arg(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("generate", help="one completion with documents")
    _engine_args(p)
    p.add_argument("prompt", help="the text that follows the documents (no chat template)")
    p.add_argument("--document", "-d", action="append", default=[], help="document text (repeatable)")
    p.add_argument(
        "--document-file",
        action="append",
        default=[],
        help="a UTF-8 file whose text is a document, titled with its path (repeatable)",
    )
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate, at most (default: 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass, in (0, 1] (default: 1)")
    p.add_argument("--top-k", type=int, default=-1, help="sample from the k likeliest tokens; -1: all (default)")
    p.add_argument("--sampling-seed", type=int, default=None, help="seed of this request's sampling")
    p.add_argument(
        "--parse-special-tokens",
        action="store_true",
        help="read special-token text in the prompt and documents (e.g. '<|eot_id|>') as control "
        "tokens; by default it is plain text",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (text, token ids, finish reason, prompt tokens, timing)",
    )
    p.set_defaults(func=cmd_generate)

    add_serve_parser(sub, _engine_args, engine_options)
    add_bench_parser(sub, _engine_args, engine_options)
    add_eval_parser(sub, _engine_args, engine_options)
    add_finetune_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from lazyattn.errors import LazyAttnError

    try:
        return args.func(args)
    except LazyAttnError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
