"""The Ray Serve application: N engine replicas (one deployment, `num_replicas=N`, routed by `DocumentRouter`)
behind one OpenAI-compatible ingress.

    build_app(ClusterConfig(...))   -> a Serve application, for `serve.run` (what `lazyattn serve --replicas`
                                       does on a local Ray instance)
    app_builder(args)               -> the same from a dict, for `serve run` / `serve deploy` with a config
                                       file (docs/serve.yaml) on a real Ray cluster

The ingress stays at one replica: it holds the document registry (docs/server.md, Replicas).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig

from lazyattn.cluster.policy import DEFAULT_LOAD_MARGIN, POLICIES
from lazyattn.cluster.replica import EngineReplica
from lazyattn.cluster.router import DocumentRouter

ENGINE_DEPLOYMENT = "LazyAttnEngine"
INGRESS_DEPLOYMENT = "LazyAttnIngress"


@dataclass(frozen=True)
class ClusterConfig:
    engine_options: dict  # EngineConfig fields, as `lazyattn serve` builds them
    server: dict = field(default_factory=dict)  # ServerConfig fields, plus "layout" as a PromptLayout
    replicas: int = 2
    policy: str = "document-affinity"
    load_margin: int = DEFAULT_LOAD_MARGIN
    # Requests one replica may hold (Serve's max_ongoing_requests). Past it Serve tries the next replica of the
    # ranking; an engine queues up to its own --max-waiting anyway.
    max_ongoing_requests: int = 1024
    gpus_per_replica: float | None = None  # None: 1 when the engine device is CUDA, else 0
    cpus_per_replica: float = 1.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown routing policy {self.policy!r}; choose from {', '.join(POLICIES)}")


@serve.ingress()
class Ingress:
    """Serve builds the FastAPI app after the constructor (`__serve_build_asgi_app__`): it needs the engine
    deployment's limits, asked from one replica."""

    def __init__(self, engine: Any, server: dict, policy: str) -> None:
        self.engine = engine
        self.server = server
        self.policy = policy

    async def __serve_build_asgi_app__(self) -> Any:
        from lazyattn.cluster.ingress import RemoteEngineLoop, RouteHeaders
        from lazyattn.server.app import ServerConfig, create_app

        info = await self.engine.info.remote()
        page_tokens = info.page_size if self.policy == "prefix-affinity" else 0
        loop = RemoteEngineLoop(self.engine, info, route_page_tokens=page_tokens)
        app = create_app(loop, ServerConfig(**self.server))
        app.add_middleware(RouteHeaders)
        return app


def build_app(config: ClusterConfig) -> serve.Application:
    gpus = config.gpus_per_replica
    if gpus is None:
        gpus = 1.0 if str(config.engine_options.get("device", "cpu")).startswith("cuda") else 0.0
    engine = (
        serve.deployment(EngineReplica, name=ENGINE_DEPLOYMENT)
        .options(
            num_replicas=config.replicas,
            max_ongoing_requests=config.max_ongoing_requests,
            ray_actor_options={"num_cpus": config.cpus_per_replica, "num_gpus": gpus},
            request_router_config=RequestRouterConfig(
                request_router_class=DocumentRouter,
                request_router_kwargs={"policy": config.policy, "load_margin": config.load_margin},
                request_routing_stats_period_s=2.0,
            ),
            # A replica loads a model: give it time before health checks count, and restart a hung one.
            health_check_period_s=10.0,
            health_check_timeout_s=60.0,
        )
        .bind(config.engine_options)
    )
    ingress = serve.deployment(Ingress, name=INGRESS_DEPLOYMENT).options(
        num_replicas=1,
        max_ongoing_requests=4096,
        ray_actor_options={"num_cpus": 0},
    )
    return ingress.bind(engine, config.server, config.policy)


def app_builder(args: dict[str, Any]) -> serve.Application:
    """For a Serve config file: `args` are `lazyattn serve` option names with underscores (docs/serve.yaml)."""
    from lazyattn.engine import prompt
    from lazyattn.server.names import LAYOUTS, served_model_name
    from lazyattn.server.registry import resolve_registry_url

    args = dict(args)
    engine_keys = (
        "model",
        "mode",
        "device",
        "dtype",
        "page_size",
        "kv_cache_gb",
        "gpu_memory_utilization",
        "max_num_batched_tokens",
        "max_num_seqs",
        "max_model_len",
        "seed",
        "relink_tokens",
        "relink_last_tokens",
        "ape_temperature",
        "ape_scale",
        "ape_prefix",
        "ape_tilt",
        "ape_parallel",
        "random_weights",
        "max_waiting",
        "warm_up",
    )
    engine_options = {k: args.pop(k) for k in engine_keys if k in args}
    engine_options.setdefault("model", "tiny")
    engine_options.setdefault("device", "cuda")
    layout = getattr(prompt, LAYOUTS[args.pop("prompt_layout", "block-attention")])
    server = {
        "model_name": args.pop("served_model_name", None) or served_model_name(engine_options["model"]),
        "api_keys": tuple(args.pop("api_keys", ())),
        "layout": layout,
        "max_documents": args.pop("max_documents", None),
        "max_request_sequences": args.pop("max_request_sequences", 256),
        "max_request_documents": args.pop("max_request_documents", 1024),
        "max_body_bytes": int(args.pop("max_body_mb", 32) * 2**20),
        "answer": args.pop("answer", "joint"),
        "confidence_tokens": args.pop("confidence_tokens", None),
        # Resolved here, where the application is built: the ingress may run on another node of the cluster, where
        # a SQLite path is another file (several nodes: a postgresql:// URL).
        "registry_url": resolve_registry_url(args.pop("registry_url", None), args.pop("state_dir", None)),
    }
    cluster_keys = ("replicas", "policy", "load_margin", "max_ongoing_requests", "gpus_per_replica", "cpus_per_replica")
    cluster = {k: args.pop(k) for k in cluster_keys if k in args}
    if args:
        raise ValueError(f"unknown option(s) for the lazyattn application: {', '.join(sorted(args))}")
    return build_app(ClusterConfig(engine_options=engine_options, server=server, **cluster))
