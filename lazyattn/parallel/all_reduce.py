"""How a rank sums a row-parallel output over the ranks: torch's symmetric-memory all-reduce for the small messages
of decode and small prefill steps on CUDA, NCCL (the process group's own all-reduce) for everything else
(docs/design.md, "Tensor parallelism").

Why: on two H200s (NVLink, multicast off), one all-reduce of bf16 [1 … 16, 4096] rows captured in a CUDA graph
takes two to three times as long through NCCL as through the kernels of `torch.ops.symm_mem` (each rank reads its
peers' buffers directly over NVLink), and an 8B decode step has 65 all-reduces (two per layer and the embedding's),
a 70B one 161: through NCCL they are over a quarter of an 8B step (docs/benchmarks.md, "Kernel constants").
Large messages (long prefill chunks) stay on NCCL, whose ring reduction moves less data per rank.

Buffer reuse: every op first puts this rank's input into its symmetric buffer (one-shot: inside the kernel), and
the kernels start and end with a barrier over the ranks' signal pads: when the op is done here, every peer has
finished reading this rank's buffer, so the next op may overwrite it at once and one buffer suffices. Results are
written to ordinary tensors, never left in the buffer: a sum that stays in use (the residual stream) would be
overwritten by the next all-reduce.

NVLink multicast stays off (group.NCCL_ENV): only the peer-to-peer kernels are used, never the multimem ones.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from lazyattn.envs import EnvSettings
from lazyattn.errors import InvalidRequestError

logger = logging.getLogger("lazyattn.parallel")

SETTING_ENV = "LAZYATTN_TP_ALLREDUCE"  # auto, nccl or symm_mem (lazyattn/envs.py)
# One-shot: each rank reads every peer's whole message (the fewest steps; the cheapest up to 1 MiB on two H200s).
# Two-shot (reduce a 1/N share, then gather the shares) above it, up to the buffer; NCCL beyond.
# `python -m benchmarks.tp_allreduce` measures them (docs/benchmarks.md, "Kernel constants").
ONE_SHOT_MAX_BYTES = 2**20
BUFFER_BYTES = 8 * 2**20  # 70B shapes: 512 rows of 8192 bf16 values
ALIGNMENT = 16  # the kernels' vector width: messages are whole multiples of it


DTYPES = (torch.float32, torch.bfloat16)  # what the symmetric-memory kernels are built for (not fp16)


def route(nbytes: int, dtype: torch.dtype, symmetric: bool) -> str:
    """Which all-reduce sums a message of `nbytes` of `dtype`: 'one_shot', 'two_shot' (symmetric memory) or
    'nccl'."""
    if not symmetric or dtype not in DTYPES or nbytes == 0 or nbytes % ALIGNMENT or nbytes > BUFFER_BYTES:
        return "nccl"
    return "one_shot" if nbytes <= ONE_SHOT_MAX_BYTES else "two_shot"


class SymmetricAllReduce:
    """This rank's symmetric buffer (BUFFER_BYTES, mapped by every peer) and the sums through it."""

    def __init__(self, device: torch.device, group_name: str) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self.group_name = group_name
        ops = torch.ops.symm_mem
        # One kernel for copy-in and sum where this torch has it (one launch less per all-reduce).
        self._copy_out = getattr(ops, "one_shot_all_reduce_copy_out", None)
        self._one_shot_out = ops.one_shot_all_reduce_out
        self._two_shot_out = ops.two_shot_all_reduce_out
        self.buffer = symm_mem.empty(BUFFER_BYTES, dtype=torch.uint8, device=device)
        symm_mem.rendezvous(self.buffer, group_name)

    def __call__(self, x: torch.Tensor, how: str = "one_shot") -> torch.Tensor:
        """The sum of `x` over the ranks, in a new tensor (`x` is left as it was)."""
        staged = self.buffer[: x.numel() * x.element_size()].view(x.dtype).view(x.shape)
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        if how == "one_shot" and self._copy_out is not None and x.is_contiguous() and x.storage_offset() == 0:
            return self._copy_out(staged, x, "sum", self.group_name, out)
        staged.copy_(x)
        if how == "one_shot":
            return self._one_shot_out(staged, "sum", self.group_name, out)
        return self._two_shot_out(staged, "sum", self.group_name, out)


