"""Replicas: lazyattn engines as Ray Serve deployments behind a document-affinity request router
(docs/server.md, Replicas).

`policy` and `keys` are plain Python (the simulation in bench/replicas.py uses them too); `app`, `router`,
`replica`, `ingress` and `cli` need Ray Serve (`pip install 'lazyattn[cluster]'`). Nothing here is imported by
`import lazyattn` or by the commands that do not use replicas.
"""
