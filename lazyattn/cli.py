"""`lazyattn demo | generate | serve | bench | eval | finetune` (also `python -m lazyattn ...`)."""

from __future__ import annotations

import argparse
import json
import sys

from lazyattn import __version__
from lazyattn.bench.cli import add_bench_parser
from lazyattn.engine.config import EngineConfig
from lazyattn.eval.cli import add_eval_parser
from lazyattn.finetune.cli import add_finetune_parser
from lazyattn.server.cli import add_serve_parser

MODES = ["lazy", "block", "prefix", "full"]


def _engine_args(p: argparse.ArgumentParser, mode: bool = True) -> None:
    """The engine's options, shared by generate, serve, bench and eval (bench and eval pick their modes: mode=False)."""
    p.add_argument(
        "--model",
        default="tiny",
        help="'tiny' (built in, random weights), 'smollm2' (fetched once), a "
        "Hugging Face checkpoint directory or a .gguf file",
    )
    if mode:
        p.add_argument(
            "--mode", default="lazy", choices=MODES, help="how documents are placed (default: lazy; see docs/design.md)"
        )
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="weights and KV cache dtype (default: the checkpoint's; float32 on the CPU)",
    )
    p.add_argument("--page-size", type=int, default=64, help="tokens per KV page (default: 64)")
    p.add_argument("--kv-cache-gb", type=float, default=None, help="KV budget (default: from free GPU memory)")
    p.add_argument(
        "--host-cache-gb",
        type=float,
        default=None,
        help="host-memory tier for documents evicted from the GPU, GiB; 0: off (default: off on the CPU, "
        "on CUDA a quarter of available host memory, at most 64; docs/design.md)",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="share of GPU memory the engine may use, KV included (default: 0.9)",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=8192,
        help="prompt tokens prefilled per step, at most (default: 8192)",
    )
    p.add_argument("--max-num-seqs", type=int, default=256, help="sequences decoded together, at most (default: 256)")
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="context limit in tokens, documents included (default: the model's)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of random weights and unseeded sampling (default: 0)")
    p.add_argument(
        "--relink-tokens",
        type=int,
        default=0,
        help="lazy mode: recompute the first K rows of each placed document in context (docs/design.md)",
    )
    for name, what in (("temperature", "T (sharpened by 1/T)"), ("scale", "S (weight times S)")):
        p.add_argument(
            f"--ape-{name}",
            type=float,
            default=1.0,
            help=f"lazy/block mode: the final segment's attention {what} on the documents (docs/design.md, APE)",
        )
    p.add_argument(
        "--ape-prefix",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="lazy mode: encode each document after the first segment, its shared attention sink (docs/design.md, APE)",
    )
    p.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="schedule the next step while the GPU runs this one (default: on CUDA, also with tensor "
        "parallelism; docs/design.md, Overlapped scheduling)",
    )
    p.add_argument(
        "--tokenizer-cache-tokens",
        type=int,
        default=EngineConfig.tokenizer_cache_tokens,
        help="documents' token ids kept so that a recurring document is tokenised once, in tokens "
        "(~36 bytes each); 0: off (default: %(default)s)",
    )
    add_tensor_parallel_arg(p)


def add_tensor_parallel_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tensor-parallel-size",
        "--tp",
        type=int,
        default=1,
        help="GPUs one engine spans, one worker process each (default: 1; docs/design.md, Tensor parallelism)",
    )


def engine_options(args: argparse.Namespace) -> dict:
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return dict(
        model=args.model,
        mode=getattr(args, "mode", "lazy"),
        device=device,
        dtype=args.dtype,
        page_size=args.page_size,
        kv_cache_gb=args.kv_cache_gb,
        host_cache_gb=args.host_cache_gb,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        seed=args.seed,
        relink_tokens=getattr(args, "relink_tokens", 0),
        ape_temperature=getattr(args, "ape_temperature", 1.0),
        ape_scale=getattr(args, "ape_scale", 1.0),
        ape_prefix=getattr(args, "ape_prefix", False),
        tensor_parallel_size=args.tensor_parallel_size,
        async_scheduling=getattr(args, "async_scheduling", None),
        tokenizer_cache_tokens=args.tokenizer_cache_tokens,
    )


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
