import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def one_cpu_thread():
    """The tiny model gains nothing from intra-op threads on a shared CPU (see tests/bench/conftest.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
