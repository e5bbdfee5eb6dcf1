"""`lazyattn serve`: the engine behind the OpenAI-compatible server, run by uvicorn."""

from __future__ import annotations

import argparse
import errno
import ipaddress
import math
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from lazyattn import envs
from lazyattn.engine.best_document import ANSWER_STRATEGIES, check_default_answer
from lazyattn.errors import InvalidRequestError
from lazyattn.server.names import LAYOUTS, served_model_name

# Keys given on the command line show up in `ps`; this variable (comma-separated) keeps them out of it.
API_KEYS_ENV = envs.API_KEYS.name


# Starts `--replicas` engines behind one ingress (cluster/cli.py's serve_replicas): given by the caller, the floor
# above this one, so that the server does not import the cluster built on it.
ServeReplicas = Callable[[argparse.Namespace, dict, dict], int]


def add_serve_parser(
    sub: argparse._SubParsersAction,
    engine_args: Callable[[argparse.ArgumentParser], None],
    engine_options: Callable[[argparse.Namespace], dict],
    serve_replicas: ServeReplicas,
) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server with documents as inputs")
    engine_args(p)
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind; any other than a loopback address without an API key is warned about (default: "
        "%(default)s, local only)",
    )
    p.add_argument("--port", type=int, default=8000, help="port to listen on, 1 to 65535 (default: %(default)s)")
    p.add_argument(
        "--api-key",
        action="append",
        default=[],
        help=f"require this key (repeatable; several keys: one tenant each, with separate document "
        f"caches; spaces around a key are dropped). Also read from ${API_KEYS_ENV}, comma-separated (default: "
        f"none, every client is served)",
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the model id clients send (default: a named model's name, else the checkpoint's directory or file name)",
    )
    p.add_argument(
        "--max-waiting",
        type=int,
        default=1024,
        help="waiting-queue limit in sequences (prompts x n); requests past it get 429 with Retry-After "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--max-request-sequences",
        type=int,
        default=256,
        help="sequences one request may ask for (prompts x n); more is a 400 (default: %(default)s)",
    )
    p.add_argument(
        "--max-request-documents",
        type=int,
        default=1024,
        help="documents one request may bring; more is a 400 (default: %(default)s)",
    )
    p.add_argument(
        "--max-body-mb",
        type=int,
        default=32,
        help="request bodies over this many MiB are a 413, refused before they are parsed (default: %(default)s)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=5.0,
        help="on SIGTERM, seconds to let running requests finish before the rest are aborted (default: %(default)s)",
    )
    p.add_argument(
        "--max-documents",
        type=int,
        default=None,
        help="registered documents limit, all tenants together (default: no limit)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where the server keeps its state, the document registry (registry.sqlite) (default: state/ under "
        f"the cache directory, ${envs.CACHE.name})",
    )
    p.add_argument(
        "--registry-url",
        default=None,
        help="the document registry's database instead: sqlite:///PATH, postgresql://USER:PASSWORD@HOST/DB (one "
        "registry for several servers), or memory (kept nowhere) (default: registry.sqlite in --state-dir)",
    )
    p.add_argument(
        "--answer",
        choices=ANSWER_STRATEGIES,
        default="joint",
        help="how a request that names no answer strategy is answered, where the strategy can answer it (n 1, no "
        "stream; both-placements: lazy mode, and the request sets no ape_parallel); others are answered jointly. "
        "both-placements with --ape-prefix --ape-temperature 0.9 is the setting measured best for single-document "
        "questions (docs/quality.md) (default: joint)",
    )
    p.add_argument(
        "--confidence-tokens",
        type=int,
        default=None,
        metavar="K",
        help="the confidence_tokens of a request that gives none, where its answer strategy (its own or --answer) "
        "is not joint: a confidence-order strategy's one-document answers stop after K tokens, the others rank "
        "their candidates by their first K tokens and stop all but the surest there (default: the whole answer)",
    )
    p.add_argument(
        "--prompt-layout",
        choices=sorted(LAYOUTS),
        default="block-attention",
        help="where documents go in the prompt; tulu3-block-ft for that checkpoint (default: %(default)s)",
    )
    p.add_argument(
        "--parse-special-tokens",
        action="store_true",
        help="read special-token text in messages, documents and prompts as control tokens (only for "
        "trusted clients: a user could forge turns); by default it is plain text",
    )
    p.add_argument(
        "--no-warm-up",
        action="store_true",
        help="skip the start-up warm-up (CUDA: kernel compilation and graph capture)",
    )
    p.add_argument(
        "--random-weights",
        action="store_true",
        help="read only config.json and draw the weights (benchmarks at real shapes; a directory without a "
        "tokenizer reads text as bytes)",
    )
    r = p.add_argument_group("replicas (Ray Serve; pip install 'lazyattn[cluster]'; docs/server.md, Replicas)")
    r.add_argument(
        "--replicas",
        type=int,
        default=0,
        help="run N engine replicas on Ray Serve behind one ingress (default: one engine, no Ray)",
    )
    r.add_argument(
        "--router",
        default="document-affinity",
        choices=["document-affinity", "prefix-affinity", "least-loaded", "round-robin"],
        help="how requests are routed to replicas (default: document-affinity)",
    )
    r.add_argument(
        "--load-margin",
        type=int,
        default=2,
        help="affinity routing skips a replica this many requests above the least loaded (default: 2)",
    )
    r.add_argument(
        "--ray-address", default=None, help="an existing Ray cluster to join (default: start a local Ray instance)"
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level (default: info)",
    )
    p.set_defaults(func=lambda args: serve(args, engine_options, serve_replicas))


