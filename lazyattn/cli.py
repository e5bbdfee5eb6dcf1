"""`lazyattn demo | generate | serve | bench | eval | finetune | models` (also `python -m lazyattn ...`).

Only the command being run is imported (its module, and torch if it runs a model), so `lazyattn --version` and
`lazyattn -h`, and the help of the commands that run no model at import, answer at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from lazyattn import __version__
from lazyattn.engine.config import EngineConfig


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


# One line per command, for `lazyattn -h` (each command's parser repeats its own; tests check they agree).
COMMANDS = {
    "demo": "a small RAG workload through every mode, side by side",
    "generate": "one answer (or completion) with documents",
    "serve": "OpenAI-compatible HTTP server with documents as inputs",
    "bench": "RAG serving benchmark: one seeded trace replayed through every mode",
    "eval": "RAG question-answering accuracy per attention mode",
    "finetune": "adapt a checkpoint to block attention (LoRA by default)",
    "models": "the named models that --model takes",
}
# The commands that answer questions share one default model, a real one: tiny's random weights answer with noise.
ANSWERING = ("demo", "generate", "serve", "eval")
DEFAULT_MODEL = "smollm2"
RUNS_A_MODEL = (*ANSWERING, "bench", "finetune")
# `--model`'s help names the models of lazyattn/model/hub.py without importing it (that would import torch);
# a test checks that it names every one.
MODEL_HELP = (
    "a named model: smollm2 (SmolLM2-135M-Instruct, fetched once), smollm2-block (smollm2 with the shipped "
    "block-attention adapter), smollm2-block-prefix (smollm2 with the adapter trained for lazy mode with the shared "
    "prefix), tiny (built in, random weights: noise; tests and benchmarks); `lazyattn models` "
    "lists them. Or a path: a Hugging Face checkpoint directory, a .gguf file, an adapter folder from `lazyattn "
    "finetune`; a path that exists wins over a name (default: %(default)s)"
)


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
    from lazyattn.engine.best_document import check_answer
    from lazyattn.engine.llm import LLM
    from lazyattn.engine.prompt import PromptLayout
    from lazyattn.engine.sampling import SamplingParams

    check_answer(args.answer, confidence_tokens=args.confidence_tokens)  # before the model loads: costs nothing
    asked = dict(answer=args.answer, confidence_tokens=args.confidence_tokens)
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
    # The progress bar is for a person at a terminal, not for a log file or a pipe.
    llm = LLM(**engine_options(args), layout=layout, progress=sys.stderr.isatty())
    has_template = llm.tokenizer.chat_template is not None
    if args.chat and not has_template:
        print(f"error: --chat: {args.model} has no chat template; --no-chat sends the prompt as is", file=sys.stderr)
        return 2
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.sampling_seed,
        guided_choice=args.choice,
    )
    chat = has_template if args.chat is None else args.chat
    if chat:
        out = llm.chat([{"role": "user", "content": args.prompt}], params, documents=[documents], **asked)[0]
    else:
        out = llm.generate([args.prompt], params, documents=[documents], **asked)[0]
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
                    "answered_from": out.answered_from,
                    "document_order": out.document_order,
                    "read_in_parallel": out.read_in_parallel,
                }
            )
        )
    else:
        print(out.text)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from lazyattn.model import hub

    rows = [("tiny", "built in: random weights, offline; its answers are noise (tests, benchmarks)")]
    for name, spec in hub.NAMED_MODELS.items():
        where = hub.cached_path(spec)
        state = f"cached at {where}" if where.is_file() else f"fetched on first use ({spec.size / 1e6:.0f} MB)"
        rows.append((name, f"{spec.description}; {state}"))
    for name, trained_for in hub.NAMED_ADAPTERS.items():
        rows.append((name, f"{_adapter_base(name)} with {trained_for}; {hub.ADAPTERS_DIR / name}"))
    width = max(len(name) for name, _ in rows)
    print("Named models (--model NAME):")
    for name, text in rows:
        print(f"  {name:<{width}}  {text}")
    print(
        "Or a path: a Hugging Face checkpoint directory, a .gguf file, or an adapter folder from `lazyattn finetune`. "
        "A path that exists wins over a name."
    )
    return 0


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help=COMMANDS["demo"])
    p.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cpu)")
    add_tensor_parallel_arg(p)
    p.set_defaults(func=cmd_demo)


def add_generate_parser(sub: argparse._SubParsersAction) -> None:
    from lazyattn.engine.best_document import ANSWER_STRATEGIES

    p = sub.add_parser("generate", help=COMMANDS["generate"])
    _engine_args(p)
    p.add_argument(
        "prompt",
        help="the question or instruction: a user turn of the model's chat template (see --chat), or with "
        "--no-chat the raw text that follows the documents",
    )
    p.add_argument("--document", "-d", action="append", default=[], help="document text (repeatable)")
    p.add_argument(
        "--document-file",
        action="append",
        default=[],
        help="a UTF-8 file whose text is a document, titled with its path (repeatable)",
    )
    p.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="send the prompt as a user message through the checkpoint's chat template (as LLM.chat); --no-chat: "
        "a raw completion of the prompt text (default: chat when the checkpoint has a chat template)",
    )
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate, at most (default: 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass, in (0, 1] (default: 1)")
    p.add_argument("--top-k", type=int, default=-1, help="sample from the k likeliest tokens; -1: all (default)")
    p.add_argument("--sampling-seed", type=int, default=None, help="seed of this request's sampling")
    p.add_argument(
        "--choice",
        action="append",
        default=None,
        help="the answer is one of these strings (repeatable; guided choice, docs/design.md), each as the tokenizer "
        "splits it alone",
    )
    p.add_argument(
        "--answer",
        choices=ANSWER_STRATEGIES,
        default="joint",
        help="joint: one request over all the documents (default); best-document: the prompt asked once per "
        "document alone, the most confident answer kept (--json names its document: answered_from); "
        "best-document-or-joint: the same, the prompt as given one more candidate; confidence-order: those "
        "one-document answers order the documents, the surest last, for one joint answer (--json: document_order); "
        "confidence-order-or-joint: the same, the prompt as given kept where its answer is as sure; each-last: the "
        "prompt as given and once with each other document moved last, in one round, the surest answer kept "
        "(--json: document_order); both-orders: the prompt as given and with its documents reversed, in one round, "
        "the surer answer kept (--json: document_order); both-placements (lazy mode): the documents read in order "
        "and in parallel, in one round, the surer answer kept (--json: read_in_parallel)",
    )
    p.add_argument(
        "--confidence-tokens",
        type=int,
        default=None,
        metavar="K",
        help="with a confidence-order --answer: the one-document answers that order the documents stop after K "
        "tokens (default: the whole answer); with another --answer but joint: the candidates are ranked by their "
        "first K tokens and all but the surest stop there",
    )
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


def add_models_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help=COMMANDS["models"])
    p.set_defaults(func=cmd_models)


def _add_command(sub: argparse._SubParsersAction, name: str) -> None:
    """Add the full parser of command `name`, importing its module."""
    if name == "demo":
        add_demo_parser(sub)
    elif name == "generate":
        add_generate_parser(sub)
    elif name == "models":
        add_models_parser(sub)
    elif name == "serve":
        from lazyattn.server.cli import add_serve_parser

        add_serve_parser(sub, _engine_args, engine_options, _serve_replicas)
    elif name == "bench":
        from lazyattn.bench.cli import add_bench_parser

        add_bench_parser(sub, _engine_args, engine_options)
    elif name == "eval":
        from lazyattn.eval.cli import add_eval_parser

        add_eval_parser(sub, _engine_args, engine_options)
    elif name == "finetune":
        from lazyattn.finetune.cli import add_finetune_parser

        add_finetune_parser(sub)
    else:
        raise ValueError(name)
    p = sub.choices[name]
    model = next((a for a in p._actions if "--model" in a.option_strings), None)
    if model is not None and name != "finetune":  # finetune's --model is the base it trains
        model.help = MODEL_HELP
        if name in ANSWERING:
            model.default = DEFAULT_MODEL
    if name in RUNS_A_MODEL and "cpu_threads" not in {a.dest for a in p._actions}:  # eval has its own
        threads = p.get_default("cpu_threads")  # None, or the command's own (bench: 1)
        p.add_argument(
            "--cpu-threads",
            type=int,
            help="torch's CPU threads (torch.set_num_threads); on a busy host fewer can be faster "
            f"(default: {threads or 'torch chooses, one per core'})",
        )


def build_parser(commands: list[str] | None = None) -> argparse.ArgumentParser:
    """The `lazyattn` parser, with the full parsers of `commands` (None: all) and the one-line help of the rest."""
    parser = argparse.ArgumentParser(prog="lazyattn", description="RAG inference with deferred RoPE")
    parser.add_argument("--version", action="version", version=f"lazyattn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in COMMANDS.items():
        if commands is None or name in commands:
            _add_command(sub, name)
        else:
            sub.add_parser(name, help=text, add_help=False)
    return parser


def local_or_named(model: str) -> str:
    """`model` as the loader should read it: a path that exists is that path, also where a named model has the
    same name (e.g. the `--out smollm2-block` of a fine-tune beside the shipped `smollm2-block`)."""
    from lazyattn.model import hub

    named = model in hub.model_names()
    return str(Path(model).resolve()) if named and os.path.exists(model) else model


def say_which_model(command: str, given: str, model: str) -> None:
    """One line on stderr naming what `--model given` loads, where that is not just the path the user typed."""
    from lazyattn.model import hub

    if model != given:
        text = f"the local {'directory' if os.path.isdir(model) else 'file'} {model} (not the named model {given})"
    elif model in hub.NAMED_ADAPTERS:
        text = f"{_adapter_base(model)} with the shipped adapter {hub.ADAPTERS_DIR / model}"
    elif model in hub.NAMED_MODELS:
        text = f"{hub.NAMED_MODELS[model].description}"
    elif model == "tiny" and command in ANSWERING:
        text = "built in, random weights: its answers are noise (--model smollm2 answers questions)"
        print(f"lazyattn: warning: --model tiny is {text}", file=sys.stderr, flush=True)
        return
    else:
        return
    print(f"lazyattn: --model {given}: {text}", file=sys.stderr, flush=True)


def _adapter_base(name: str) -> str:
    from lazyattn.model import hub
    from lazyattn.model.adapter import CONFIG_FILE

    config = json.loads((hub.ADAPTERS_DIR / name / CONFIG_FILE).read_text(encoding="utf-8"))
    return config["base_model_name_or_path"]


def _serve_replicas(args: argparse.Namespace, options: dict, server: dict) -> int:
    """`serve --replicas N`: Ray Serve replicas behind one ingress (cluster/cli.py; imported only when asked)."""
    from lazyattn.cluster.cli import serve_replicas

    return serve_replicas(args, options, server)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # The first word that is no option names the command (the top level's options take no values).
    command = next((a for a in argv if not a.startswith("-")), None)
    from lazyattn.errors import InvalidRequestError, LazyAttnError

    try:
        args = build_parser([command] if command in COMMANDS else []).parse_args(argv)
        if getattr(args, "model", None):
            given = args.model
            args.model = local_or_named(given)
            say_which_model(args.command, given, args.model)
        threads = getattr(args, "cpu_threads", None)
        if threads is not None:
            if threads < 1:
                raise InvalidRequestError(f"--cpu-threads must be >= 1, got {threads}", "--cpu-threads")
            import torch

            torch.set_num_threads(threads)
        return args.func(args)
    except LazyAttnError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
