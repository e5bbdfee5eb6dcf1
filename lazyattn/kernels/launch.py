"""What the Triton attention launchers (prefill.py, decode.py) share: interpreter detection, the SM count that
sizes their grids, and the log2(e) that their exp2 softmax folds into the scale.

The launchers hold no state of their own: persistent launch state (decode's arrival counters) belongs to
whoever launches them repeatedly, TritonBackend in the engine.
"""

from __future__ import annotations

import functools
import os

import torch

# Softmax runs on exp2: exp(x * scale) = exp2(x * scale * LOG2E), so the scale passed to a kernel carries it.
LOG2E = 1.4426950408889634


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1 (the CPU tests): programs run one by one, so launchers keep grids small."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (the current one when `device` has no index)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _sm_count_of(index)


@functools.lru_cache(maxsize=16)
def _sm_count_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count