def symmetric_all_reduce(
    device: torch.device, rank: int, size: int, env: EnvSettings
) -> tuple[SymmetricAllReduce | None, str]:
    """Set up the symmetric-memory all-reduce if the setting allows it and it works on every rank (a collective:
    every rank calls it at the same point): (the all-reduce or None, why, for the log line). `env`: the engine's
    settings, LAZYATTN_TP_ALLREDUCE (auto: symmetric memory where available, else NCCL; nccl; or symm_mem, required)
    and LAZYATTN_TP_PROBE_TIMEOUT_S (how long the buffer's rendezvous may wait for the peers before this rank gives
    up on symmetric memory and NCCL serves: seconds in practice; with a file store it was seen to wait for ever under
    pytest, docs/design.md, "Tensor parallelism")."""
    wanted = env.tp_allreduce
    if wanted == "nccl":
        return None, f"{SETTING_ENV}=nccl"
    symm, ok = None, False
    if device.type != "cuda":
        reason = "not on CUDA"
    elif not _every_rank(_fresh_group_name(), device):
        # Some torch versions register a group's symmetric-memory store once per process, by name: a second
        # engine in the same process (its group named like the first's) cannot register its own, and a
        # rendezvous over the first one's store could wait for ever.
        reason = "symmetric memory was already set up in this process, for an earlier engine's group"
    else:
        try:
            symm = _probe(device, rank, size, env.tp_probe_timeout_s)
            ok, reason = True, ""
        except Exception as error:  # noqa: BLE001 (any failure means: not here; NCCL serves)
            reason = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            logger.warning("rank %d: symmetric memory unavailable (%s)", rank, reason)
        # Every rank must take the same path, or a collective would pair different kernels.
        if not _every_rank(ok, device) and ok:
            symm, ok, reason = None, False, "unavailable on another rank"
    if not ok and wanted == "symm_mem":
        raise InvalidRequestError(
            f"{SETTING_ENV}=symm_mem, but symmetric memory is unavailable ({reason})", SETTING_ENV
        )
    return symm, reason


@contextlib.contextmanager
def _store_timeout(timeout: timedelta):
    """The process group's store (and every store it wraps) waits at most `timeout` for a key meanwhile."""
    stores = [dist.distributed_c10d._get_default_store()]
    while hasattr(stores[-1], "underlying_store"):
        stores.append(stores[-1].underlying_store)
    before = [store.timeout for store in stores]
    for store in stores:
        store.set_timeout(timeout)
    try:
        yield
    finally:
        for store, value in zip(stores, before):
            store.set_timeout(value)


def _every_rank(ok: bool, device: torch.device) -> bool:
    flag = torch.tensor([int(ok)], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


# Group names this process has set up symmetric memory for (or tried to). torch keeps a group's rendezvous state
# (its store among it) per name for the life of the process, and a new process group of the same name (the next
# engine's world group is named "0" again) would rendezvous through the old, closed store: the peers wait for keys
# that never come (seen on two H200s under torch 2.11: every engine after the first in a process waited the probe's
# whole timeout). Such a rank takes NCCL at once instead.
_SET_UP: set[str] = set()


def _fresh_group_name() -> bool:
    import torch.distributed._symmetric_memory as symm_mem

    name = dist.group.WORLD.group_name
    return name not in _SET_UP and name not in getattr(symm_mem, "_group_name_to_store", {})


def _probe(device: torch.device, rank: int, size: int, timeout_s: float) -> SymmetricAllReduce:
    """Build the buffer and check one sum of each route and dtype against the known answer."""
    import torch.distributed._symmetric_memory as symm_mem

    group_name = dist.group.WORLD.group_name
    _SET_UP.add(group_name)
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None and getattr(enable, "__deprecated__", None) is None:  # needed before torch deprecated it
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            enable(group_name)
    with _store_timeout(timedelta(seconds=timeout_s)):
        symm = SymmetricAllReduce(device, group_name)
    expected = size * (size + 1) / 2
    for dtype in (torch.float32, torch.bfloat16):
        for how, rows in (("one_shot", 4), ("two_shot", ONE_SHOT_MAX_BYTES // 512 + 8)):
            x = torch.full((rows, 256), rank + 1.0, dtype=dtype, device=device)
            got = symm(x, how)
            if not bool((got == expected).all()) or not bool((x == rank + 1.0).all()):
                raise RuntimeError(f"the {how} {dtype} probe summed wrongly")
    torch.cuda.synchronize(device)
    return symm
