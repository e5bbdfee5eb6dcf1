import os

import pytest
import torch

# Triton kernels run on the CPU through the interpreter; the flag must be set before triton is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # Every CPU engine checks the document cache's and the scheduler's bookkeeping after each step
    # (engine/invariants.py): a broken invariant fails the test that broke it, where it broke.
    os.environ.setdefault("LAZYATTN_CHECK_INVARIANTS", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def kernel_settings():
    """`use(VAR=value, ...)` activates the kernels' settings parsed from those variables alone (lazyattn/envs.py), as
    an engine made with them in the environment would; the previous settings come back after the test."""
    from lazyattn import envs

    previous = envs.activate(envs.read_env({}))

    def use(**variables: str):
        envs.activate(envs.read_env(variables))
        return envs.active()

    yield use
    envs.activate(previous)
