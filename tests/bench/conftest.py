import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_script(name: str) -> Iterator[ModuleType]:
    """A script under benchmarks/ imported as a module for the length of a fixture."""
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture(autouse=True, scope="package")
def one_cpu_thread():
    """The tiny model's ops are too small to split across threads, and on a busy CPU intra-op threads stall
    each other (measured: a 16-request replay 0.14 s with one thread, 11.6 s with two on a loaded 2-core box)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
