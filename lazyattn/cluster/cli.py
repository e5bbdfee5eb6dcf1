"""`lazyattn serve --replicas N`: the Serve application (cluster/app.py) on a local Ray instance, or on the
cluster at --ray-address, until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path


def serve_replicas(args: argparse.Namespace, engine_options: dict, server: dict) -> int:
    try:
        import ray
        from ray import serve
    except ImportError:
        print(
            "error: --replicas runs on Ray Serve, which is not installed: pip install 'lazyattn[cluster]'",
            file=sys.stderr,
        )
        return 2
    from lazyattn.cluster.app import ClusterConfig, build_app

    model = engine_options.get("model")
    if model and Path(model).exists():  # by absolute path: actors of a cluster at --ray-address may run elsewhere
        engine_options = {**engine_options, "model": str(Path(model).resolve())}
    config = ClusterConfig(
        engine_options=engine_options,
        server=server,
        replicas=args.replicas,
        policy=args.router,
        load_margin=args.load_margin,
    )
    start = time.monotonic()
    ray.init(address=args.ray_address, include_dashboard=False)
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(build_app(config), name="lazyattn", route_prefix="/")
        print(
            f"lazyattn serve: {args.replicas} replica(s) of {args.model} ({engine_options['mode']} mode, "
            f"{engine_options['device']}) routed by {args.router}; ready in {time.monotonic() - start:.1f} s; "
            f"listening on http://{args.host}:{args.port}",
            file=sys.stderr,
            flush=True,
        )
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0
