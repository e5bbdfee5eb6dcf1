"""StepInputs: one forward pass as plain host lists (packed token ids, positions, slots, page tables, block copies).

The model runner turns a scheduled batch into this, then into device tensors. The split exists for tensor
parallelism (docs/design.md, "Tensor parallelism"): the driver decides a step once and sends these lists to every
other rank, which builds the same tensors on its own GPU; nothing in them depends on the rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lazyattn.engine.batch import ScheduledBatch
from lazyattn.kernels.backend import ForwardBatch
from lazyattn.kernels.paged import EntryPages, PagedBatch, cdiv, page_fill


@dataclass
class StepInputs:
    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    entries: list[EntryPages] = field(default_factory=list)
    q_lens: list[int] = field(default_factory=list)
    q_starts: list[int] = field(default_factory=list)
    logits_rows: list[int] = field(default_factory=list)  # packed rows whose logits are sampled
    is_decode: bool = False
    # block mode's copies (docs/design.md, Modes), one element per page
    copy_src: list[int] = field(default_factory=list)
    copy_dst: list[int] = field(default_factory=list)
    copy_deltas: list[int] = field(default_factory=list)

    @staticmethod
    def from_batch(batch: ScheduledBatch, page_size: int) -> StepInputs:
        ps = page_size
        step = StepInputs(is_decode=batch.is_decode)
        for w in batch.works:
            run = w.run
            step.tokens += run.tokens[w.lo : w.hi]
            step.positions += range(run.start_pos + w.lo, run.start_pos + w.hi)
            step.slots += [run.pages[i // ps] * ps + i % ps for i in range(w.lo, w.hi)]
            n_own = cdiv(w.hi, ps)
            step.entries.append(w.context.then(run.pages[:n_own], page_fill(w.hi, ps)))
            step.q_lens.append(w.hi - w.lo)
            step.q_starts.append(run.start_pos + w.lo)
            if w.samples:
                step.logits_rows.append(len(step.tokens) - 1)
        for c in batch.copies:
            step.copy_src += c.src
            step.copy_dst += c.dst
            step.copy_deltas += c.deltas
        return step

    def to_device(self, device: torch.device) -> tuple[torch.Tensor, ForwardBatch]:
        """(input_ids [T], the ForwardBatch) on `device`."""

        def int64(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)

        fb = ForwardBatch(
            positions=int64(self.positions),
            slot_mapping=int64(self.slots),
            attn=PagedBatch.build(self.entries, self.q_lens, self.q_starts, device),
            is_decode=self.is_decode,
            logits_indices=int64(self.logits_rows),
        )
        return int64(self.tokens), fb
