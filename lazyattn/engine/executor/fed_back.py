"""Overlapped scheduling under tensor parallelism (docs/design.md, "Overlapped scheduling"): the input tokens of a
step scheduled before the previous step's tokens were read exist only on the driver's GPU, where that step sampled
them. The driver gathers them into one buffer and broadcasts it (NCCL, queued on the stream like the step itself:
no rank's host waits for it); every rank then feeds the step from its copy, as a one-GPU engine feeds it from the
sampled ids (engine/graph_inputs.py, FedBack).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from lazyattn.engine.graph_inputs import FedBack


class FedBackRelay:
    """One rank's buffer for the fed-back tokens of a step: rows [0, n) of it, the same on every rank."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.buffer = torch.zeros(rows, dtype=torch.int64, device=device)

    def share(self, rows: int, fed: FedBack | None = None) -> FedBack:
        """The step's FedBack on this rank: the driver passes its own (`fed`), whose tokens it broadcasts; the other
        ranks pass none and receive them. Every rank must call it for the same step, in the same order as the
        step's collectives."""
        if rows > self.buffer.numel():
            self.buffer = torch.zeros(rows, dtype=torch.int64, device=self.buffer.device)
        ids = self.buffer[:rows]
        if fed is not None:
            fed.write(ids)
        dist.broadcast(ids, src=0)
        return FedBack(ids, list(range(rows)))
