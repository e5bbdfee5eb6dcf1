"""The tensor-parallel group of one rank: its rendezvous and its collectives (torch.distributed: NCCL on GPUs,
gloo on the CPU; the small all-reduces of decode through torch's symmetric memory, parallel/all_reduce.py). Which
part of the model each rank holds is the model's business (model/sharding.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from lazyattn.envs import EnvSettings
from lazyattn.parallel.all_reduce import (
    BUFFER_BYTES,
    ONE_SHOT_MAX_BYTES,
    SymmetricAllReduce,
    route,
    symmetric_all_reduce,
)

logger = logging.getLogger("lazyattn.parallel")

# The device machines share NVLink switches with other tenants: NVLink multicast (NVLS) stays off in NCCL,
# PyTorch's symmetric memory and NVSHMEM, in every process we start (workers inherit the environment).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
HOST = "127.0.0.1"  # the ranks of one engine run on one host
# How long a rank waits for the others in the rendezvous or in one collective before giving up.
TIMEOUT = timedelta(minutes=10)
# torch >= 2.13 renames all_gather_into_tensor; the device machine runs an older torch.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True)
class TensorParallelGroup:
    rank: int
    size: int
    # The symmetric-memory all-reduce, where it runs (CUDA, every rank able, not switched off); else NCCL/gloo only.
    symmetric: SymmetricAllReduce | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def all_reduce_path(self) -> str:
        """'symm_mem' (small messages; the process group's backend for the rest), else 'nccl' or 'gloo'."""
        return dist.get_backend() if self.symmetric is None else "symm_mem"

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of `x` over the ranks (captured into CUDA graphs like any kernel). Use the result: it is `x`,
        summed in place, on the NCCL/gloo path, and a new tensor on the symmetric-memory one."""
        how = route(x.numel() * x.element_size(), x.dtype, self.symmetric is not None)
        if how == "nccl":
            dist.all_reduce(x)
            return x
        return self.symmetric(x, how)

    def gather_vocab(self, local: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """[n, vocab / size] logits of each rank's vocabulary block -> [n, vocab] on every rank."""
        n, block = local.shape
        out = torch.empty(self.size * n, block, dtype=local.dtype, device=local.device)
        _all_gather(out, local.contiguous())
        return out.view(self.size, n, block).permute(1, 0, 2).reshape(n, self.size * block)[:, :vocab_size]

    def min(self, value: int, device: torch.device) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())


def serve_store(size: int) -> dist.TCPStore:
    """The driver's rendezvous store for a group of `size` ranks: a TCP store on a free loopback port, which the
    workers connect to (connect_store). Not a file store: with one, torch's symmetric-memory rendezvous was seen to
    wait for a key for ever under pytest (docs/design.md, "Tensor parallelism"). Loopback only: left to itself the
    store listens on every interface, where anyone on the network could write into the rendezvous."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((HOST, 0))
    listener.listen()
    port = listener.getsockname()[1]
    fd = listener.detach()  # the store owns the socket from here
    try:
        return dist.TCPStore(
            HOST, port, world_size=size, is_master=True, timeout=TIMEOUT, wait_for_workers=False, master_listen_fd=fd
        )
    except BaseException:
        os.close(fd)
        raise


def connect_store(port: int, size: int) -> dist.TCPStore:
    return dist.TCPStore(HOST, port, world_size=size, is_master=False, timeout=TIMEOUT)


def join(store: dist.Store, rank: int, size: int, device: torch.device, env: EnvSettings) -> TensorParallelGroup:
    """Join the group (blocks until every rank has): NCCL for a CUDA device, gloo for the CPU. `env`: the engine's
    settings (its all-reduce, symmetric_all_reduce)."""
    for key, value in NCCL_ENV.items():
        os.environ.setdefault(key, value)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", store=store, rank=rank, world_size=size, timeout=TIMEOUT, device_id=device)
    else:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=TIMEOUT)
    symmetric, reason = symmetric_all_reduce(device, rank, size, env)
    if rank == 0:
        if symmetric is not None:
            logger.info(
                "tensor-parallel all-reduce: torch symmetric memory up to %d KiB (one-shot up to %d KiB), %s above",
                BUFFER_BYTES // 1024,
                ONE_SHOT_MAX_BYTES // 1024,
                dist.get_backend(),
            )
        else:
            logger.info("tensor-parallel all-reduce: %s only (%s)", dist.get_backend(), reason)
    return TensorParallelGroup(rank, size, symmetric)


def leave() -> None:
    """Leave the group. NCCL: abort the communicators first (nothing is in flight when an engine stops): a plain
    destroy flushes and waits for every rank, and was seen to hang at the end of two-GPU runs whose graphs had
    captured NCCL collectives, with both ranks leaving at once."""
    if not dist.is_initialized():
        return
    if dist.get_backend() == "nccl":
        dist.distributed_c10d._abort_process_group()  # also forgets the group
    if dist.is_initialized():
        dist.destroy_process_group()
