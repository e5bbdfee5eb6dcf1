"""What the Triton launchers share: interpreter detection, the SM count that sizes their grids, the log2(e) that
the exp2 softmax folds into the scale, and programmatic dependent launch.

Programmatic dependent launch (Hopper and later; docs/design.md, "Kernels"). A decode step is ~300 dependent
kernels, most of them a few microseconds long, so the gap between one kernel's last program and the next kernel's
first (launch, block scheduling, the first loads) is a sizeable share of the step. Launched with PDL, a kernel's
programs may start while the kernel before it is still finishing; each waits (`wait_for_producers`) before it
touches memory the earlier kernels write, and only then lets the next kernel's programs start. What runs before
the wait must read nothing a kernel of this step writes: addresses, the weights (gemv.py prefetches them), and the
attention launches' page tables (decode.py, prefill_hopper.py), which the host stages and copies (kernels/paged.py).
Everything after the wait sees all the writes of every kernel before it, as in a plain stream.

The launchers hold no state of their own: persistent launch state (decode's arrival counters) belongs to
whoever launches them repeatedly, TritonBackend in the engine.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

PDL_ENV = "LAZYATTN_PDL"  # 0 turns programmatic dependent launch off

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


def pdl_options(device: torch.device) -> dict:
    """Launch options of a kernel taking a USE_PDL constexpr: on with a Hopper-or-later CUDA device (not the
    interpreter, not LAZYATTN_PDL=0)."""
    on = (device.type == "cuda" and not interpreting() and os.environ.get(PDL_ENV, "1") != "0"
          and _capability_of(device.index if device.index is not None else torch.cuda.current_device()) >= (9, 0))
    return {"USE_PDL": True, "launch_pdl": True} if on else {"USE_PDL": False}


@functools.lru_cache(maxsize=16)
def _capability_of(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@triton.jit
def wait_for_producers(USE_PDL: tl.constexpr):
    """Under PDL: wait until the kernels before this one have finished and their writes are visible, then let the
    next kernel's programs launch. A no-op otherwise."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
