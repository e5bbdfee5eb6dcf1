"""Tensor parallelism's lower floor: the group of ranks and its collectives (`group.py`, `all_reduce.py`), used by
the model (each rank's part of it: model/sharding.py). The driver and the workers that run an engine over the
ranks are an executor of the engine (engine/executor/tensor_parallel.py; docs/design.md, "Tensor parallelism").
"""
