"""Turns a scheduled batch into one forward pass: packed tokens, positions, slots and page tables."""

from __future__ import annotations

import torch

from lazyattn.engine.cuda_graphs import DecodeGraphs
from lazyattn.engine.scheduler import ScheduledBatch, page_fill
from lazyattn.kernels.backend import AttentionBackend, ForwardBatch
from lazyattn.kernels.paged import EntryPages, PagedBatch
from lazyattn.model.llama import CausalLM


class ModelRunner:
    def __init__(self, model: CausalLM, backend: AttentionBackend, device: torch.device,
                 graphs: DecodeGraphs | None = None) -> None:
        self.model = model
        self.backend = backend
        self.device = device
        self.page_size = backend.page_size
        self.graphs = graphs  # decode steps replay CUDA graphs when set

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> torch.Tensor:
        """Forward the batch; fp32 logits [n, vocab] of the works that sample, in batch order."""
        self._copy_rotate(batch)
        input_ids, fb = self.prepare(batch)
        if self.graphs is not None and self.graphs.fits(fb):
            return self.graphs.run(input_ids, fb)
        hidden = self.model(input_ids, fb, self.backend)
        return self.model.compute_logits(hidden[fb.logits_indices])

    def prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, ForwardBatch]:
        ps = self.page_size
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        entries: list[EntryPages] = []
        q_lens: list[int] = []
        q_starts: list[int] = []
        logits_rows: list[int] = []
        for w in batch.works:
            run = w.run
            tokens += run.tokens[w.lo : w.hi]
            positions += range(run.start_pos + w.lo, run.start_pos + w.hi)
            slots += [run.pages[i // ps] * ps + i % ps for i in range(w.lo, w.hi)]
            n_own = -(-w.hi // ps)
            ctx = w.context
            entries.append(
                EntryPages(
                    list(ctx.pages) + run.pages[:n_own],
                    list(ctx.deltas) + [0] * n_own,
                    list(ctx.valid) + page_fill(w.hi, ps),
                )
            )
            q_lens.append(w.hi - w.lo)
            q_starts.append(run.start_pos + w.lo)
            if w.samples:
                logits_rows.append(len(tokens) - 1)
        dev = self.device
        fb = ForwardBatch(
            positions=torch.tensor(positions, dtype=torch.int64).to(dev, non_blocking=True),
            slot_mapping=torch.tensor(slots, dtype=torch.int64).to(dev, non_blocking=True),
            attn=PagedBatch.build(entries, q_lens, q_starts, dev),
            is_decode=batch.is_decode,
            logits_indices=torch.tensor(logits_rows, dtype=torch.int64).to(dev, non_blocking=True),
        )
        return torch.tensor(tokens, dtype=torch.int64).to(dev, non_blocking=True), fb

    def _copy_rotate(self, batch: ScheduledBatch) -> None:
        if not batch.copies:
            return
        src = [p for c in batch.copies for p in c.src]
        dst = [p for c in batch.copies for p in c.dst]
        deltas = [d for c in batch.copies for d in c.deltas]
        if not src:
            return

        def as_tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32).to(self.device)

        self.backend.copy_rotate(as_tensor(src), as_tensor(dst), as_tensor(deltas))
