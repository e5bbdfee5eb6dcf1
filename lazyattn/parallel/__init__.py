"""Tensor parallelism: one engine across the GPUs of a host (docs/design.md, "Tensor parallelism").

`group.py` holds the collectives and the shard arithmetic, `sharding.py` cuts weights per rank, `worker.py` is the
process of every rank but the driver, and `driver.py` is the runner the engine drives in the user's process.
"""
