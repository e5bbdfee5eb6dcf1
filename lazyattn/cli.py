"""`lazyattn demo | generate | serve | bench | eval`."""

from __future__ import annotations

import argparse
import json
import sys

from lazyattn.bench.cli import add_bench_parser
from lazyattn.eval.cli import add_eval_parser
from lazyattn.server.cli import add_serve_parser


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="'tiny' (built in) or a Hugging Face checkpoint directory")
    p.add_argument("--mode", default="lazy", choices=["lazy", "block", "prefix", "full"])
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--kv-cache-gb", type=float, default=None, help="KV budget (default: from free GPU memory)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--relink-tokens", type=int, default=0,
                   help="lazy mode: recompute the first K rows of each placed document in context (docs/design.md)")


def engine_options(args: argparse.Namespace) -> dict:
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return dict(model=args.model, mode=args.mode, device=device, dtype=args.dtype, page_size=args.page_size,
                kv_cache_gb=args.kv_cache_gb, gpu_memory_utilization=args.gpu_memory_utilization,
                max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                max_model_len=args.max_model_len, seed=args.seed, relink_tokens=getattr(args, "relink_tokens", 0))


def cmd_demo(args: argparse.Namespace) -> int:
    from lazyattn.demo import main

    return main(args.model, args.device or "cpu")


def cmd_generate(args: argparse.Namespace) -> int:
    from lazyattn.engine.llm import LLM
    from lazyattn.engine.sampling import SamplingParams

    documents = []
    for d in args.document:
        documents.append(d)
    for path in args.document_file:
        with open(path, encoding="utf-8") as f:
            documents.append({"title": path, "text": f.read()})
    llm = LLM(**engine_options(args))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.sampling_seed)
    out = llm.generate([args.prompt], params, documents=[documents])[0]
    if args.json:
        m = out.metrics
        print(json.dumps({"text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
                          "ttft_s": m.ttft, "cached_tokens": m.cached_tokens}))
    else:
        print(out.text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lazyattn", description="RAG inference with deferred RoPE")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="a small RAG workload through every mode, side by side")
    p.add_argument("--model", default="tiny")
    p.add_argument("--device", default=None)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("generate", help="one completion with documents")
    _engine_args(p)
    p.add_argument("prompt")
    p.add_argument("--document", "-d", action="append", default=[], help="document text (repeatable)")
    p.add_argument("--document-file", action="append", default=[], help="a file whose text is a document")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--sampling-seed", type=int, default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_generate)

    add_serve_parser(sub, _engine_args, engine_options)
    add_bench_parser(sub, _engine_args, engine_options)
    add_eval_parser(sub, _engine_args, engine_options)

    args = parser.parse_args(argv)
    from lazyattn.errors import LazyAttnError

    try:
        return args.func(args)
    except LazyAttnError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