def check_options(args: argparse.Namespace) -> None:
    """Refuse a setting that cannot start a server, or that would start one refusing every request, before anything
    is bound or loaded. Raises InvalidRequestError naming the option (the CLI prints it on one line, exit 2)."""
    if not 1 <= args.port <= 65535:
        raise InvalidRequestError(f"--port must be in 1..65535, got {args.port}", "--port")
    if any(not key.strip() for key in args.api_key):
        raise InvalidRequestError("--api-key must not be empty (or only spaces)", "--api-key")
    at_least_one = {
        "--max-waiting": args.max_waiting,
        "--max-request-sequences": args.max_request_sequences,
        "--max-request-documents": args.max_request_documents,
        "--max-body-mb": args.max_body_mb,
        "--max-documents": args.max_documents,
        "--confidence-tokens": args.confidence_tokens,
    }
    for flag, value in at_least_one.items():
        if value is not None and value < 1:
            raise InvalidRequestError(f"{flag} must be >= 1, got {value}", flag)
    check_default_answer(args.answer, args.mode)
    if not (math.isfinite(args.shutdown_timeout) and args.shutdown_timeout >= 0):
        raise InvalidRequestError(
            f"--shutdown-timeout must be a number of seconds >= 0, got {args.shutdown_timeout}", "--shutdown-timeout"
        )


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach `host` (a name other than localhost may resolve anywhere)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(
    args: argparse.Namespace, engine_options: Callable[[argparse.Namespace], dict], serve_replicas: ServeReplicas
) -> int:
    check_options(args)
    keys = list(args.api_key) + list(envs.read_var(envs.API_KEYS))
    if not keys and not is_loopback(args.host):
        print(
            f"lazyattn: warning: --host {args.host} accepts connections from other machines and no API key is set: "
            f"anyone who reaches port {args.port} can use this server (--api-key, ${API_KEYS_ENV})",
            file=sys.stderr,
            flush=True,
        )
    if args.disk_cache_dir is not None:  # as the registry below: a directory that cannot be used fails now
        from lazyattn.cache.disk_tier import prepare_directory

        prepare_directory(args.disk_cache_dir)
    try:  # before torch and the model load: a port in use fails now, not after minutes of loading
        sock = bind(args.host, args.port)
    except OSError as e:
        busy = " (another server is listening there; --port picks another)" if e.errno == errno.EADDRINUSE else ""
        print(f"error: cannot listen on {args.host}:{args.port}: {e.strerror or e}{busy}", file=sys.stderr)
        return 1

    from lazyattn.errors import RegistryError
    from lazyattn.server.registry import DocumentRegistry, resolve_registry_url, safe_url

    registry = resolve_registry_url(args.registry_url, args.state_dir)
    try:  # the same: an unreachable database or one from a newer release fails before the model loads
        DocumentRegistry(registry).close()
    except RegistryError as e:
        sock.close()
        print(f"error: {e}", file=sys.stderr)
        return 1

    import dataclasses

    import uvicorn

    from lazyattn.engine import prompt
    from lazyattn.engine.config import EngineConfig
    from lazyattn.engine.llm_engine import LLMEngine
    from lazyattn.server.app import ServerConfig, create_app

    options = engine_options(args)
    options.update(
        max_waiting=args.max_waiting, progress=False, warm_up=not args.no_warm_up, random_weights=args.random_weights
    )
    layout = dataclasses.replace(
        getattr(prompt, LAYOUTS[args.prompt_layout]), parse_special_tokens=args.parse_special_tokens
    )
    server = dict(
        model_name=args.served_model_name or served_model_name(args.model),
        api_keys=tuple(keys),
        layout=layout,
        max_documents=args.max_documents,
        max_request_sequences=args.max_request_sequences,
        max_request_documents=args.max_request_documents,
        max_body_bytes=args.max_body_mb * 2**20,
        registry_url=registry,
        answer=args.answer,
        confidence_tokens=args.confidence_tokens,
    )
    if args.replicas:
        sock.close()  # Ray Serve binds the port itself
        return serve_replicas(args, options, server)
    start = time.monotonic()
    try:
        engine = LLMEngine(EngineConfig(**options))
    except BaseException:
        sock.close()
        raise
    stats, mc = engine.stats(), engine.model_config
    disk = "" if engine.disk is None else f"; disk tier {args.disk_cache_dir} ({args.disk_cache_gb:g} GiB)"
    print(
        f"lazyattn serve: {args.model} ({mc.architecture}, {mc.num_layers} layers, {engine.config.torch_dtype}) on "
        f"{engine.device}, {engine.mode.name} mode; KV pool ({engine.config.kv_torch_dtype}) {stats.num_pages} pages x "
        f"{engine.config.page_size} "
        f"tokens = {stats.num_pages * stats.page_bytes / 2**30:.2f} GiB; context {engine.max_model_len} tokens; "
        f"loaded{' and warmed up' if engine.config.warm_up and engine.device.type == 'cuda' else ''} in "
        f"{time.monotonic() - start:.1f} s; document registry {safe_url(registry)}{disk}; listening on "
        f"http://{args.host}:{args.port}",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(
        create_app(engine, ServerConfig(**server)),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.shutdown_timeout,
    )
    app_server = uvicorn.Server(config)
    app_server.run(sockets=[sock])
    return 0 if app_server.started else 1


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (not listening yet: until the server starts, connections are refused),
    set up as uvicorn sets up its own."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
