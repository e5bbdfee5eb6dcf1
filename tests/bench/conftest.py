import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def one_cpu_thread():
    """The tiny model's ops are too small to split across threads, and on a busy CPU intra-op threads stall
    each other (measured: a 16-request replay 0.14 s with one thread, 11.6 s with two on a loaded 2-core box)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
