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
Which kernels launch with PDL is per kernel family and per device (pdl_families): every family, except where a device
was measured slower with one (the H200's skinny GEMMs).

The launchers hold no state of their own: persistent launch state (decode's arrival counters) belongs to
whoever launches them repeatedly, TritonBackend in the engine.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from lazyattn import envs
from lazyattn.envs import PDL_FAMILIES

# The kernel families a launcher names to pdl_options (PDL_FAMILIES, declared with LAZYATTN_PDL in lazyattn/envs.py).
# Devices where PDL is measured slower for some families: the families that keep it there (every other device keeps
# it for all). Measured with `python -m benchmarks.engine` and LAZYATTN_PDL set per family (docs/design.md, "Decode
# fusion"; docs/kernels.md, "What the kernels do").
_PDL_BY_DEVICE: dict[str, frozenset[str]] = {
    # H200, torch 2.11 / Triton 3.6, Llama-3.1-8B shapes: a decode step with the skinny GEMMs under PDL is slower than
    # without them under it, and slower than without PDL at all, at batch 1 and 16; the H100 gains from PDL in every
    # family (docs/benchmarks.md, "Kernel constants").
    "NVIDIA H200": frozenset({"attention", "rope", "norm", "sampling"}),
}

# Softmax runs on exp2: exp(x * scale) = exp2(x * scale * LOG2E), so the scale passed to a kernel carries it.
LOG2E = 1.4426950408889634


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1 (the CPU tests): programs run one by one, so launchers keep grids small."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (the current one when `device` has no index)."""
    return _sm_count_of(_index(device))


@functools.lru_cache(maxsize=16)
def _sm_count_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def hopper_or_later(device: torch.device) -> bool:
    """A CUDA device of compute capability 9.0 or later (PDL, the copy engine's tensor loads), not the interpreter."""
    return device.type == "cuda" and not interpreting() and _capability_of(_index(device)) >= (9, 0)


def pdl_options(device: torch.device, family: str) -> dict:
    """Launch options of a kernel taking a USE_PDL constexpr: on with a Hopper-or-later CUDA device (not the
    interpreter) where the kernel's family (PDL_FAMILIES) launches with PDL (pdl_families)."""
    on = hopper_or_later(device) and family in pdl_families(_device_name(device))
    return {"USE_PDL": True, "launch_pdl": True} if on else {"USE_PDL": False}


def pdl_on(device: torch.device) -> list[str]:
    """The kernel families that launch with PDL on `device` (none off a Hopper-or-later GPU)."""
    return [f for f in PDL_FAMILIES if pdl_options(device, f)["USE_PDL"]]


def pdl_families(device_name: str) -> frozenset[str]:
    """The kernel families that launch with PDL on a device of this name. LAZYATTN_PDL (the settings the engine
    activated, lazyattn/envs.py, which checked the names): `auto`, the
    device's measured default (every family, except where _PDL_BY_DEVICE says fewer); `1` every family; `0` none;
    or a comma-separated list of families (PDL_FAMILIES) for those only."""
    return _parse_families(envs.active().pdl, device_name)


@functools.lru_cache(maxsize=64)
def _parse_families(value: str, device_name: str) -> frozenset[str]:
    if value == "auto":
        return _PDL_BY_DEVICE.get(device_name, frozenset(PDL_FAMILIES))
    if value == "1":
        return frozenset(PDL_FAMILIES)
    if value == "0":
        return frozenset()
    return frozenset(value.split(","))


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _device_name(device: torch.device) -> str:
    return _name_of(_index(device)) if device.type == "cuda" else device.type


@functools.lru_cache(maxsize=16)
def _name_of(index: int) -> str:
    return torch.cuda.get_device_name(index)


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
