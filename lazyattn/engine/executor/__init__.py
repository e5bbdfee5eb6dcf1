"""Executors: how the engine's forward passes run, in one process (local.py) or across ranks (tensor_parallel.py:
the driver; worker.py: each other rank's process; channel.py and fed_back.py: what travels between them)."""
